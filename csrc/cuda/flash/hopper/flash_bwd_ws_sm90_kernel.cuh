// FlashAttention-2 backward, Hopper warp-specialized single kernel (sm_90a): FA3's layout for head dims
// 64 and 128, causal or not; deterministic mode by ordered dQ reductions. Query tiles of 64 rows at
// head dim 128, 128 at 64 (kBlockM: the wgmma N of S^T and dP^T).
//
// One thread block per (K/V tile of kBlockN = 128 keys, KV head, batch), as flash_bwd_sm90_kernel.cuh;
// the loop runs over the query heads of the KV head's group and their query tiles.
// Warpgroup 0 is the producer: it gives up registers (setmaxnreg). Its warp 0 issues the TMA loads
// (K and V once; per step Q_i and dO_i into two stages, each stage refilled once the consumers
// release it on its empty barrier) and loads the step's lse / D rows (lane r rows r, r + 32, ...), all
// completing the stage's full barrier. Its warp 1 writes dQ: per step and consumer warpgroup, once
// the warpgroup has staged its dQ piece, one bulk reduction per 32-column block into the fp32
// accumulator, then it frees the staging piece (deterministic mode: warp 1 consumer 0's pieces and
// warp 3 consumer 1's, each piece's place taking its own turns). A consumer stages its pieces through
// kDqBufs buffers in turn: two at head dim 128 without a causal mask (atomic mode), else one.
// Warpgroups 1 and 2 are the consumers: warpgroup 1 + w owns keys [64 w, 64 w + 64) of the tile, its
// dK and dV in registers. Per step: S^T and dP^T (committed separately), P^T while dP^T runs, dV
// issued, dS^T, dK issued, dS^T into shared memory (double-buffered; full / empty mbarriers of both
// consumers), then its dQ piece = dS K_j (d128: a half of the columns; d64: a half of the rows, all 64
// columns) over the block's 128 keys: consumer 1 this step's, consumer 0 the previous
// step's, so that neither waits for the other's dS^T of the same step and consumer 1 may run up to a
// step behind (no barrier holds them in lockstep). Then the stage is released and the dQ piece staged
// for the writer. The producer runs a stage ahead. At the end each consumer stages its dK / dV in a
// Q / dO stage (free once the last two steps are released) and one of its threads stores them with
// TMA, except in the d64 not-causal kernel that is not rotated (kDkDvTma, measured there).
// Causal: per query head the steps start at the first query tile that sees a key of the tile
// (mask.cuh first_query_tile), and the tiles that cross the diagonal mask P^T and dS^T per element.
// Without a causal mask the only hidden pairs are the tails (keys >= seqlen_k, rows >= seqlen_q),
// which TMA fills with zeros: no NaN / ±Inf from the inputs meets a hidden P or dS = 0. With it, the
// crossing tiles hold hidden pairs with real data, and bwd_nonfinite.cuh's rare path runs there:
//   - Q and dO: on a crossing step the producer's warp 0 votes on the rows' lse / D
//     (bwd_row_suspect); if any row is flagged it waits for the stage's TMA (its own barrier on
//     crossing steps), zeroes the NaN / ±Inf elements of the flagged rows of Q and dO in place (the
//     stage serves this step only), and only then completes the stage's full barrier. The consumers
//     add dO's terms of the visible pairs to dV after the dV product (P^T through the dS^T buffer).
//   - K: the producer's warps 2 and 3 scan the resident K tile once, note its rows with NaN / ±Inf
//     and, if any, copy it to sK0 with those elements zeroed; dQ of a crossing step then reads sK0,
//     and the consumer adds K's terms of the visible pairs to the accumulator by atomics (the terms
//     are non-finite: their order against the bulk reductions does not matter).
// Nsight Compute (H100, bf16, B2 H16 S8192, 2026-11-26; consumers in lockstep at a named dS barrier
// then): 4.93 ms at 1.81 GHz, 557 TFLOP/s by FA2's count, tensor pipe 56.5% busy. Reading lse / D
// into registers before the wgmma waits and deferring the dQ piece's proxy fence by a step moved the
// stall samples elsewhere and bought nothing (queued 5.448 vs 5.444 ms at 8k). Consumer 0 taking the
// previous step's dQ (the skew above) bought 1-4% (queued, 1k / 2k / 8k: 0.950 / 1.570 / 5.27 ms
// against 0.966 / 1.61 / 5.48) and costs deterministic mode 1-2%; starting consumer 1 half a step
// late on top of it bought nothing more (5.19 against 5.18 ms at 8k). S^T and dP^T accumulating onto
// -lse2 / scale_log2 and -D (the rows read before the products are issued, not after their waits)
// bought 2-3% (queued, 1k / 2k / 8k, three runs each: 0.909-0.918 / 1.50-1.56 / 5.08-5.11 ms against
// 0.928-0.936 / 1.54-1.58 / 5.24-5.25). Causal (queued, 512 / 1k / 2k / 8k): 0.553-0.566 / 0.725-0.734 /
// 1.078 / 3.21-3.27 ms against the two kernels' 0.547-0.552 / 0.750-0.759 / 1.18 / 3.75-3.77;
// deterministic with descending turns 1.04-1.11x the atomic time (ascending: 1.35-1.92x).
// Head dim 64 with 128-row steps (the dQ product M = 64 rows, K = 128 keys: half the dQ reductions a
// FLOP of 64-row steps, whose consumers each reduced a 64 x 64 piece over their own 64 keys): H200,
// bf16, queued, 1.11-1.24x the TFLOP/s of 64-row steps without a causal mask, 1.08-1.16x causal,
// deterministic 1.09-1.28x (flash_configs.h kBwdWsSm90Configs).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/attention_params.h"
#include "cuda/flash/bwd_nonfinite.cuh"
#include "cuda/flash/dq_accum.cuh"
#include "cuda/flash/epilogue.cuh"
#include "cuda/flash/flash_configs.h"
#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/hopper/flash_bwd_sm90_kernel.cuh"
#include "cuda/flash/hopper/kv_load.cuh"
#include "cuda/flash/hopper/tma.cuh"
#include "cuda/flash/hopper/wgmma.cuh"
#include "cuda/flash/mask.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/flash/tile_scheduler.cuh"
#include "cuda/smem_limits.h"

namespace fa::cuda::flash::sm90 {

template <int kHeadDim_, typename Elem_, bool kIsCausal_, int kBlockM_>
struct FlashBwdWsSm90Traits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kIsCausal = kIsCausal_;
  static constexpr int kConsumers = 2;
  static constexpr int kNThreads = 128 * (1 + kConsumers);
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kWgKeys = 64;                       // wgmma M of S^T: keys per consumer
  static constexpr int kBlockN = kWgKeys * kConsumers;     // keys per block
  static constexpr int kBlockM = kBlockM_;                 // query rows per step (wgmma N of S^T)
  static constexpr int kStages = 2;                        // Q / dO / lse / D stages
  // setmaxnreg budgets: the launch gives each thread 168 registers (65,536 / 384, in steps of 8), and
  // what the producer gives up is all the consumers can take: 128 x 24 + 256 x 240 = 128 x 40 + 256 x
  // 232 = 384 x 168. ptxas (sm_90a) at 24 / 240: 0-20 bytes of spill stores, 0-24 of loads.
  static constexpr int kLaunchRegs = (65536 / kNThreads) / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;

