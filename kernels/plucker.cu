// Plücker mixing: the elementwise stages of grassflow.ops.plucker (the "cupy" backend).
//
// The op is g_t = W (z_t ∧ c_t) + b with
//     c_t = (1/n_t) Σ_{Δ: t-Δ ≥ 0} z_{t-Δ} / max(‖z_t ∧ z_{t-Δ}‖, eps)
// (see src/grassflow/ops/plucker/fast.py for the derivation). The projections by W are
// cuBLAS GEMMs issued by torch; these kernels do everything else, each with one thread per
// output element, so that a step's 4,096 tokens make hundreds of blocks, not sixteen:
//   plucker_coeff      thread (token, k<r)     z         -> c
//   plucker_wedge      thread (token, pair)    z, c      -> q = z ∧ c (r(r-1)/2 coords)
//   plucker_wedge_bwd  thread (token, k<r)     dq, z, c  -> da = D c, dc = -D a
//   plucker_lag_bwd    thread (token, k<r)     z, dc, da -> dz (gathers, no atomics)
// where D is the r×r antisymmetric matrix with D_ij = dq_ij for i<j. A thread recomputes the
// scalars of its token's pairs (norms, dot products: O(r) each, from rows held in registers;
// the r threads of a token read the same rows, which the cache broadcasts) and writes its one
// element once: no global read-modify-write, and stores coalesced along k.
//
// r is a compile-time constant R: an instantiation per r in {4, 8, 16, 32} (loops unrolled,
// rows in registers), and for any other r ≤ 64 the next of {8, 16, 32, 64} as a bound, rows
// zero-padded to it. Kernel names: plucker_<stage>_<variant>_<type>, variant r<R> (exact) or
// upto<R> (bound); type f32, f64 or bf16 (bf16_t, the raw bits). plucker_wedge needs no R.
//
// Every kernel is barrier-free (no shared memory, no __syncthreads, no warp shuffles, no
// atomics): each thread owns its outputs, so kernels/cpu_shim/cuda_cpu_shim.h can run these very
// sources on the CPU by looping over the grid. Arithmetic is done in acc_t (float for
// float/bf16 inputs, double for double) and c, da, dc, dz are stored in acc_t.
//
// ‖a ∧ b‖² = ‖a‖²‖b‖² − (a·b)² (Lagrange) is evaluated as ‖a‖² ‖b − μa‖², μ = a·b/‖a‖²,
// which is the same number without the catastrophic cancellation for near-parallel a, b.

// Full unrolling where a loop's bound is the compile-time R (g++, for the shim, has its own pragma).
#ifdef __CUDACC__
#define PLUCKER_UNROLL _Pragma("unroll")
#else
#define PLUCKER_UNROLL _Pragma("GCC unroll 64")
#endif

struct bf16_t {
  unsigned short bits;
};

template <typename T> struct AccOf { typedef float type; };
template <> struct AccOf<double> { typedef double type; };

__device__ __forceinline__ float to_acc(float x) { return x; }
__device__ __forceinline__ double to_acc(double x) { return x; }
__device__ __forceinline__ float to_acc(bf16_t x) {
  return __uint_as_float(((unsigned int)x.bits) << 16);
}
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(double* p, double v) { *p = v; }
__device__ __forceinline__ void store(bf16_t* p, float v) {
  unsigned int u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays NaN
    p->bits = (unsigned short)((u >> 16) | 0x40u);
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  p->bits = (unsigned short)(u >> 16);
}

// Number of offsets valid at position t (duplicates count, as in the reference loop).
__device__ __forceinline__ int n_valid(const int* lags, int n_lags, int t) {
  int n = 0;
  for (int l = 0; l < n_lags; ++l) n += (lags[l] <= t);
  return n;
}

// A row of z (or dc) in registers, zero past r: sums over all R then need no guard.
template <int R, typename acc_t, typename scalar_t>
__device__ __forceinline__ void load_row(const scalar_t* p, int r, acc_t (&v)[R]) {
  PLUCKER_UNROLL
  for (int k = 0; k < R; ++k) v[k] = k < r ? to_acc(p[k]) : acc_t(0);
}

template <int R, typename acc_t>
__device__ __forceinline__ acc_t dot(const acc_t (&x)[R], const acc_t (&y)[R]) {
  acc_t s = 0;
  PLUCKER_UNROLL
  for (int k = 0; k < R; ++k) s += x[k] * y[k];
  return s;
}

