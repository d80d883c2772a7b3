// FlashAttention-2 forward, Hopper path (sm_90a): warpgroup MMA (wgmma) with fp32 accumulation.
//
// Grid: one thread block per (query tile of kBlockM rows, head, batch), flattened into blockIdx.x with
// the query tile fastest (the blocks of one head run together and share its K/V in L2) and the
// heaviest causal tiles first. Warpgroups split Q: warpgroup w owns rows [64 w, 64 w + 64) of the tile
// (wgmma M = 64); the running max / sum and the unscaled O accumulator stay in registers for the whole
// K/V loop. Q stays in shared memory (the A operand of S = Q K^T is read through a descriptor).
// K/V tiles stream through kStages shared-memory stages with cp.async (all threads load; 128-byte
// swizzled rows, wgmma.cuh). Per K/V tile:
//   S = Q K^T            wgmma m64 n kBlockN k16, A = Q and B = K from shared memory (K-major)
//   mask, online softmax fragment_softmax.cuh (-inf masking before the max, base-2, scale first)
//   O = O * rescale + P V   wgmma m64 n kHeadDim k16, A = P from registers, B = V (MN-major)
// Epilogue: O / l stored (rows >= seqlen_q and columns >= head_dim skipped); lse in natural log.
// Head dims below kHeadDim (multiples of 8) run with zero-filled columns.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention_params.h"
#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/hopper/flash_fwd_sm90_traits.h"
#include "cuda/flash/hopper/wgmma.cuh"
#include "cuda/flash/ptx.cuh"

namespace fa::cuda::flash::sm90 {

// Copies rows [row0, row0 + kRows) x columns [0, kHeadDim) of a [seq, head_dim] slice into an SW128
// tile at shared address `tile`. Rows >= seq_limit and columns >= head_dim are zero-filled.
template <typename Traits, int kRows>
__device__ __forceinline__ void load_tile(uint32_t tile, const typename Traits::Elem* gmem, int64_t row_stride,
                                          int row0, int seq_limit, int head_dim) {
  constexpr int kChunks = kRows * Traits::kChunksPerRow;
  constexpr int kIters = (kChunks + Traits::kNThreads - 1) / Traits::kNThreads;
  const int valid_chunks = head_dim / Traits::kChunk;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = static_cast<int>(threadIdx.x) + it * Traits::kNThreads;
    if (kChunks % Traits::kNThreads == 0 || c < kChunks) {
      const int r = c / Traits::kChunksPerRow, chunk = c % Traits::kChunksPerRow;
      const bool valid = row0 + r < seq_limit && chunk < valid_chunks;
      const typename Traits::Elem* src =
          valid ? gmem + static_cast<int64_t>(row0 + r) * row_stride + chunk * Traits::kChunk : gmem;
      cp_async_16(tile + sw128_offset<kRows>(r, chunk), src, valid);
    }
  }
}

