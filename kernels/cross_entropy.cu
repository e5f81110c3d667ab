// Softmax cross-entropy over a row-major (n_rows, n_cols) block of logits: each row's loss, and
// the logits overwritten by the gradient, reading the logits twice and writing them once (the
// "fused" LM head of grassflow.ops.linear_ce). Three launches, each one thread per item:
//   ce_partial  thread (row, lane < lanes)  logits            -> running max m and Σ exp(x − m) but
//               for the max's own 1, over the columns lane, lane + lanes, … (adjacent threads
//               read adjacent columns)
//   ce_finish   thread row                  partials, logits  -> the row's max m, log s = log Σ exp(x − m),
//                                                                 loss = (m − x_y) + log s
//   ce_grad     thread (row, col)           logits, m, log s  -> logits := (softmax − onehot)·scale
// On a confident row s − 1 is tiny: it is summed without the 1 and log s taken by log1p, the
// target's p − 1 by expm1, and lse = m + log s never formed (it would drop log s), so the loss
// and gradient keep their digits where 1 + ε or m + ε would round ε away.
// At Table 1's shape (4,096 × 30,522 bf16 logits, 250 MB) that is 750 MB of traffic per
// member-step, where the reference (bf16 logits → fp32 copy → log-softmax → nll, and back)
// moves ~5.5 GB (by arithmetic: reports/bench/head-bytes.md).
//
// Barrier-free, like kernels/plucker.cu (no shared memory, __syncthreads, warp shuffles or
// atomics; every thread owns what it writes), so kernels/cpu_shim/ runs this very source on the
// CPU. Arithmetic in float; logits T = float (f32) or bf16_t (bf16, raw bits).
// A target outside [0, n_cols) gives that row a NaN loss, which the loop reports as divergence
// (the reference asserts on the device instead; checking here would cost a host sync per step).

// The bf16 helpers as plucker.cu has them. They are not shared through a header: plucker.cu's
// bytes are part of every Grassmann run's code hash, so moving them would rerun runs for nothing.
struct bf16_t {
  unsigned short bits;
};

__device__ __forceinline__ float ce_load(float x) { return x; }
__device__ __forceinline__ float ce_load(bf16_t x) { return __uint_as_float(((unsigned int)x.bits) << 16); }
__device__ __forceinline__ void ce_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void ce_store(bf16_t* p, float v) {
  unsigned int u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN stays NaN
    p->bits = (unsigned short)((u >> 16) | 0x40u);
    return;
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  p->bits = (unsigned short)(u >> 16);
}

__device__ __forceinline__ long ce_thread() { return (long)blockIdx.x * blockDim.x + threadIdx.x; }

template <typename T>
__device__ __forceinline__ void ce_partial_body(const T* __restrict__ logits, long n_rows, int n_cols,
                                                int lanes, float* __restrict__ part_max,
                                                float* __restrict__ part_sum) {
  long i = ce_thread();
  if (i >= n_rows * lanes) return;
  long row = i / lanes;
  int lane = (int)(i - row * lanes);
  const T* x = logits + row * n_cols;
  // online softmax: t = Σ exp(x − m) − 1 for the running max m (−inf: no column yet, and a lane
  // past the row's end stays so)
  float m = -__uint_as_float(0x7f800000u), t = 0.0f;
  for (int j = lane; j < n_cols; j += lanes) {
    float v = ce_load(x[j]);
    if (v > m) {
      t = (t + 1.0f) * expf(m - v);  // the old max's 1 joins the sum; 0 for the first column
      m = v;
    } else {
      t += expf(v - m);  // a NaN lands here and stays in t
    }
  }
  part_max[i] = m;
  part_sum[i] = t;
}

template <typename T>
__device__ __forceinline__ void ce_finish_body(const T* __restrict__ logits, const int* __restrict__ target,
                                               const float* __restrict__ part_max,
                                               const float* __restrict__ part_sum, long n_rows, int n_cols,
                                               int lanes, float* __restrict__ row_max,
                                               float* __restrict__ row_log_sum, float* __restrict__ loss) {
  long row = ce_thread();
  if (row >= n_rows) return;
  const float* pm = part_max + row * lanes;
  const float* ps = part_sum + row * lanes;
  int top = 0;  // the first lane holding the row's max: its t counts without a 1, every other lane's with
  for (int k = 1; k < lanes; ++k) top = pm[k] > pm[top] ? k : top;
  float m = pm[top], t = ps[top];
  for (int k = 0; k < lanes; ++k) {
    if (k != top && pm[k] > -__uint_as_float(0x7f800000u)) t += (ps[k] + 1.0f) * expf(pm[k] - m);
  }
  float log_s = log1pf(t);
  int y = target[row];
  row_max[row] = m;
  row_log_sum[row] = log_s;
  loss[row] = (y >= 0 && y < n_cols) ? (m - ce_load(logits[row * n_cols + y])) + log_s : __uint_as_float(0x7fc00000u);
}

template <typename T>
__device__ __forceinline__ void ce_grad_body(T* __restrict__ logits, const int* __restrict__ target,
                                             const float* __restrict__ row_max,
                                             const float* __restrict__ row_log_sum, long n_rows,
                                             int n_cols, float scale) {
  long i = ce_thread();
  if (i >= n_rows * n_cols) return;
  long row = i / n_cols;
  long col = i - row * n_cols;
  float a = (ce_load(logits[i]) - row_max[row]) - row_log_sum[row];  // log p
  ce_store(&logits[i], (col == target[row] ? expm1f(a) : expf(a)) * scale);
}

// CE_ON_KERNEL(name) follows each kernel: empty here; the CPU shim defines it to emit a launcher.
#ifndef CE_ON_KERNEL
#define CE_ON_KERNEL(name)
#endif
#define CE_KERNELS(T, SUFFIX)                                                                    \
  extern "C" __global__ void ce_partial_##SUFFIX(const T* __restrict__ logits, long n_rows,      \
                                                 int n_cols, int lanes,                          \
                                                 float* __restrict__ part_max,                   \
                                                 float* __restrict__ part_sum) {                 \
    ce_partial_body<T>(logits, n_rows, n_cols, lanes, part_max, part_sum);                       \
  }                                                                                              \
  CE_ON_KERNEL(ce_partial_##SUFFIX)                                                              \
  extern "C" __global__ void ce_finish_##SUFFIX(                                                 \
      const T* __restrict__ logits, const int* __restrict__ target,                             \
      const float* __restrict__ part_max, const float* __restrict__ part_sum, long n_rows,       \
      int n_cols, int lanes, float* __restrict__ row_max, float* __restrict__ row_log_sum,       \
      float* __restrict__ loss) {                                                                \
    ce_finish_body<T>(logits, target, part_max, part_sum, n_rows, n_cols, lanes, row_max,        \
                      row_log_sum, loss);                                                        \
  }                                                                                              \
  CE_ON_KERNEL(ce_finish_##SUFFIX)                                                               \
  extern "C" __global__ void ce_grad_##SUFFIX(T* __restrict__ logits,                            \
                                              const int* __restrict__ target,                   \
                                              const float* __restrict__ row_max,                 \
                                              const float* __restrict__ row_log_sum, long n_rows, \
                                              int n_cols, float scale) {                         \
    ce_grad_body<T>(logits, target, row_max, row_log_sum, n_rows, n_cols, scale);                \
  }                                                                                              \
  CE_ON_KERNEL(ce_grad_##SUFFIX)

CE_KERNELS(float, f32)
CE_KERNELS(bf16_t, bf16)