// Scalars of one pair (a = z_t, b = z_{t-Δ}): ‖a‖², a·b, μ, ‖b − μa‖², and N = max(‖a∧b‖, eps).
template <typename acc_t>
struct Pair {
  acc_t sa, ab, mu, sp, norm;
  bool active;  // ‖a∧b‖ > eps: the normalisation carries a gradient
  template <int R>
  __device__ __forceinline__ Pair(const acc_t (&a)[R], const acc_t (&b)[R], acc_t eps) {
    sa = dot(a, a);
    ab = dot(a, b);
    mu = sa > 0 ? ab / sa : acc_t(0);
    sp = 0;
  PLUCKER_UNROLL
    for (int k = 0; k < R; ++k) {
      acc_t d = b[k] - mu * a[k];
      sp += d * d;
    }
    acc_t s = sa * sp;
    active = s > eps * eps;
    norm = active ? sqrt(s) : eps;
  }
};

// The backward's terms of one pair, as functions of one component k (fast.py's formulas).
// With w = 1/(n_t N), u = dc_t·b and κ = −u w / N² (0 where the norm is clamped):
//   d/da (s = t, the later token):    κ (‖b−μa‖² a − (a·b)(b − μa))
//   d/db (s = t−Δ, the earlier token): w dc_t + κ ‖a‖² (b − μa)
template <typename acc_t>
struct LaterTerm {  // s plays a: its pair with b = z_{s-Δ}
  acc_t kappa, sp, ab, mu;
  template <int R>
  __device__ __forceinline__ LaterTerm(const Pair<acc_t>& p, const acc_t (&dc_s)[R],
                                       const acc_t (&b)[R], int n_s) {
    acc_t w = acc_t(1) / (p.norm * n_s);
    kappa = p.active ? -dot(dc_s, b) * w / (p.norm * p.norm) : acc_t(0);
    sp = p.sp, ab = p.ab, mu = p.mu;
  }
  __device__ __forceinline__ acc_t at(acc_t a_k, acc_t b_k) const {
    return kappa * (sp * a_k - ab * (b_k - mu * a_k));
  }
};

template <typename acc_t>
struct EarlierTerm {  // s plays b: its pair with a = z_{s+Δ}, whose coefficient gradient is dc_t
  acc_t w, kappa_sa, mu;
  template <int R>
  __device__ __forceinline__ EarlierTerm(const Pair<acc_t>& p, const acc_t (&dc_t)[R],
                                         const acc_t (&b)[R], int n_t) {
    w = acc_t(1) / (p.norm * n_t);
    kappa_sa = p.active ? -dot(dc_t, b) * w / (p.norm * p.norm) * p.sa : acc_t(0);
    mu = p.mu;
  }
  __device__ __forceinline__ acc_t at(acc_t dc_k, acc_t b_k, acc_t a_k) const {
    return w * dc_k + kappa_sa * (b_k - mu * a_k);
  }
};

// (token, k) of a thread of a (token, k<r) grid; false past the end.
__device__ __forceinline__ bool token_component(long n_tokens, int r, long* tok, int* k) {
  long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= n_tokens * r) return false;
  *tok = idx / r;
  *k = (int)(idx - *tok * r);
  return true;
}

// c[tok, k] = Σ_Δ z[tok−Δ, k] / (n_t N_Δ)
template <int R, bool EXACT, typename scalar_t>
__device__ __forceinline__ void plucker_coeff_body(
    const scalar_t* __restrict__ z, const int* __restrict__ lags, int n_lags, long n_tokens,
    int seq_len, int r_arg, typename AccOf<scalar_t>::type eps,
    typename AccOf<scalar_t>::type* __restrict__ c) {
  typedef typename AccOf<scalar_t>::type acc_t;
  const int r = EXACT ? R : r_arg;
  long tok;
  int k;
  if (!token_component(n_tokens, r, &tok, &k)) return;
  int t = (int)(tok % seq_len);
  int n = n_valid(lags, n_lags, t);
  acc_t a[R], b[R], acc = 0;
  load_row(z + tok * r, r, a);
  for (int l = 0; l < n_lags; ++l) {
    int d = lags[l];
    if (d > t) continue;
    const scalar_t* zb = z + (tok - d) * r;
    load_row(zb, r, b);
    Pair<acc_t> p(a, b, eps);
    acc += (acc_t(1) / (p.norm * n)) * to_acc(zb[k]);
  }
  c[tok * r + k] = acc;
}