  // dQ = dS K over the block's 128 keys, split between the consumers (each needs both dS^T halves): at
  // head dim 128 (64-row steps) by 64-column halves, at 64 (128-row steps) by rows (kDqSplitRows:
  // consumer c rows [64 c, 64 c + 64), all 64 columns). A consumer's piece is kDqRows x kDqN.
  static constexpr bool kDqSplitRows = kBlockM == 128;
  static constexpr int kDqRows = 64;                     // wgmma M of dQ
  // Causal with 128-row steps: dS^T = P^T (dP^T - D) with P^T from its packed A operand (rounded as
  // the dV product read it) rather than the fp32 P^T, which then dies at the packing: S^T and dP^T take
  // 64 registers each, and ptxas (sm_90a, 240 registers) spills 168 / 248 bytes (stores / loads) with
  // the fp32 P^T live, 20 / 24 with the packed one. Without a causal mask neither spills: fp32.
  static constexpr bool kDsFromPackedP = kBlockM == 128 && kIsCausal;
  // Causal: the dQ terms of K's NaN / ±Inf elements (add_k_nonfinite_dq_terms, a rare path) called out
  // of line at head dim 128, inlined at 64. H100, bf16, queued ms, two rounds each, against the build
  // that inlined it everywhere (2026-11-27): d128 causal out of line 0.93-0.99x the time at 512-16k (4k
  // 1.65-1.68 against 1.76, 8k 3.00-3.02 against 3.20-3.21, 16k 5.52-5.54 against 5.95-5.97),
  // deterministic 0.95-0.99x; d64 causal out of line 1.03x at 8k and 1.06x at 16k although its spills
  // fell from 24 / 60 bytes to 8 / 8, inlined 0.98-0.99x.
  static constexpr bool kRareDqOutOfLine = kHeadDim == 128;
  // The dV terms of the flagged rows' dO elements (add_dv_nonfinite_rows, causal) stay inlined: out of
  // line, with dV copied through local memory around the call, ptxas spills as much at d64 (20 / 24
  // bytes) and more at d128.
  static constexpr int kDqN = kDqSplitRows ? kHeadDim : kHeadDim / kConsumers;  // dQ columns per consumer
  static constexpr int kMmaK = 16;
  static constexpr int kKSteps = kHeadDim / kMmaK;
  static constexpr int kQKSteps = kBlockM / kMmaK;
  static constexpr int kDqKSteps = kBlockN / kMmaK;
  static constexpr int kSTiles = kBlockM / 8;
  static constexpr int kKvTiles = kHeadDim / 8;
  static constexpr int kDqTiles = kDqN / 8;
  static constexpr int kDqBoxes = kDqN / 32;               // 32-column blocks of a consumer's dQ piece

  static constexpr int kColBlocks = kHeadDim / 64;
  static constexpr size_t kKvTileBytes = static_cast<size_t>(kColBlocks) * kBlockN * 128;
  static constexpr size_t kQTileBytes = static_cast<size_t>(kColBlocks) * kBlockM * 128;
  // dS^T: [kBlockM / 64 query blocks][keys][64 queries] (ds_t_offset).
  static constexpr size_t kDsBytes = static_cast<size_t>(kBlockM / 64) * kBlockN * 128;
  // dQ staging buffers per consumer: two at head dim 128 without a causal mask, so that a consumer
  // stages its next piece while the writer still reduces the last one (causal, sK0 leaves no room).
  // H200, bf16, back to back, two rounds each in turns with one buffer (2026-11-28): d128 not causal
  // 0.95-0.98x the time at 1k-16k (8k 4.99-5.04 against 5.10-5.12 ms; deterministic mode's rotated
  // walks keep one, in the kernel); d64 not causal (the build without the dynamic base's alignment
  // slack) 1.06-1.10x, deterministic 1.00-1.01x: with every block of a KV head adding to the same
  // query tile at once (the walks are not rotated), a consumer running further ahead crowds the
  // reductions.
  static constexpr int kDqBufs = kHeadDim == 128 && !kIsCausal ? 2 : 1;
  static constexpr size_t kDqPieceBytes = static_cast<size_t>(kDqRows) * kDqN * sizeof(float);
  // Every consumer's dQ pieces, kDqRows x kDqN fp32 each (the step's 64 x 128 tile at d128, 128 x 64 at
  // d64), [kDqBufs][kConsumers].
  static constexpr size_t kDqStageBytes = static_cast<size_t>(kDqBufs) * kConsumers * kDqPieceBytes;
  // Causal: K with its NaN / ±Inf elements zeroed, for dQ on the crossing steps (the rare path).
  static constexpr size_t kK0Bytes = kIsCausal ? kKvTileBytes : 0;
  // Layout: sK | sV | sQ [kStages] | sdO [kStages] | sdS [2] | sdQ | sK0 (each 1024-aligned) | lse2, D
  // [kStages][kBlockM] floats | flag words (kRowFlags, kKRowFlags, kKFlag) | mbarriers: K/V full, Q
  // full [kStages], Q empty [kStages], dQ full [kDqBufs][kConsumers], dQ empty [kDqBufs][kConsumers],
  // dS full [2], dS empty [2], Q loaded [kStages], K scanned; +1024 to align the dynamic base.
  static constexpr size_t kFloatBytes = 2 * kStages * kBlockM * sizeof(float);
  static constexpr int kRowWords = kBlockM / 32;            // flag words of a step's rows
  static constexpr int kRowFlags = 0;                       // [kStages][kRowWords]: the step's flagged rows
  static constexpr int kKRowFlags = kRowWords * kStages;    // [kBlockN / 32]: K rows holding NaN / ±Inf
  static constexpr int kKFlag = kKRowFlags + kBlockN / 32;  // whether sK0 holds the zeroed copy
  static constexpr size_t kFlagBytes = kIsCausal ? 4 * static_cast<size_t>(kKFlag + 2) : 0;
  static constexpr int kDqBarriers = kDqBufs * kConsumers;  // full (and empty) barriers of the dQ pieces
  static constexpr size_t kBarrierBytes = 8 * (1 + 3 * kStages + 2 * kDqBarriers + 4 + 1);
  static constexpr size_t kSmemBytes = 2 * kKvTileBytes + 2 * kStages * kQTileBytes + 2 * kDsBytes + kDqStageBytes +
                                       kK0Bytes + kFloatBytes + kFlagBytes + kBarrierBytes + 1024;
  static constexpr int kScanBarrier = 1;   // named barrier of the producer's warps 2 and 3 (the K scan)
  static constexpr int kRareBarrier0 = 2;  // + consumer: the rare path's P^T exchange
  static constexpr int kEpilogueBarrier0 = 4;  // + consumer: its dK / dV staged for the TMA store


