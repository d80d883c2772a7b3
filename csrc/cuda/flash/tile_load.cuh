// cp.async loading of one tile of rows of a [seq, head_dim] slice into padded shared memory, shared
// by the sm_80+ mma.sync FlashAttention kernels (forward and backward). Traits supplies the thread
// count and the shared-memory geometry: kNThreads, kChunk (elements per 16-byte copy), kChunksPerRow
// (kHeadDim / kChunk) and kSmemPitch (elements per shared-memory row).
#pragma once
#include <cmath>
#include <cstdint>

#include "common/attention_params.h"
#include "cuda/flash/ptx.cuh"

namespace fa::cuda::flash {

// Copies rows [row0, row0 + kRows) of a [seq, head_dim] slice (row stride in elements) into shared
// memory of pitch kSmemPitch; rows >= seq_limit and columns >= head_dim are zero-filled (so masked V
// rows add exact zeros and padded head-dim columns contribute nothing).
template <typename Traits, int kRows>
__device__ __forceinline__ void load_tile_async(typename Traits::Elem* smem, const typename Traits::Elem* gmem,
                                                int64_t row_stride, int row0, int seq_limit, int head_dim) {
  constexpr int kIters = kRows * Traits::kChunksPerRow / Traits::kNThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = static_cast<int>(threadIdx.x) + it * Traits::kNThreads;
    const int r = c / Traits::kChunksPerRow;
    const int col = (c % Traits::kChunksPerRow) * Traits::kChunk;
    const bool valid = row0 + r < seq_limit && col < head_dim;
    const typename Traits::Elem* src = valid ? gmem + static_cast<int64_t>(row0 + r) * row_stride + col : gmem;
    cp_async_16(smem_u32(smem + r * Traits::kSmemPitch + col), src, valid);
  }
}

// The statistics of one step of the backward's main loop (every backward kernel): the lse and D rows
// of query tile m0 of head `head`, one row per thread of [0, kBlockM). Rows past seqlen_q (and the
// other threads) get placeholders (lse +inf, D 0): they see no key, so P and dS select 0 for them.
// Read into registers first (read_bwd_row_stats) and stored into stage `stage` of sLse2 (base 2) and
// sD later (store_bwd_row_stats), a pipelined kernel issues the loads for its next step and stores
// them after the current step's products, so that their latency does not stall the warps that issue
// those products.
struct BwdRowStats {
  float lse, d;
};
template <int kBlockM>
__device__ __forceinline__ BwdRowStats read_bwd_row_stats(const AttentionBwdParams& p, const float* d, int head,
                                                          int m0, int64_t batch, int seqlen_q) {
  BwdRowStats s{INFINITY, 0.0f};
  const int row = m0 + static_cast<int>(threadIdx.x);
  if (threadIdx.x < kBlockM && row < seqlen_q) {
    const int64_t stat = (batch * p.heads_q + head) * p.seqlen_q + row;
    s.lse = p.lse_in[stat];
    s.d = d[stat];
  }
  return s;
}
template <int kBlockM>
__device__ __forceinline__ void store_bwd_row_stats(const BwdRowStats& s, float* sLse2, float* sD, int stage) {
  if (threadIdx.x < kBlockM) {
    sLse2[stage * kBlockM + threadIdx.x] = s.lse * kLog2e;
    sD[stage * kBlockM + threadIdx.x] = s.d;
  }
}
template <int kBlockM>
__device__ __forceinline__ void load_bwd_row_stats(const AttentionBwdParams& p, const float* d, float* sLse2, float* sD,
                                                   int stage, int head, int m0, int64_t batch, int seqlen_q) {
  store_bwd_row_stats<kBlockM>(read_bwd_row_stats<kBlockM>(p, d, head, m0, batch, seqlen_q), sLse2, sD, stage);
}

// The query side of one step of the backward's main loop (the mma.sync kernels, fp16 / bf16 and
// float32): the Q and dO rows of query tile m0 of head `head` (cp.async, not committed) into stage
// `stage` of sQ and sdO, and the tile's statistics (load_bwd_row_stats).
template <typename Traits, int kBlockM>
__device__ __forceinline__ void load_bwd_query_step(const AttentionBwdParams& p, const float* d,
                                                    typename Traits::Elem* sQ, typename Traits::Elem* sdO,
                                                    float* sLse2, float* sD, int stage, int head, int m0,
                                                    int64_t batch, int seqlen_q, int head_dim) {
  using Elem = typename Traits::Elem;
  const Elem* q = static_cast<const Elem*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const Elem* dout = static_cast<const Elem*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride;
  load_tile_async<Traits, kBlockM>(sQ + stage * Traits::kQTileElems, q, p.q_row_stride, m0, seqlen_q, head_dim);
  load_tile_async<Traits, kBlockM>(sdO + stage * Traits::kQTileElems, dout, p.do_row_stride, m0, seqlen_q, head_dim);
  load_bwd_row_stats<kBlockM>(p, d, sLse2, sD, stage, head, m0, batch, seqlen_q);
}

}  // namespace fa::cuda::flash
