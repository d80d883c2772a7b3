// FlashAttention-2 backward, Hopper path (sm_90a): FA2's Algorithm 2 in one kernel on warpgroup MMA
// (wgmma, fp32 accumulation), dQ added to an fp32 accumulator by TMA bulk reductions.
//
// Grid and loop as in the mma.sync kernel (flash_bwd_kernel.cuh): one thread block per (K/V tile of
// kBlockN = 128 keys, KV head, batch); the loop runs over the query heads of the KV head's group and,
// per head, the query tiles that can see the block's keys. Warpgroup w owns keys [64 w, 64 w + 64) of
// the tile (wgmma M = 64); its dK and dV stay in registers for the whole loop. K and V arrive once by
// TMA; Q_i and dO_i by TMA into two stages (thread 0 issues, mbarriers complete them), lse_i and D_i by
// plain loads (issued a step ahead without the causal mask: kPipelined). Per query tile, per warpgroup:
//   S^T  = K_w Q_i^T     wgmma m64 n kBlockM, A = K (K-major), B = Q (K-major), from shared memory
//   dP^T = V_w dO_i^T    likewise
//   P^T = 2^(S^T c - lse2), dS^T = P^T o (dP^T - D)   (accumulator layout: per warp the m16n8 layout,
//                        queries along columns); hidden pairs (mask.cuh: keys >= seqlen_k, query
//                        rows >= seqlen_q, causal keys past the row's diagonal) get P^T = dS^T = 0 by a
//                        select (0 * NaN would leak otherwise), on tiles that hold one only
//   dV  += P^T dO_i      wgmma rs: A = P^T from registers, B = dO (MN-major)
//   dK  += dS^T Q_i      wgmma rs: A = dS^T from registers, B = Q (MN-major)
//   dS^T -> shared memory as the MN-major A operand of dQ (128-byte swizzle, queries contiguous)
//   dQ_i += dS K_j       wgmma ss, A = dS (MN-major), B = K (MN-major): split by 64-column halves
//                        between the warpgroups (head dim 128), else warpgroup 0's; staged in shared
//                        memory in fp32 and added to the accumulator by one thread's bulk reductions
//                        (cp.reduce.async.bulk.tensor), which run while the next step computes.
// With kComputeDq = false the kernel computes dK and dV only: the dK/dV kernel of the two-kernel
// backward (flash_bwd_dq_sm90_kernel.cuh computes dQ).
// Epilogue: dK * softmax_scale and dV rounded to Elem. Rows past seqlen_q arrive as zeros (TMA bounds)
// and see no key: their P^T and dS^T are selected to 0 (a key holding -inf would score 0 * (-inf) = NaN
// there). The dQ accumulator has rows up to the next multiple of 128 (flash_bwd.cu), so its reductions
// stay inside its tensor map.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/attention_params.h"
#include "cuda/flash/bwd_nonfinite.cuh"
#include "cuda/flash/dq_accum.cuh"
#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/hopper/flash_bwd_sm90_traits.h"
#include "cuda/flash/hopper/kv_load.cuh"
#include "cuda/flash/hopper/sw128_nonfinite.cuh"
#include "cuda/flash/hopper/tma.cuh"
#include "cuda/flash/hopper/wgmma.cuh"
#include "cuda/flash/mask.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/flash/tile_load.cuh"
#include "cuda/flash/tile_scheduler.cuh"