  static_assert(sizeof(Elem) == 2, "the wgmma path takes fp16 or bf16");
  static_assert((kHeadDim == 128 && kBlockM == 64) || (kHeadDim == 64 && kBlockM == 128),
                "head dim 128 with 64-row steps (dQ split by columns) or 64 with 128 (by rows)");
  static_assert(2 * kColBlocks * 8 <= 32, "the rare path's row zeroing gives one 16-byte chunk of a Q / dO row to a lane");
  static_assert(kFlagBytes % 8 == 0, "the mbarriers stay 8-byte aligned");
  static_assert(kConsumers == kBwdWsDqTurnsPerTile, "deterministic mode: a turn per consumer's dQ piece");
  static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kLaunchRegs * kNThreads,
                "setmaxnreg: the consumers take only what the producer gives up");
  static_assert(kSmemBytes <= kSm90MaxSmemPerBlock, "shared memory exceeds the sm_90 per-block limit");
};

// The byte offset of dS^T element (key, query q) in a dS^T / P^T buffer of kKeys keys: blocks of 64
// queries, each a key per 128-byte row with its 64 queries along it, 16-byte chunks swizzled with the
// key (the layout the dQ product reads: an MN-major SW128 tile).
template <int kKeys>
__device__ __forceinline__ uint32_t ds_t_offset(int key, int q) {
  return static_cast<uint32_t>((q / 64) * kKeys * kSw128RowBytes + key * kSw128RowBytes +
                               ((((q % 64) / 8) ^ (key % 8)) * 16) + (q % 8) * 2);
}
// The element (key, query q) of the dS^T / P^T buffer of kKeys keys at sdS_b, as the tensor core read it.
template <typename Elem, int kKeys>
__device__ __forceinline__ float ds_t_read(uint32_t sdS_b, int key, int q) {
  uint16_t bits;
  asm volatile("ld.shared.u16 %0, [%1];\n" : "=h"(bits) : "r"(sdS_b + ds_t_offset<kKeys>(key, q)));
  return to_float(elem_from_bits<Elem>(bits));
}

// Causal, a crossing step whose K tile holds NaN / ±Inf (sK0 held zeros there for the dQ product):
// dQ_i[c] += dS_ij K_j[c] for those elements at the visible pairs (bwd_nonfinite.cuh, step 2), K from
// global memory, dS^T from buffer sdS_b (ds_t_offset's layout), added to the fp32 accumulator by
// atomics. The keys are the bits set in words [w0, w1) of key_flags, this thread's columns
// col0 + 8 (c / 2) + c % 2 and rows q0, q0 + 8 of the query tile at m0.
// Inlined into the consumers' step loop, its loop state raises their register pressure on every step:
// ptxas (sm_90a) spills 76 / 120 bytes (stores / loads) at d128 causal, 36 / 80 with it out of line
// (16 / 16 without a causal mask); Nsight Compute (d128 causal 8k, H100) counted 22% more consumer
// instructions a step than without a causal mask, in spill reloads and recomputed wgmma descriptors.
template <typename Traits, typename Mask>
__device__ __forceinline__ void add_k_nonfinite_dq_terms(const uint32_t* key_flags, int w0, int w1,
                                                         const typename Traits::Elem* k_tile, int64_t k_row_stride,
                                                         float* acc, uint32_t sdS_b, int col0, int head_dim, int q0,
                                                         int m0, int n0, const Mask& mask) {
  using Elem = typename Traits::Elem;
#pragma unroll 1
  for (int w = w0; w < w1; ++w)
#pragma unroll 1
    for (uint32_t bits = key_flags[w]; bits != 0u; bits &= bits - 1u) {
      const int j = 32 * w + __ffs(static_cast<int>(bits)) - 1;
      const Elem* krow = k_tile + static_cast<int64_t>(j) * k_row_stride;
#pragma unroll 1
      for (int c = 0; c < 2 * Traits::kDqTiles; ++c) {  // column col0 + 8 (c / 2) + c % 2
        const int off = 8 * (c / 2) + c % 2;
        if (col0 + off >= head_dim) continue;
        const float x = to_float(krow[col0 + off]);
        if (isfinite(x)) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int q = q0 + 8 * h;
          if (mask.hidden(m0 + q, n0 + j)) continue;
          atomicAdd(acc + 8 * h * Traits::kHeadDim + off, ds_t_read<Elem, Traits::kBlockN>(sdS_b, j, q) * x);
        }
      }
    }
}

// The same, out of line (Traits::kRareDqOutOfLine): the mask rebuilt here.
template <typename Traits>
__device__ __noinline__ void add_k_nonfinite_dq_terms_call(const uint32_t* key_flags, int w0, int w1,
                                                           const typename Traits::Elem* k_tile, int64_t k_row_stride,
                                                           float* acc, uint32_t sdS_b, int col0, int head_dim, int q0,
                                                           int m0, int n0, int seqlen_q, int seqlen_k) {
  const AttentionMask<Traits::kIsCausal> mask(seqlen_q, seqlen_k);
  add_k_nonfinite_dq_terms<Traits>(key_flags, w0, w1, k_tile, k_row_stride, acc, sdS_b, col0, head_dim, q0, m0, n0, mask);
}

// Causal, a crossing step whose query rows the producer flagged (their dO zeroed for the products):
// dV_j[c] += P_ij dO_i[c] for the flagged rows' NaN / ±Inf dO elements at the visible pairs
// (bwd_nonfinite.cuh, step 2), dO from global memory (its head's rows from dout), P^T from buffer
// sdS_buf (ds_t_offset's layout), this thread's keys key_row0 and key_row0 + 8 of the tile at n0. The
// flags are bits i of row_flags[i / 32] for the rows m0 + i.
template <typename Traits, typename Mask>
__device__ __forceinline__ void add_dv_nonfinite_rows(float (&dv)[Traits::kKvTiles][4], const uint32_t* row_flags,
                                                      const typename Traits::Elem* dout, int64_t do_row_stride,
                                                      uint32_t sdS_buf, int key_row0, int t, int head_dim, int m0, int n0,
                                                      const Mask& mask) {
  using Elem = typename Traits::Elem;
#pragma unroll 1
  for (int i = 0; i < Traits::kBlockM; ++i) {
    if (((row_flags[i / 32] >> (i % 32)) & 1u) == 0u) continue;
    const int row = m0 + i;
    const float pij[2] = {ds_t_read<Elem, Traits::kBlockN>(sdS_buf, key_row0, i),
                          ds_t_read<Elem, Traits::kBlockN>(sdS_buf, key_row0 + 8, i)};
    add_nonfinite_terms(dv, dout + static_cast<int64_t>(row) * do_row_stride, pij, t, head_dim,
                        [&](int h) { return !mask.hidden(row, n0 + key_row0 + 8 * h); });  // bwd_nonfinite.cuh
  }
}


