// The Plücker kernels as of 441a7fd (one thread per token for coeff and lag_bwd, r a run-time
// argument), kept verbatim beside this launcher only as the baseline of `python -m grassflow.bench
// --parts kernels` (old vs new kernels through the same interface). Nothing trains with them.
// The launcher is that commit's kernels/cpu_shim/plucker_cpu.cpp.
#include <cstddef>
#include <type_traits>
#include <utility>

#include "../cpu_shim/cuda_cpu_shim.h"
#include "plucker_441a7fd.cu"

template <typename... P, std::size_t... I>
static void launch_unpacked(void (*kernel)(P...), unsigned grid, unsigned block, void** args,
                            std::index_sequence<I...>) {
  shim_launch(kernel, grid, block, *static_cast<std::remove_reference_t<P>*>(args[I])...);
}

template <typename... P>
static void launch_packed(void (*kernel)(P...), unsigned grid, unsigned block, void** args) {
  launch_unpacked(kernel, grid, block, args, std::index_sequence_for<P...>{});
}

#define PLUCKER_CPU_LAUNCHER(K) \
  extern "C" void launch_##K(unsigned grid, unsigned block, void** args) { launch_packed(K, grid, block, args); }
#define PLUCKER_CPU_LAUNCHERS(SUFFIX)                \
  PLUCKER_CPU_LAUNCHER(plucker_coeff_##SUFFIX)       \
  PLUCKER_CPU_LAUNCHER(plucker_wedge_##SUFFIX)       \
  PLUCKER_CPU_LAUNCHER(plucker_wedge_bwd_##SUFFIX)   \
  PLUCKER_CPU_LAUNCHER(plucker_lag_bwd_##SUFFIX)

PLUCKER_CPU_LAUNCHERS(f32)
PLUCKER_CPU_LAUNCHERS(f64)
PLUCKER_CPU_LAUNCHERS(bf16)
