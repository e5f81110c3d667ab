// C entry points over kernels/plucker.cu compiled for the CPU (see cuda_cpu_shim.h);
// loaded with ctypes by grassflow.ops.plucker.cpu_kernel.
#include "cuda_cpu_shim.h"
#include "../plucker.cu"

static const unsigned kBlock = 128;
static unsigned blocks(long n) { return (unsigned)((n + kBlock - 1) / kBlock); }

#define PLUCKER_CPU_EXPORT(T, NAME)                                                        \
  extern "C" void coeff_##NAME(const T* z, const int* lags, int n_lags, long n_tokens,     \
                               int seq_len, int r, double eps, AccOf<T>::type* c) {        \
    shim_launch(plucker_coeff<T>, blocks(n_tokens), kBlock, z, lags, n_lags, n_tokens,     \
                seq_len, r, (AccOf<T>::type)eps, c);                                       \
  }                                                                                        \
  extern "C" void wedge_##NAME(const T* z, const AccOf<T>::type* c, const int* pi,         \
                               const int* pj, long n_tokens, int r, T* q) {                \
    shim_launch(plucker_wedge<T>, blocks(n_tokens * (r * (r - 1) / 2)), kBlock, z, c, pi,  \
                pj, n_tokens, r, q);                                                       \
  }                                                                                        \
  extern "C" void wedge_bwd_##NAME(const T* dq, const T* z, const AccOf<T>::type* c,       \
                                   long n_tokens, int r, AccOf<T>::type* da,               \
                                   AccOf<T>::type* dc) {                                   \
    shim_launch(plucker_wedge_bwd<T>, blocks(n_tokens * r), kBlock, dq, z, c, n_tokens, r, \
                da, dc);                                                                   \
  }                                                                                        \
  extern "C" void lag_bwd_##NAME(const T* z, const AccOf<T>::type* dc,                     \
                                 const AccOf<T>::type* da, const int* lags, int n_lags,    \
                                 long n_tokens, int seq_len, int r, double eps,            \
                                 AccOf<T>::type* dz) {                                     \
    shim_launch(plucker_lag_bwd<T>, blocks(n_tokens), kBlock, z, dc, da, lags, n_lags,     \
                n_tokens, seq_len, r, (AccOf<T>::type)eps, dz);                            \
  }

PLUCKER_CPU_EXPORT(float, f32)
PLUCKER_CPU_EXPORT(double, f64)
PLUCKER_CPU_EXPORT(bf16_t, bf16)
