// Plücker mixing: the elementwise stages of grassflow.ops.plucker (the "cupy" backend).
//
// The op is g_t = W (z_t ∧ c_t) + b with
//     c_t = (1/n_t) Σ_{Δ: t-Δ ≥ 0} z_{t-Δ} / max(‖z_t ∧ z_{t-Δ}‖, eps)
// (see src/grassflow/ops/plucker/fast.py for the derivation). The projections by W are
// cuBLAS GEMMs issued from Python; these kernels do everything else:
//   plucker_coeff      one thread per token        z        -> c
//   plucker_wedge      one thread per (token,pair) z, c     -> q = z ∧ c (r(r-1)/2 coords)
//   plucker_wedge_bwd  one thread per (token,k<r)  dq, z, c -> da = D c, dc = -D a
//   plucker_lag_bwd    one thread per token        z, dc, da -> dz (gathers, no atomics)
// where D is the r×r antisymmetric matrix with D_ij = dq_ij for i<j.
//
// Every kernel is barrier-free (no shared memory, no __syncthreads, no warp shuffles, no
// atomics): each thread owns its outputs, so kernels/cpu_shim/cuda_cpu_shim.h can run these very
// sources on the CPU by looping over the grid. Arithmetic is done in acc_t (float for
// float/bf16 inputs, double for double) and c, da, dc, dz are stored in acc_t.
//
// ‖a ∧ b‖² = ‖a‖²‖b‖² − (a·b)² (Lagrange) is evaluated as ‖a‖² ‖b − μa‖², μ = a·b/‖a‖²,
// which is the same number without the catastrophic cancellation for near-parallel a, b.

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

// Scalars of one pair (a = z_t, b = z_{t-Δ}): ‖a‖², a·b, μ, ‖b − μa‖², and N = max(‖a∧b‖, eps).
template <typename acc_t, typename scalar_t>
struct Pair {
  acc_t sa, ab, mu, sp, norm;
  bool active;  // ‖a∧b‖ > eps: the normalisation carries a gradient
  __device__ __forceinline__ Pair(const scalar_t* a, const scalar_t* b, int r, acc_t eps) {
    sa = 0; ab = 0;
    for (int k = 0; k < r; ++k) {
      acc_t ak = to_acc(a[k]), bk = to_acc(b[k]);
      sa += ak * ak; ab += ak * bk;
    }
    mu = sa > 0 ? ab / sa : acc_t(0);
    sp = 0;
    for (int k = 0; k < r; ++k) {
      acc_t d = to_acc(b[k]) - mu * to_acc(a[k]);
      sp += d * d;
    }
    acc_t s = sa * sp;
    active = s > eps * eps;
    norm = active ? sqrt(s) : eps;
  }
};

template <typename scalar_t>
__device__ __forceinline__ void plucker_coeff_body(
    const scalar_t* __restrict__ z, const int* __restrict__ lags, int n_lags, long n_tokens,
    int seq_len, int r, typename AccOf<scalar_t>::type eps,
    typename AccOf<scalar_t>::type* __restrict__ c) {
  typedef typename AccOf<scalar_t>::type acc_t;
  long tok = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (tok >= n_tokens) return;
  int t = (int)(tok % seq_len);
  const scalar_t* a = z + tok * r;
  acc_t* ct = c + tok * r;
  for (int k = 0; k < r; ++k) ct[k] = 0;
  int n = n_valid(lags, n_lags, t);
  if (n == 0) return;
  for (int l = 0; l < n_lags; ++l) {
    int d = lags[l];
    if (d > t) continue;
    const scalar_t* b = a - (long)d * r;
    Pair<acc_t, scalar_t> p(a, b, r, eps);
    acc_t w = acc_t(1) / (p.norm * n);
    for (int k = 0; k < r; ++k) ct[k] += w * to_acc(b[k]);
  }
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

template <typename scalar_t>
__device__ __forceinline__ void plucker_wedge_bwd_body(
    const scalar_t* __restrict__ dq, const scalar_t* __restrict__ z,
    const typename AccOf<scalar_t>::type* __restrict__ c, long n_tokens, int r,
    typename AccOf<scalar_t>::type* __restrict__ da,
    typename AccOf<scalar_t>::type* __restrict__ dc) {
  typedef typename AccOf<scalar_t>::type acc_t;
  long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= n_tokens * r) return;
  long tok = idx / r;
  int k = (int)(idx - tok * r);
  int n_pairs = r * (r - 1) / 2;
  const scalar_t* dqt = dq + tok * n_pairs;
  const scalar_t* a = z + tok * r;
  const acc_t* ct = c + tok * r;
  acc_t sa = 0, sc = 0;  // (D c)_k and (D a)_k, D_kj = dq_kj (k<j), -dq_jk (k>j)
  for (int j = 0; j < r; ++j) {
    if (j == k) continue;
    acc_t dkj = j > k ? to_acc(dqt[pair_index(k, j, r)]) : -to_acc(dqt[pair_index(j, k, r)]);
    sa += dkj * ct[j];
    sc += dkj * to_acc(a[j]);
  }
  da[idx] = sa;
  dc[idx] = -sc;
}

