// FlashAttention-2 backward, Hopper path (sm_90a), head dims 192 and 256: the dK/dV kernel of the
// two-kernel backward (flash_bwd_dq_sm90_kernel.cuh computes dQ).
//
// At these head dims the layout of flash_bwd_sm90_kernel.cuh (each warpgroup holding dK and dV of its
// 64 keys for every column) needs 2 x 64 x D / 128 registers a thread for them alone: 192 at d192,
// 256 at d256. Here both warpgroups work on the same 64 keys (one block per K/V tile of kBlockN = 64
// keys, KV head, batch) and split the work twice:
//   S^T  = K Q_w^T, dP^T = V dO_w^T   per warpgroup w: its 32 queries of the 64-query step (wgmma m64n32,
//                                     A = K / V K-major, B = Q / dO rows [32 w, 32 w + 32) K-major)
//   P^T, dS^T                         as in flash_bwd_sm90_kernel.cuh, then rounded to Elem and written to
//                                     shared memory (sP, sdS: one 128-byte row of 64 queries per key,
//                                     SW128) so that either warpgroup reads all 64 queries
//   dV += P^T dO                      warpgroup 0, every column (wgmma ss, A = sP K-major, B = dO
//                                     MN-major, N = D)
//   dK += dS^T Q                      warpgroup 1, likewise
// so that a thread holds one accumulator of 64 keys x D: 96 registers at d192, 128 at d256.
// Masking and NaN / ±Inf containment (the rows whose lse / D flag their q or dO, on tiles that cross
// the diagonal) as in flash_bwd_sm90_kernel.cuh, with P^T read from sP for dV's added terms.
// Epilogue: dK * softmax_scale (warpgroup 1) and dV (warpgroup 0) rounded to Elem.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/attention_params.h"
#include "cuda/flash/bwd_nonfinite.cuh"
#include "cuda/flash/dq_accum.cuh"
#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/hopper/flash_bwd_sm90_kernel.cuh"
#include "cuda/flash/hopper/kv_load.cuh"
#include "cuda/flash/hopper/sw128_nonfinite.cuh"
#include "cuda/flash/hopper/tma.cuh"
#include "cuda/flash/hopper/wgmma.cuh"
#include "cuda/flash/mask.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/flash/tile_load.cuh"
#include "cuda/flash/tile_scheduler.cuh"
#include "cuda/smem_limits.h"

namespace fa::cuda::flash::sm90 {

template <int kHeadDim_, typename Elem_>
struct FlashBwdWideSm90Traits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarpGroups = 2;
  static constexpr int kNThreads = kNWarpGroups * 128;
  static constexpr int kBlockN = 64;   // keys per thread block: wgmma M of S^T, dP^T, dV, dK
  static constexpr int kBlockM = 64;   // query rows per Q / dO tile
  static constexpr int kWgQueries = kBlockM / kNWarpGroups;  // wgmma N of a warpgroup's S^T, dP^T
  static constexpr int kStages = 2;    // Q / dO / lse / D double buffering

  static constexpr int kMmaK = 16;
  static constexpr int kKSteps = kHeadDim / kMmaK;   // k-steps of S^T, dP^T (over the head dim)
  static constexpr int kQKSteps = kBlockM / kMmaK;   // k-steps of dV, dK (over the step's queries)
  static constexpr int kSTiles = kWgQueries / 8;     // n8 tiles of a warp's S^T / dP^T
  static constexpr int kKvTiles = kHeadDim / 8;      // n8 tiles of a warp's dV or dK

  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr size_t kKvTileBytes = static_cast<size_t>(kColBlocks) * kBlockN * 128;
  static constexpr size_t kQTileBytes = static_cast<size_t>(kColBlocks) * kBlockM * 128;
  static constexpr size_t kPBytes = static_cast<size_t>(kBlockN) * 128;  // sP or sdS: 64 keys x 64 queries
  // Layout: sK | sV | sQ [kStages] | sdO [kStages] | sP | sdS (each 1024-aligned) | lse2, D
  // [kStages][kBlockM] floats | mbarriers: K/V, then Q/dO per stage; +1024 to align the dynamic base.
  static constexpr size_t kFloatBytes = 2 * kStages * kBlockM * sizeof(float);
  static constexpr size_t kBarrierBytes = 8 * (1 + kStages);
  static constexpr size_t kSmemBytes =
      2 * kKvTileBytes + 2 * kStages * kQTileBytes + 2 * kPBytes + kFloatBytes + kBarrierBytes + 1024;