// kRotated (deterministic, not causal): the blocks walk the query tiles rotated (tile_scheduler.cuh).
template <typename Traits, bool kRotated = false>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    flash_bwd_ws_sm90_kernel(const __grid_constant__ AttentionBwdParams p, const __grid_constant__ BwdTensorMaps maps,
                             const FlashBwdWorkspace ws) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Elem = typename Traits::Elem;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kHeadDim = Traits::kHeadDim;
  constexpr int kStages = Traits::kStages, kSTiles = Traits::kSTiles, kKvTiles = Traits::kKvTiles;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem_base = sw128_aligned_base(smem_raw);
  const uint32_t sK = smem_base;
  const uint32_t sV = sK + static_cast<uint32_t>(Traits::kKvTileBytes);
  const uint32_t sQ = sV + static_cast<uint32_t>(Traits::kKvTileBytes);
  const uint32_t sdO = sQ + static_cast<uint32_t>(kStages * Traits::kQTileBytes);
  const uint32_t sdS = sdO + static_cast<uint32_t>(kStages * Traits::kQTileBytes);
  const uint32_t sdQ = sdS + static_cast<uint32_t>(2 * Traits::kDsBytes);
  const uint32_t sK0 = sdQ + static_cast<uint32_t>(Traits::kDqStageBytes);
  const uint32_t float_base = sK0 + static_cast<uint32_t>(Traits::kK0Bytes);
  const uint32_t flag_base = float_base + static_cast<uint32_t>(Traits::kFloatBytes);
  const uint32_t full_kv = flag_base + static_cast<uint32_t>(Traits::kFlagBytes);
  const auto full_q = [&](int st) { return full_kv + 8u * static_cast<uint32_t>(1 + st); };
  const auto empty_q = [&](int st) { return full_kv + 8u * static_cast<uint32_t>(1 + kStages + st); };
  // Consumer c's dQ piece of its k-th step: buffer k % kDqBufs, that buffer's use k / kDqBufs. The
  // rotated walks (deterministic mode) stage through one buffer: with two, d128 deterministic ran
  // 1.02-1.04x the time at 4k-8k (H200, bf16, 2026-11-28).
  constexpr int kDqBufs = kRotated ? 1 : Traits::kDqBufs;
  constexpr int kDqBarriers = kDqBufs * Traits::kConsumers;  // <= Traits::kDqBarriers (the smem layout's)
  const auto dq_buf = [](int k) { return k % kDqBufs; };
  const auto dq_use_parity = [](int k) { return static_cast<uint32_t>(k / kDqBufs) & 1u; };
  const auto full_dq = [&](int c, int k) {
    return full_kv + 8u * static_cast<uint32_t>(1 + 2 * kStages + dq_buf(k) * Traits::kConsumers + c);
  };
  const auto empty_dq = [&](int c, int k) {
    return full_kv + 8u * static_cast<uint32_t>(1 + 2 * kStages + kDqBarriers + dq_buf(k) * Traits::kConsumers + c);
  };
  // dS^T buffer b: both consumers' halves stored (full), both consumers' dQ products done with it (empty).
  const auto full_ds = [&](int b) {
    return full_kv + 8u * static_cast<uint32_t>(1 + 2 * kStages + 2 * kDqBarriers + b);
  };
  const auto empty_ds = [&](int b) {
    return full_kv + 8u * static_cast<uint32_t>(1 + 2 * kStages + 2 * kDqBarriers + 2 + b);
  };
  // Causal crossing steps: stage st's TMA completes here, the producer's warp 0 then the full barrier.
  const auto loaded_q = [&](int st) {
    return full_kv + 8u * static_cast<uint32_t>(1 + 2 * kStages + 2 * kDqBarriers + 4 + st);
  };
  const uint32_t k_scanned = full_kv + 8u * static_cast<uint32_t>(1 + 3 * kStages + 2 * kDqBarriers + 4);
  const auto smem_ptr = [&](uint32_t addr) { return smem_raw + (addr - smem_u32(smem_raw)); };
  float* sLse2 = reinterpret_cast<float*>(smem_ptr(float_base));
  float* sD = sLse2 + kStages * kBlockM;
  uint32_t* const sFlags = reinterpret_cast<uint32_t*>(smem_ptr(flag_base));
  // Consumer c's first 32-column block of dQ (head dim 64: every piece holds columns 0-63) and first
  // row in the step's query tile (kDqSplitRows: 64 c).
  const auto dq_col_box = [](int c) { return Traits::kDqN == kHeadDim ? 0 : c * Traits::kDqBoxes; };
  const auto dq_row0 = [](int c) { return Traits::kDqSplitRows ? c * Traits::kDqRows : 0; };
  // Consumer c's dQ piece of its k-th step: kDqBoxes column blocks of kDqRows rows.
  const auto sdq_piece = [&](int c, int k) {
    return sdQ + static_cast<uint32_t>((dq_buf(k) * Traits::kConsumers + c) * Traits::kDqPieceBytes);
  };

  const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = static_cast<int>(p.seqlen_k);
  const int head_dim = static_cast<int>(p.head_dim);
  const int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
  const KeyTileWork tile = key_tile_work(p, static_cast<uint32_t>(n_blocks));  // tile_scheduler.cuh
  // Deterministic and causal (kDescending): the K/V tiles that add to a query tile take their turns
  // from its last one (on the diagonal) down to tile 0, and the blocks of a KV head take the tiles last
  // first, so that a block waits only on blocks launched before it. Ascending, tile n's block would start
  // at its diagonal query tile only after tiles 0 .. n - 1 had added theirs: a sweep from tile 0 down the
  // diagonal, at 1.35-1.92x the atomic time (bf16 d128, 512-16k, H100).
  const bool descending = Traits::kIsCausal && p.deterministic;
  const int n_tile = descending ? n_blocks - 1 - tile.first_tile : tile.first_tile;
  const int n0 = n_tile * kBlockN, head_kv = tile.head_kv;
  const int64_t batch = tile.batch;
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const AttentionMask<Traits::kIsCausal> mask(seqlen_q, seqlen_k);  // mask.cuh
  const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
  const int m_begin = mask.template first_query_tile<kBlockM>(n0, m_blocks);
  const int m_count = m_blocks - m_begin;  // query tiles per query head that see the block's keys
  const int iters = m_count * group;
  // Rotated: each query head's walk starts at the block's rotated_start and wraps around.
  static_assert(!(kRotated && Traits::kIsCausal), "the causal walks are not rotated");
  const int m_start = kRotated ? rotated_start(n_tile, n_blocks, m_count) : 0;
  // Step it's query head, query tile and first row, and whether the tile crosses the causal diagonal.
  const auto step_head = [&](int it) { return head_kv * group + it / m_count; };
  const auto step_m_block = [&](int it) {
    if constexpr (!kRotated) return m_begin + it % m_count;
    const int m = it % m_count + m_start;
    return m_begin + (m < m_count ? m : m - m_count);
  };
  const auto step_m0 = [&](int it) { return step_m_block(it) * kBlockM; };
  const auto crossing = [&](int m0) { return mask.template crosses<kBlockM, kBlockN>(m0, n0); };

  if (threadIdx.x == 0) {
    mbarrier_init(full_kv, 1);
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbarrier_init(full_q(st), 1 + 32);                        // the TMA's expect_tx, the lse / D lanes
      mbarrier_init(empty_q(st), Traits::kConsumerThreads);  // every consumer thread
    }
#pragma unroll
    for (int k = 0; k < kDqBufs; ++k)