// dz_s = da_s + Σ_Δ [s plays a = z_t, t = s] + Σ_Δ [s plays b = z_{t-Δ}, t = s+Δ].
// With w = 1/(n_t N), u = dc_t·b and κ = −u w / N² (0 where the norm is clamped):
//   d/da: κ (‖b−μa‖² a − (a·b)(b − μa))        d/db: w dc_t + κ ‖a‖² (b − μa)
template <typename scalar_t>
__device__ __forceinline__ void plucker_lag_bwd_body(
    const scalar_t* __restrict__ z, const typename AccOf<scalar_t>::type* __restrict__ dc,
    const typename AccOf<scalar_t>::type* __restrict__ da, const int* __restrict__ lags,
    int n_lags, long n_tokens, int seq_len, int r, typename AccOf<scalar_t>::type eps,
    typename AccOf<scalar_t>::type* __restrict__ dz) {
  typedef typename AccOf<scalar_t>::type acc_t;
  long tok = (long)blockIdx.x * blockDim.x + threadIdx.x;
  if (tok >= n_tokens) return;
  int s = (int)(tok % seq_len);
  const scalar_t* zs = z + tok * r;
  acc_t* out = dz + tok * r;
  for (int k = 0; k < r; ++k) out[k] = da[tok * r + k];
  int n_s = n_valid(lags, n_lags, s);
  for (int l = 0; l < n_lags; ++l) {
    int d = lags[l];
    if (d <= s) {  // s is the later token: a = z_s, b = z_{s-d}
      const scalar_t* b = zs - (long)d * r;
      const acc_t* dct = dc + tok * r;
      Pair<acc_t, scalar_t> p(zs, b, r, eps);
      if (p.active) {
        acc_t w = acc_t(1) / (p.norm * n_s), u = 0;
        for (int k = 0; k < r; ++k) u += dct[k] * to_acc(b[k]);
        acc_t kappa = -u * w / (p.norm * p.norm);
        for (int k = 0; k < r; ++k) {
          acc_t ak = to_acc(zs[k]), bp = to_acc(b[k]) - p.mu * ak;
          out[k] += kappa * (p.sp * ak - p.ab * bp);
        }
      }
    }
    if (s + d < seq_len) {  // s is the earlier token: a = z_{s+d}, b = z_s
      long t_tok = tok + d;
      const scalar_t* a = zs + (long)d * r;
      const acc_t* dct = dc + t_tok * r;
      Pair<acc_t, scalar_t> p(a, zs, r, eps);
      acc_t w = acc_t(1) / (p.norm * n_valid(lags, n_lags, s + d)), u = 0;
      for (int k = 0; k < r; ++k) u += dct[k] * to_acc(zs[k]);
      acc_t kappa = p.active ? -u * w / (p.norm * p.norm) : acc_t(0);
      for (int k = 0; k < r; ++k) {
        acc_t bp = to_acc(zs[k]) - p.mu * to_acc(a[k]);
        out[k] += w * dct[k] + kappa * p.sa * bp;
      }
    }
  }
}

// The kernels: one extern "C" __global__ per stage and type, so that CuPy compiles the module
// without name_expressions (and so keeps the binary in its on-disk cache) and launches the
// kernels by these plain names; nvcc, NVRTC and the CPU shim see the same symbols.
//   plucker_<stage>_<suffix>, suffix f32 (float), f64 (double), bf16 (bf16_t: the raw bits)
// Parameter types are spelled out (ACC is AccOf<T>::type) so that the signatures can be read
// off the preprocessed source (grassflow.ops.plucker.kernel_abi).
#define PLUCKER_KERNELS(T, ACC, SUFFIX)                                                        \
  extern "C" __global__ void plucker_coeff_##SUFFIX(                                           \
      const T* __restrict__ z, const int* __restrict__ lags, int n_lags, long n_tokens,         \
      int seq_len, int r, ACC eps, ACC* __restrict__ c) {                                       \
    plucker_coeff_body<T>(z, lags, n_lags, n_tokens, seq_len, r, eps, c);                       \
  }                                                                                             \
  extern "C" __global__ void plucker_wedge_##SUFFIX(                                           \
      const T* __restrict__ z, const ACC* __restrict__ c, const int* __restrict__ pair_i,       \
      const int* __restrict__ pair_j, long n_tokens, int r, T* __restrict__ q) {                \
    plucker_wedge_body<T>(z, c, pair_i, pair_j, n_tokens, r, q);                                \
  }                                                                                             \
  extern "C" __global__ void plucker_wedge_bwd_##SUFFIX(                                       \
      const T* __restrict__ dq, const T* __restrict__ z, const ACC* __restrict__ c,             \
      long n_tokens, int r, ACC* __restrict__ da, ACC* __restrict__ dc) {                       \
    plucker_wedge_bwd_body<T>(dq, z, c, n_tokens, r, da, dc);                                   \
  }                                                                                             \
  extern "C" __global__ void plucker_lag_bwd_##SUFFIX(                                         \
      const T* __restrict__ z, const ACC* __restrict__ dc, const ACC* __restrict__ da,          \
      const int* __restrict__ lags, int n_lags, long n_tokens, int seq_len, int r, ACC eps,     \
      ACC* __restrict__ dz) {                                                                   \
    plucker_lag_bwd_body<T>(z, dc, da, lags, n_lags, n_tokens, seq_len, r, eps, dz);            \
  }

PLUCKER_KERNELS(float, float, f32)
PLUCKER_KERNELS(double, double, f64)
PLUCKER_KERNELS(bf16_t, float, bf16)
