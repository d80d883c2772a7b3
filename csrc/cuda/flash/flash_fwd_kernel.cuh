// FlashAttention-2 forward, sm_80+ mma.sync path (fp16 / bf16, fp32 accumulation).
//
// Grid: one thread block per (query tile of kBlockM rows, head, batch), flattened into blockIdx.x with
// the query tile fastest (a head's blocks share its K/V in L2); causal, the heaviest tiles of a
// section of heads first (tile_scheduler.cuh).
// Warps split Q: warp w owns query rows [w * kRowsPerWarp, (w + 1) * kRowsPerWarp) of the tile in
// 16-row mma tiles. The running row max m / row sum l and the unscaled O accumulator stay in
// registers for the whole K/V loop, and so do the Q fragments when kQInRegs (otherwise they are
// re-read from shared memory per k-step: the large head dims, whose registers go to O). K/V tiles
// (kBlockN rows) stream through shared memory with cp.async, double buffered: tile j + 1 is in
// flight while tile j is used. Per tile:
//   S = Q K^T          (mma m16n8k16, A = Q fragments, B = K via ldmatrix)
//   mask, online softmax (fragment_softmax.cuh: -inf masking before the max, base 2, scale first)
//   O = O * rescale + P V  (P re-packed to Elem in registers as the A operand, V via ldmatrix.trans)
// Epilogue: O / l stored as Elem (rows >= seqlen_q and columns >= head_dim skipped); lse in natural
// log. Rows that see no key write O = 0, lse = +inf; rows whose l is NaN or 0 write NaN (finish()).
// NaN / ±Inf in V on tiles that cross the diagonal: nonfinite_pv.cuh. Head dims below kHeadDim
// (multiples of 8) run with zero-filled columns.
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "common/attention_params.h"
#include "cuda/flash/epilogue.cuh"
#include "cuda/flash/flash_fwd_traits.h"
#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/mask.cuh"
#include "cuda/flash/nonfinite_pv.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/flash/tile_load.cuh"
#include "cuda/flash/tile_scheduler.cuh"