template <typename Traits, bool kIsCausal>
__global__ void __launch_bounds__(Traits::kNThreads, 1) flash_fwd_sm90_kernel(const AttentionFwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Elem = typename Traits::Elem;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kStages = Traits::kStages;
  constexpr int kSTiles = Traits::kSTiles, kOTiles = Traits::kOTiles;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem_base = (smem_u32(smem_raw) + kSw128AtomBytes - 1) & ~uint32_t(kSw128AtomBytes - 1);
  const uint32_t sQ = smem_base;
  const uint32_t sK = sQ + static_cast<uint32_t>(Traits::kQBytes);
  const uint32_t sV = sK + static_cast<uint32_t>(kStages * Traits::kKvTileBytes);

  const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = static_cast<int>(p.seqlen_k);
  const int head_dim = static_cast<int>(p.head_dim);
  const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
  const int m_block = m_blocks - 1 - static_cast<int>(blockIdx.x % m_blocks);
  // 32-bit division (the launcher keeps the grid below 2^31 blocks): a 64-bit one is a slow call.
  const uint32_t bh = blockIdx.x / static_cast<uint32_t>(m_blocks);
  const int head = static_cast<int>(bh % static_cast<uint32_t>(p.heads_q));
  const int64_t batch = bh / static_cast<uint32_t>(p.heads_q);
  const int head_kv = head / static_cast<int>(p.heads_q / p.heads_kv);
  const int m0 = m_block * kBlockM;
  const int diag = seqlen_k - seqlen_q;  // causal: row i sees keys j <= i + diag

  const Elem* q = static_cast<const Elem*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const Elem* k = static_cast<const Elem*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride;
  const Elem* v = static_cast<const Elem*>(p.v) + batch * p.v_batch_stride + head_kv * p.v_head_stride;
  Elem* out = static_cast<Elem*>(p.out) + batch * p.o_batch_stride + head * p.o_head_stride;
  float* lse = p.lse + (batch * p.heads_q + head) * p.seqlen_q;

  const int wg = static_cast<int>(threadIdx.x) / 128;
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = m0 + wg * Traits::kWgRows + warp * 16 + g;  // this thread's rows: row0, row0 + 8
  const uint32_t sQ_wg = sQ + wg * Traits::kWgRows * kSw128RowBytes;

  // K/V tiles [0, n_blocks): causal skips every tile entirely above the diagonal.
  const int n_end = kIsCausal ? min(seqlen_k, m0 + kBlockM + diag) : seqlen_k;
  const int n_blocks = n_end > 0 ? (n_end + kBlockN - 1) / kBlockN : 0;

  float o[kOTiles][4];
#pragma unroll
  for (int j = 0; j < kOTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
  OnlineSoftmax softmax;

  if (n_blocks > 0) {
    // Prologue: Q with tile 0, then tiles 1 .. kStages - 2, one cp.async group each.
    load_tile<Traits, kBlockM>(sQ, q, p.q_row_stride, m0, seqlen_q, head_dim);
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < n_blocks) {
        load_tile<Traits, kBlockN>(sK + st * Traits::kKvTileBytes, k, p.k_row_stride, st * kBlockN, seqlen_k, head_dim);
        load_tile<Traits, kBlockN>(sV + st * Traits::kKvTileBytes, v, p.v_row_stride, st * kBlockN, seqlen_k, head_dim);
      }
      cp_async_commit();
    }

    for (int nb = 0; nb < n_blocks; ++nb) {
      cp_async_wait<kStages - 2>();  // tile nb has landed (later tiles may be in flight)
      fence_proxy_async_smem();
      __syncthreads();  // tile nb is visible to every warpgroup, and tile nb - 1's stage is free
      {
        const int next = nb + kStages - 1;
        if (next < n_blocks) {
          const uint32_t off = (next % kStages) * static_cast<uint32_t>(Traits::kKvTileBytes);
          load_tile<Traits, kBlockN>(sK + off, k, p.k_row_stride, next * kBlockN, seqlen_k, head_dim);
          load_tile<Traits, kBlockN>(sV + off, v, p.v_row_stride, next * kBlockN, seqlen_k, head_dim);
        }
        cp_async_commit();  // possibly empty: keeps one group per tile for the wait count
      }
      const uint32_t stage_off = (nb % kStages) * static_cast<uint32_t>(Traits::kKvTileBytes);
      const uint32_t sK_tile = sK + stage_off, sV_tile = sV + stage_off;

      // S = Q K^T: this warp's (16, kBlockN) slice of the warpgroup's (64, kBlockN).
      float s[kSTiles][4];
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < Traits::kKSteps; ++ks)
        Wgmma<kBlockN, Elem>::ss(s, desc_k_major<kBlockM>(sQ_wg, ks), desc_k_major<kBlockN>(sK_tile, ks), ks > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(s);

      const int n0 = nb * kBlockN;
      if (n0 + kBlockN > seqlen_k || (kIsCausal && n0 + kBlockN - 1 > m0 + diag))
        mask_scores<kSTiles, kIsCausal>(s, n0 + 2 * t, row0, seqlen_k, diag);
      float rescale[2];
      softmax.update(s, p.scale_log2, rescale);
      scale_rows(o, rescale);

      // O += P V: P re-packed as kPvKSteps A fragments (written before the fence, as wgmma requires).
      uint32_t pa[Traits::kPvKSteps][4];
#pragma unroll
      for (int ks = 0; ks < Traits::kPvKSteps; ++ks) p_to_a_operand<Elem>(s, ks, pa[ks]);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < Traits::kPvKSteps; ++ks)
        Wgmma<Traits::kHeadDim, Elem>::rs_tb(o, pa[ks], desc_mn_major<kBlockN>(sV_tile, ks), 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(o);
    }
    cp_async_wait<0>();
  }

  // Epilogue: O / l and lse. Rows that saw no key: O = 0, lse = +inf.
  float inv_l[2], row_lse[2];
  softmax.finish(inv_l, row_lse);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + h * 8;
    if (row < seqlen_q) {
      Elem* orow = out + static_cast<int64_t>(row) * p.o_row_stride;
#pragma unroll
      for (int j = 0; j < kOTiles; ++j) {
        const int col = j * 8 + 2 * t;
        if (col < head_dim)
          *reinterpret_cast<uint32_t*>(orow + col) = pack2<Elem>(o[j][2 * h] * inv_l[h], o[j][2 * h + 1] * inv_l[h]);
      }
      if (t == 0) lse[row] = row_lse[h];
    }
  }
#else
  __trap();  // only the sm_90a build has this kernel; the launcher never selects it elsewhere
#endif
}

}  // namespace fa::cuda::flash::sm90