  static_assert(sizeof(Elem) == 2, "the wgmma path takes fp16 or bf16");
  static_assert(kHeadDim % 64 == 0 && kHeadDim <= 256, "head dim: whole 64-column blocks, wgmma N <= 256");
  static_assert(kSmemBytes <= kSm90MaxSmemPerBlock, "shared memory exceeds the sm_90 per-block limit");
};

template <typename Traits, bool kIsCausal>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    flash_bwd_wide_sm90_kernel(const __grid_constant__ AttentionBwdParams p, const __grid_constant__ BwdTensorMaps maps,
                               const FlashBwdWorkspace ws) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Elem = typename Traits::Elem;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  constexpr int kSTiles = Traits::kSTiles, kKvTiles = Traits::kKvTiles, kStages = Traits::kStages;
  constexpr int kWgQueries = Traits::kWgQueries;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem_base = sw128_aligned_base(smem_raw);
  const uint32_t sK = smem_base;
  const uint32_t sV = sK + static_cast<uint32_t>(Traits::kKvTileBytes);
  const uint32_t sQ = sV + static_cast<uint32_t>(Traits::kKvTileBytes);
  const uint32_t sdO = sQ + static_cast<uint32_t>(kStages * Traits::kQTileBytes);
  const uint32_t sP = sdO + static_cast<uint32_t>(kStages * Traits::kQTileBytes);
  const uint32_t sdS = sP + static_cast<uint32_t>(Traits::kPBytes);
  const uint32_t float_base = sdS + static_cast<uint32_t>(Traits::kPBytes);
  const uint32_t bar_kv = float_base + static_cast<uint32_t>(Traits::kFloatBytes);
  const auto bar_q = [&](int stage) { return bar_kv + 8u * static_cast<uint32_t>(1 + stage); };
  float* sLse2 = reinterpret_cast<float*>(smem_raw + (float_base - smem_u32(smem_raw)));
  float* sD = sLse2 + kStages * kBlockM;

  const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = static_cast<int>(p.seqlen_k);
  const int head_dim = static_cast<int>(p.head_dim);
  const int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
  const KeyTileWork tile = key_tile_work(p, static_cast<uint32_t>(n_blocks));  // tile_scheduler.cuh
  const int head_kv = tile.head_kv;
  const int64_t batch = tile.batch;
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const AttentionMask<kIsCausal> mask(seqlen_q, seqlen_k);  // mask.cuh

  const int wg = warp_uniform_int(static_cast<int>(threadIdx.x) / 128);
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int key_row0 = warp * 16 + g;  // this thread's keys: key_row0, +8 (in the tile; both warpgroups)
  const int q_base = wg * kWgQueries;  // this warpgroup's queries of S^T, dP^T in the step

  if (threadIdx.x == 0) {
    mbarrier_init(bar_kv, 1);
#pragma unroll
    for (int st = 0; st < kStages; ++st) mbarrier_init(bar_q(st), 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  const int n0 = tile.first_tile * kBlockN;
  const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
  const int m_begin = mask.template first_query_tile<kBlockM>(n0, m_blocks);
  const int m_count = m_blocks - m_begin;
  const int iters = m_count * group;

  // dV (warpgroup 0) or dK (warpgroup 1) of the block's 64 keys, every column.
  float acc[kKvTiles][4];
#pragma unroll
  for (int j = 0; j < kKvTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  // Iteration it's Q and dO tiles (thread 0, TMA, into `stage`) and its lse / D rows (threads <
  // kBlockM, into registers: the caller stores them with store_bwd_row_stats, tile_load.cuh).
  const auto load_iter = [&](int it, int stage) {
    const int head = head_kv * group + it / m_count;
    const int m0 = (m_begin + it % m_count) * kBlockM;
    if (threadIdx.x == 0)
      load_query_tiles<Traits>(&maps.q, &maps.dout, sQ, sdO, bar_q(stage), stage, m0, head, static_cast<int>(batch));
    return read_bwd_row_stats<kBlockM>(p, ws.d, head, m0, batch, seqlen_q);
  };

  if (iters > 0) {
    if (threadIdx.x == 0)
      load_resident_kv_tile<Traits>(&maps.k, &maps.v, sK, sV, bar_kv, n0, head_kv, static_cast<int>(batch));
    store_bwd_row_stats<kBlockM>(load_iter(0, 0), sLse2, sD, 0);
    mbarrier_wait(bar_kv, 0);
  }

  // sP and sdS hold (key, query) matrices of Elem: row = key, the step's 64 queries along the row
  // (128 bytes), 16-byte chunks swizzled with the row (SW128). The address of element (key, q), q even
  // for a 4-byte pair (q, q + 1).
  const auto pds_addr = [&](uint32_t base, int key, int q) {
    return base + static_cast<uint32_t>(key * kSw128RowBytes + (((q / 8) ^ (key % 8)) * 16) + (q % 8) * 2);
  };

  for (int it = 0; it < iters; ++it) {
    const int stage = it % kStages;
    const int head = head_kv * group + it / m_count;
    const int m0 = (m_begin + it % m_count) * kBlockM;
    // One iteration; tiles that cross the causal diagonal (kCross) get the rows' rare path.
    const auto iteration = [&](auto cross) {
      constexpr bool kCross = decltype(cross)::value;
      mbarrier_wait(bar_q(stage), static_cast<uint32_t>((it / kStages) & 1));
      // Both warpgroups are past iteration it - 1 after this barrier: its stage, sP / sdS and lse / D
      // rows are free. On a crossing tile it also votes on whether a row's statistics flag its q or dO.
      bool rows_flagged = false;
      if constexpr (kCross) {
        const int r = static_cast<int>(threadIdx.x);
        rows_flagged = warp_uniform(__syncthreads_or(
            r < kBlockM && bwd_row_suspect(m0 + r, seqlen_q, sLse2[stage * kBlockM + r], sD[stage * kBlockM + r])));
      } else {
        __syncthreads();
      }
      // The next iteration's loads: its lse / D rows are stored after this iteration's P^T and dS^T (the
      // stage's previous reader, iteration it - 1, is past the barrier above).
      const bool has_next = it + 1 < iters;
      const BwdRowStats next_stats = has_next ? load_iter(it + 1, (it + 1) % kStages) : BwdRowStats{};
      const uint32_t sQs = sQ + static_cast<uint32_t>(stage * Traits::kQTileBytes);
      const uint32_t sdOs = sdO + static_cast<uint32_t>(stage * Traits::kQTileBytes);
      const float* lse2 = sLse2 + stage * kBlockM;
      const float* dvec = sD + stage * kBlockM;

      // S^T = K Q_w^T and dP^T = V dO_w^T: (64 keys, this warpgroup's 32 queries), committed separately:
      // P^T is computed while the tensor cores run dP^T.
      float st[kSTiles][4], dpt[kSTiles][4];
      const uint32_t q_rows = static_cast<uint32_t>(q_base * kSw128RowBytes);
      wgmma_fence();  // not wgmma_ss_k_major_two_groups: that computes sQs + q_rows before the fence
      wgmma_ss_k_major<kWgQueries, kBlockN, kBlockM, Traits::kKSteps, Elem>(st, sK, sQs + q_rows);
      wgmma_commit();
      wgmma_ss_k_major<kWgQueries, kBlockN, kBlockM, Traits::kKSteps, Elem>(dpt, sV, sdOs + q_rows);
      wgmma_commit();

      // P^T, then dS^T (flash_bwd_sm90_kernel.cuh's rule). Element (j, e): key n0 + key_row0 + 8 (e / 2),
      // query m0 + q_base + 8 j + 2 t + e % 2.
      const auto by_mask = [&](auto f) {  // mask.cuh
        by_tile_mask(mask.template bwd_tile_needs_mask<kBlockM, kBlockN>(m0, n0), f);
      };
      const int key0 = n0 + key_row0;
      wgmma_wait<1>();  // S^T is ready; dP^T may still run
      fence_operands(st);
      by_mask([&](auto masked) {  // fragment_softmax.cuh
        bwd_p_transposed<decltype(masked)::value>(st, mask, p.scale_log2, lse2, m0, q_base, t, key0);
      });
      wgmma_wait<0>();
      fence_operands(dpt);
      by_mask([&](auto masked) { bwd_ds_transposed<decltype(masked)::value>(dpt, st, mask, dvec, m0, q_base, t, key0); });
      if (has_next) store_bwd_row_stats<kBlockM>(next_stats, sLse2, sD, (it + 1) % kStages);

      // This warpgroup's 32 queries of P^T and dS^T, rounded to Elem, into sP and sdS.
#pragma unroll
      for (int j = 0; j < kSTiles; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int key = key_row0 + 8 * h, q = q_base + 8 * j + 2 * t;
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(pds_addr(sP, key, q)),
                       "r"(pack2<Elem>(st[j][2 * h], st[j][2 * h + 1]))
                       : "memory");
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(pds_addr(sdS, key, q)),
                       "r"(pack2<Elem>(dpt[j][2 * h], dpt[j][2 * h + 1]))
                       : "memory");
        }
      // Rare path (bwd_nonfinite.cuh), on a crossing tile whose rows flag their q or dO: their non-finite
      // elements are zeroed in shared memory for the products (a hidden P or dS = 0 would multiply
      // them); dO's terms of the visible pairs are added to dV after its product.
      const bool rare_rows = kCross && rows_flagged;
      if (rare_rows) {
        __syncthreads();  // every warpgroup's S^T and dP^T have read Q and dO
        constexpr int kQRows = Traits::kColBlocks * kBlockM;
        tile_nonfinite<Elem, kQRows, kSw128BlockCols, kSw128BlockCols, Traits::kNThreads, true>(
            reinterpret_cast<Elem*>(smem_raw + (sQs - smem_u32(smem_raw))));
        tile_nonfinite<Elem, kQRows, kSw128BlockCols, kSw128BlockCols, Traits::kNThreads, true>(
            reinterpret_cast<Elem*>(smem_raw + (sdOs - smem_u32(smem_raw))));
      }
      fence_proxy_async_smem();
      __syncthreads();  // both warpgroups' halves of P^T and dS^T (and the zeroed tiles) are in place

      // dV += P^T dO (warpgroup 0) or dK += dS^T Q (warpgroup 1), over the step's 64 queries.
      const uint32_t sA = wg == 0 ? sP : sdS, sB = wg == 0 ? sdOs : sQs;
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < Traits::kQKSteps; ++ks)
        Wgmma<kHeadDim, Elem>::template ss_t<0, 1>(acc, desc_k_major<kBlockN>(sA, ks), desc_mn_major<kBlockM>(sB, ks), 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(acc);

      if (rare_rows && wg == 0) {
        // dV_j += P_ij dO_i[c] for the flagged rows' non-finite dO elements (from global memory) and the
        // keys they see; P^T as the tensor core read it, from sP.
        const Elem* dout = static_cast<const Elem*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride;
        const auto p_read = [&](int key, int q) {
          return to_float(*reinterpret_cast<const Elem*>(smem_raw + (pds_addr(sP, key, q) - smem_u32(smem_raw))));
        };
#pragma unroll 1
        for (int i = 0; i < kBlockM; ++i) {
          const int row = m0 + i;
          if (!bwd_row_suspect(row, seqlen_q, lse2[i], dvec[i])) continue;
          const float pij[2] = {p_read(key_row0, i), p_read(key_row0 + 8, i)};
          add_nonfinite_terms(acc, dout + static_cast<int64_t>(row) * p.do_row_stride, pij, t, head_dim,
                              [&](int h) { return !mask.hidden(row, n0 + key_row0 + 8 * h); });
        }
      }
    };
    if (mask.template crosses<kBlockM, kBlockN>(m0, n0))
      iteration(std::true_type{});
    else
      iteration(std::false_type{});
  }

  // Epilogue: dV (warpgroup 0) or dK * scale (warpgroup 1) for this thread's keys (zeros when no query
  // saw the tile).
  Elem* out = wg == 0 ? static_cast<Elem*>(p.dv) + batch * p.dv_batch_stride + head_kv * p.dv_head_stride
                      : static_cast<Elem*>(p.dk) + batch * p.dk_batch_stride + head_kv * p.dk_head_stride;
  const int64_t row_stride = wg == 0 ? p.dv_row_stride : p.dk_row_stride;
  const float scale = wg == 0 ? 1.0f : p.softmax_scale;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = n0 + key_row0 + 8 * h;
    if (key >= seqlen_k) continue;
#pragma unroll
    for (int j = 0; j < kKvTiles; ++j) {
      const int col = 8 * j + 2 * t;
      if (col >= head_dim) continue;
      *reinterpret_cast<uint32_t*>(out + static_cast<int64_t>(key) * row_stride + col) =
          pack2<Elem>(acc[j][2 * h] * scale, acc[j][2 * h + 1] * scale);
    }
  }
#else
  __trap();  // only the sm_90a build has this kernel
#endif
}

}  // namespace fa::cuda::flash::sm90
