// FlashAttention-2 forward, Hopper path (sm_90a): warpgroup MMA (wgmma) with fp32 accumulation.
//
// Grid: one thread block per (query tile of kBlockM rows, head, batch), flattened into blockIdx.x with
// the query tile fastest (the blocks of one head run together and share its K/V in L2); causal, the
// heaviest tiles of a section of heads first (tile_scheduler.cuh). Warpgroups split Q: warpgroup w
// owns rows [64 w, 64 w + 64) of the tile (wgmma M = 64); the running max / sum and the unscaled O
// accumulator stay in registers for the whole K/V loop. Q stays in shared memory (the A operand of
// S = Q K^T is read through a descriptor). Q and the K/V tiles arrive by TMA (tma.cuh), issued by
// thread 0, into 128-byte swizzled tiles (wgmma.cuh); K/V stream through kStages stages, each with an
// mbarrier. The tensor maps' bounds do the masking of the loads: rows past the sequence and columns
// past head_dim arrive as zeros.
// Per K/V tile:
//   S = Q K^T            wgmma m64 n kBlockN k16, A = Q and B = K from shared memory (K-major)
//   mask, online softmax fragment_softmax.cuh (-inf masking before the max, base-2, scale first)
//   O = O * rescale + P V   wgmma m64 n kHeadDim k16, A = P from registers, B = V (MN-major)
// pipelined inside each warpgroup: the softmax of tile j runs while the tensor cores do P V of tile
// j - 1 (FA3's intra-warpgroup overlap), which is why a stage is refilled two tiles late.
// Epilogue: O / l stored (rows >= seqlen_q and columns >= head_dim skipped); lse in natural log; rows
// that see no key: O = 0, lse = +inf, rows whose l is NaN or 0: NaN (fragment_softmax.cuh finish()).
// NaN / ±Inf in V on tiles that cross the diagonal: nonfinite_pv.cuh (tile nb is scanned when it
// lands, corrected after its P V in iteration nb + 1). Head dims below kHeadDim (multiples of 8) run
// with zero-filled columns.
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "common/attention_params.h"
#include "cuda/flash/epilogue.cuh"
#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/mask.cuh"
#include "cuda/flash/nonfinite_pv.cuh"
#include "cuda/flash/hopper/flash_fwd_sm90_traits.h"
#include "cuda/flash/hopper/kv_load.cuh"
#include "cuda/flash/hopper/tma.cuh"
#include "cuda/flash/hopper/wgmma.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/flash/tile_scheduler.cuh"

namespace fa::cuda::flash::sm90 {

// The tensor maps of one call (flash_fwd_sm90.cu builds them): 4-D views (head_dim, seqlen, heads,
// batch) of q, k and v with 64-column x kRows boxes and the 128-byte swizzle, and of out with boxes of
// 64 rows (a consumer warpgroup's; made only for kernels whose epilogue stores through TMA).
struct FwdTensorMaps {
  CUtensorMap q, k, v, o;
};

// One step of the forward's software pipeline, per warpgroup: issues S_nb = Q K_nb^T and, from the
// second tile on, O += P_{nb-1} V_{nb-1} behind it, and returns once S_nb is in `s` (the P V may still
// run, overlapping the caller's softmax of S_nb). Both Hopper forward kernels run their tiles with it.
template <typename Traits, typename Elem>
__device__ __forceinline__ void issue_s_then_pv(float (&s)[Traits::kSTiles][4], float (&o)[Traits::kOTiles][4],
                                                const uint32_t (&pa)[Traits::kPvKSteps][4], uint32_t sQ_wg,
                                                uint32_t sK_tile, uint32_t sV_prev, bool has_prev) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN;
  wgmma_fence();
  wgmma_ss_k_major<kBlockN, kBlockM, kBlockN, Traits::kKSteps, Elem>(s, sQ_wg, sK_tile);
  wgmma_commit();
  if (has_prev) {
    wgmma_rs_mn_major<Traits::kHeadDim, kBlockN, Traits::kPvKSteps, Elem>(o, pa, sV_prev);
    wgmma_commit();
    wgmma_wait<1>();  // S_nb is ready; P_{nb-1} V_{nb-1} may still run
  } else {
    wgmma_wait<0>();
  }
  fence_operands(s);
}

