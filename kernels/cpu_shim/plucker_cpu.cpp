// kernels/plucker.cu compiled for the CPU (see cuda_cpu_shim.h), loaded with ctypes by
// grassflow.ops.plucker.cpu_kernel. Each extern "C" kernel K gets a launcher
//     launch_K(grid, block, args)
// where args is CUDA's kernel-argument array (cudaLaunchKernel / cuLaunchKernel: one pointer
// to each argument's value, in the kernel's parameter order). The `kernel-cpu` backend and
// the CuPy stand-in of the tests launch through these, with the grid and block they chose.
#include <cstddef>
#include <type_traits>
#include <utility>

#include "cuda_cpu_shim.h"

template <typename... P, std::size_t... I>
static void launch_unpacked(void (*kernel)(P...), unsigned grid, unsigned block, void** args,
                            std::index_sequence<I...>) {
  shim_launch(kernel, grid, block, *static_cast<std::remove_reference_t<P>*>(args[I])...);
}

template <typename... P>
static void launch_packed(void (*kernel)(P...), unsigned grid, unsigned block, void** args) {
  launch_unpacked(kernel, grid, block, args, std::index_sequence_for<P...>{});
}

// plucker.cu names each kernel it defines to this hook, so no list of kernels is kept here.
#define PLUCKER_ON_KERNEL(K) \
  extern "C" void launch_##K(unsigned grid, unsigned block, void** args) { launch_packed(K, grid, block, args); }

#include "../plucker.cu"
