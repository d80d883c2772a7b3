// FlashAttention-2 forward for float32 inputs, sm_80+ mma.sync path on TF32 tensor cores with fp32
// accumulation; Fp32Precision::kHighest runs each product as 3xTF32 for fp32-level accuracy.
//
// The algorithm and semantics of the fp16/bf16 kernel (flash_fwd_kernel.cuh, common/attention_params.h):
// one thread block per (query tile of kBlockM rows, head, batch); warp w owns query rows
// [16 w, 16 w + 16) of the tile. The O accumulator, the row max m and the row sum l stay in
// registers for the whole K/V loop (Q too, where Traits::kQInRegs). K/V tiles of kBlockN rows stream
// through padded (bank-conflict-free) shared memory with cp.async, one buffer each, loads interleaved
// with compute: V_j is in flight during S_j and the softmax, K_(j+1) during P_j V_j. Per tile:
//   S = Q K^T            (mma m16n8k8 tf32: A = Q, B = K via ldmatrix; 1 or 3 mma per product)
//   mask, online softmax (fragment_softmax.cuh, shared with the fp16/bf16 kernels: -inf for keys >=
//                         seqlen_k and, causal, above the bottom-right diagonal, before the max;
//                         x = S * scale_log2 rounded once, so two keys with equal scores get equal x
//                         and exact ties stay exact; m' = max(m, rowmax x); P = 2^(x - m'))
//   l = l * 2^(m - m') + rowsum P; O = O * 2^(m - m') + P V
//   P V: the S accumulator is the A operand as it stands. Within one mma the order of the 8 k indices
//   is free as long as A and B agree: A's k column t is taken as key 2t and column t + 4 as key 2t + 1,
//   so a = {c0, c2, c1, c3} of S's n8 tile, and B = V rows 2t, 2t + 1 (column g) read to match.
// Epilogue: O / l (rows >= seqlen_q and columns >= head_dim not stored); lse = (m + log2 l) * ln 2.
// Rows that see no key keep l = 0 and write O = 0, lse = +inf.
//
// Head dims below the specialisation (Traits::kHeadDim) are zero-padded: cp.async fills columns >=
// head_dim with zeros (src-size 0), and the k-steps of S and the n8 tiles of O past head_dim are
// skipped (head_dim is a multiple of 8 = one k-step or one n8 tile), so they cost no mma.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/attention_params.h"
#include "cuda/flash/epilogue.cuh"
#include "cuda/flash/flash_fwd_fp32_traits.h"
#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/mask.cuh"
#include "cuda/flash/nonfinite_pv.cuh"
#include "cuda/flash/mma_tf32.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/flash/tile_load.cuh"
#include "cuda/flash/tile_scheduler.cuh"

namespace fa::cuda::flash {

// A operand (16 rows x 8 of head_dim) of k-step ks of S = Q K^T for this warp's rows, from shared memory.
// ldmatrix x4 matrices: (rows 0-7, d 0-3) = a0, (rows 8-15, d 0-3) = a1, (rows 0-7, d 4-7) = a2,
// (rows 8-15, d 4-7) = a3; lanes 8i..8i+7 address the rows of matrix i.
template <typename Traits>
__device__ __forceinline__ void load_q_frag(uint32_t (&a)[4], const float* sQ, int warp_row0, int ks, int lane) {
  const int mi = lane / 8;
  ldmatrix_x4(a, smem_u32(sQ + (warp_row0 + (mi % 2) * 8 + lane % 8) * Traits::kSmemPitch + ks * Traits::kMmaK +
                          (mi / 2) * 4));
}

template <typename Traits, bool kIsCausal, Fp32Precision kPrecision>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    flash_fwd_fp32_kernel(const AttentionFwdParams p, const QueryTileScheduler sched) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kPitch = Traits::kSmemPitch;
  constexpr int kKSteps = Traits::kKSteps, kSTiles = Traits::kSTiles, kOTiles = Traits::kOTiles;
  constexpr int kMmaK = Traits::kMmaK, kMmaN = Traits::kMmaN;
  constexpr bool kHighest = kPrecision == Fp32Precision::kHighest;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  float* sQ = reinterpret_cast<float*>(smem_raw);  // [kBlockM][kPitch]
  float* sK = sQ + Traits::kQTileElems;            // [kBlockN][kPitch]
  float* sV = sK + Traits::kKvTileElems;           // [kBlockN][kPitch]