// The epilogue of both Hopper forward kernels, per warpgroup: O / l of its 64 query rows (from m0_wg)
// staged in its rows of a Q tile at `tile` (column blocks Traits::kBlockM rows apart; this thread's
// rows are tile rows tile_row and tile_row + 8, its columns 2 t of each fragment tile; epilogue.cuh
// stage_fwd_rows_sw128) once all its warps are past their S GEMMs, the rows' last readers (named
// barrier `barrier`), then one TMA store per 64-column block from the warpgroup's first thread,
// committed as a bulk group. Returns true on that thread: it must see the store read the tile
// (bulk_wait_read) before the tile is written again or the block exits.
template <typename Traits, typename Mask>
__device__ __forceinline__ bool store_fwd_rows_tma(const float (&o)[Traits::kOTiles][4], const OnlineSoftmax& softmax,
                                                   const Mask& mask, int row0, int t, int tile_row, uint32_t tile,
                                                   int barrier, const CUtensorMap* map, int m0_wg, int head,
                                                   int batch, float* lse) {
  constexpr uint32_t kBlockBytes = static_cast<uint32_t>(Traits::kBlockM * kSw128RowBytes);
  named_barrier_sync(barrier, 128);
  stage_fwd_rows_sw128<typename Traits::Elem>(o, softmax, mask, row0, t, tile, kBlockBytes, tile_row, lse);
  fence_proxy_async_smem();
  named_barrier_sync(barrier, 128);
  if (threadIdx.x % 128 != 0) return false;
#pragma unroll
  for (int cb = 0; cb < Traits::kColBlocks; ++cb)
    tma_store_4d(map, tile + cb * kBlockBytes, cb * kSw128BlockCols, m0_wg, head, batch);
  bulk_commit_group();
  return true;
}

template <typename Traits, bool kIsCausal>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm) flash_fwd_sm90_kernel(const __grid_constant__ AttentionFwdParams p,
                                                                            const __grid_constant__ FwdTensorMaps maps,
                                                                            const __grid_constant__ QueryTileScheduler sched) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Elem = typename Traits::Elem;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kStages = Traits::kStages;
  constexpr int kSTiles = Traits::kSTiles, kOTiles = Traits::kOTiles;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem_base = sw128_aligned_base(smem_raw);
  const uint32_t sQ = smem_base;
  const uint32_t sK = sQ + static_cast<uint32_t>(Traits::kQBytes);
  const uint32_t sV = sK + static_cast<uint32_t>(kStages * Traits::kKvTileBytes);
  const uint32_t bar_q = sV + static_cast<uint32_t>(kStages * Traits::kKvTileBytes);  // then one per stage
  const auto bar_kv = [&](int stage) { return bar_q + 8u * static_cast<uint32_t>(1 + stage); };

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

  const int wg = warp_uniform_int(static_cast<int>(threadIdx.x) / 128);
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int row0 = m0 + wg * Traits::kWgRows + warp * 16 + g;  // this thread's rows: row0, row0 + 8
  const uint32_t sQ_wg = sQ + wg * Traits::kWgRows * kSw128RowBytes;

  // K/V tiles [0, n_blocks): causal skips every tile entirely above the diagonal.
  const KeyRange keys = mask.template query_tile_keys<kBlockM, kBlockN>(m0);
  const int n_end = keys.end, n_blocks = keys.tiles;

  float o[kOTiles][4];
