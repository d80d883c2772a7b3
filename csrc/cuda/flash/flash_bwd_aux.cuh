// The two small kernels around the FA2 backward's main kernel: the preprocess (D = rowsum(dO o O) in
// fp32) and the dQ conversion (dq = softmax_scale * the fp32 accumulator, rounded to the input dtype).
// Both are memory-bound: one 16-byte vector (8 elements) per thread and step.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention_params.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/flash/ptx.cuh"

namespace fa::cuda::flash {

inline constexpr int kAuxThreads = 256;
inline constexpr int kAuxVec = 8;  // elements per 16-byte access (head_dim is a multiple of 8)

// D[b, h, i] = sum_c dO[b, i, h, c] * O[b, i, h, c] over c < head_dim. One warp per row (b, h, i); lane l
// takes the 8 columns [8 l, 8 l + 8) (head_dim <= 256 = 32 lanes x 8).
template <typename Elem>
__global__ void __launch_bounds__(kAuxThreads) flash_bwd_dot_do_o_kernel(const AttentionBwdParams p, float* d_out) {
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t warps_per_grid = static_cast<int64_t>(gridDim.x) * (kAuxThreads / kWarpSize);
  for (int64_t r = blockIdx.x * (kAuxThreads / kWarpSize) + threadIdx.x / kWarpSize; r < rows; r += warps_per_grid) {
    const int64_t i = r % p.seqlen_q, bh = r / p.seqlen_q;
    const int64_t h = bh % p.heads_q, b = bh / p.heads_q;
    const int64_t off = b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
    float acc = 0.0f;
    const int col = lane * kAuxVec;
    if (col < p.head_dim) {
      const uint4 o4 = *reinterpret_cast<const uint4*>(static_cast<const Elem*>(p.out) + off + col);
      const uint4 g4 = *reinterpret_cast<const uint4*>(static_cast<const Elem*>(p.dout) + off + col);
      const Elem* o = reinterpret_cast<const Elem*>(&o4);
      const Elem* g = reinterpret_cast<const Elem*>(&g4);
#pragma unroll
      for (int e = 0; e < kAuxVec; ++e) acc += to_float(o[e]) * to_float(g[e]);
    }
    acc = warp_sum(acc);
    if (lane == 0) d_out[r] = acc;  // r = (b * heads_q + h) * seqlen_q + i: the [B, Hq, Sq] layout
  }
}

// dq[b, i, h, c] = scale * sum over the slices s, in order, of accum[s][b, h, i, c] for c < head_dim;
// accum rows have kAccumCols columns, the head has dq_rows (>= seqlen_q) of them and the slices are
// split_stride elements apart. One thread per 8 columns of a row.
template <typename Elem, int kAccumCols>
__global__ void __launch_bounds__(kAuxThreads) flash_bwd_convert_dq_kernel(const AttentionBwdParams p,
                                                                           const float* accum, int64_t dq_rows,
                                                                           int splits, int64_t split_stride) {
  const int64_t vecs_per_row = p.head_dim / kAuxVec;
  const int64_t total = p.batch * p.heads_q * p.seqlen_q * vecs_per_row;
  for (int64_t x = blockIdx.x * static_cast<int64_t>(kAuxThreads) + threadIdx.x; x < total;
       x += static_cast<int64_t>(gridDim.x) * kAuxThreads) {
    const int64_t c = (x % vecs_per_row) * kAuxVec, row = x / vecs_per_row;
    const int64_t i = row % p.seqlen_q, bh = row / p.seqlen_q;
    const int64_t h = bh % p.heads_q, b = bh / p.heads_q;
    const float* src = accum + (bh * dq_rows + i) * kAccumCols + c;
    float4 lo = *reinterpret_cast<const float4*>(src);
    float4 hi = *reinterpret_cast<const float4*>(src + 4);
    for (int s = 1; s < splits; ++s) {
      const float4 l = *reinterpret_cast<const float4*>(src + s * split_stride);
      const float4 h4 = *reinterpret_cast<const float4*>(src + s * split_stride + 4);
      lo = make_float4(lo.x + l.x, lo.y + l.y, lo.z + l.z, lo.w + l.w);
      hi = make_float4(hi.x + h4.x, hi.y + h4.y, hi.z + h4.z, hi.w + h4.w);
    }
    uint4 packed;
    packed.x = pack2<Elem>(lo.x * p.softmax_scale, lo.y * p.softmax_scale);
    packed.y = pack2<Elem>(lo.z * p.softmax_scale, lo.w * p.softmax_scale);
    packed.z = pack2<Elem>(hi.x * p.softmax_scale, hi.y * p.softmax_scale);
    packed.w = pack2<Elem>(hi.z * p.softmax_scale, hi.w * p.softmax_scale);
    *reinterpret_cast<uint4*>(static_cast<Elem*>(p.dq) + b * p.q_batch_stride + i * p.q_row_stride +
                              h * p.q_head_stride + c) = packed;
  }
}

}  // namespace fa::cuda::flash