  const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = static_cast<int>(p.seqlen_k);
  const int head_dim = static_cast<int>(p.head_dim);
  const QueryTileWork tile = sched.work<kBlockM, kIsCausal>(blockIdx.x);  // tile_scheduler.cuh
  const int m0 = tile.m0, head = tile.head, head_kv = tile.head_kv;
  const int64_t batch = tile.batch;
  const AttentionMask<kIsCausal> mask(seqlen_q, seqlen_k);  // mask.cuh
  // k-steps of S and n8 tiles of O inside head_dim (all of them unless head_dim is padded).
  const int d_steps = head_dim / kMmaK;

  const float* q = static_cast<const float*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const float* k = static_cast<const float*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride;
  const float* v = static_cast<const float*>(p.v) + batch * p.v_batch_stride + head_kv * p.v_head_stride;
  float* out = static_cast<float*>(p.out) + batch * p.o_batch_stride + head * p.o_head_stride;
  float* lse = p.lse + (batch * p.heads_q + head) * p.seqlen_q;

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment row group and thread-in-group
  const int warp_row0 = warp * Traits::kMmaM;

  // K/V tiles [0, n_blocks): causal skips every tile entirely above the diagonal.
  const KeyRange keys = mask.template query_tile_keys<kBlockM, kBlockN>(m0);
  const int n_end = keys.end, n_blocks = keys.tiles;

  // O accumulator (16, kHeadDim) per warp as kOTiles n8 tiles (unscaled); the running max and sums of
  // this thread's rows g and g + 8.
  float o_acc[kOTiles][4];
  OnlineSoftmax softmax;
  // This thread's V values on tiles that cross the diagonal held NaN / ±Inf (nonfinite_pv.cuh).
  bool v_nonfinite = false;
#pragma unroll
  for (int nt = 0; nt < kOTiles; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) o_acc[nt][e] = 0.0f;

  if (n_blocks > 0) {
    // Prologue: Q and K tile 0 in one cp.async group; V tile 0 is issued by the loop.
    load_tile_async<Traits, kBlockM>(sQ, q, p.q_row_stride, m0, seqlen_q, head_dim);
    load_tile_async<Traits, kBlockN>(sK, k, p.k_row_stride, 0, seqlen_k, head_dim);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    // Q fragments (16, kHeadDim) as kKSteps A operands: TF32-rounded once (kTf32), or kept in fp32 and
    // split per use (kHighest: big and small would take twice the registers).
    uint32_t q_frag[Traits::kQInRegs ? kKSteps : 1][4];
    if constexpr (Traits::kQInRegs) {
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        load_q_frag<Traits>(q_frag[ks], sQ, warp_row0, ks, lane);
        if constexpr (!kHighest)
#pragma unroll
          for (int e = 0; e < 4; ++e) q_frag[ks][e] = tf32_round(__uint_as_float(q_frag[ks][e]));
      }
    }

