// Fused CPU path of the Plücker stages (the "fused-cpu" backend): per-token loops over
// tokens in parallel (OpenMP), each token's outputs written in one pass, no temporaries.
// The same formulas as plucker.cu, from its own pieces (Pair, LaterTerm, EarlierTerm), but a
// token at a time: its pairs' scalars computed once for all r components (a GPU thread owns
// one component and recomputes them; a CPU core would pay that r times). wedge and its
// backward are plucker_wedge / plucker_wedge_bwd reorganised per token so the inner loops run
// over contiguous memory. float and double only: CPU training runs in fp32. The entry points
// take the stage's arguments (those of plucker.cu's kernels, eps as a double) after the number
// of threads, and pick the instantiation for r as the GPU backend does (r exact or a bound).
#include <omp.h>

#include "../cpu_shim/cuda_cpu_shim.h"
#include "../plucker.cu"

template <typename T> using acc_t = typename AccOf<T>::type;

template <int R, typename T>
static void coeff_token(const T* z, const int* lags, int n_lags, long tok, int seq_len, int r,
                        acc_t<T> eps, acc_t<T>* c) {
  int t = (int)(tok % seq_len), n = n_valid(lags, n_lags, t);
  acc_t<T> a[R], b[R], acc[R] = {};
  load_row(z + tok * r, r, a);
  for (int l = 0; l < n_lags; ++l) {
    if (lags[l] > t) continue;
    load_row(z + (tok - lags[l]) * r, r, b);
    Pair<acc_t<T>> p(a, b, eps);
    const acc_t<T> w = acc_t<T>(1) / (p.norm * n);
    for (int k = 0; k < r; ++k) acc[k] += w * b[k];
  }
  for (int k = 0; k < r; ++k) c[tok * r + k] = acc[k];
}

template <int R, typename T>
static void lag_bwd_token(const T* z, const acc_t<T>* dc, const acc_t<T>* da, const int* lags,
                          int n_lags, long tok, int seq_len, int r, acc_t<T> eps, acc_t<T>* dz) {
  int s = (int)(tok % seq_len), n_s = n_valid(lags, n_lags, s);
  acc_t<T> zs[R], dcs[R], x[R], dcx[R], out[R];
  load_row(z + tok * r, r, zs);
  load_row(dc + tok * r, r, dcs);
  load_row(da + tok * r, r, out);
  for (int l = 0; l < n_lags; ++l) {
    int d = lags[l];
    if (d <= s) {  // s is the later token: a = z_s, b = z_{s-d}
      load_row(z + (tok - d) * r, r, x);
      LaterTerm<acc_t<T>> term(Pair<acc_t<T>>(zs, x, eps), dcs, x, n_s);
      for (int k = 0; k < r; ++k) out[k] += term.at(zs[k], x[k]);
    }
    if (s + d < seq_len) {  // s is the earlier token: a = z_{s+d}, b = z_s
      load_row(z + (tok + d) * r, r, x);
      load_row(dc + (tok + d) * r, r, dcx);
      EarlierTerm<acc_t<T>> term(Pair<acc_t<T>>(x, zs, eps), dcx, zs, n_valid(lags, n_lags, s + d));
      for (int k = 0; k < r; ++k) out[k] += term.at(dcx[k], zs[k], x[k]);
    }
  }
  for (int k = 0; k < r; ++k) dz[tok * r + k] = out[k];
}

// f<R>(args...) for every token in parallel, R the bound plucker.cu would use for r (≤ 64).
#define PLUCKER_PER_TOKEN(NT, N_TOKENS, R_RUNTIME, F, T, ...)                                  \
  do {                                                                                          \
    const int r_ = (R_RUNTIME), nt_ = (NT);                                                     \
    _Pragma("omp parallel for num_threads(nt_) schedule(static)")                               \
    for (long tok = 0; tok < (N_TOKENS); ++tok) {                                               \
      if (r_ <= 4) F<4, T>(__VA_ARGS__);                                                        \
      else if (r_ <= 8) F<8, T>(__VA_ARGS__);                                                   \
      else if (r_ <= 16) F<16, T>(__VA_ARGS__);                                                 \
      else if (r_ <= 32) F<32, T>(__VA_ARGS__);                                                 \
      else F<64, T>(__VA_ARGS__);                                                               \
    }                                                                                           \
  } while (0)

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
    PLUCKER_PER_TOKEN(nt, n_tokens, r, coeff_token, T, z, lags, n_lags, tok, seq_len, r,       \
                      (acc_t<T>)eps, c);                                                       \
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
    PLUCKER_PER_TOKEN(nt, n_tokens, r, lag_bwd_token, T, z, dc, da, lags, n_lags, tok, seq_len, \
                      r, (acc_t<T>)eps, dz);                                                   \
  }

PLUCKER_FUSED_EXPORT(float, f32)
PLUCKER_FUSED_EXPORT(double, f64)