#pragma unroll
  for (int j = 0; j < kOTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
  OnlineSoftmax softmax;
  // First key of the first tile whose V held NaN / ±Inf on the diagonal (nonfinite_pv.cuh); INT_MAX: none.
  int v_nonfinite_from = INT_MAX;

  if (threadIdx.x == 0) {
    mbarrier_init(bar_q, 1);
#pragma unroll
    for (int st = 0; st < kStages; ++st) mbarrier_init(bar_kv(st), 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  // Thread 0 issues every TMA load: tile j of K and V into stage j % kStages, one box per 64 columns.
  const auto issue_kv = [&](int j) {
    load_kv_tile<Traits>(&maps.k, &maps.v, sK, sV, bar_kv, j, head_kv, static_cast<int>(batch));
  };

  if (n_blocks > 0) {
    // Tile j goes to stage j % kStages. Tile j + kStages - 2 is issued at the top of iteration j: its
    // stage last held tile j - 2, whose V was read by the P V of iteration j - 1 (done by then).
    constexpr int kAhead = kStages - 2;
    if (threadIdx.x == 0) {
      mbarrier_arrive_expect_tx(bar_q, static_cast<uint32_t>(Traits::kQBytes));
#pragma unroll
      for (int cb = 0; cb < Traits::kColBlocks; ++cb)
        tma_load_4d(sQ + static_cast<uint32_t>(cb * kBlockM * kSw128RowBytes), &maps.q, bar_q, cb * kSw128BlockCols, m0,
                    head, static_cast<int>(batch));
#pragma unroll
      for (int j = 0; j < kAhead; ++j)
        if (j < n_blocks) issue_kv(j);
    }
    mbarrier_wait(bar_q, 0);

    const auto stage_off = [&](int j) { return static_cast<uint32_t>((j % kStages) * Traits::kKvTileBytes); };
    // Software pipeline (per warpgroup): iteration nb issues S_nb = Q K_nb^T and then O += P_{nb-1} V_{nb-1},
    // runs the softmax of S_nb while the tensor cores do P_{nb-1} V_{nb-1}, then rescales O.
    float s[kSTiles][4];
    uint32_t pa[Traits::kPvKSteps][4];  // P_{nb-1} as the A operand of the P V k-steps
    for (int nb = 0; nb < n_blocks; ++nb) {
      mbarrier_wait(bar_kv(nb % kStages), static_cast<uint32_t>((nb / kStages) & 1));
      const int n0 = nb * kBlockN;
      const bool crosses_diag = mask.template crosses<kBlockM, kBlockN>(m0, n0);
      // Every warpgroup finished iteration nb - 1 after this barrier: tile nb - 2's stage may be
      // refilled. On a tile that crosses the diagonal the barrier also votes on NaN / ±Inf in V tile
      // nb: zeroed now (its P V runs next iteration), added back in the epilogue (nonfinite_pv.cuh).
      if (!crosses_diag) {
        __syncthreads();
      } else if (barrier_zero_tile_nonfinite<Elem, Traits::kColBlocks * kBlockN, kSw128BlockCols, kSw128BlockCols,
                                             Traits::kNThreads, true>(
                     reinterpret_cast<Elem*>(smem_raw + (sV + stage_off(nb) - smem_u32(smem_raw))))) {
        v_nonfinite_from = min(v_nonfinite_from, n0);
      }
      if (threadIdx.x == 0 && nb + kAhead < n_blocks) issue_kv(nb + kAhead);

      issue_s_then_pv<Traits, Elem>(s, o, pa, sQ_wg, sK + stage_off(nb), sV + stage_off(nb - 1), nb > 0);

      if (mask.template fwd_tile_needs_mask<kBlockN>(n0, crosses_diag)) mask.mask_scores(s, n0 + 2 * t, row0);
      float rescale[2];
      softmax.update(s, p.scale_log2, rescale);

      wgmma_wait<0>();
      fence_operands(o);
      scale_rows(o, rescale);
#pragma unroll
      for (int ks = 0; ks < Traits::kPvKSteps; ++ks) p_to_a_operand<Elem>(s, ks, pa[ks]);
    }
    // The last tile's P V.
    wgmma_fence();
    const uint32_t sV_last = sV + stage_off(n_blocks - 1);
    wgmma_rs_mn_major<Traits::kHeadDim, kBlockN, Traits::kPvKSteps, Elem>(o, pa, sV_last);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(o);
  }
  if (v_nonfinite_from < n_end)
    add_nonfinite_v<Elem, kOTiles>(o, v, p.v_row_stride, v_nonfinite_from, n_end, row0, mask, head_dim, lane);

  // Epilogue: O / l and lse (epilogue.cuh). Rows that see no key: O = 0, lse = +inf.
  if constexpr (Traits::kStagedO) {
    // Through the warpgroup's rows of sQ; the block's shared memory must outlive the store's reads.
    if (store_fwd_rows_tma<Traits>(o, softmax, mask, row0, t, warp * 16 + g, sQ_wg, Traits::kEpilogueBarrier0 + wg, &maps.o,
                                   m0 + wg * Traits::kWgRows, head, static_cast<int>(batch), lse))
      bulk_wait_read<0>();
  } else {
    write_fwd_rows<Elem>(o, softmax, mask, row0, t, out, p.o_row_stride, lse, head_dim);
  }
#else
  __trap();  // only the sm_90a build has this kernel; the launcher never selects it elsewhere
#endif
}

}  // namespace fa::cuda::flash::sm90
