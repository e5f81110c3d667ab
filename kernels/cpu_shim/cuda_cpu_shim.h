// CUDA-on-CPU shim: just enough of the CUDA C++ dialect to compile barrier-free kernels
// with g++ and run them by looping over the grid. A kernel that needs shared memory,
// barriers, warp shuffles or atomics will not compile here, by design: that is what
// makes the CPU tests of kernels/*.cu meaningful.
#pragma once
#include <cmath>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline

struct uint3 { unsigned x, y, z; };
struct dim3 { unsigned x, y, z; };
// thread_local: the fused CPU path (kernels/cpu_fused/) runs kernels from several threads.
static thread_local uint3 blockIdx, threadIdx;
static thread_local dim3 blockDim, gridDim;

inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
using std::sqrt;

// Runs every thread of a 1-D grid, blocks and threads in reverse order: a kernel whose
// result depended on thread order (a hidden race) would disagree with the reference.
template <typename Kernel, typename... Args>
void shim_launch(Kernel kernel, unsigned grid, unsigned block, Args... args) {
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  for (unsigned b = grid; b-- > 0;) {
    for (unsigned t = block; t-- > 0;) {
      blockIdx = {b, 0, 0};
      threadIdx = {t, 0, 0};
      kernel(args...);
    }
  }
}
