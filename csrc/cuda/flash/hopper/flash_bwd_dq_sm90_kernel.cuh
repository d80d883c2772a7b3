// The dQ kernel of the two-kernel FA2 backward, Hopper path (sm_90a, wgmma): dQ without atomics. The
// other kernel is flash_bwd_sm90_kernel with kComputeDq = false (dK and dV only).
//
// Grid: one thread block per (query tile of kBlockM = 128 rows, query head, batch), flattened into
// blockIdx.x with the query tile fastest; causal, the heaviest tiles of a section of heads first (as
// the forward).
// Warpgroup w owns rows [64 w, 64 w + 64) of the tile; its dQ accumulator stays in registers for the
// whole K/V loop. Q and dO arrive once by TMA; K/V tiles of kBlockN keys stream through two stages
// (thread 0 issues, mbarriers complete). Per K/V tile, per warpgroup:
//   S  = Q K^T      wgmma m64 n kBlockN, A = Q (K-major), B = K (K-major), from shared memory
//   dP = dO V^T     likewise
//   P = 2^(S c - lse2) with lse2 and D per row (two rows per thread, in registers); dS = P o (dP - D);
//   hidden pairs (mask.cuh: keys >= seqlen_k, rows >= seqlen_q, causal keys past the row's
//   diagonal) get dS = 0 by a select (0 * NaN would leak otherwise), on tiles that hold one only
//   dQ += dS K      wgmma rs: A = dS from registers, B = K (MN-major)
// NaN / ±Inf in K on tiles that cross the diagonal: a rare path zeroes them for dQ += dS K and adds
// their visible terms back (bwd_nonfinite.cuh).
// Epilogue: dq = dQ * softmax_scale rounded to Elem (rows >= seqlen_q and columns >= head_dim skipped).
// Rows past seqlen_q arrive as zeros and see no key (dS selected to 0). Rows that see no key get dq = 0.
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/attention_params.h"
#include "cuda/flash/bwd_nonfinite.cuh"
#include "cuda/flash/epilogue.cuh"
#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/hopper/flash_bwd_dq_sm90_traits.h"
#include "cuda/flash/hopper/kv_load.cuh"
#include "cuda/flash/hopper/tma.cuh"
#include "cuda/flash/hopper/wgmma.cuh"
#include "cuda/flash/mask.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/flash/tile_scheduler.cuh"

namespace fa::cuda::flash::sm90 {

// The dQ kernel's tensor maps: q and dout in boxes of 64 columns x kBlockM rows, k and v in 64 x kBlockN.
struct BwdDqTensorMaps {
  CUtensorMap q, dout, k, v;
};

// The rare path's terms (the kernel below): for each key j of the tile from n0 (below seqlen_k) whose K
// row holds NaN / ±Inf, dQ_i[c] += dS_ij K_j[c] at this thread's rows row0, row0 + 8 that see key j, K
// from global memory (k_tile: the tile's first row), dS from dp (the warp's m16n8-layout tile; dS of
// row h, key j sits in lane (g, (j % 8) / 2) of this quad, rounded as the tensor core reads it).
// Out of line, dq and dp copied through local memory around the call (on the rare path only): inlined,
// its loops made ptxas (sm_90a) spill 112 / 204 bytes (stores / loads) in the d256 causal kernel's
// main loop, and its registers rose from 234 to 255.
template <typename Traits, typename Mask>
__device__ __noinline__ void add_k_nonfinite_dq(float (&dq)[Traits::kDqTiles][4], const float (&dp)[Traits::kSTiles][4],
                                                const typename Traits::Elem* k_tile, int64_t k_row_stride, int n0,
                                                int seqlen_k, int row0, int lane, int head_dim, const Mask mask) {
  using Elem = typename Traits::Elem;
  const int t = lane % 4;
  // Key j = 8 jq + r: the tile index jq is a compile-time constant (a runtime index into dp would move
  // it to a slower local-memory walk), r a runtime one.
#pragma unroll
  for (int jq = 0; jq < Traits::kSTiles; ++jq)
#pragma unroll 1
    for (int r = 0; r < 8; ++r) {
      const int j = 8 * jq + r;
      if (n0 + j >= seqlen_k) break;
      const float own[2] = {r % 2 ? dp[jq][1] : dp[jq][0], r % 2 ? dp[jq][3] : dp[jq][2]};
      const int src = (lane & ~3) | (r / 2);
      const float ds[2] = {as_operand<Elem>(__shfl_sync(0xffffffffu, own[0], src)),
                           as_operand<Elem>(__shfl_sync(0xffffffffu, own[1], src))};
      add_nonfinite_terms(dq, k_tile + static_cast<int64_t>(j) * k_row_stride, ds, t, head_dim,
                          [&](int h) { return !mask.off_band(row0 + 8 * h, n0 + j); });
    }
}

template <typename Traits, bool kIsCausal>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    flash_bwd_dq_sm90_kernel(const __grid_constant__ AttentionBwdParams p, const __grid_constant__ BwdDqTensorMaps maps,
                             const float* __restrict__ d_rows,
                             const __grid_constant__ QueryTileScheduler sched) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Elem = typename Traits::Elem;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kStages = Traits::kStages;
  constexpr int kSTiles = Traits::kSTiles, kDqTiles = Traits::kDqTiles;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem_base = sw128_aligned_base(smem_raw);
  const uint32_t sQ = smem_base;
  const uint32_t sdO = sQ + static_cast<uint32_t>(Traits::kQTileBytes);
  const uint32_t sK = sdO + static_cast<uint32_t>(Traits::kQTileBytes);
  const uint32_t sV = sK + static_cast<uint32_t>(kStages * Traits::kKvTileBytes);
  const uint32_t bar_q = sV + static_cast<uint32_t>(kStages * Traits::kKvTileBytes);  // then one per stage
  const auto bar_kv = [&](int stage) { return bar_q + 8u * static_cast<uint32_t>(1 + stage); };