// Index of pair (i, j), i < j, in the row-major upper triangle of an r×r matrix.
__device__ __forceinline__ int pair_index(int i, int j, int r) {
  return i * (2 * r - i - 1) / 2 + (j - i - 1);
}

template <typename scalar_t>
__device__ __forceinline__ void plucker_wedge_body(
    const scalar_t* __restrict__ z, const typename AccOf<scalar_t>::type* __restrict__ c,
    const int* __restrict__ pair_i, const int* __restrict__ pair_j, long n_tokens, int r,
    scalar_t* __restrict__ q) {
  typedef typename AccOf<scalar_t>::type acc_t;
  int n_pairs = r * (r - 1) / 2;
  long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= n_tokens * n_pairs) return;
  long tok = idx / n_pairs;
  int k = (int)(idx - tok * n_pairs);
  int i = pair_i[k], j = pair_j[k];
  const scalar_t* a = z + tok * r;
  const acc_t* ct = c + tok * r;
  store(q + idx, to_acc(a[i]) * ct[j] - to_acc(a[j]) * ct[i]);
}

// da_k = (D c)_k, dc_k = −(D a)_k, D_kj = dq_kj (k<j), −dq_jk (k>j): rows a, c in registers.
template <int R, bool EXACT, typename scalar_t>
__device__ __forceinline__ void plucker_wedge_bwd_body(
    const scalar_t* __restrict__ dq, const scalar_t* __restrict__ z,
    const typename AccOf<scalar_t>::type* __restrict__ c, long n_tokens, int r_arg,
    typename AccOf<scalar_t>::type* __restrict__ da,
    typename AccOf<scalar_t>::type* __restrict__ dc) {
  typedef typename AccOf<scalar_t>::type acc_t;
  const int r = EXACT ? R : r_arg;
  long tok;
  int k;
  if (!token_component(n_tokens, r, &tok, &k)) return;
  const scalar_t* dqt = dq + tok * (r * (r - 1) / 2);
  acc_t a[R], ct[R], sa = 0, sc = 0;
  load_row(z + tok * r, r, a);
  load_row(c + tok * r, r, ct);
  PLUCKER_UNROLL
  for (int j = 0; j < R; ++j) {
    if (j >= r || j == k) continue;
    acc_t dkj = j > k ? to_acc(dqt[pair_index(k, j, r)]) : -to_acc(dqt[pair_index(j, k, r)]);
    sa += dkj * ct[j];
    sc += dkj * a[j];
  }
  da[tok * r + k] = sa;
  dc[tok * r + k] = -sc;
}

// dz_s = da_s + Σ_Δ [s plays a: t = s] + Σ_Δ [s plays b: t = s+Δ] (LaterTerm, EarlierTerm).
template <int R, bool EXACT, typename scalar_t>
__device__ __forceinline__ void plucker_lag_bwd_body(
    const scalar_t* __restrict__ z, const typename AccOf<scalar_t>::type* __restrict__ dc,
    const typename AccOf<scalar_t>::type* __restrict__ da, const int* __restrict__ lags,
    int n_lags, long n_tokens, int seq_len, int r_arg, typename AccOf<scalar_t>::type eps,
    typename AccOf<scalar_t>::type* __restrict__ dz) {
  typedef typename AccOf<scalar_t>::type acc_t;
  const int r = EXACT ? R : r_arg;
  long tok;
  int k;
  if (!token_component(n_tokens, r, &tok, &k)) return;
  int s = (int)(tok % seq_len);
  int n_s = n_valid(lags, n_lags, s);
  acc_t zs[R], dcs[R], x[R], dcx[R];
  load_row(z + tok * r, r, zs);
  load_row(dc + tok * r, r, dcs);
  const acc_t zs_k = to_acc(z[tok * r + k]);
  acc_t out = da[tok * r + k];
  for (int l = 0; l < n_lags; ++l) {
    int d = lags[l];
    if (d <= s) {  // s is the later token: a = z_s, b = z_{s-d}
      const scalar_t* zb = z + (tok - d) * r;
      load_row(zb, r, x);
      Pair<acc_t> p(zs, x, eps);
      out += LaterTerm<acc_t>(p, dcs, x, n_s).at(zs_k, to_acc(zb[k]));
    }
    if (s + d < seq_len) {  // s is the earlier token: a = z_{s+d}, b = z_s
      const scalar_t* za = z + (tok + d) * r;
      const acc_t* dct = dc + (tok + d) * r;
      load_row(za, r, x);
      load_row(dct, r, dcx);
      Pair<acc_t> p(x, zs, eps);
      out += EarlierTerm<acc_t>(p, dcx, zs, n_valid(lags, n_lags, s + d)).at(dct[k], zs_k, to_acc(za[k]));
    }
  }
  dz[tok * r + k] = out;
}