namespace fa::cuda::flash::sm90 {

// The tensor maps of one backward call: (head_dim, seqlen, heads, batch) views of q and dout (boxes of
// 64 columns x kBlockM rows) and of k and v (64 x kBlockN); for the single kernel, the fp32 dQ
// accumulator (tensor_map.h make_accum_map: boxes of 32 columns x kBlockM rows); for the
// warp-specialized kernel, dk and dv (64 columns x a consumer's 64 keys), which it stores through TMA.
struct BwdTensorMaps {
  CUtensorMap q, dout, k, v, dq_accum, dk, dv;
};

// The dK / dV epilogue of the kernels whose warpgroups hold 64 keys of dK and dV (kKvTiles 8-column
// accumulator tiles): this thread's keys key0 and key0 + 8, columns 8 j + 2 t and + 1, dK scaled by
// softmax_scale, rounded to Elem; keys past seqlen_k and columns past head_dim are not written.
template <typename Elem, int kKvTiles>
__device__ __forceinline__ void store_dk_dv(const AttentionBwdParams& p, const float (&dk)[kKvTiles][4],
                                            const float (&dv)[kKvTiles][4], int64_t batch, int head_kv, int key0,
                                            int t, int seqlen_k, int head_dim) {
  Elem* dk_out = static_cast<Elem*>(p.dk) + batch * p.dk_batch_stride + head_kv * p.dk_head_stride;
  Elem* dv_out = static_cast<Elem*>(p.dv) + batch * p.dv_batch_stride + head_kv * p.dv_head_stride;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = key0 + 8 * h;
    if (key >= seqlen_k) continue;
#pragma unroll
    for (int j = 0; j < kKvTiles; ++j) {
      const int col = 8 * j + 2 * t;
      if (col >= head_dim) continue;
      *reinterpret_cast<uint32_t*>(dk_out + static_cast<int64_t>(key) * p.dk_row_stride + col) =
          pack2<Elem>(dk[j][2 * h] * p.softmax_scale, dk[j][2 * h + 1] * p.softmax_scale);
      *reinterpret_cast<uint32_t*>(dv_out + static_cast<int64_t>(key) * p.dv_row_stride + col) =
          pack2<Elem>(dv[j][2 * h], dv[j][2 * h + 1]);
    }
  }
}