  const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = static_cast<int>(p.seqlen_k);
  const int head_dim = static_cast<int>(p.head_dim);
  const QueryTileWork tile = sched.work<kBlockM, kIsCausal>(blockIdx.x);  // tile_scheduler.cuh
  const int m0 = tile.m0, head = tile.head, head_kv = tile.head_kv;
  const int64_t batch = tile.batch;
  const AttentionMask<kIsCausal> mask(seqlen_q, seqlen_k);  // mask.cuh

  const int wg = warp_uniform_int(static_cast<int>(threadIdx.x) / 128);
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = m0 + wg * Traits::kWgRows + warp * 16 + g;  // this thread's rows: row0, row0 + 8

  // lse (base 2) and D of this thread's two rows; rows past seqlen_q have none to read: placeholders, as
  // they see no key (dS selected to 0).
  float lse2[2], dval[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    const int64_t stat = (batch * p.heads_q + head) * p.seqlen_q + row;
    lse2[h] = row < seqlen_q ? p.lse_in[stat] * kLog2e : INFINITY;
    dval[h] = row < seqlen_q ? d_rows[stat] : 0.0f;
  }

  const int n_blocks = mask.template query_tile_keys<kBlockM, kBlockN>(m0).tiles;

  float dq[kDqTiles][4];
#pragma unroll
  for (int j = 0; j < kDqTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[j][e] = 0.0f;

  if (threadIdx.x == 0) {
    mbarrier_init(bar_q, 1);
#pragma unroll
    for (int st = 0; st < kStages; ++st) mbarrier_init(bar_kv(st), 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  // K/V tile j into stage j % kStages (thread 0).
  const auto issue_kv = [&](int j) {
    load_kv_tile<Traits>(&maps.k, &maps.v, sK, sV, bar_kv, j, head_kv, static_cast<int>(batch));
  };

  if (n_blocks > 0) {
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_tx(bar_q, static_cast<uint32_t>(2 * Traits::kQTileBytes));
#pragma unroll
      for (int cb = 0; cb < Traits::kColBlocks; ++cb) {
        const uint32_t cb_off = static_cast<uint32_t>(cb * kBlockM * kSw128RowBytes);
        tma_load_4d(sQ + cb_off, &maps.q, bar_q, cb * kSw128BlockCols, m0, head, static_cast<int>(batch));
        tma_load_4d(sdO + cb_off, &maps.dout, bar_q, cb * kSw128BlockCols, m0, head, static_cast<int>(batch));
      }
      issue_kv(0);
    }
    mbarrier_wait(bar_q, 0);
  }

  const uint32_t sQ_wg = sQ + wg * Traits::kWgRows * kSw128RowBytes;
  const uint32_t sdO_wg = sdO + wg * Traits::kWgRows * kSw128RowBytes;
  for (int nb = 0; nb < n_blocks; ++nb) {
    const int stage = nb % kStages;
    const int n0 = nb * kBlockN;
    // One tile. Tiles that cross the causal diagonal (kCross) get the rare path of bug B2 and its vote;
    // the others compile to the loop without them (flash_bwd_sm90_kernel.cuh has the measurement).
    const auto tile = [&](auto cross) {
      constexpr bool kCross = decltype(cross)::value;
      mbarrier_wait(bar_kv(stage), static_cast<uint32_t>((nb / kStages) & 1));
      const uint32_t sK_tile = sK + static_cast<uint32_t>(stage * Traits::kKvTileBytes);
      Elem* const sK_ptr = reinterpret_cast<Elem*>(smem_raw + (sK_tile - smem_u32(smem_raw)));
      // Both warpgroups are done with tile nb - 1 after this barrier: its stage may be refilled. On a
      // tile that crosses the diagonal the barrier also votes on NaN / ±Inf in K (each thread scans its
      // chunks, visible to it after the mbarrier wait) for the rare path below.
      bool k_flag = false;
      if constexpr (kCross)
        k_flag = warp_uniform(__syncthreads_or(
            tile_nonfinite<Elem, Traits::kColBlocks * kBlockN, kSw128BlockCols, kSw128BlockCols, Traits::kNThreads, false>(sK_ptr)));
      else
        __syncthreads();
      if (threadIdx.x == 0 && nb + 1 < n_blocks) issue_kv(nb + 1);
      const uint32_t sV_tile = sV + static_cast<uint32_t>(stage * Traits::kKvTileBytes);

      // S = Q K^T and dP = dO V^T: (64 rows, kBlockN keys) per warpgroup, committed separately: without
      // the causal mask P is computed while the tensor cores run dP (flash_bwd_sm90_kernel.cuh
      // kPipelined has the measurement; the causal kernel waits for both).
      float s[kSTiles][4], dp[kSTiles][4];
      wgmma_ss_k_major_two_groups<kBlockN, kBlockM, kBlockN, Traits::kKSteps, Elem>(
          s, sQ_wg, sK_tile, dp, sdO_wg, sV_tile);
      wgmma_wait<kIsCausal ? 0 : 1>();  // S is ready; dP may still run
      fence_operands(s);
#pragma unroll
      for (int j = 0; j < kSTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] = exp2_approx(s[j][e] * p.scale_log2 - lse2[e / 2]);
      wgmma_wait<0>();
      fence_operands(dp);

      // dS = P o (dP - D), P = 2^(S c - lse2) (above). Element (j, e): row row0 + 8 (e / 2), key
      // n0 + 8 j + 2 t + e % 2. On a tile that holds a hidden pair (`masked`, a std::bool_constant: the
      // other tiles compile without the test), a hidden element gets dS = 0 by a select (mask.cuh),
      // whatever S, lse, dP, D hold.
      const auto ds_of_tile = [&](auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
        // The keys that row h sees: offsets below end[h] from n0 + 2 t, so that element (j, e) compares its
        // constant offset 8 j + e % 2. INT_MIN: a row >= seqlen_q sees none.
        int end[2] = {0, 0};
        if constexpr (kMasked) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int row = row0 + 8 * h;
            end[h] = row < seqlen_q ? mask.key_end(row) - n0 - 2 * t : INT_MIN;
          }
        }
#pragma unroll
        for (int j = 0; j < kSTiles; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int h = e / 2;
            const bool hidden = kMasked & (8 * j + e % 2 >= end[h]);
            const float ds = s[j][e] * (dp[j][e] - dval[h]);
            dp[j][e] = hidden ? 0.0f : ds;
          }
      };
      if (mask.template bwd_tile_needs_mask<kBlockM, kBlockN>(m0, n0))
        ds_of_tile(std::true_type{});
      else
        ds_of_tile(std::false_type{});

      // Rare path (bwd_nonfinite.cuh): K holds NaN / ±Inf on a tile that crosses the diagonal. Its
      // elements are zeroed in shared memory for dQ = dS K (a hidden dS = 0 would multiply them), and
      // their terms dS_ij K_j[c] are added for the rows that see key j (K from global memory). The stage
      // is refilled by TMA later (after the fence and the next iteration's barrier), so nothing is
      // restored.
      if (kCross && k_flag) {
        __syncthreads();  // both warpgroups' S products have read K
        tile_nonfinite<Elem, Traits::kColBlocks * kBlockN, kSw128BlockCols, kSw128BlockCols, Traits::kNThreads, true>(sK_ptr);
        fence_proxy_async_smem();
        const Elem* k_tile = static_cast<const Elem*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride +
                             static_cast<int64_t>(n0) * p.k_row_stride;
        float dq_local[kDqTiles][4], dp_local[kSTiles][4];
        copy_fragments(dq_local, dq);
        copy_fragments(dp_local, dp);
        add_k_nonfinite_dq<Traits>(dq_local, dp_local, k_tile, p.k_row_stride, n0, seqlen_k, row0, lane, head_dim, mask);
        copy_fragments(dq, dq_local);
        __syncthreads();  // the zeroed tile is in place for the tensor cores
      }
      uint32_t dsa[Traits::kDqKSteps][4];
#pragma unroll
      for (int ks = 0; ks < Traits::kDqKSteps; ++ks) p_to_a_operand<Elem>(dp, ks, dsa[ks]);

      // dQ += dS K over this tile's keys.
      wgmma_fence();
      wgmma_rs_mn_major<Traits::kHeadDim, kBlockN, Traits::kDqKSteps, Elem>(dq, dsa, sK_tile);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(dq);
    };
    if (mask.template crosses<kBlockM, kBlockN>(m0, n0))
      tile(std::true_type{});
    else
      tile(std::false_type{});
  }

  // Epilogue: dq * scale, rounded to Elem (epilogue.cuh).
  Elem* dq_out = static_cast<Elem*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + 8 * h;
    if (row < seqlen_q)
      store_fragment_row<Elem>(dq, h, p.softmax_scale, dq_out + static_cast<int64_t>(row) * p.dq_row_stride, 2 * t,
                               head_dim);
  }
#else
  __trap();  // only the sm_90a build has this kernel; the launcher never selects it elsewhere
#endif
}

}  // namespace fa::cuda::flash::sm90