#pragma unroll
      for (int c = 0; c < Traits::kConsumers; ++c) {
        mbarrier_init(full_dq(c, k), 128);  // every thread of consumer c, after its fence
        mbarrier_init(empty_dq(c, k), 1);   // the writer, once its reductions have read the piece
      }
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      mbarrier_init(full_ds(b), Traits::kConsumerThreads);   // every consumer thread, after its fence
      mbarrier_init(empty_ds(b), Traits::kConsumerThreads);  // every consumer thread, its dQ product done
    }
    if constexpr (Traits::kIsCausal) {
#pragma unroll
      for (int st = 0; st < kStages; ++st) mbarrier_init(loaded_q(st), 1);  // the TMA's expect_tx
      mbarrier_init(k_scanned, 64);                                        // the producer's warps 2 and 3
#pragma unroll
      for (int w = Traits::kKRowFlags; w <= Traits::kKFlag; ++w) sFlags[w] = 0u;
    }
    fence_mbarrier_init();
  }
  __syncthreads();  // the last block-wide barrier: the roles part here

  const int wg = warp_uniform_int(static_cast<int>(threadIdx.x) / 128);
  const int lane = static_cast<int>(threadIdx.x) % 32;
  if (wg == 0) {
    setmaxnreg_dec<Traits::kProducerRegs>();
    const int warp = static_cast<int>(threadIdx.x) / 32;
    // Consumer c's dQ piece of a step (rows from m0 of query head `head`) added to the accumulator by
    // bulk reductions, one per 32-column block; the piece is free again once they have read it. One lane.
    const auto add_dq_piece = [&](int c, int it, int m0, int head) {
#pragma unroll
      for (int b = 0; b < Traits::kDqBoxes; ++b)
        tma_reduce_add_5d(&maps.dq_accum, sdq_piece(c, it) + static_cast<uint32_t>(b * Traits::kDqRows * kSw128RowBytes),
                          (dq_col_box(c) + b) * kSw128F32Cols, m0 + dq_row0(c), head, static_cast<int>(batch), 0);
      bulk_commit_group();
      bulk_wait_read<0>();
      mbarrier_arrive(empty_dq(c, it));
    };
    // This K/V tile's turn at step it's query tile (deterministic): rotated, the blocks' order of arrival
    // there; else its index, or descending its distance from the query tile's last K/V tile.
    const auto dq_turn_position = [&](int it) {
      if constexpr (kRotated) return rotated_turn(n_tile, n_blocks, step_m_block(it) - m_begin, m_count);
      const int last = mask.template query_tile_keys<kBlockM, kBlockN>(step_m0(it)).tiles - 1;
      return descending ? last - n_tile : n_tile;
    };
    if (warp == 0) {
      // Loads. Stage st's use u = it / kStages: its empty barrier's previous phase (parity of use u - 1;
      // a fresh barrier passes the first kStages waits).
      if (iters > 0 && lane == 0) {
        prefetch_tensor_map(&maps.q);
        prefetch_tensor_map(&maps.dout);
        load_resident_kv_tile<Traits>(&maps.k, &maps.v, sK, sV, full_kv, n0, head_kv, static_cast<int>(batch));
      }
      uint32_t loaded_parity = 0;  // causal: bit st, the parity of loaded_q(st)'s next use
      for (int it = 0; it < iters; ++it) {
        const int st = it % kStages;
        mbarrier_wait(empty_q(st), static_cast<uint32_t>(((it / kStages) & 1) ^ 1));
        const int head = step_head(it), m0 = step_m0(it);
        const bool cross = crossing(m0);
        if (lane == 0)
          load_query_tiles<Traits>(&maps.q, &maps.dout, sQ, sdO, cross ? loaded_q(st) : full_q(st), st, m0, head,
                                   static_cast<int>(batch));
        const int64_t stat0 = (batch * p.heads_q + head) * p.seqlen_q + m0 + lane;
#pragma unroll
        for (int h = 0; h < kBlockM / 32; ++h) {
          const int r = lane + 32 * h;
          const bool valid = m0 + r < seqlen_q;
          sLse2[st * kBlockM + r] = valid ? p.lse_in[stat0 + 32 * h] * kLog2e : INFINITY;
          sD[st * kBlockM + r] = valid ? ws.d[stat0 + 32 * h] : 0.0f;
        }
        if constexpr (Traits::kIsCausal) {
          if (cross) {
            // The rare path's rows (bwd_nonfinite.cuh bwd_row_suspect): flagged ones get their NaN / ±Inf
            // elements of Q and dO zeroed once the stage has landed; lane 0's second arrival stands in for
            // the TMA's.
            uint32_t rows[kBlockM / 32];
#pragma unroll
            for (int h = 0; h < kBlockM / 32; ++h) {
              const int r = st * kBlockM + lane + 32 * h;
              rows[h] = __ballot_sync(~0u, bwd_row_suspect(m0 + lane + 32 * h, seqlen_q, sLse2[r], sD[r]));
            }
            if (lane == 0) {
#pragma unroll
              for (int h = 0; h < kBlockM / 32; ++h) sFlags[Traits::kRowFlags + st * Traits::kRowWords + h] = rows[h];
            }
            mbarrier_wait(loaded_q(st), (loaded_parity >> st) & 1u);
            loaded_parity ^= 1u << st;
            uint32_t any_row = 0u;
#pragma unroll
            for (int h = 0; h < kBlockM / 32; ++h) any_row |= rows[h];
            if (any_row != 0u) {
              // Lane l: 16-byte chunk l % 8 of column block (l / 8) % kColBlocks of the row in Q (l < 8
              // kColBlocks) or dO; lanes from 16 kColBlocks on have none.
              constexpr int kRowChunks = 8 * Traits::kColBlocks;
              const bool has_chunk = lane < 2 * kRowChunks;
              const uint32_t lane_off =
                  static_cast<uint32_t>(st * Traits::kQTileBytes +
                                        ((lane / 8) % Traits::kColBlocks) * kBlockM * kSw128RowBytes) +
                  static_cast<uint32_t>((lane % 8) * 16);
              const uint32_t lane_base = (lane < kRowChunks ? sQ : sdO) + lane_off;
#pragma unroll
              for (int h = 0; h < kBlockM / 32; ++h)
                for (uint32_t bits = has_chunk ? rows[h] : 0u; bits != 0u; bits &= bits - 1u) {
                  const int r = 32 * h + __ffs(static_cast<int>(bits)) - 1;
                  uint4* chunk =
                      reinterpret_cast<uint4*>(smem_ptr(lane_base + static_cast<uint32_t>(r * kSw128RowBytes)));
                  const uint4 w = *chunk;
                  if (chunk_nonfinite<Elem>(w))
                    *chunk = make_uint4(word_zero_nonfinite<Elem>(w.x), word_zero_nonfinite<Elem>(w.y),
                                        word_zero_nonfinite<Elem>(w.z), word_zero_nonfinite<Elem>(w.w));
                }
              fence_proxy_async_smem();  // the zeroed rows before the consumers' products
            }
            __syncwarp();
            if (lane == 0) mbarrier_arrive(full_q(st));
          }
        }
        mbarrier_arrive(full_q(st));
      }
    } else if (warp == 1 && !p.deterministic) {
      // dQ writer: per step, each consumer's piece once staged (its buffer's full barrier, the parity of its use),
      // added by bulk reductions; the piece is free again once they have read it.
      for (int it = 0; it < iters; ++it) {
        const int head = step_head(it), m0 = step_m0(it);
#pragma unroll
        for (int c = 0; c < Traits::kConsumers; ++c) {
          mbarrier_wait(full_dq(c, it), dq_use_parity(it));
          if (lane == 0) add_dq_piece(c, it, m0, head);
          __syncwarp();
        }
      }
      // No wait for the last reductions to complete: each piece's were waited on until they had read
      // it, and their writes are visible to the conversion kernel after this grid (the block's exit
      // no longer waits for the L2's reduction latency).
    } else {
      if (Traits::kIsCausal && iters > 0 && warp >= 2) {
        // Warps 2 and 3, causal: the K tile's rows holding NaN / ±Inf (kKRowFlags) and, if there are
        // any, sK0 = K with those elements zeroed (kKFlag set), then the K-scanned barrier.
        const int tid = static_cast<int>(threadIdx.x) - 64;
        constexpr int kChunksPerRow = kSw128RowBytes / 16;
        constexpr int kChunks = Traits::kColBlocks * kBlockN * kChunksPerRow;
        const uint4* const k_chunks = reinterpret_cast<const uint4*>(smem_ptr(sK));
        mbarrier_wait(full_kv, 0);
        bool any = false;
#pragma unroll 1
        for (int c = tid; c < kChunks; c += 64) {
          if (chunk_nonfinite<Elem>(k_chunks[c])) {
            const int row = (c / kChunksPerRow) % kBlockN;
            atomicOr(&sFlags[Traits::kKRowFlags + row / 32], 1u << (row % 32));
            any = true;
          }
        }
        if (named_barrier_or(Traits::kScanBarrier, 64, any)) {
          uint4* const k0_chunks = reinterpret_cast<uint4*>(smem_ptr(sK0));
#pragma unroll 1
          for (int c = tid; c < kChunks; c += 64) {
            const uint4 w = k_chunks[c];
            k0_chunks[c] = make_uint4(word_zero_nonfinite<Elem>(w.x), word_zero_nonfinite<Elem>(w.y),
                                      word_zero_nonfinite<Elem>(w.z), word_zero_nonfinite<Elem>(w.w));
          }
          fence_proxy_async_smem();  // sK0 before the consumers' dQ products
          if (tid == 0) sFlags[Traits::kKFlag] = 1u;
        }
        mbarrier_arrive(k_scanned);
      }
      if (p.deterministic && warp % 2 == 1) {
        // Deterministic: a dQ writer per consumer (warp 1: consumer 0's columns, warp 3: consumer 1's),
        // each column half a chain of its own. The K/V tiles of the KV head add to a query tile's half
        // in tile order, descending when causal (tma.cuh ordered turns; the block of the tile before in
        // that order has the lower blockIdx), or rotated in the order the walks reach the query tile;
        // each reduction completed before the turn passes on. One
        // writer and one turn a step for both halves held the turn from consumer 0's piece to the
        // completion of consumer 1's: 1.13-1.26x the atomic time at d128 without a causal mask (H100).
        const int c = warp / 2;
        for (int it = 0; it < iters; ++it) {
          const int head = step_head(it), m0 = step_m0(it);
          mbarrier_wait(full_dq(c, it), dq_use_parity(it));
          if (lane == 0) {
            const int pos = dq_turn_position(it);
            // The counter of this query tile's piece c.
            int* const turn =
                ws.dq_turns + ((batch * p.heads_q + head) * m_blocks + step_m_block(it)) * Traits::kConsumers + c;
            ordered_turn_wait(turn, pos);
            add_dq_piece(c, it, m0, head);
            bulk_wait<0>();
            ordered_turn_pass(turn);
          }
          __syncwarp();
        }
      }
    }
    return;
  }

  // Consumers.
  setmaxnreg_inc<Traits::kConsumerRegs>();
  const int cw = wg - 1;
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4;
  const int g = lane / 4, t = lane % 4;
  const int key_row0 = cw * Traits::kWgKeys + warp * 16 + g;  // this thread's keys: key_row0, +8 (in the tile)
  const uint32_t sK_wg = sK + static_cast<uint32_t>(cw * Traits::kWgKeys * kSw128RowBytes);
  const uint32_t sV_wg = sV + static_cast<uint32_t>(cw * Traits::kWgKeys * kSw128RowBytes);
  // The operands of this consumer's dQ = dS K: B, its 64 columns of K (column block cw of the K tile;
  // kDqSplitRows: the whole tile), and the offset of A in a dS^T buffer (the step's 64 queries;
  // kDqSplitRows: query block cw, its rows).
  const uint32_t sK_dq = sK + static_cast<uint32_t>(Traits::kDqSplitRows ? 0 : cw * kBlockN * kSw128RowBytes);
  const uint32_t ds_dq_off = static_cast<uint32_t>(Traits::kDqSplitRows ? cw * kBlockN * kSw128RowBytes : 0);
  // Causal: whether dQ of the step from row m0 reads sK0, K with its NaN / ±Inf elements zeroed (a
  // crossing step, and the scan found some).
  const auto k_rare = [&](int m0) {
    if constexpr (Traits::kIsCausal) {
      if (!crossing(m0)) return false;
      mbarrier_wait(k_scanned, 0);
      return sFlags[Traits::kKFlag] != 0u;
    } else {
      return false;
    }
  };
  // This thread's elements of a (64 keys, kBlockM queries) tile packed as A operands (P^T, dS^T) into
  // buffer sdS_b in ds_t_offset's layout. Element (key_row0 + 8 h, q = 8 j + 2 t) lies at row_base + (j / 8) kBlockN rows + 8 h rows + (16 (j %
  // 8) ^ swz) (ds_t_offset, with key % 8 = g): the base and the swizzle are opaque to the compiler, which
  // otherwise hoists an address per element out of the step loop and holds them all in registers.
  const auto store_ds_t = [&](uint32_t sdS_b, const uint32_t (&a)[Traits::kQKSteps][4]) {
    uint32_t row_base = sdS_b + static_cast<uint32_t>(key_row0 * kSw128RowBytes + 4 * t);
    uint32_t swz = static_cast<uint32_t>(g * 16);
    asm volatile("" : "+r"(row_base), "+r"(swz));
#pragma unroll
    for (int j = 0; j < kSTiles; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t addr = row_base + static_cast<uint32_t>((j / 8) * kBlockN * kSw128RowBytes + 8 * h * kSw128RowBytes) +
                              ((16u * (j % 8)) ^ swz);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(a[j / 2][(j % 2) * 2 + h]) : "memory");
      }
  };

  float dk[kKvTiles][4], dv[kKvTiles][4];