template <typename Traits, bool kIsCausal, bool kComputeDq = true>
__global__ void __launch_bounds__(Traits::kNThreads, kComputeDq ? 1 : Traits::kDkDvMinBlocksPerSm)
    flash_bwd_sm90_kernel(const __grid_constant__ AttentionBwdParams p, const __grid_constant__ BwdTensorMaps maps,
                          const FlashBwdWorkspace ws) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Elem = typename Traits::Elem;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  constexpr int kSTiles = Traits::kSTiles, kKvTiles = Traits::kKvTiles, kDqTiles = Traits::kDqTiles;
  constexpr int kStages = Traits::kStages;
  // Pipelined step: the next step's lse / D loads in flight across this step's products, P^T computed
  // while dP^T runs, and dV's product issued before dS^T is computed (off the diagonal). Not causal:
  // on an H100 (bf16, B*S = 16k, 2026-11-26, two runs beside the serial kernels) it bought 1-5% for
  // the dK/dV kernel without a mask and cost 1-5% with one (d64 / d128 causal, 512-8k). Nor in d32's
  // dK/dV kernel, whose two blocks per SM leave 128 registers (ptxas, sm_90a: the causal kernel spilled
  // 56 bytes and serialized its wgmma).
  constexpr bool kPipelined = !kIsCausal && (kComputeDq || Traits::kDkDvMinBlocksPerSm == 1);

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem_base = sw128_aligned_base(smem_raw);
  const uint32_t sK = smem_base;
  const uint32_t sV = sK + static_cast<uint32_t>(Traits::kKvTileBytes);
  const uint32_t sQ = sV + static_cast<uint32_t>(Traits::kKvTileBytes);
  const uint32_t sdO = sQ + static_cast<uint32_t>(kStages * Traits::kQTileBytes);
  const uint32_t sdS = sdO + static_cast<uint32_t>(kStages * Traits::kQTileBytes);
  const uint32_t float_base = sdS + static_cast<uint32_t>(Traits::kDsBytes);
  const uint32_t bar_kv = float_base + static_cast<uint32_t>(Traits::kFloatBytes);
  const uint32_t sdQ = smem_base + static_cast<uint32_t>(Traits::kDqStageOffset);  // the single kernel's
  const auto bar_q = [&](int stage) { return bar_kv + 8u * static_cast<uint32_t>(1 + stage); };
  // After the barriers: the K tile's NaN / ±Inf flag (causal, with dQ).
  int* const sKFlag = reinterpret_cast<int*>(smem_raw + (bar_q(kStages) - smem_u32(smem_raw)));
  // Generic pointers to the float arrays: lse2 [kStages][kBlockM] then D [kStages][kBlockM].
  float* sLse2 = reinterpret_cast<float*>(smem_raw + (float_base - smem_u32(smem_raw)));
  float* sD = sLse2 + kStages * kBlockM;

  const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = static_cast<int>(p.seqlen_k);
  const int head_dim = static_cast<int>(p.head_dim);
  const int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
  // Atomic mode: one K/V tile per block. Deterministic mode: block `split` of ws.splits takes the tiles
  // split, split + splits, ... in turn, so its dQ adds go to its own accumulator slice, in a fixed order.
  // The dK/dV kernel of the two-kernel backward (!kComputeDq) has no accumulator and one tile per block
  // whatever p.deterministic says (its workspace has no splits: ws.splits is 0).
  const bool split_tiles = kComputeDq && p.deterministic;
  const uint32_t tile_stride = split_tiles ? static_cast<uint32_t>(ws.splits) : static_cast<uint32_t>(n_blocks);
  const KeyTileWork tile = key_tile_work(p, tile_stride);  // tile_scheduler.cuh
  const int first_tile = tile.first_tile, head_kv = tile.head_kv;
  const int64_t batch = tile.batch;
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const AttentionMask<kIsCausal> mask(seqlen_q, seqlen_k);  // mask.cuh
  float* const dq_accum = ws.dq_accum + (split_tiles ? first_tile * ws.split_stride : 0);
  // The thread that issues its warpgroup's dQ reductions (a function: kept in a register across the loop,
  // it cost d128's causal kernel spills).
  const auto dq_issuer = [] { return kComputeDq && threadIdx.x % 128 == 0; };

  const int wg = warp_uniform_int(static_cast<int>(threadIdx.x) / 128);
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int key_row0 = wg * Traits::kWgKeys + warp * 16 + g;  // this thread's keys: key_row0, +8 (in the tile)

  if (threadIdx.x == 0) {
    mbarrier_init(bar_kv, 1);
#pragma unroll
    for (int st = 0; st < kStages; ++st) mbarrier_init(bar_q(st), 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  // Uses of the barriers so far (their phase parities): K/V loads, and Q/dO tiles over all K/V tiles.
  int kv_loads = 0, q_tiles = 0;
  for (int n_block = first_tile; n_block < n_blocks; n_block += static_cast<int>(tile_stride)) {
    const int n0 = n_block * kBlockN;
    const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
    const int m_begin = mask.template first_query_tile<kBlockM>(n0, m_blocks);
    const int m_count = m_blocks - m_begin;
    const int iters = m_count * group;

    float dk[kKvTiles][4], dv[kKvTiles][4];
#pragma unroll
    for (int j = 0; j < kKvTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;

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
      store_bwd_row_stats<kBlockM>(load_iter(0, q_tiles % kStages), sLse2, sD, q_tiles % kStages);
      mbarrier_wait(bar_kv, static_cast<uint32_t>(kv_loads & 1));
      ++kv_loads;
    }
    Elem* const sK_ptr = reinterpret_cast<Elem*>(smem_raw + (sK - smem_u32(smem_raw)));
    // The K tile in global memory, for the rare path (recomputed there: a pointer kept live across the
    // loop cost d128 a spill).
    const auto k_src = [&] {
      return static_cast<const Elem*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride +
             static_cast<int64_t>(n0) * p.k_row_stride;
    };
    // Causal, with dQ: whether the K tile holds NaN / ±Inf (one scan and vote per K/V tile), for dQ's
    // rare path on the query tiles that cross the diagonal. Kept in shared memory (sKFlag) and read
    // there on those tiles only: in a register, live across the loop, d128 spilled it and reloaded it
    // on every query tile. Written after the vote: every thread has read the last tile's value by then.
    if constexpr (kIsCausal && kComputeDq) {
      const bool k_flag = __syncthreads_or(iters > 0 && tile_nonfinite<Elem, Traits::kColBlocks * kBlockN, kSw128BlockCols,
                                                                        kSw128BlockCols, Traits::kNThreads, false>(sK_ptr));
      if (threadIdx.x == 0) *sKFlag = k_flag;  // read after the loop's barrier
    }

    // This warpgroup's 64 keys in every column block of K and V (the A operands of S^T and dP^T).
    const uint32_t sK_wg = sK + wg * Traits::kWgKeys * kSw128RowBytes;
    const uint32_t sV_wg = sV + wg * Traits::kWgKeys * kSw128RowBytes;

    for (int it = 0; it < iters; ++it) {
      const int use = q_tiles + it;  // this Q/dO tile's index over the block's whole run
      const int stage = use % kStages;
      const int head = head_kv * group + it / m_count;
      const int m0 = (m_begin + it % m_count) * kBlockM;
      // One iteration. Tiles that cross the causal diagonal (kCross) get the rare path of bug B2 and its
      // vote; the others compile to the loop without them. Measured on an H100 (2026-11-21, causal bf16
      // backward d32-d128, 512-8k, against the kernels before B2): one body for both tile kinds 1.08x the
      // time; two bodies, with the votes and the warpgroup index made warp-uniform and no spills left,
      // 1.015x (single kernel) and 1.027x (two kernels), the rest being the crossing tiles' own work
      // (up to 1.05x at 512, where a quarter of the tiles cross; ~1.0x at 8k).
      const auto iteration = [&](auto cross) {
        constexpr bool kCross = decltype(cross)::value;
        mbarrier_wait(bar_q(stage), static_cast<uint32_t>((use / kStages) & 1));
        // Both warpgroups are past iteration it - 1 after this barrier: its stage, sdS and lse/D rows are
        // free. On a tile that crosses the diagonal it also votes on whether the statistics of a row flag
        // its q or dO (bwd_row_suspect; thread r < kBlockM stored row r's itself), for the rare path below.
        bool rows_flagged = false;
        if constexpr (kCross) {
          const int r = static_cast<int>(threadIdx.x);
          rows_flagged = warp_uniform(__syncthreads_or(
              r < kBlockM && bwd_row_suspect(m0 + r, seqlen_q, sLse2[stage * kBlockM + r], sD[stage * kBlockM + r])));
        } else {
          __syncthreads();
        }
        // The next iteration's loads: its lse / D rows are stored after this iteration's products (the
        // stage's previous reader, iteration it - 1, is past the barrier above).
        const bool has_next = it + 1 < iters;
        const BwdRowStats next_stats = has_next ? load_iter(it + 1, (use + 1) % kStages) : BwdRowStats{};
        if (!kPipelined && has_next) store_bwd_row_stats<kBlockM>(next_stats, sLse2, sD, (use + 1) % kStages);
        const uint32_t sQs = sQ + static_cast<uint32_t>(stage * Traits::kQTileBytes);
        const uint32_t sdOs = sdO + static_cast<uint32_t>(stage * Traits::kQTileBytes);
        const float* lse2 = sLse2 + stage * kBlockM;
        const float* dvec = sD + stage * kBlockM;

        // S^T = K_w Q^T and dP^T = V_w dO^T: (64 keys, kBlockM queries) per warpgroup, committed
        // separately (kPipelined: P^T is computed while the tensor cores run dP^T).
        float st[kSTiles][4], dpt[kSTiles][4];
        wgmma_ss_k_major_two_groups<kBlockM, kBlockN, kBlockM, Traits::kKSteps, Elem>(st, sK_wg, sQs, dpt, sV_wg, sdOs);

        // P^T, then dS^T. Element (j, e): key n0 + key_row0 + 8 (e / 2), query m0 + 8 j + 2 t + e % 2.
        // x = S^T scale_log2 is rounded before lse2 is subtracted (__fmul_rn: ptxas would contract a plain
        // multiply and subtract into one fma and change P's bits). On a tile that holds a hidden pair
        // (`masked`, a std::bool_constant: the other tiles compile without the test), a hidden element
        // gets P^T = dS^T = 0 by selects (mask.cuh), whatever S, lse, dP and D hold. (Selecting the
        // outputs here, the inputs in flash_bwd_kernel.cuh: each the form that cost ptxas fewer registers.)
        const bool tile_masked = mask.template bwd_tile_needs_mask<kBlockM, kBlockN>(m0, n0);
        const auto by_mask = [&](auto f) { by_tile_mask(tile_masked, f); };  // mask.cuh
        const auto hidden_at = [&](auto masked, int j, int e) {
          return decltype(masked)::value & mask.hidden(m0 + 8 * j + 2 * t + e % 2, n0 + key_row0 + 8 * (e / 2));
        };
        const auto p_at = [&](int j, int e) {
          return exp2_approx(__fmul_rn(st[j][e], p.scale_log2) - lse2[8 * j + 2 * t + e % 2]);
        };
        const auto ds_at = [&](float pe, int j, int e) { return pe * (dpt[j][e] - dvec[8 * j + 2 * t + e % 2]); };
        uint32_t pa[Traits::kQKSteps][4], dsa[Traits::kQKSteps][4];
        // dV += P^T dO (asynchronous until the wait after dQ). Off the diagonal it runs while dS^T is
        // computed (kEarlyDv); on a crossing tile it waits for the rare path below, which may zero dO's
        // elements.
        const auto issue_dv = [&] {
          wgmma_fence();
          wgmma_rs_mn_major<kHeadDim, kBlockM, Traits::kQKSteps, Elem>(dv, pa, sdOs);
        };
        constexpr bool kEarlyDv = !kCross && kPipelined;
        if constexpr (kPipelined) {
          wgmma_wait<1>();  // S^T is ready; dP^T may still run
          fence_operands(st);
          by_mask([&](auto masked) {
#pragma unroll
            for (int j = 0; j < kSTiles; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e) st[j][e] = hidden_at(masked, j, e) ? 0.0f : p_at(j, e);
          });
#pragma unroll
          for (int ks = 0; ks < Traits::kQKSteps; ++ks) p_to_a_operand<Elem>(st, ks, pa[ks]);
          if constexpr (kEarlyDv) {
            issue_dv();
            wgmma_commit();
          }
          wgmma_wait<kEarlyDv ? 1 : 0>();  // dP^T is ready; dV may still run
          fence_operands(dpt);
          by_mask([&](auto masked) {
#pragma unroll
            for (int j = 0; j < kSTiles; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e) dpt[j][e] = hidden_at(masked, j, e) ? 0.0f : ds_at(st[j][e], j, e);
          });
        } else {
          wgmma_wait<0>();
          fence_operands(st);
          fence_operands(dpt);
          by_mask([&](auto masked) {
#pragma unroll
            for (int j = 0; j < kSTiles; ++j)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const bool hidden = hidden_at(masked, j, e);
                const float pe = p_at(j, e);
                const float ds = ds_at(pe, j, e);
                st[j][e] = hidden ? 0.0f : pe;
                dpt[j][e] = hidden ? 0.0f : ds;
              }
          });
#pragma unroll
          for (int ks = 0; ks < Traits::kQKSteps; ++ks) p_to_a_operand<Elem>(st, ks, pa[ks]);
        }

        // sdS holds a (key, query) matrix of Elem: row = key (in the tile), queries along the row in 64-query
        // column blocks of 128 bytes, 16-byte chunks swizzled with the row (wgmma.cuh's SW128 layout).
        // The address of element (key, q), q even for a 4-byte pair (q, q + 1).
        const auto sds_addr = [&](int key, int q) {
          return sdS + static_cast<uint32_t>((q / 64) * kBlockN * kSw128RowBytes + key * kSw128RowBytes +
                                             ((((q % 64) / 8) ^ (key % 8)) * 16) + (q % 8) * 2);
        };
        const auto sds_read = [&](int key, int q) {
          return to_float(*reinterpret_cast<const Elem*>(smem_raw + (sds_addr(key, q) - smem_u32(smem_raw))));
        };

        // Rare path (bwd_nonfinite.cuh), on a tile that crosses the diagonal: NaN / ±Inf in the Q or dO
        // rows that their lse / D flag, or in K. Their elements are zeroed in shared memory here for the
        // products that would multiply a hidden P or dS = 0 by them (Q and dO for dK and dV; K for dQ, put
        // back after it); dO's and K's terms of the visible pairs are added after the products, where
        // fewer registers are live (the terms are non-finite: their order against the finite sum does not
        // matter). Adding them here, from registers, cost d128 spills in the hot loop.
        const bool rare_rows = kCross && rows_flagged;
        const bool rare_k = kCross && kComputeDq && warp_uniform(*sKFlag != 0);
        if (rare_rows || rare_k) {
          __syncthreads();  // every warpgroup's S^T and dP^T have read Q, dO and K
          if (rare_rows) {
            constexpr int kQRows = Traits::kColBlocks * kBlockM;
            tile_nonfinite<Elem, kQRows, kSw128BlockCols, kSw128BlockCols, Traits::kNThreads, true>(
                reinterpret_cast<Elem*>(smem_raw + (sQs - smem_u32(smem_raw))));
            tile_nonfinite<Elem, kQRows, kSw128BlockCols, kSw128BlockCols, Traits::kNThreads, true>(
                reinterpret_cast<Elem*>(smem_raw + (sdOs - smem_u32(smem_raw))));
          }
          if constexpr (kComputeDq) {
            if (rare_k) sw128_zero_nonfinite<Elem, kBlockN, Traits::kColBlocks, Traits::kNThreads>(sK_ptr);
          }
          fence_proxy_async_smem();
          __syncthreads();  // the zeroed tiles are in place for the tensor cores
        }
#pragma unroll
        for (int ks = 0; ks < Traits::kQKSteps; ++ks) p_to_a_operand<Elem>(dpt, ks, dsa[ks]);

        // dK += dS^T Q (and dV on a crossing tile), asynchronous until the wait after dQ.
        if constexpr (!kEarlyDv)
          issue_dv();
        else
          wgmma_fence();
        wgmma_rs_mn_major<kHeadDim, kBlockM, Traits::kQKSteps, Elem>(dk, dsa, sQs);
        wgmma_commit();
        if (kPipelined && has_next) store_bwd_row_stats<kBlockM>(next_stats, sLse2, sD, (use + 1) % kStages);

        if constexpr (kComputeDq) {
          // dS^T to shared memory (sds_addr's layout).
#pragma unroll
          for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const uint32_t packed = dsa[j / 2][(j % 2) * 2 + h];  // dS^T (key, q .. q + 1), packed above
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sds_addr(key_row0 + 8 * h, 8 * j + 2 * t)), "r"(packed)
                           : "memory");
            }
          }
          fence_proxy_async_smem();
          // The previous step's dQ reductions have read sdQ (issued a step ago: no wait in practice).
          if (dq_issuer()) bulk_wait_read<0>();
          __syncthreads();  // both warpgroups' dS^T halves are in place, sdQ is free

          // dQ_i (this warpgroup's piece) = dS K_j over the block's 128 keys.
          if (Traits::kDqSplitCols || wg == 0) {
            float dq[kDqTiles][4];
            const uint32_t sK_b = sK + (Traits::kDqSplitCols ? wg * (Traits::kDqN / 64) * kBlockN * kSw128RowBytes : 0);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < Traits::kDqKSteps; ++ks)
              Wgmma<Traits::kDqN, Elem>::ss_tt(dq, desc_mn_major<kBlockN>(sdS, ks), desc_mn_major<kBlockN>(sK_b, ks), ks > 0);
            wgmma_commit();
            wgmma_wait<0>();
            fence_operands(dq);
            // dQ_i to sdQ (this warpgroup's column blocks; element (row r, column c) at 128-byte row r of
            // block c / 32, 16-byte chunk (c % 32) / 4 swizzled with r % 8 = g), then one thread adds the
            // blocks to the accumulator by bulk reductions: whole 128-byte rows, in L2, off the critical
            // path. Per-thread vector atomics (16 red.global.add.v2.f32 a thread at d128) held this kernel
            // at 436 TFLOP/s done on an H100 (d128, seqlen 8k, L2 busy 71%: Nsight Compute) against the
            // dK/dV kernel's 586 for the same products less dQ.
            const int piece = Traits::kDqSplitCols ? wg : 0;
            const uint32_t sdQ_wg = sdQ + static_cast<uint32_t>(piece * Traits::kDqBoxes * kBlockM * kSw128RowBytes);
            // Column c = 8 j + 2 t: chunk 2 (j % 4) + t / 2 (bit 0 from t), so the swizzled chunk offset is
            // 32 (j % 4) ^ swz with swz = 16 ((t / 2) ^ g). (The empty asm keeps ptxas from computing the
            // addresses before the loop and holding them in registers.)
            uint32_t row_base = sdQ_wg + static_cast<uint32_t>((warp * 16 + g) * kSw128RowBytes + (t % 2) * 8);
            uint32_t swz = static_cast<uint32_t>(((t / 2) ^ g) * 16);
            asm volatile("" : "+r"(row_base), "+r"(swz));
#pragma unroll
            for (int j = 0; j < kDqTiles; ++j)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const uint32_t addr = row_base + static_cast<uint32_t>((j / 4) * kBlockM * kSw128RowBytes +
                                                                       8 * h * kSw128RowBytes) +
                                      ((32u * (j % 4)) ^ swz);
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(dq[j][2 * h]), "f"(dq[j][2 * h + 1])
                             : "memory");
              }
            fence_proxy_async_smem();
            named_barrier_sync(Traits::kDqBarrier0 + wg, 128);  // this warpgroup's piece is in place
            if (dq_issuer()) {
#pragma unroll
              for (int b = 0; b < Traits::kDqBoxes; ++b)
                tma_reduce_add_5d(&maps.dq_accum, sdQ_wg + static_cast<uint32_t>(b * kBlockM * kSw128RowBytes),
                                  (piece * Traits::kDqBoxes + b) * kSw128F32Cols, m0, head, static_cast<int>(batch),
                                  split_tiles ? first_tile : 0);  // the accumulator slice
              bulk_commit_group();
            }
            const int dq_col = piece * Traits::kDqN + 2 * t;
            float* acc = dq_accum + ((batch * p.heads_q + head) * ws.dq_rows + m0 + warp * 16 + g) * kHeadDim + dq_col;
            if (rare_k) {
              // dQ_i[c] += dS_ij K_j[c] for K's non-finite elements (from global memory: shared memory
              // holds zeros there) and the pairs that are visible, dS^T (key j, query q) from sdS. These
              // terms are non-finite: the sum is the same whatever their order against the bulk reductions.
              const Elem* k_tile = k_src();
#pragma unroll 1
              for (int j = 0; j < kBlockN && n0 + j < seqlen_k; ++j) {
                const Elem* krow = k_tile + static_cast<int64_t>(j) * p.k_row_stride;
#pragma unroll
                for (int jt = 0; jt < kDqTiles; ++jt)
#pragma unroll
                  for (int e = 0; e < 2; ++e) {
                    const int col = dq_col + 8 * jt + e;
                    if (col >= head_dim) continue;
                    const float x = to_float(krow[col]);
                    if (isfinite(x)) continue;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                      const int q = warp * 16 + g + 8 * h;
                      if (!mask.hidden(m0 + q, n0 + j))
                        atomicAdd(acc + 8 * h * kHeadDim + 8 * jt + e, sds_read(j, q) * x);
                    }
                  }
              }
            }
          }
        }
        wgmma_wait<0>();  // dV and dK of this tile (their A registers are rewritten next iteration)
        fence_operands(dk);
        fence_operands(dv);
        if (rare_rows || rare_k) __syncthreads();  // every dQ product has read sdS and the zeroed K
        if (rare_rows) {
          // dV_j += P_ij dO_i[c] for the flagged rows' non-finite dO elements (from global memory) and the
          // keys they see. P^T (rounded to Elem, as the tensor core read it) goes through sdS: query i's P
          // for this thread's keys lies in another lane of the quad. (The empty asm keeps ptxas from
          // computing these addresses before the loop and holding them in registers, as it does for dS^T's:
          // d32's dK/dV kernel, at 128 registers, spilled them.)
          int key = key_row0;
          asm volatile("" : "+r"(key));
#pragma unroll
          for (int j = 0; j < kSTiles; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sds_addr(key + 8 * h, 8 * j + 2 * t)),
                           "r"(pa[j / 2][(j % 2) * 2 + h])
                           : "memory");
          __syncthreads();  // P^T is in place
          const Elem* dout = static_cast<const Elem*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride;
