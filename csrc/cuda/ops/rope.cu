// Rotary position embedding in place on a strided [batch, seqlen, heads, head_dim] view
// (csrc/common/op_params.h; rotate-half pairing). One thread per (b, s, i < head_dim / 2): it computes
// theta_i (in double, rounded to float), the float angle and sincosf once, then rotates the pair
// (i, i + half) of every head of its row. Consecutive threads take consecutive i: a warp reads and
// writes contiguous runs of each head. Memory-bound; the strides allow any view (q or k inside a
// packed [B, S, 3, H, D] projection), so there is no vector path.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/ops/op_utils.cuh"
#include "cuda/ops/ops_cuda.h"

namespace fa::cuda {
namespace {

constexpr int kRopeThreads = 256;

// ptxas (nvcc 13.0, sm_80 / sm_90a): 30-32 registers, 0 spills; the 32-byte stack frame is sincosf's
// reduction of arguments beyond 105615 (positions far past any context here).
template <typename T>
__global__ void __launch_bounds__(kRopeThreads) rope_kernel(const RopeParams p, double log2_base) {
  T* x = static_cast<T*>(p.x);
  const int64_t half = p.head_dim / 2;
  const int64_t items = p.batch * p.seqlen * half;
  const double neg_two_over_d = -2.0 / static_cast<double>(p.head_dim);
  for (int64_t item = ops::global_thread(); item < items; item += ops::grid_threads()) {
    const int64_t i = item % half;
    const int64_t bs = item / half;
    const int64_t s = bs % p.seqlen;
    const int64_t b = bs / p.seqlen;
    // theta_i = base^(-2i / head_dim) = 2^(-2i / head_dim * log2(base)) in double (within a few double
    // ulps of pow, so the same float after rounding), then float; angle = float(p) * theta_i in float.
    // (pow's slow path spilled 8 bytes.)
    const float theta = static_cast<float>(exp2(static_cast<double>(i) * neg_two_over_d * log2_base));
    const float angle = static_cast<float>(p.position_offset + s) * theta;
    float sn, cs;
    sincosf(angle, &sn, &cs);
    if (p.inverse) sn = -sn;
    T* row = x + b * p.batch_stride + s * p.row_stride + i;
    for (int64_t h = 0; h < p.heads; ++h) {
      T* e = row + h * p.head_stride;
      const float x1 = to_float(e[0]);
      const float x2 = to_float(e[half]);
      e[0] = from_float<T>(x1 * cs - x2 * sn);
      e[half] = from_float<T>(x1 * sn + x2 * cs);
    }
  }
}

}  // namespace

cudaError_t rope(const RopeParams& p, cudaStream_t stream) {
  if (p.batch < 1 || p.seqlen < 1 || p.heads < 1 || p.head_dim < 2) return cudaSuccess;
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t items = p.batch * p.seqlen * (p.head_dim / 2);
    rope_kernel<T><<<grid_size(items, kRopeThreads), kRopeThreads, 0, stream>>>(p, std::log2(static_cast<double>(p.base)));
    return cudaGetLastError();
  });
}

}  // namespace fa::cuda