#pragma unroll
  for (int j = 0; j < kKvTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;
  if (iters > 0) mbarrier_wait(full_kv, 0);

  // dQ_k's columns [64 cw, 64 cw + 64) = dS_k K_j over the block's 128 keys, once both halves of step
  // k's dS^T are in place (buffer k % 2, use k / 2); committed, not waited for.
  const auto issue_dq = [&](float (&dq)[Traits::kDqTiles][4], int k) {
    const int b = k % 2;
    mbarrier_wait(full_ds(b), static_cast<uint32_t>((k / 2) & 1));
    const uint32_t sdS_b = sdS + static_cast<uint32_t>(b * Traits::kDsBytes) + ds_dq_off;
    const uint32_t sK_b = k_rare(step_m0(k)) ? sK0 + (sK_dq - sK) : sK_dq;
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < Traits::kDqKSteps; ++ks)
      Wgmma<Traits::kDqN, Elem>::ss_tt(dq, desc_mn_major<kBlockN>(sdS_b, ks), desc_mn_major<kBlockN>(sK_b, ks),
                                      ks > 0);
    wgmma_commit();
  };
  // After issue_dq's product completed: the dS^T buffer is released, and dQ_k staged for the writer
  // (flash_bwd_sm90_kernel.cuh's layout) once it has read this consumer's previous piece (parity of
  // piece k - 1), then released to it.
  const auto stage_dq = [&](float (&dq)[Traits::kDqTiles][4], int k) {
    fence_operands(dq);
    if constexpr (Traits::kIsCausal) {
      const int m0 = step_m0(k);
      if (k_rare(m0)) {
        // dQ_i[c] += dS_ij K_j[c] for K's NaN / ±Inf elements (from global memory: sK0 held zeros there)
        // at the visible pairs, dS^T from the buffer, added to the accumulator by atomics.
        const Elem* k_tile = static_cast<const Elem*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride +
                             static_cast<int64_t>(n0) * p.k_row_stride;
        const int col0 = dq_col_box(cw) * kSw128F32Cols + 2 * t;
        const int q0 = dq_row0(cw) + warp * 16 + g;  // this thread's first dQ row in the step's tile
        float* const acc = ws.dq_accum + ((batch * p.heads_q + step_head(k)) * ws.dq_rows + m0 + q0) * kHeadDim + col0;
        constexpr int kDqKeyWords = kBlockN / 32;  // the keys of this consumer's dQ product: all 128
        const uint32_t sdS_b = sdS + static_cast<uint32_t>((k % 2) * Traits::kDsBytes);
        if constexpr (Traits::kRareDqOutOfLine)
          add_k_nonfinite_dq_terms_call<Traits>(sFlags + Traits::kKRowFlags, 0, kDqKeyWords, k_tile,
                                                p.k_row_stride, acc, sdS_b, col0, head_dim, q0, m0, n0,
                                                seqlen_q, seqlen_k);
        else
          add_k_nonfinite_dq_terms<Traits>(sFlags + Traits::kKRowFlags, 0, kDqKeyWords, k_tile, p.k_row_stride,
                                           acc, sdS_b, col0, head_dim, q0, m0, n0, mask);
      }
    }
    mbarrier_arrive(empty_ds(k % 2));
    mbarrier_wait(empty_dq(cw, k), dq_use_parity(k) ^ 1u);
    // Row warp * 16 + g of the piece (kDqRows rows a column block).
    uint32_t row_base = sdq_piece(cw, k) + static_cast<uint32_t>((warp * 16 + g) * kSw128RowBytes + (t % 2) * 8);
    uint32_t swz = static_cast<uint32_t>(((t / 2) ^ g) * 16);
    asm volatile("" : "+r"(row_base), "+r"(swz));
#pragma unroll
    for (int j = 0; j < Traits::kDqTiles; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t addr = row_base +
                              static_cast<uint32_t>((j / 4) * Traits::kDqRows * kSw128RowBytes + 8 * h * kSw128RowBytes) +
                              ((32u * (j % 4)) ^ swz);
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(dq[j][2 * h]), "f"(dq[j][2 * h + 1])
                     : "memory");
      }
    fence_proxy_async_smem();
    mbarrier_arrive(full_dq(cw, k));
  };

  const float inv_scale_log2 = 1.0f / p.scale_log2;
  for (int it = 0; it < iters; ++it) {
    const int st = it % kStages;
    const int m0 = step_m0(it);
    mbarrier_wait(full_q(st), static_cast<uint32_t>((it / kStages) & 1));
    const uint32_t sQs = sQ + static_cast<uint32_t>(st * Traits::kQTileBytes);
    const uint32_t sdOs = sdO + static_cast<uint32_t>(st * Traits::kQTileBytes);
    const float* lse2 = sLse2 + st * kBlockM;
    const float* dvec = sD + st * kBlockM;
    // Causal: a crossing step with rows that the producer flagged (their Q / dO zeroed there).
    const uint32_t* const row_flags = sFlags + Traits::kRowFlags + st * Traits::kRowWords;
    bool rows_rare = false;
    if constexpr (Traits::kIsCausal) {
      if (crossing(m0)) {
        uint32_t any_row = 0u;
#pragma unroll
        for (int h = 0; h < Traits::kRowWords; ++h) any_row |= row_flags[h];
        rows_rare = any_row != 0u;
      }
    }

    // S^T = K_w Q^T and dP^T - D = V_w dO^T - D: (64 keys, 64 queries), committed separately; the dP
    // product accumulates onto -D (element (j, e): query 8 j + 2 t + e % 2), so that D is read before
    // the wait, not after it.
    // S^T likewise accumulates onto -lse2 / scale_log2, so that S^T scale_log2 is the exponent.
    float s_t[kSTiles][4], dp_t[kSTiles][4];
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) {
      const float2 dd = *reinterpret_cast<const float2*>(dvec + 8 * j + 2 * t);
      const float2 ll = *reinterpret_cast<const float2*>(lse2 + 8 * j + 2 * t);
      dp_t[j][0] = dp_t[j][2] = -dd.x;
      dp_t[j][1] = dp_t[j][3] = -dd.y;
      s_t[j][0] = s_t[j][2] = -ll.x * inv_scale_log2;
      s_t[j][1] = s_t[j][3] = -ll.y * inv_scale_log2;
    }
    fence_operands(s_t);  // each element its own register before the fence (no copies after it)
    fence_operands(dp_t);
    wgmma_fence();
    wgmma_ss_k_major<kBlockM, kBlockN, kBlockM, Traits::kKSteps, Elem, true>(s_t, sK_wg, sQs);
    wgmma_commit();
    wgmma_ss_k_major<kBlockM, kBlockN, kBlockM, Traits::kKSteps, Elem, true>(dp_t, sV_wg, sdOs);
    wgmma_commit();

    const bool tile_masked = mask.template bwd_tile_needs_mask<kBlockM, kBlockN>(m0, n0);
    const auto by_mask = [&](auto f) { by_tile_mask(tile_masked, f); };  // mask.cuh
    wgmma_wait<1>();  // S^T is ready; dP^T may still run
    fence_operands(s_t);
    by_mask([&](auto masked) {  // fragment_softmax.cuh
      bwd_p_transposed<decltype(masked)::value>(s_t, mask, p.scale_log2, FoldedRowStat{}, m0, 0, t, n0 + key_row0);
    });
    uint32_t pa[Traits::kQKSteps][4], dsa[Traits::kQKSteps][4];
