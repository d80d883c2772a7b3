// FlashAttention-2 forward, sm_80+ mma.sync path (fp16 / bf16, fp32 accumulation).
//
// Grid: (query tiles of kBlockM rows, heads_q, batch); one thread block per tile. Warps split Q: warp w
// owns query rows [w * kRowsPerWarp, (w + 1) * kRowsPerWarp) of the tile in 16-row mma tiles. Q
// fragments, the running row max m / row sum l and the unscaled O accumulator stay in registers for
// the whole K/V loop. K/V tiles (kBlockN rows) stream through shared memory with cp.async, double
// buffered: tile j + 1 is in flight while tile j is used. Per tile:
//   S = Q K^T          (mma m16n8k16, A = Q from registers, B = K via ldmatrix)
//   mask               (keys >= seqlen_k, and causal bottom-right: key j visible iff j <= i + Sk - Sq)
//   m' = max(m, rowmax S); P = 2^(S * scale_log2 - m' * scale_log2); l = l * 2^((m - m') scale_log2) + rowsum P
//   O = O * 2^((m - m') scale_log2) + P V  (P re-packed to Elem in registers as the A operand, V via
//                                            ldmatrix.trans)
// Epilogue: O / l stored as Elem (rows >= seqlen_q skipped); lse = (m * scale_log2 + log2 l) * ln 2.
// Rows that see no key keep l = 0 and write O = 0, lse = +inf.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/attention_params.h"
#include "cuda/flash/flash_fwd_traits.h"
#include "cuda/flash/ptx.cuh"

namespace fa::cuda::flash {

// Copies rows [row0, row0 + kRows) of a [seq, head_dim] slice (row stride in elements) into shared
// memory of pitch kSmemPitch; rows >= seq_limit are zero-filled (so masked V rows add exact zeros).
template <typename Traits, int kRows>
__device__ __forceinline__ void load_tile_async(typename Traits::Elem* smem, const typename Traits::Elem* gmem,
                                                int64_t row_stride, int row0, int seq_limit) {
  constexpr int kIters = kRows * Traits::kChunksPerRow / Traits::kNThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = static_cast<int>(threadIdx.x) + it * Traits::kNThreads;
    const int r = c / Traits::kChunksPerRow;
    const int col = (c % Traits::kChunksPerRow) * Traits::kChunk;
    const bool valid = row0 + r < seq_limit;
    const typename Traits::Elem* src = valid ? gmem + static_cast<int64_t>(row0 + r) * row_stride + col : gmem;
    cp_async_16(smem_u32(smem + r * Traits::kSmemPitch + col), src, valid);
  }
}

