// kernels/cross_entropy.cu compiled for the CPU (see cuda_cpu_shim.h), loaded with ctypes by
// grassflow.ops.linear_ce.fused: each extern "C" kernel K gets a launcher
//     launch_K(grid, block, args)
// with CUDA's kernel-argument array, as plucker_cpu.cpp gives plucker.cu's kernels. (Its
// launcher template is not shared: plucker_cpu.cpp's bytes are in every Grassmann run's code hash.)
#include <cstddef>
#include <type_traits>
#include <utility>

#include "cuda_cpu_shim.h"

template <typename... P, std::size_t... I>
static void ce_launch_unpacked(void (*kernel)(P...), unsigned grid, unsigned block, void** args,
                               std::index_sequence<I...>) {
  shim_launch(kernel, grid, block, *static_cast<std::remove_reference_t<P>*>(args[I])...);
}

template <typename... P>
static void ce_launch_packed(void (*kernel)(P...), unsigned grid, unsigned block, void** args) {
  ce_launch_unpacked(kernel, grid, block, args, std::index_sequence_for<P...>{});
}

#define CE_ON_KERNEL(K) \
  extern "C" void launch_##K(unsigned grid, unsigned block, void** args) { ce_launch_packed(K, grid, block, args); }

#include "../cross_entropy.cu"