#pragma unroll
    for (int ks = 0; ks < Traits::kQKSteps; ++ks) p_to_a_operand<Elem>(s_t, ks, pa[ks]);
    // dV += P^T dO while dS^T is computed.
    wgmma_fence();
    wgmma_rs_mn_major<kHeadDim, kBlockM, Traits::kQKSteps, Elem>(dv, pa, sdOs);
    wgmma_commit();
    if constexpr (Traits::kIsCausal) {
      if (rows_rare) {
        // dV_j[c] += P_ij dO_i[c] for the flagged rows' NaN / ±Inf dO elements (from global memory) at
        // the visible pairs. P^T (rounded as the tensor core read it) goes through this consumer's rows
        // of the dS^T buffer that dS^T takes later in the step: query i's P for this thread's keys lies
        // in another lane of the quad. (From registers by shuffles, pa live across the loop cost 44
        // bytes of spills.)
        const int buf = it % 2;
        const uint32_t sdS_buf = sdS + static_cast<uint32_t>(buf * Traits::kDsBytes);
        mbarrier_wait(empty_ds(buf), static_cast<uint32_t>(((it / 2) & 1) ^ 1));
        store_ds_t(sdS_buf, pa);
        wgmma_wait<0>();
        fence_operands(dv);
        named_barrier_sync(Traits::kRareBarrier0 + cw, 128);  // this consumer's P^T is in place
        const Elem* dout =
            static_cast<const Elem*>(p.dout) + batch * p.do_batch_stride + step_head(it) * p.do_head_stride;
        add_dv_nonfinite_rows<Traits>(dv, row_flags, dout, p.do_row_stride, sdS_buf, key_row0, t, head_dim, m0, n0,
                                      mask);
        named_barrier_sync(Traits::kRareBarrier0 + cw, 128);  // read before dS^T overwrites it
      }
    }
    wgmma_wait<1>();  // dP^T is ready; dV may still run
    fence_operands(dp_t);
    by_mask([&](auto masked) {
      if constexpr (Traits::kDsFromPackedP)
        bwd_ds_transposed_packed_p<decltype(masked)::value, Elem>(dp_t, pa, mask, FoldedRowStat{}, m0, 0, t,
                                                                  n0 + key_row0);
      else
        bwd_ds_transposed<decltype(masked)::value>(dp_t, s_t, mask, FoldedRowStat{}, m0, 0, t, n0 + key_row0);
    });