#pragma unroll 1
          for (int i = 0; i < kBlockM; ++i) {
            const int row = m0 + i;
            if (!bwd_row_suspect(row, seqlen_q, lse2[i], dvec[i])) continue;
            const float pij[2] = {sds_read(key_row0, i), sds_read(key_row0 + 8, i)};
            add_nonfinite_terms(dv, dout + static_cast<int64_t>(row) * p.do_row_stride, pij, t, head_dim,
                                [&](int h) { return !mask.hidden(row, n0 + key_row0 + 8 * h); });
          }
        }
        if constexpr (kComputeDq) {
          if (rare_k) {
            sw128_restore_nonfinite<Elem, kBlockN, Traits::kColBlocks, Traits::kNThreads>(sK_ptr, k_src(), p.k_row_stride,
                                                                                          seqlen_k - n0, head_dim);
            fence_proxy_async_smem();  // before the next S^T (after the loop's barrier) and the next K load
          }
        }
      };
      if (mask.template crosses<kBlockM, kBlockN>(m0, n0))
        iteration(std::true_type{});
      else
        iteration(std::false_type{});
    }

    // Epilogue: dK * scale and dV for this thread's keys (zeros when no query saw the tile).
    store_dk_dv<Elem>(p, dk, dv, batch, head_kv, n0 + key_row0, t, seqlen_k, head_dim);
    q_tiles += iters;
    // Deterministic mode: this tile's dQ reductions are done before the next tile's add to the same
    // accumulator rows (the order of a slice's sums is the tiles' order).
    if (split_tiles && dq_issuer()) bulk_wait<0>();
    __syncthreads();  // the next K/V tile's loads overwrite sK, sV (read by both warpgroups' dQ)
  }
  if (dq_issuer()) bulk_wait<0>();  // the reductions have read sdQ and written the accumulator
#else
  __trap();  // only the sm_90a build has this kernel; the launcher never selects it elsewhere
#endif
}

}  // namespace fa::cuda::flash::sm90
