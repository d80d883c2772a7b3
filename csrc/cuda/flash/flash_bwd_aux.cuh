// The two small kernels around the FA2 backward's main kernel: the preprocess (D = rowsum(dO o O) in
// fp32) and the dQ conversion (dq = softmax_scale * the fp32 accumulator, rounded to the input dtype).
// Elem is __half, __nv_bfloat16 or float. Both are memory-bound: 8 elements per thread and step, one
// 16-byte access for fp16 / bf16, two for float.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention_params.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/flash/ptx.cuh"

namespace fa::cuda::flash {

inline constexpr int kAuxThreads = 256;
inline constexpr int kAuxVec = 8;  // elements per thread and step (head_dim is a multiple of 8)
inline constexpr int kAuxAccessBytes = 16;

// kAuxVec elements at src (16-byte aligned) as fp32.
template <typename Elem>
__device__ __forceinline__ void load_vec_as_float(const Elem* src, float (&x)[kAuxVec]) {
  constexpr int kPerAccess = kAuxAccessBytes / static_cast<int>(sizeof(Elem));
#pragma unroll
  for (int a = 0; a < kAuxVec / kPerAccess; ++a) {
    const uint4 raw = *reinterpret_cast<const uint4*>(src + a * kPerAccess);
    const Elem* e = reinterpret_cast<const Elem*>(&raw);
#pragma unroll
    for (int i = 0; i < kPerAccess; ++i) x[a * kPerAccess + i] = to_float(e[i]);
  }
}

// kAuxVec fp32 values rounded to Elem (round to nearest even) at dst (16-byte aligned).
template <typename Elem>
__device__ __forceinline__ void store_vec_from_float(Elem* dst, const float (&x)[kAuxVec]) {
  if constexpr (sizeof(Elem) == sizeof(float)) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(x[0], x[1], x[2], x[3]);
    reinterpret_cast<float4*>(dst)[1] = make_float4(x[4], x[5], x[6], x[7]);
  } else {
    uint4 packed;
    packed.x = pack2<Elem>(x[0], x[1]);
    packed.y = pack2<Elem>(x[2], x[3]);
    packed.z = pack2<Elem>(x[4], x[5]);
    packed.w = pack2<Elem>(x[6], x[7]);
    *reinterpret_cast<uint4*>(dst) = packed;
  }
}

// Lanes per row of the preprocess: head_dim / kAuxVec rounded up to a power of two (1-32), so that a
// warp takes 32 / that many rows at once. On 64 MiB each of O and dO (B*S = 16k, H*D = 2048; H100,
// bf16, Nsight Compute, 2026-11-27) one row per warp, the lanes past head_dim / 8 idle, ran 120 us at
// d64 and 63 us at d128; four rows per warp at d64 run 49 us.
__host__ __device__ constexpr int dot_do_o_lanes_per_row(int64_t head_dim) {
  int lanes = 1;
  while (lanes < kWarpSize && lanes * kAuxVec < head_dim) lanes *= 2;
  return lanes;
}

// D[b, h, i] = sum_c dO[b, i, h, c] * O[b, i, h, c] over c < head_dim. A group of `lanes` lanes per row
// (b, h, i) (dot_do_o_lanes_per_row); lane l of a group takes the 8 columns [8 l, 8 l + 8) (head_dim <=
// 256 = 32 lanes x 8; 16-byte aligned for every Elem as the launchers require), and the group sums by a
// butterfly of its own.
template <typename Elem>
__global__ void __launch_bounds__(kAuxThreads) flash_bwd_dot_do_o_kernel(const AttentionBwdParams p, float* d_out) {
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  const int lanes = dot_do_o_lanes_per_row(p.head_dim), rows_per_warp = kWarpSize / lanes;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t warps_per_grid = static_cast<int64_t>(gridDim.x) * (kAuxThreads / kWarpSize);
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kAuxThreads / kWarpSize) + threadIdx.x / kWarpSize;
  // r0 is the same in every lane of the warp, so that all of them reach the shuffles.
  for (int64_t r0 = warp * rows_per_warp; r0 < rows; r0 += warps_per_grid * rows_per_warp) {
    const int64_t r = r0 + lane / lanes;
    const int col = (lane % lanes) * kAuxVec;
    float acc = 0.0f;
    if (r < rows && col < p.head_dim) {
      const int64_t i = r % p.seqlen_q, bh = r / p.seqlen_q;
      const int64_t h = bh % p.heads_q, b = bh / p.heads_q;
      const int64_t off = b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride;
      const int64_t do_off = b * p.do_batch_stride + i * p.do_row_stride + h * p.do_head_stride;
      float o[kAuxVec], g[kAuxVec];
      load_vec_as_float(static_cast<const Elem*>(p.out) + off + col, o);
      load_vec_as_float(static_cast<const Elem*>(p.dout) + do_off + col, g);
#pragma unroll
      for (int e = 0; e < kAuxVec; ++e) acc += o[e] * g[e];
    }
    for (int offset = lanes / 2; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
    if (r < rows && lane % lanes == 0) d_out[r] = acc;  // r = (b * heads_q + h) * seqlen_q + i: [B, Hq, Sq]
  }
}

// Launches the preprocess on `stream`: D of every row into d ([B, Hq, Sq] floats).
template <typename Elem>
inline cudaError_t launch_flash_bwd_dot_do_o(const AttentionBwdParams& p, float* d, cudaStream_t stream) {
  const int64_t rows = p.batch * p.heads_q * p.seqlen_q;
  const int rows_per_block = kAuxThreads / dot_do_o_lanes_per_row(p.head_dim);
  flash_bwd_dot_do_o_kernel<Elem><<<grid_size(rows, rows_per_block), kAuxThreads, 0, stream>>>(p, d);
  return cudaGetLastError();
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
    const float scaled[kAuxVec] = {lo.x * p.softmax_scale, lo.y * p.softmax_scale, lo.z * p.softmax_scale,
                                   lo.w * p.softmax_scale, hi.x * p.softmax_scale, hi.y * p.softmax_scale,
                                   hi.z * p.softmax_scale, hi.w * p.softmax_scale};
    store_vec_from_float(
        static_cast<Elem*>(p.dq) + b * p.dq_batch_stride + i * p.dq_row_stride + h * p.dq_head_stride + c, scaled);
  }
}

}  // namespace fa::cuda::flash
