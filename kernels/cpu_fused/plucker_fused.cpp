// Fused CPU path of the Plücker stages (the "fused-cpu" backend): per-token loops over
// tokens in parallel (OpenMP), each token's outputs written in one pass, no temporaries.
// coeff and lag_bwd run the very kernels of plucker.cu (one "thread" per token, launched in
// parallel); wedge and its backward are the same formulas as plucker_wedge /
// plucker_wedge_bwd, reorganised per token so the inner loops run over contiguous memory.
// float and double only: CPU training runs in fp32. The entry points take the stage's
// arguments (those of plucker.cu's kernels, eps as a double) after the number of threads.
#include <omp.h>

#include "../cpu_shim/cuda_cpu_shim.h"
#include "../plucker.cu"

template <typename T> using acc_t = typename AccOf<T>::type;

// One kernel "thread" per token, blocks of 1: blockIdx/threadIdx are thread_local in the shim.
template <typename Kernel, typename... Args>
static void parallel_tokens(int n_threads, long n_tokens, Kernel kernel, Args... args) {
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (long tok = 0; tok < n_tokens; ++tok) {
    gridDim = {(unsigned)n_tokens, 1, 1};
    blockDim = {1, 1, 1};
    blockIdx = {(unsigned)tok, 0, 0};
    threadIdx = {0, 0, 0};
    kernel(args...);
  }
}

template <typename T>
static void wedge(int n_threads, const T* z, const acc_t<T>* c, long n_tokens, int r, T* q) {
  const int n_pairs = r * (r - 1) / 2;
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (long tok = 0; tok < n_tokens; ++tok) {
    const T* a = z + tok * r;
    const acc_t<T>* ct = c + tok * r;
    T* qt = q + tok * n_pairs;
    for (int i = 0; i < r - 1; ++i) {  // row block i: (a_i c_j − c_i a_j) for j > i
      const acc_t<T> ai = a[i], ci = ct[i];
      for (int j = i + 1; j < r; ++j) *qt++ = ai * ct[j] - ci * a[j];
    }
  }
}

// da = D c, dc = −D a with D_ij = dq_ij (i<j), D_ji = −dq_ij.
template <typename T>
static void wedge_bwd(int n_threads, const T* dq, const T* z, const acc_t<T>* c, long n_tokens,
                      int r, acc_t<T>* da, acc_t<T>* dc) {
  const int n_pairs = r * (r - 1) / 2;
#pragma omp parallel for num_threads(n_threads) schedule(static)
  for (long tok = 0; tok < n_tokens; ++tok) {
    const T* a = z + tok * r;
    const acc_t<T>* ct = c + tok * r;
    const T* d = dq + tok * n_pairs;
    acc_t<T>* dat = da + tok * r;
    acc_t<T>* dct = dc + tok * r;
    for (int k = 0; k < r; ++k) dat[k] = dct[k] = 0;
    for (int i = 0; i < r - 1; ++i) {
      const acc_t<T> ai = a[i], ci = ct[i];
      acc_t<T> sa = 0, sc = 0;
      for (int j = i + 1; j < r; ++j, ++d) {
        const acc_t<T> x = *d;
        sa += x * ct[j];
        sc += x * a[j];
        dat[j] -= x * ci;
        dct[j] += x * ai;
      }
      dat[i] += sa;
      dct[i] -= sc;
    }
  }
}

#define PLUCKER_FUSED_EXPORT(T, NAME)                                                          \
  extern "C" void coeff_##NAME(int nt, const T* z, const int* lags, int n_lags, long n_tokens, \
                               int seq_len, int r, double eps, acc_t<T>* c) {                  \
    parallel_tokens(nt, n_tokens, plucker_coeff_body<T>, z, lags, n_lags, n_tokens, seq_len, r, \
                    (acc_t<T>)eps, c);                                                         \
  }                                                                                            \
  extern "C" void wedge_##NAME(int nt, const T* z, const acc_t<T>* c, const int*, const int*,  \
                               long n_tokens, int r, T* q) {                                   \
    wedge<T>(nt, z, c, n_tokens, r, q);                                                        \
  }                                                                                            \
  extern "C" void wedge_bwd_##NAME(int nt, const T* dq, const T* z, const acc_t<T>* c,         \
                                   long n_tokens, int r, acc_t<T>* da, acc_t<T>* dc) {         \
    wedge_bwd<T>(nt, dq, z, c, n_tokens, r, da, dc);                                           \
  }                                                                                            \
  extern "C" void lag_bwd_##NAME(int nt, const T* z, const acc_t<T>* dc, const acc_t<T>* da,   \
                                 const int* lags, int n_lags, long n_tokens, int seq_len,      \
                                 int r, double eps, acc_t<T>* dz) {                            \
    parallel_tokens(nt, n_tokens, plucker_lag_bwd_body<T>, z, dc, da, lags, n_lags, n_tokens,   \
                    seq_len, r, (acc_t<T>)eps, dz);                                            \
  }

PLUCKER_FUSED_EXPORT(float, f32)
PLUCKER_FUSED_EXPORT(double, f64)