// The kernels: extern "C" __global__ functions, so that CuPy compiles the module without
// name_expressions (and so keeps the binary in its on-disk cache) and looks them up by these
// plain names; nvcc, NVRTC and the CPU shim see the same symbols. Parameter types are spelled
// out (ACC is AccOf<T>::type) so that the signatures can be read off the preprocessed source
// (grassflow.ops.plucker.kernel_abi). PLUCKER_ON_KERNEL(name) follows each kernel: empty here;
// the CPU shim defines it to emit the kernel's launcher (kernels/cpu_shim/plucker_cpu.cpp).
#ifndef PLUCKER_ON_KERNEL
#define PLUCKER_ON_KERNEL(name)
#endif
#define PLUCKER_R_KERNELS(T, ACC, SUFFIX, VARIANT, R, EXACT)                                   \
  extern "C" __global__ void plucker_coeff_##VARIANT##_##SUFFIX(                               \
      const T* __restrict__ z, const int* __restrict__ lags, int n_lags, long n_tokens,         \
      int seq_len, int r, ACC eps, ACC* __restrict__ c) {                                       \
    plucker_coeff_body<R, EXACT, T>(z, lags, n_lags, n_tokens, seq_len, r, eps, c);             \
  }                                                                                             \
  PLUCKER_ON_KERNEL(plucker_coeff_##VARIANT##_##SUFFIX)                                         \
  extern "C" __global__ void plucker_wedge_bwd_##VARIANT##_##SUFFIX(                           \
      const T* __restrict__ dq, const T* __restrict__ z, const ACC* __restrict__ c,             \
      long n_tokens, int r, ACC* __restrict__ da, ACC* __restrict__ dc) {                       \
    plucker_wedge_bwd_body<R, EXACT, T>(dq, z, c, n_tokens, r, da, dc);                         \
  }                                                                                             \
  PLUCKER_ON_KERNEL(plucker_wedge_bwd_##VARIANT##_##SUFFIX)                                     \
  extern "C" __global__ void plucker_lag_bwd_##VARIANT##_##SUFFIX(                             \
      const T* __restrict__ z, const ACC* __restrict__ dc, const ACC* __restrict__ da,          \
      const int* __restrict__ lags, int n_lags, long n_tokens, int seq_len, int r, ACC eps,     \
      ACC* __restrict__ dz) {                                                                   \
    plucker_lag_bwd_body<R, EXACT, T>(z, dc, da, lags, n_lags, n_tokens, seq_len, r, eps, dz);  \
  }                                                                                             \
  PLUCKER_ON_KERNEL(plucker_lag_bwd_##VARIANT##_##SUFFIX)

#define PLUCKER_KERNELS(T, ACC, SUFFIX)                                                        \
  extern "C" __global__ void plucker_wedge_##SUFFIX(                                           \
      const T* __restrict__ z, const ACC* __restrict__ c, const int* __restrict__ pair_i,       \
      const int* __restrict__ pair_j, long n_tokens, int r, T* __restrict__ q) {                \
    plucker_wedge_body<T>(z, c, pair_i, pair_j, n_tokens, r, q);                                \
  }                                                                                             \
  PLUCKER_ON_KERNEL(plucker_wedge_##SUFFIX)                                                     \
  PLUCKER_R_KERNELS(T, ACC, SUFFIX, r4, 4, true)                                                \
  PLUCKER_R_KERNELS(T, ACC, SUFFIX, r8, 8, true)                                                \
  PLUCKER_R_KERNELS(T, ACC, SUFFIX, r16, 16, true)                                              \
  PLUCKER_R_KERNELS(T, ACC, SUFFIX, r32, 32, true)                                              \
  PLUCKER_R_KERNELS(T, ACC, SUFFIX, upto8, 8, false)                                            \
  PLUCKER_R_KERNELS(T, ACC, SUFFIX, upto16, 16, false)                                          \
  PLUCKER_R_KERNELS(T, ACC, SUFFIX, upto32, 32, false)                                          \
  PLUCKER_R_KERNELS(T, ACC, SUFFIX, upto64, 64, false)

PLUCKER_KERNELS(float, float, f32)
PLUCKER_KERNELS(double, double, f64)
PLUCKER_KERNELS(bf16_t, float, bf16)