#pragma unroll
    for (int ks = 0; ks < Traits::kQKSteps; ++ks) p_to_a_operand<Elem>(dp_t, ks, dsa[ks]);
    // dK += dS^T Q.
    wgmma_fence();
    wgmma_rs_mn_major<kHeadDim, kBlockM, Traits::kQKSteps, Elem>(dk, dsa, sQs);
    wgmma_commit();

    // dS^T into sdS[it % 2] (ds_t_offset's layout), once both consumers' dQ products of step it - 2
    // are done with the buffer (its empty barrier, use it / 2 - 1).
    const int buf = it % 2;
    mbarrier_wait(empty_ds(buf), static_cast<uint32_t>(((it / 2) & 1) ^ 1));
    store_ds_t(sdS + static_cast<uint32_t>(buf * Traits::kDsBytes), dsa);
    fence_proxy_async_smem();
    mbarrier_arrive(full_ds(buf));

    // dQ: consumer 1 takes this step's, consumer 0 the previous step's, so that consumer 1 runs up to a
    // step behind consumer 0 and their softmax phases need not coincide.
    // This thread is done with the stage once dV and dK are: its products have read Q and dO, its
    // lse / D reads are done. Every thread arrives, not one a warp after __syncwarp: compute-sanitizer's
    // racecheck then sees the producer's next lse / D writes ordered after each thread's reads (one a
    // warp: 312 hazards).
    const int dq_it = cw == 1 ? it : it - 1;
    if (dq_it >= 0) {
      float dq[Traits::kDqTiles][4];
      issue_dq(dq, dq_it);
      wgmma_wait<0>();  // dV, dK and dQ
      fence_operands(dk);
      fence_operands(dv);
      mbarrier_arrive(empty_q(st));
      stage_dq(dq, dq_it);
    } else {
      wgmma_wait<0>();
      fence_operands(dk);
      fence_operands(dv);
      mbarrier_arrive(empty_q(st));
    }
  }
  if (cw == 0 && iters > 0) {  // consumer 0's last dQ
    float dq[Traits::kDqTiles][4];
    issue_dq(dq, iters - 1);
    wgmma_wait<0>();
    stage_dq(dq, iters - 1);
  }

  // Epilogue: dK * scale and dV of this consumer's 64 keys (zeros when no query saw the tile).
  // Through TMA (kDkDvTma), staged in stage cw's Q (dK) and dO (dV) tiles, which hold a 64-row tile of
  // head-dim columns each. Both stages are free once every consumer thread has released its last two
  // uses: no load follows them. The store clips the keys past seqlen_k and the columns past head_dim.
  // H100, bf16, B * S = 16k, the native check's back-to-back times against register stores: d128
  // 0.88-0.93x at 512-1k, 0.93-0.97x at 2k, 0.97-0.99x at 8k; d64 causal 0.93 / 0.95 / 0.97-0.99 / 0.98;
  // d64 not causal, rotated 0.96 at 512 to 1.00 at 8k. The d64 not-causal kernel that is not rotated
  // took 0.92x at 512 but 1.03x at 2k and 1.05x at 8k: the same instructions in its main loop, scheduled
  // differently (Nsight Compute at 8k: instruction count -0.1%, cycles +11%), so it stores from registers.
  constexpr bool kDkDvTma = !(kHeadDim == 64 && !Traits::kIsCausal && !kRotated);
  if constexpr (!kDkDvTma) {
    store_dk_dv<Elem>(p, dk, dv, batch, head_kv, n0 + key_row0, t, seqlen_k, head_dim);  // flash_bwd_sm90_kernel.cuh
  } else {
    if (iters > 0) {
      const int last = iters - 1;
      mbarrier_wait(empty_q(last % kStages), static_cast<uint32_t>((last / kStages) & 1));
      if (iters > 1) mbarrier_wait(empty_q((last - 1) % kStages), static_cast<uint32_t>(((last - 1) / kStages) & 1));
    }
    static_assert(kStages >= Traits::kConsumers, "a Q / dO stage per consumer for its dK / dV");
    static_assert(Traits::kQTileBytes >= static_cast<size_t>(Traits::kColBlocks) * Traits::kWgKeys * kSw128RowBytes,
                  "a stage's Q tile holds a consumer's dK");
    constexpr uint32_t kBlockBytes = static_cast<uint32_t>(Traits::kWgKeys * kSw128RowBytes);
    const uint32_t sdK_wg = sQ + static_cast<uint32_t>(cw * Traits::kQTileBytes);
    const uint32_t sdV_wg = sdO + static_cast<uint32_t>(cw * Traits::kQTileBytes);
    stage_rows_sw128<Elem>(dk, p.softmax_scale, t, sdK_wg, kBlockBytes, warp * 16 + g);  // epilogue.cuh
    stage_rows_sw128<Elem>(dv, 1.0f, t, sdV_wg, kBlockBytes, warp * 16 + g);
    fence_proxy_async_smem();
    named_barrier_sync(Traits::kEpilogueBarrier0 + cw, 128);
    if (threadIdx.x % 128 == 0) {
      const int key0 = n0 + cw * Traits::kWgKeys, b = static_cast<int>(batch);
#pragma unroll
      for (int cb = 0; cb < Traits::kColBlocks; ++cb) {
        tma_store_4d(&maps.dk, sdK_wg + cb * kBlockBytes, cb * kSw128BlockCols, key0, head_kv, b);
        tma_store_4d(&maps.dv, sdV_wg + cb * kBlockBytes, cb * kSw128BlockCols, key0, head_kv, b);
      }
      bulk_commit_group();
      bulk_wait_read<0>();  // the tiles stay until the stores have read them
    }
  }
#else
  __trap();  // only the sm_90a build has this kernel
#endif
}

}  // namespace fa::cuda::flash::sm90