template <typename Traits, bool kIsCausal>
__global__ void __launch_bounds__(Traits::kNThreads) flash_fwd_kernel(const AttentionFwdParams p) {
  using Elem = typename Traits::Elem;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kPitch = Traits::kSmemPitch;
  constexpr int kRowTiles = Traits::kRowTiles, kKSteps = Traits::kKSteps, kSTiles = Traits::kSTiles;
  constexpr int kOTiles = Traits::kOTiles, kPvKSteps = Traits::kPvKSteps;
  constexpr float kNegInf = -INFINITY;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* sQ = reinterpret_cast<Elem*>(smem_raw);
  Elem* sK = sQ + Traits::kQTileElems;                    // [kStages][kBlockN][kPitch]
  Elem* sV = sK + Traits::kStages * Traits::kKvTileElems;  // [kStages][kBlockN][kPitch]

  const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = static_cast<int>(p.seqlen_k);
  // Heaviest (causal) tiles first: reverse the query-tile order.
  const int m_block = static_cast<int>(gridDim.x - 1 - blockIdx.x);
  const int head = static_cast<int>(blockIdx.y), batch = static_cast<int>(blockIdx.z);
  const int head_kv = head / static_cast<int>(p.heads_q / p.heads_kv);
  const int m0 = m_block * kBlockM;
  const int diag = seqlen_k - seqlen_q;  // causal: row i sees keys j <= i + diag

  const Elem* q = static_cast<const Elem*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
  const Elem* k = static_cast<const Elem*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride;
  const Elem* v = static_cast<const Elem*>(p.v) + batch * p.v_batch_stride + head_kv * p.v_head_stride;
  Elem* out = static_cast<Elem*>(p.out) + batch * p.o_batch_stride + head * p.o_head_stride;
  float* lse = p.lse + (static_cast<int64_t>(batch) * p.heads_q + head) * p.seqlen_q;

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment row group and thread-in-group
  const int warp_row0 = warp * Traits::kRowsPerWarp;

  // K/V tiles [0, n_blocks): causal skips every tile entirely above the diagonal.
  int n_end = seqlen_k;
  if (kIsCausal) n_end = min(seqlen_k, m0 + kBlockM + diag);  // last row of the tile sees keys < m0+kBlockM-1+diag+1
  const int n_blocks = n_end > 0 ? (n_end + kBlockN - 1) / kBlockN : 0;

  // Epilogue shared by the normal and the all-empty path; o_acc is unscaled, l the row sums.
  float o_acc[kRowTiles][kOTiles][4];
  float row_max[kRowTiles][2], row_sum[kRowTiles][2];
#pragma unroll
  for (int rt = 0; rt < kRowTiles; ++rt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[rt][h] = kNegInf;
      row_sum[rt][h] = 0.0f;
    }
#pragma unroll
    for (int nt = 0; nt < kOTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[rt][nt][e] = 0.0f;
  }

  if (n_blocks > 0) {
    // Prologue: Q and K/V tile 0 in one cp.async group.
    load_tile_async<Traits, kBlockM>(sQ, q, p.q_row_stride, m0, seqlen_q);
    load_tile_async<Traits, kBlockN>(sK, k, p.k_row_stride, 0, seqlen_k);
    load_tile_async<Traits, kBlockN>(sV, v, p.v_row_stride, 0, seqlen_k);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    // Q fragments: (16, kHeadDim) per row tile as kKSteps A operands. ldmatrix x4 lane address:
    // row lane % 16, column (lane / 16) * 8 of the 16x16 block.
    uint32_t q_frag[kRowTiles][kKSteps][4];
#pragma unroll
    for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        ldmatrix_x4(q_frag[rt][ks],
                    smem_u32(sQ + (warp_row0 + rt * 16 + lane % 16) * kPitch + ks * 16 + (lane / 16) * 8));

    for (int nb = 0; nb < n_blocks; ++nb) {
      const int stage = nb % Traits::kStages;
      const Elem* sKs = sK + stage * Traits::kKvTileElems;
      const Elem* sVs = sV + stage * Traits::kKvTileElems;
      if (nb + 1 < n_blocks) {
        // The other stage was last read in iteration nb - 1, which ended with __syncthreads().
        const int next = (nb + 1) % Traits::kStages;
        load_tile_async<Traits, kBlockN>(sK + next * Traits::kKvTileElems, k, p.k_row_stride, (nb + 1) * kBlockN,
                                         seqlen_k);
        load_tile_async<Traits, kBlockN>(sV + next * Traits::kKvTileElems, v, p.v_row_stride, (nb + 1) * kBlockN,
                                         seqlen_k);
        cp_async_commit();
        cp_async_wait<1>();  // tile nb has landed, tile nb + 1 may still be in flight
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();

      const int n0 = nb * kBlockN;
      // Masking only on tiles that cross seqlen_k or (causal) the diagonal of some row of this block.
      const bool need_mask = n0 + kBlockN > seqlen_k || (kIsCausal && n0 + kBlockN - 1 > m0 + diag);

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
#pragma unroll
          for (int np = 0; np < kSTiles / 2; ++np) {
            // Matrices: (keys 0-7, d 0-7), (keys 0-7, d 8-15), (keys 8-15, d 0-7), (keys 8-15, d 8-15)
            // = b0, b1 of n-tile 2np and b0, b1 of n-tile 2np + 1.
            uint32_t kf[4];
            const int mi = lane / 8;
            ldmatrix_x4(kf, smem_u32(sKs + (np * 16 + (mi / 2) * 8 + lane % 8) * kPitch + ks * 16 + (mi % 2) * 8));
            const uint32_t b0[2] = {kf[0], kf[1]};
            const uint32_t b1[2] = {kf[2], kf[3]};
            mma_m16n8k16<Elem>(s[2 * np], q_frag[rt][ks], b0);
            mma_m16n8k16<Elem>(s[2 * np + 1], q_frag[rt][ks], b1);
          }
        }

        // Mask with -inf before the row max. This thread holds rows r0 (e = 0, 1) and r0 + 8 (e = 2, 3).
        const int r0 = m0 + warp_row0 + rt * 16 + g;
        if (need_mask) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int limit = kIsCausal ? min(seqlen_k, r0 + h * 8 + diag + 1) : seqlen_k;
#pragma unroll
            for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
              for (int e = 0; e < 2; ++e)
                if (n0 + nt * 8 + 2 * t + e >= limit) s[nt][2 * h + e] = kNegInf;
          }
        }

        // Online softmax in base 2; the 4 threads of a group share a row (reduce over lane bits 0, 1).
        float rescale[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float mx = row_max[rt][h];
#pragma unroll
          for (int nt = 0; nt < kSTiles; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          // A row with no visible key so far keeps max -inf: subtract 0 so exp2(-inf) = 0, never NaN.
          const float max_scaled = mx == kNegInf ? 0.0f : mx * p.scale_log2;
          rescale[h] = exp2_approx(row_max[rt][h] * p.scale_log2 - max_scaled);
          row_max[rt][h] = mx;
          float sum = 0.0f;
#pragma unroll
          for (int nt = 0; nt < kSTiles; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const float pe = exp2_approx(fmaf(s[nt][2 * h + e], p.scale_log2, -max_scaled));
              s[nt][2 * h + e] = pe;
              sum += pe;
            }
          row_sum[rt][h] = row_sum[rt][h] * rescale[h] + sum;  // per-thread partial; reduced at the end
        }
#pragma unroll
        for (int nt = 0; nt < kOTiles; ++nt) {
          o_acc[rt][nt][0] *= rescale[0];
          o_acc[rt][nt][1] *= rescale[0];
          o_acc[rt][nt][2] *= rescale[1];
          o_acc[rt][nt][3] *= rescale[1];
        }

        // O += P V. P's n-tiles 2ks, 2ks + 1 are the A operand of k-step ks (same register layout).
#pragma unroll
        for (int ks = 0; ks < kPvKSteps; ++ks) {
          const uint32_t a[4] = {pack2<Elem>(s[2 * ks][0], s[2 * ks][1]), pack2<Elem>(s[2 * ks][2], s[2 * ks][3]),
                                 pack2<Elem>(s[2 * ks + 1][0], s[2 * ks + 1][1]),
                                 pack2<Elem>(s[2 * ks + 1][2], s[2 * ks + 1][3])};
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

  // Epilogue: full row sums, O / l, lse. Empty rows (l = 0): O = 0, lse = +inf.
#pragma unroll
  for (int rt = 0; rt < kRowTiles; ++rt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[rt][h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const bool empty = !(l > 0.0f);
      const float inv_l = empty ? 0.0f : 1.0f / l;
      const int row = m0 + warp_row0 + rt * 16 + g + h * 8;
      if (row < seqlen_q) {
        Elem* orow = out + static_cast<int64_t>(row) * p.o_row_stride;
#pragma unroll
        for (int nt = 0; nt < kOTiles; ++nt)
          *reinterpret_cast<uint32_t*>(orow + nt * 8 + 2 * t) =
              pack2<Elem>(o_acc[rt][nt][2 * h] * inv_l, o_acc[rt][nt][2 * h + 1] * inv_l);
        if (t == 0)
          lse[row] = empty ? INFINITY : (row_max[rt][h] * p.scale_log2 + __log2f(l)) * kLn2;
      }
    }
  }
}

}  // namespace fa::cuda::flash