    for (int nb = 0; nb < n_blocks; ++nb) {
      const int n0 = nb * kBlockN;
      if (nb > 0) {
        cp_async_wait<0>();  // K tile nb (the only group in flight) has landed
        __syncthreads();     // ... for every thread; and every warp is done reading V tile nb - 1
      }
      load_tile_async<Traits, kBlockN>(sV, v, p.v_row_stride, n0, seqlen_k, head_dim);
      cp_async_commit();

      // S = Q K^T: (16, kBlockN) per warp as kSTiles n8 accumulators.
      float s[kSTiles][4];
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        if (ks >= d_steps) continue;  // zero-padded head-dim columns
        uint32_t qa[4];
        if constexpr (Traits::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[e] = q_frag[ks][e];
        } else {
          load_q_frag<Traits>(qa, sQ, warp_row0, ks, lane);
        }
        Tf32Operand<4> a;
        if constexpr (Traits::kQInRegs && !kHighest) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a.big[e] = qa[e];  // rounded in the prologue
        } else {
          const float qf[4] = {__uint_as_float(qa[0]), __uint_as_float(qa[1]), __uint_as_float(qa[2]),
                               __uint_as_float(qa[3])};
          a = to_tf32<kPrecision>(qf);
        }
#pragma unroll
        for (int np = 0; np < kSTiles / 2; ++np) {
          // Matrices: (keys 0-7, d 0-3), (keys 0-7, d 4-7), (keys 8-15, d 0-3), (keys 8-15, d 4-7)
          // = b0, b1 of n-tile 2np and b0, b1 of n-tile 2np + 1.
          uint32_t kf[4];
          const int mi = lane / 8;
          ldmatrix_x4(kf, smem_u32(sK + (np * 16 + (mi / 2) * 8 + lane % 8) * kPitch + ks * kMmaK + (mi % 2) * 4));
          const float k0[2] = {__uint_as_float(kf[0]), __uint_as_float(kf[1])};
          const float k1[2] = {__uint_as_float(kf[2]), __uint_as_float(kf[3])};
          mma_fp32_operands<kPrecision>(s[2 * np], a, to_tf32<kPrecision>(k0));
          mma_fp32_operands<kPrecision>(s[2 * np + 1], a, to_tf32<kPrecision>(k1));
        }
      }

      // Mask (-inf before the row max), then the online softmax in base 2 (fragment_softmax.cuh: x =
      // S * scale_log2 rounded once, max over x, P = 2^(x - max) in place of S). This thread holds rows
      // r0 (e = 0, 1) and r0 + 8 (e = 2, 3), keys n0 + 8 nt + 2t + (e & 1).
      const int r0 = m0 + warp_row0 + g;
      const bool need_mask =
          mask.template fwd_tile_needs_mask<kBlockN>(n0, mask.template crosses<kBlockM, kBlockN>(m0, n0));
      if (need_mask) mask.mask_scores(s, n0 + 2 * t, r0);
      float rescale[2];
      softmax.update(s, p.scale_log2, rescale);
      scale_rows(o_acc, rescale);

      cp_async_wait<0>();  // V tile nb has landed
      __syncthreads();     // ... for every thread; and every warp is done reading K tile nb
      if (nb + 1 < n_blocks) {
        load_tile_async<Traits, kBlockN>(sK, k, p.k_row_stride, n0 + kBlockN, seqlen_k, head_dim);
        cp_async_commit();
      }
      // O += P V: S's n8 tile nt (keys n0 + 8nt ..) is k-step nt, with A's k column t = key 2t and
      // column t + 4 = key 2t + 1: a = {(g, 2t), (g + 8, 2t), (g, 2t + 1), (g + 8, 2t + 1)} = {c0, c2, c1, c3}.
      // Each warp reads the whole V tile. On a tile that crosses the diagonal, NaN / ±Inf values of V
      // enter the product as 0 (0 * NaN would reach the rows that do not see their key) and the
      // epilogue adds them back to the rows that do (nonfinite_pv.cuh). Done in registers here, not
      // by barrier_zero_tile_nonfinite's shared-memory scan and vote: at the register cap of the 'highest'
      // kernels (d32 / d64) that scan made ptxas spill 4-108 bytes.
      const bool crosses_diag = mask.template crosses<kBlockM, kBlockN>(m0, n0);
#pragma unroll
      for (int nt = 0; nt < kSTiles; ++nt) {
        const float pf[4] = {s[nt][0], s[nt][2], s[nt][1], s[nt][3]};
        const Tf32Operand<4> a = to_tf32<kPrecision>(pf);
        const float* v_rows = sV + (nt * kMmaN + 2 * t) * kPitch + g;  // B: b0 = V[2t][g], b1 = V[2t + 1][g]
#pragma unroll
        for (int dt = 0; dt < kOTiles; ++dt) {
          if (dt >= d_steps) continue;  // zero-padded head-dim columns
          float vb[2] = {v_rows[dt * kMmaN], v_rows[kPitch + dt * kMmaN]};
          if (kIsCausal && crosses_diag) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const bool finite = isfinite(vb[e]);
              v_nonfinite |= !finite;
              vb[e] = finite ? vb[e] : 0.0f;
            }
          }
          mma_fp32_operands<kPrecision>(o_acc[dt], a, to_tf32<kPrecision>(vb));
        }
      }
    }
  }

  // Epilogue: O / l and lse (epilogue.cuh). Rows that see no key: O = 0, lse = +inf; rows whose l is
  // NaN or 0: NaN.
  const int r_lo = m0 + warp_row0 + g;
  // Keys of the tiles that crossed the diagonal (mask.cuh).
  if (kIsCausal && __any_sync(0xffffffffu, v_nonfinite))
    add_nonfinite_v<float, kOTiles>(o_acc, v, p.v_row_stride, mask.template crossing_keys_begin<kBlockN>(m0), n_end,
                                    r_lo, mask, head_dim, lane);
  write_fwd_rows<float>(o_acc, softmax, mask, r_lo, t, out, p.o_row_stride, lse, head_dim);
}

}  // namespace fa::cuda::flash