namespace fa::cuda::flash {

template <typename Traits, bool kIsCausal>
__global__ void __launch_bounds__(Traits::kNThreads) flash_fwd_kernel(const AttentionFwdParams p,
                                                                       const QueryTileScheduler sched) {
  using Elem = typename Traits::Elem;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kPitch = Traits::kSmemPitch;
  constexpr int kRowTiles = Traits::kRowTiles, kKSteps = Traits::kKSteps, kSTiles = Traits::kSTiles;
  constexpr int kOTiles = Traits::kOTiles, kPvKSteps = Traits::kPvKSteps;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* sQ = reinterpret_cast<Elem*>(smem_raw);
  Elem* sK = sQ + Traits::kQTileElems;                    // [kStages][kBlockN][kPitch]
  Elem* sV = sK + Traits::kStages * Traits::kKvTileElems;  // [kStages][kBlockN][kPitch]

  const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = static_cast<int>(p.seqlen_k);
  const int head_dim = static_cast<int>(p.head_dim);
  const QueryTileWork tile = sched.work<kBlockM, kIsCausal>(blockIdx.x);  // tile_scheduler.cuh
  const int m0 = tile.m0, head = tile.head, head_kv = tile.head_kv;
  const int64_t batch = tile.batch;
  const AttentionMask<kIsCausal> mask(seqlen_q, seqlen_k);  // mask.cuh

  const Elem* q = static_cast<const Elem*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const Elem* k = static_cast<const Elem*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride;
  const Elem* v = static_cast<const Elem*>(p.v) + batch * p.v_batch_stride + head_kv * p.v_head_stride;
  Elem* out = static_cast<Elem*>(p.out) + batch * p.o_batch_stride + head * p.o_head_stride;
  float* lse = p.lse + (batch * p.heads_q + head) * p.seqlen_q;

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment row group and thread-in-group
  const int warp_row0 = warp * Traits::kRowsPerWarp;

  // K/V tiles [0, n_blocks): causal skips every tile entirely above the diagonal.
  const KeyRange keys = mask.template query_tile_keys<kBlockM, kBlockN>(m0);
  const int n_end = keys.end, n_blocks = keys.tiles;

  float o_acc[kRowTiles][kOTiles][4];
#pragma unroll
  for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[rt][nt][e] = 0.0f;
  OnlineSoftmax softmax[kRowTiles];
  // First key of the first tile whose V held NaN / ±Inf on the diagonal (nonfinite_pv.cuh); INT_MAX: none.
  int v_nonfinite_from = INT_MAX;

  if (n_blocks > 0) {
    // Prologue: Q and K/V tile 0 in one cp.async group.
    load_tile_async<Traits, kBlockM>(sQ, q, p.q_row_stride, m0, seqlen_q, head_dim);
    load_tile_async<Traits, kBlockN>(sK, k, p.k_row_stride, 0, seqlen_k, head_dim);
    load_tile_async<Traits, kBlockN>(sV, v, p.v_row_stride, 0, seqlen_k, head_dim);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    // Q fragments: (16, kHeadDim) per row tile as kKSteps A operands. ldmatrix x4 lane address:
    // row lane % 16, column (lane / 16) * 8 of the 16x16 block.
    auto load_q_frag = [&](uint32_t (&f)[4], int rt, int ks) {
      ldmatrix_x4(f, smem_u32(sQ + (warp_row0 + rt * 16 + lane % 16) * kPitch + ks * 16 + (lane / 16) * 8));
    };
    uint32_t q_frag[kRowTiles][Traits::kQInRegs ? kKSteps : 1][4];
    if constexpr (Traits::kQInRegs) {
#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) load_q_frag(q_frag[rt][ks], rt, ks);
    }

    for (int nb = 0; nb < n_blocks; ++nb) {
      const int stage = nb % Traits::kStages;
      const Elem* sKs = sK + stage * Traits::kKvTileElems;
      const Elem* sVs = sV + stage * Traits::kKvTileElems;
      if (nb + 1 < n_blocks) {
        // The other stage was last read in iteration nb - 1, which ended with __syncthreads().
        const int next = (nb + 1) % Traits::kStages;
        load_tile_async<Traits, kBlockN>(sK + next * Traits::kKvTileElems, k, p.k_row_stride, (nb + 1) * kBlockN,
                                         seqlen_k, head_dim);
        load_tile_async<Traits, kBlockN>(sV + next * Traits::kKvTileElems, v, p.v_row_stride, (nb + 1) * kBlockN,
                                         seqlen_k, head_dim);
        cp_async_commit();
        cp_async_wait<1>();  // tile nb has landed, tile nb + 1 may still be in flight
      } else {
        cp_async_wait<0>();
      }
      const int n0 = nb * kBlockN;
      // Masking only on tiles that cross seqlen_k or (causal) the diagonal of some row of this block.
      const bool crosses_diag = mask.template crosses<kBlockM, kBlockN>(m0, n0);
      const bool need_mask = mask.template fwd_tile_needs_mask<kBlockN>(n0, crosses_diag);
      // The tile is visible to every thread after this barrier. On a tile that crosses the diagonal
      // the barrier also votes on NaN / ±Inf in V: zeroed for the product, added back in the epilogue
      // to the rows that see their key (nonfinite_pv.cuh).
      if (!crosses_diag) {
        __syncthreads();
      } else if (barrier_zero_tile_nonfinite<Elem, kBlockN, Traits::kHeadDim, kPitch, Traits::kNThreads>(
                     sV + stage * Traits::kKvTileElems)) {
        v_nonfinite_from = min(v_nonfinite_from, n0);
      }

#pragma unroll
      for (int rt = 0; rt < kRowTiles; ++rt) {
        // S = Q K^T: (16, kBlockN) per row tile as kSTiles n8 accumulators.
        float s[kSTiles][4];
#pragma unroll
        for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
          uint32_t qa[4];
          if constexpr (Traits::kQInRegs) {
#pragma unroll
            for (int i = 0; i < 4; ++i) qa[i] = q_frag[rt][ks][i];
          } else {
            load_q_frag(qa, rt, ks);
          }
#pragma unroll
          for (int np = 0; np < kSTiles / 2; ++np) {
            // Matrices: (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15)
            // = b0, b1 of n-tile 2np and b0, b1 of n-tile 2np + 1.
            uint32_t kf[4];
            const int mi = lane / 8;
            ldmatrix_x4(kf, smem_u32(sKs + (np * 16 + (mi / 2) * 8 + lane % 8) * kPitch + ks * 16 + (mi % 2) * 8));
            const uint32_t b0[2] = {kf[0], kf[1]};
            const uint32_t b1[2] = {kf[2], kf[3]};
            mma_m16n8k16<Elem>(s[2 * np], qa, b0);
            mma_m16n8k16<Elem>(s[2 * np + 1], qa, b1);
          }
        }

        const int r0 = m0 + warp_row0 + rt * 16 + g;  // this thread's rows: r0, r0 + 8
        if (need_mask) mask.mask_scores(s, n0 + 2 * t, r0);
        float rescale[2];
        softmax[rt].update(s, p.scale_log2, rescale);
        scale_rows(o_acc[rt], rescale);

        // O += P V. P's n-tiles 2ks, 2ks + 1 are the A operand of k-step ks (same register layout).
#pragma unroll
        for (int ks = 0; ks < kPvKSteps; ++ks) {
          uint32_t a[4];
          p_to_a_operand<Elem>(s, ks, a);
#pragma unroll
          for (int dp = 0; dp < kOTiles / 2; ++dp) {
            // Transposed matrices: (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7, d 8-15),
            // (keys 8-15, d 8-15) = b0, b1 of d-tile 2dp and b0, b1 of d-tile 2dp + 1.
            uint32_t vf[4];
            const int mi = lane / 8;
            ldmatrix_x4_trans(vf,
                              smem_u32(sVs + (ks * 16 + (mi % 2) * 8 + lane % 8) * kPitch + dp * 16 + (mi / 2) * 8));
            const uint32_t b0[2] = {vf[0], vf[1]};
            const uint32_t b1[2] = {vf[2], vf[3]};
            mma_m16n8k16<Elem>(o_acc[rt][2 * dp], a, b0);
            mma_m16n8k16<Elem>(o_acc[rt][2 * dp + 1], a, b1);
          }
        }
      }
      __syncthreads();  // this stage may be overwritten by the next iteration's prefetch
    }
  }

  // Epilogue: O / l and lse (epilogue.cuh). Rows that see no key: O = 0, lse = +inf.
#pragma unroll
  for (int rt = 0; rt < kRowTiles; ++rt) {
    const int r0 = m0 + warp_row0 + rt * 16 + g;
    if (v_nonfinite_from < n_end)
      add_nonfinite_v<Elem, kOTiles>(o_acc[rt], v, p.v_row_stride, v_nonfinite_from, n_end, r0, mask, head_dim, lane);
    write_fwd_rows<Elem>(o_acc[rt], softmax[rt], mask, r0, t, out, p.o_row_stride, lse, head_dim);
  }
}

}  // namespace fa::cuda::flash
