// The sm_90a GEMM kernel (wgmma + TMA) for fp16 / bf16 operands: C = epilogue(A·B) for every layout
// of gemm_params.h.
//
// Grid: one thread block per (kBlockM x kBlockN tile of C, K split), N tile fastest, as the sm80
// kernel. Warpgroups split the tile's rows: warpgroup w owns rows [64 w, 64 w + 64) (wgmma M = 64)
// and all kBlockN columns, accumulated in registers.
// Operands: K tiles of 64 (one 128-byte swizzled column block, wgmma.cuh) arrive by TMA, issued by
// thread 0, into kStages stages with one mbarrier each. Each operand keeps its global orientation:
//   A k-major: box (64 k, kBlockM rows) -> [kBlockM][64 k], K-major descriptor (trans-a 0)
//   A m-major: kBlockM / 64 boxes (64 m, 64 k) -> column blocks [64 k][64 m], MN-major (trans-a 1)
//   B k-major: box (64 k, kBlockN rows) -> [kBlockN][64 k], K-major (trans-b 0)
//   B n-major: kBlockN / 64 boxes (64 n, 64 k) -> column blocks [64 k][64 n], MN-major (trans-b 1)
// The tensor maps' bounds zero-fill the M, N and K tails. Per K tile: wait for the stage, issue
// four wgmma k16 steps, commit, wait until only this tile's group is in flight (the previous tile's
// reads are done), a block barrier (every warpgroup is past the previous tile), then thread 0 refills
// the previous tile's stage kStages - 1 tiles ahead.
// Epilogue: the accumulators are staged through shared memory (the pipeline's stages) and finished
// 8 columns per thread with 16-byte stores (gemm_common.cuh), or written as raw fp32 sums into the
// split's workspace slice.
//
// gemm_sm90_ws_kernel, the warp-specialized persistent variant: warpgroup 0 is the producer (one
// thread issues every TMA load), warpgroups 1.. the consumers, in kTileGroups groups. One block per
// SM walks the work items (tile, K split) blockIdx.x, + gridDim.x, ...; item j goes to group
// j % kTileGroups, whose warpgroups split its rows (kMmaBlocks x 64 each). A K tile's stage cycles
// through a full barrier (the producer's expect_tx, completed by TMA) and an empty barrier (every
// warp of the group using it arrives once its wgmma reading the stage are done), so no block-wide
// barrier sits in the main loop and the producer runs up to kStages tiles ahead, into the next work
// item while the consumers finish the last one. Groups take turns (named barriers) at the main
// loop, in walk order, and at the epilogue's staging buffer, which the pipeline does not share: one
// group finishes its tile, kBlockN / kEpiloguePasses columns at a time, while the next multiplies.
// With the TMA-store epilogue (Sm90Traits::kTmaStore) each warpgroup instead converts its rows to
// 16-bit in registers into a staging block of its own and leaves the stores to TMA: no turns at
// the epilogue, and the warpgroup is back at the main loop as soon as its block is written.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gemm_params.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/flash/hopper/tma.cuh"
#include "cuda/flash/hopper/wgmma.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/gemm/gemm_common.cuh"
#include "cuda/smem_limits.h"

namespace fa::cuda::gemm_kernels {

// A configuration's defaults; each configuration (gemm_sm90.cu) derives from this and sets what
// differs.
struct Sm90ConfigBase {
  static constexpr int kBlocksPerSm = 1;
  static constexpr bool kWarpSpecialized = false;
  static constexpr int kEpiloguePasses = 1;
  static constexpr int kMmaBlocks = 1;
  static constexpr int kTileGroups = 1;
  static constexpr bool kTmaStore = false;
};

template <typename Elem_, typename Config, bool kAKMajor_, bool kBKMajor_>
struct Sm90Traits {
  using Elem = Elem_;
  static constexpr int kBlockM = Config::kBlockM, kBlockN = Config::kBlockN, kBlockK = 64, kStages = Config::kStages;
  static constexpr int kMinBlocksPerSm = Config::kBlocksPerSm;
  static constexpr bool kAKMajor = kAKMajor_, kBKMajor = kBKMajor_;
  static constexpr bool kWarpSpecialized = Config::kWarpSpecialized;
  // The epilogue stages kBlockN / kEpiloguePasses columns at a time (a smaller staging buffer
  // leaves room for more pipeline stages).
  static constexpr int kEpiloguePasses = Config::kEpiloguePasses;
  static constexpr int kPassCols = kBlockN / kEpiloguePasses;
  // Rows per multiplying warpgroup: kMmaBlocks blocks of 64 (wgmma M), each with its own
  // accumulators [kNTiles][4] (two blocks of 192 columns: 192 fp32 registers per thread).
  static constexpr int kMmaBlocks = Config::kMmaBlocks;
  // The multiplying warpgroups form kTileGroups groups, each working on tiles of its own (the
  // warp-specialized kernel's work items alternate between them), with kGroupWarpGroups warpgroups
  // sharing a tile's rows. Two groups take turns: one group's epilogue runs while the other
  // multiplies.
  static constexpr int kTileGroups = Config::kTileGroups;
  static constexpr int kGroupWarpGroups = kBlockM / (64 * kMmaBlocks);
  static constexpr int kGroupThreads = kGroupWarpGroups * 128;
  static constexpr int kWarpGroups = kGroupWarpGroups * kTileGroups;  // the ones that multiply
  static constexpr int kMmaThreads = kWarpGroups * 128;
  // Register budgets of the warp-specialized kernel's warpgroups (setmaxnreg) where the consumers'
  // accumulators need more than an even share of the register file: the producer gives up all but
  // kProducerRegs per thread, so that the consumers can hold kConsumerRegs.
  static constexpr bool kRebalanceRegs = kWarpSpecialized && kMmaBlocks > 1;
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = kWarpGroups == 2 ? 232 : 160;
  static constexpr int kNThreads = kMmaThreads + (kWarpSpecialized ? 128 : 0);  // + the producer warpgroup
  static constexpr int kNTiles = kBlockN / 8;  // accumulator n8 tiles per thread
  static constexpr int kBlockBytes = 64 * flash::sm90::kSw128RowBytes;  // one [64][64] column block
  static constexpr int kATileBytes = kBlockM * kBlockK * 2;
  static constexpr int kBTileBytes = kBlockN * kBlockK * 2;
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;
  // Shared memory: the stages, then (warp-specialized) the epilogue's staging buffer (one, which
  // tile groups take turns at); the non-specialized kernel stages its epilogue in the stages'
  // memory (and more when it needs more). The mbarriers come last: full per stage and,
  // warp-specialized, empty per stage.
  static constexpr int kPipeBytes = kStages * kStageBytes;
  // The TMA-store epilogue (warp-specialized kernel, 16-bit C written without reading it: the
  // planner's choice, gemm.cu): each multiplying warpgroup converts its kStoreRows rows to 16-bit
  // in registers, 64 columns at a time, into its own 128-byte-swizzled column block (the layout of
  // the operand tiles), from which one of its threads issues a TMA store; the warpgroup goes on to
  // its next tile while the store runs. The tile's bias waits in shared memory as fp32 (per
  // warpgroup). Else the accumulators are staged as fp32 (gemm_common.cuh) and finished by the
  // threads' own 16-byte stores.
  static constexpr bool kTmaStore = Config::kTmaStore;
  static constexpr int kStoreRows = kMmaBlocks * 64;
  static constexpr int kStoreBlockBytes = kStoreRows * flash::sm90::kSw128RowBytes;
  static constexpr int kStorePasses = kBlockN / flash::sm90::kSw128BlockCols;
  static constexpr int kStagingBytes =
      kTmaStore ? kWarpGroups * kStoreBlockBytes : kStagedTileBytes<kBlockM, kPassCols>;
  static constexpr int kBiasBytes = kTmaStore ? kWarpGroups * kBlockN * 4 : 0;
  static constexpr int kDataBytes = kWarpSpecialized             ? kPipeBytes + kStagingBytes + kBiasBytes
                                    : kPipeBytes > kStagingBytes ? kPipeBytes
                                                                 : kStagingBytes;
  static constexpr int kBarrierBytes = 8 * 2 * kStages;
  static constexpr int kSmemBytes = kDataBytes + flash::sm90::kSw128AtomBytes + kBarrierBytes;
  static_assert(kBlockM % (64 * kMmaBlocks) == 0 && kBlockN % 64 == 0 && kBlockN <= 256,
                "tiles of whole 64-wide column blocks");
  // setmaxnreg.inc can take only what .dec gave up: the budgets fit the launch's registers per thread
  // (65,536 / kNThreads in steps of 8) x kNThreads, not the whole register file.
  static_assert(!kRebalanceRegs ||
                    kProducerRegs * 128 + kConsumerRegs * kMmaThreads <= (65536 / kNThreads) / 8 * 8 * kNThreads,
                "the warpgroups' register budgets fit the registers the launch gives the block");
  static_assert(kPassCols % 8 == 0 && kPassCols * kEpiloguePasses == kBlockN, "passes of whole n8 fragments");
  static_assert(kWarpSpecialized || (kEpiloguePasses == 1 && kTileGroups == 1),
                "the plain kernel's warpgroups share one tile, staged at once");
  static_assert(!kTmaStore || (kWarpSpecialized && kEpiloguePasses == 1 && kPipeBytes % flash::sm90::kSw128AtomBytes == 0),
                "TMA stores from the warp-specialized kernel, from swizzle-aligned column blocks");
  static_assert(kSmemBytes <= kSm90MaxSmemPerBlock, "an sm_90 block has at most 227 KiB of shared memory");
};

// The operands' maps; C's and pre_out's (boxes of 64 columns x kStoreRows rows) for the TMA-store
// epilogue.
struct GemmTensorMaps {
  CUtensorMap a, b, c, pre;
};

// Named barriers of the warp-specialized kernel (0 is __syncthreads'): a tile group's staged
// epilogue; the groups' turns at the main loop and at the staging buffer; a multiplying
// warpgroup's TMA-store epilogue.
inline constexpr int kEpilogueBarrier0 = 1, kMainloopTurn0 = 3, kStagingTurn0 = 5, kStoreBarrier0 = 7;

// One work item: a kBlockM x kBlockN tile of C and a K split (N tile fastest, then M tile, then split).
struct Sm90Work {
  int i0, j0;        // the tile's first row and column of C
  int64_t split;     // >= splits: no such work item
  int64_t kt_begin;  // its first K tile
  int n_kt;          // its K tiles
};

template <typename Traits>
__device__ __forceinline__ Sm90Work sm90_work(const GemmParams& p, int64_t item, int k_tiles_per_split) {
  const int64_t n_tiles = ceil_div<int64_t>(p.n, Traits::kBlockN), m_tiles = ceil_div<int64_t>(p.m, Traits::kBlockM);
  const int64_t tn = item % n_tiles, tm = (item / n_tiles) % m_tiles;
  Sm90Work w;
  w.split = item / (n_tiles * m_tiles);
  w.i0 = static_cast<int>(tm * Traits::kBlockM);
  w.j0 = static_cast<int>(tn * Traits::kBlockN);
  const int64_t k_tiles = ceil_div<int64_t>(p.k, Traits::kBlockK);
  w.kt_begin = w.split * k_tiles_per_split;
  const int64_t kt_end = w.kt_begin + k_tiles_per_split < k_tiles ? w.kt_begin + k_tiles_per_split : k_tiles;
  w.n_kt = static_cast<int>(kt_end > w.kt_begin ? kt_end - w.kt_begin : 0);
  return w;
}

// kRows rows (of A or B) x 64 k of one K tile into dst, completing on `bar`:
//   k-major: box (64 k, kRows rows) -> [kRows][64 k];
//   m/n-major: kRows / 64 boxes (64 rows, 64 k) -> column blocks [64 k][64 rows].
template <bool kKMajor, int kRows>
__device__ __forceinline__ void sm90_load_operand(uint32_t dst, const CUtensorMap* map, uint32_t bar, int row0, int k0) {
  using namespace flash::sm90;
  if constexpr (kKMajor) {
    tma_load_4d(dst, map, bar, k0, row0, 0, 0);
  } else {
#pragma unroll
    for (int cb = 0; cb < kRows / 64; ++cb) tma_load_4d(dst + cb * 64 * kSw128RowBytes, map, bar, row0 + 64 * cb, k0, 0, 0);
  }
}

// K tile `kt` of work item w into the stage at s_a (A, then B), completing on `bar`. One thread
// issues it.
template <typename Traits>
__device__ __forceinline__ void sm90_load_k_tile(const GemmTensorMaps& maps, uint32_t s_a, uint32_t bar, const Sm90Work& w,
                                                 int64_t kt) {
  using namespace flash::sm90;
  const int k0 = static_cast<int>(kt * Traits::kBlockK);
  mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>(Traits::kStageBytes));
  sm90_load_operand<Traits::kAKMajor, Traits::kBlockM>(s_a, &maps.a, bar, w.i0, k0);
  sm90_load_operand<Traits::kBKMajor, Traits::kBlockN>(s_a + static_cast<uint32_t>(Traits::kATileBytes), &maps.b, bar,
                                                       w.j0, k0);
}

// The accumulators of one multiplying warpgroup: [m64 block][n8 tile][4].
template <typename Traits>
using Sm90Acc = float[Traits::kMmaBlocks][Traits::kNTiles][4];

// The four k16 wgmma steps of one K tile (A at s_a, B at s_b) for warpgroup `wg` (its kMmaBlocks x
// 64 rows of A) into acc.
template <typename Traits>
__device__ __forceinline__ void sm90_mma_k_tile(Sm90Acc<Traits>& acc, uint32_t s_a, uint32_t s_b, int wg) {
  using namespace flash::sm90;
  constexpr int kBM = Traits::kBlockM, kBN = Traits::kBlockN, kBK = Traits::kBlockK;
  constexpr int kTransA = Traits::kAKMajor ? 0 : 1, kTransB = Traits::kBKMajor ? 0 : 1;
#pragma unroll
  for (int ks = 0; ks < kBK / 16; ++ks) {
    const uint64_t db = Traits::kBKMajor ? desc_k_major<kBN>(s_b, ks) : desc_mn_major<kBK>(s_b, ks);
#pragma unroll
    for (int mb = 0; mb < Traits::kMmaBlocks; ++mb) {
      // Row block b = wg * kMmaBlocks + mb of A: rows [64 b, 64 b + 64) of a k-major tile, or column
      // block b.
      const int b = wg * Traits::kMmaBlocks + mb;
      const uint32_t a_b = s_a + static_cast<uint32_t>(b * (Traits::kAKMajor ? 64 * kSw128RowBytes : Traits::kBlockBytes));
      const uint64_t da = Traits::kAKMajor ? desc_k_major<kBM>(a_b, ks) : desc_mn_major<kBK>(a_b, ks);
      flash::sm90::Wgmma<kBN, typename Traits::Elem>::template ss_t<kTransA, kTransB>(acc[mb], da, db, 1);
    }
  }
}

// Columns [kPass * kPassCols, (kPass + 1) * kPassCols) of warpgroup wg's accumulators into the
// fp32 staging tile; `t` is the thread's index in its warpgroup.
template <typename Traits, int kPass = 0>
__device__ __forceinline__ void sm90_stage_acc(float* stage, const Sm90Acc<Traits>& acc, int wg, int t) {
  constexpr int kCols = Traits::kPassCols, kJ0 = kPass * kCols / 8;
  const int warp = t / 32, lane = t % 32;
#pragma unroll
  for (int mb = 0; mb < Traits::kMmaBlocks; ++mb) {
    const int row = (wg * Traits::kMmaBlocks + mb) * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      const int col = 8 * j + 2 * (lane % 4);
      stage_pair<kCols>(stage, row, col, acc[mb][kJ0 + j][0], acc[mb][kJ0 + j][1]);
      stage_pair<kCols>(stage, row + 8, col, acc[mb][kJ0 + j][2], acc[mb][kJ0 + j][3]);
    }
  }
}

template <typename Traits>
__device__ __forceinline__ void sm90_zero_acc(Sm90Acc<Traits>& acc) {
#pragma unroll
  for (int mb = 0; mb < Traits::kMmaBlocks; ++mb)
#pragma unroll
    for (int j = 0; j < Traits::kNTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mb][j][e] = 0.0f;
}

template <typename Traits>
__device__ __forceinline__ void sm90_fence_acc(Sm90Acc<Traits>& acc) {
#pragma unroll
  for (int mb = 0; mb < Traits::kMmaBlocks; ++mb) flash::sm90::fence_operands(acc[mb]);
}

// The epilogue of the warp-specialized kernel: kEpiloguePasses rounds of staging and finishing by
// the kGroupThreads threads of tile group `group` (`gw`: the warpgroup's index in it, `gt`: the
// thread's), in the staging buffer, ordered by named barrier kEpilogueBarrier0 + group (the first
// sync of a pass waits until the group has finished reading the previous pass, or the previous tile).
template <typename Traits, int kPass = 0>
__device__ __forceinline__ void sm90_ws_epilogue(const GemmParams& p, float* staging, const Sm90Acc<Traits>& acc,
                                                 const Sm90Work& w, float* slice, int group, int gw, int gt) {
  flash::named_barrier_sync(kEpilogueBarrier0 + group, Traits::kGroupThreads);
  sm90_stage_acc<Traits, kPass>(staging, acc, gw, gt % 128);
  flash::named_barrier_sync(kEpilogueBarrier0 + group, Traits::kGroupThreads);
  finish_staged_tile<typename Traits::Elem, Traits::kBlockM, Traits::kPassCols, Traits::kGroupThreads>(
      p, staging, w.i0, w.j0 + kPass * Traits::kPassCols, slice, gt);
  if constexpr (kPass + 1 < Traits::kEpiloguePasses)
    sm90_ws_epilogue<Traits, kPass + 1>(p, staging, acc, w, slice, group, gw, gt);
}

// The TMA-store epilogue of multiplying warpgroup cw (rows [gw kStoreRows, (gw + 1) kStoreRows) of
// tile w; `t`: the thread's index in the warpgroup), ordered by named barrier kStoreBarrier0 + cw.
// Per 64-column block: alpha and the bias applied to the accumulators in place; pre_out's values
// (when asked), then C's (after the activation), each written as 16-bit pairs into the staging
// block `stage` at the 128-byte swizzle (chunk c of row r at chunk c ^ (r % 8): the 4 pairs x 8
// rows of a warp's store hit 32 different banks) and stored by thread 0. Before a block is written
// again, thread 0 waits until the previous store has read it.
template <typename Traits>
__device__ __forceinline__ void sm90_tma_epilogue(const GemmParams& p, const GemmTensorMaps& maps, uint32_t stage,
                                                  float* bias_s, Sm90Acc<Traits>& acc, const Sm90Work& w, int cw,
                                                  int gw, int t) {
  using namespace flash::sm90;
  using Elem = typename Traits::Elem;
  constexpr int kBN = Traits::kBlockN, kCols = kSw128BlockCols, kChunks = kCols / 8;
  const int bar_id = kStoreBarrier0 + cw;
  const int warp = t / 32, lane = t % 32;
  const bool gelu = p.activation == GemmActivation::kGeluTanh;
  // The tile's bias, 0 past N; a barrier below orders these writes before the reads.
  if (p.bias != nullptr) {
    for (int c = t; c < kBN; c += 128) {
      const int64_t col = w.j0 + c;
      float b = 0.0f;
      if (col < p.n)
        b = p.bias_dtype == DType::kFloat32 ? static_cast<const float*>(p.bias)[col]
                                            : to_float(static_cast<const Elem*>(p.bias)[col]);
      bias_s[c] = b;
    }
    flash::named_barrier_sync(bar_id, 128);
  }
  const int row0 = w.i0 + gw * Traits::kStoreRows;
  // One staging block (f applied to the pass's accumulators) and its store through `map`.
  const auto store_block = [&](const CUtensorMap* map, int pass, auto f) {
    if (t == 0) bulk_wait_read<0>();
    flash::named_barrier_sync(bar_id, 128);
#pragma unroll
    for (int mb = 0; mb < Traits::kMmaBlocks; ++mb) {
      const int row = mb * 64 + warp * 16 + lane / 4;  // and row + 8; both have row % 8 == lane / 4
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const float* v = acc[mb][pass * kChunks + c];
        const uint32_t addr =
            stage + static_cast<uint32_t>(row * kSw128RowBytes + ((c ^ (lane / 4)) * 16) + (lane % 4) * 4);
        flash::st_shared_b32(addr, flash::pack2<Elem>(f(v[0]), f(v[1])));
        flash::st_shared_b32(addr + 8 * kSw128RowBytes, flash::pack2<Elem>(f(v[2]), f(v[3])));
      }
    }
    fence_proxy_async_smem();
    flash::named_barrier_sync(bar_id, 128);
    if (t == 0) {
      tma_store_4d(map, stage, w.j0 + pass * kCols, row0, 0, 0);
      bulk_commit_group();
    }
  };
#pragma unroll
  for (int pass = 0; pass < Traits::kStorePasses; ++pass) {
    if (p.alpha != 1.0f || p.bias != nullptr) {
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int col = pass * kCols + 8 * c + 2 * (lane % 4);
        const float b0 = p.bias != nullptr ? bias_s[col] : 0.0f, b1 = p.bias != nullptr ? bias_s[col + 1] : 0.0f;
#pragma unroll
        for (int mb = 0; mb < Traits::kMmaBlocks; ++mb) {
          float* v = acc[mb][pass * kChunks + c];
          v[0] = p.alpha * v[0] + b0, v[1] = p.alpha * v[1] + b1;
          v[2] = p.alpha * v[2] + b0, v[3] = p.alpha * v[3] + b1;
        }
      }
    }
    if (p.pre_out != nullptr) store_block(&maps.pre, pass, [](float x) { return x; });
    if (gelu)
      store_block(&maps.c, pass, [](float x) { return gelu_tanh(x); });
    else
      store_block(&maps.c, pass, [](float x) { return x; });
  }
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    gemm_sm90_kernel(const __grid_constant__ GemmParams p, const __grid_constant__ GemmTensorMaps maps,
                     float* partial, int splits, int k_tiles_per_split) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace flash::sm90;
  using Elem = typename Traits::Elem;
  constexpr int kBM = Traits::kBlockM, kBN = Traits::kBlockN, kStages = Traits::kStages;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = sw128_aligned_base(smem_raw);
  const auto s_a = [&](int st) { return base + static_cast<uint32_t>(st * Traits::kStageBytes); };
  const auto bar = [&](int st) { return base + static_cast<uint32_t>(Traits::kDataBytes + 8 * st); };

  const Sm90Work w = sm90_work<Traits>(p, blockIdx.x, k_tiles_per_split);
  if (w.split >= splits) return;
  const int n_kt = w.n_kt;

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&maps.a);
    prefetch_tensor_map(&maps.b);
#pragma unroll
    for (int st = 0; st < kStages; ++st) mbarrier_init(bar(st), 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  // Thread 0: local K tile `it` into stage it % kStages.
  const auto issue = [&](int it) { sm90_load_k_tile<Traits>(maps, s_a(it % kStages), bar(it % kStages), w, w.kt_begin + it); };
  const int wg = warp_uniform_int(static_cast<int>(threadIdx.x) / 128);

  Sm90Acc<Traits> acc;
  sm90_zero_acc<Traits>(acc);

  if (threadIdx.x == 0)
    for (int it = 0; it < kStages - 1 && it < n_kt; ++it) issue(it);

  for (int it = 0; it < n_kt; ++it) {
    const int st = it % kStages;
    mbarrier_wait(bar(st), static_cast<uint32_t>((it / kStages) & 1));
    wgmma_fence();
    sm90_mma_k_tile<Traits>(acc, s_a(st), s_a(st) + static_cast<uint32_t>(Traits::kATileBytes), wg);
    wgmma_commit();
    wgmma_wait<1>();  // tile it - 1's wgmma are done in this warpgroup
    __syncthreads();  // ... and in every warpgroup: its stage may be refilled
    if (threadIdx.x == 0 && it + kStages - 1 < n_kt) issue(it + kStages - 1);
  }
  wgmma_wait<0>();
  sm90_fence_acc<Traits>(acc);

  // Staged epilogue (gemm_common.cuh) in the stages' memory: every warpgroup's wgmma reads and every
  // TMA write are complete (each was waited for), the barrier orders the other warpgroups.
  __syncthreads();
  float* stage = reinterpret_cast<float*>(smem_raw + (base - flash::smem_u32(smem_raw)));
  sm90_stage_acc<Traits>(stage, acc, wg, static_cast<int>(threadIdx.x) % 128);
  __syncthreads();
  float* slice = partial != nullptr ? partial + w.split * p.m * p.n : nullptr;
  finish_staged_tile<Elem, kBM, kBN, Traits::kNThreads>(p, stage, w.i0, w.j0, slice, static_cast<int>(threadIdx.x));
#else
  __trap();  // only the sm_90a build has this kernel; the planner never selects it elsewhere
#endif
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    gemm_sm90_ws_kernel(const __grid_constant__ GemmParams p, const __grid_constant__ GemmTensorMaps maps,
                        float* partial, int64_t items, int k_tiles_per_split) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(Traits::kWarpSpecialized, "the warp-specialized traits");
  using namespace flash::sm90;
  constexpr int kStages = Traits::kStages;
  constexpr bool kTurns = Traits::kTileGroups > 1;
  constexpr int kTurnThreads = 2 * Traits::kGroupThreads;  // a turn passes from one group to the next

  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = sw128_aligned_base(smem_raw);
  const auto s_a = [&](int st) { return base + static_cast<uint32_t>(st * Traits::kStageBytes); };
  const auto bar = [&](int i) { return base + static_cast<uint32_t>(Traits::kDataBytes + 8 * i); };
  const auto full = [&](int st) { return bar(st); };
  const auto empty = [&](int st) { return bar(kStages + st); };
  float* staging = reinterpret_cast<float*>(smem_raw + (base - flash::smem_u32(smem_raw)) + Traits::kPipeBytes);
  const uint32_t staging_u32 = base + static_cast<uint32_t>(Traits::kPipeBytes);
  float* bias_s = staging + Traits::kStagingBytes / 4;

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&maps.a);
    prefetch_tensor_map(&maps.b);
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbarrier_init(full(st), 1);                              // the producer's expect_tx
      mbarrier_init(empty(st), Traits::kGroupThreads / 32);  // every warp of the group using it
    }
    fence_mbarrier_init();
  }
  __syncthreads();  // the last block-wide barrier: the roles part here

  const int wg = warp_uniform_int(static_cast<int>(threadIdx.x) / 128);
  if (wg == 0) {
    if constexpr (Traits::kRebalanceRegs) setmaxnreg_dec<Traits::kProducerRegs>();
    // Producer: K tile g of this block's walk (over all its work items) goes to stage g % kStages once
    // the consumers have released that stage's use g - kStages (parity of the previous phase; a fresh
    // barrier counts its phase before the first as complete, so the first kStages waits pass).
    if (threadIdx.x == 0) {
      if constexpr (Traits::kTmaStore) {
        prefetch_tensor_map(&maps.c);
        if (p.pre_out != nullptr) prefetch_tensor_map(&maps.pre);
      }
      int64_t g = 0;
      for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const Sm90Work w = sm90_work<Traits>(p, item, k_tiles_per_split);
        for (int it = 0; it < w.n_kt; ++it, ++g) {
          const int st = static_cast<int>(g % kStages);
          mbarrier_wait(empty(st), static_cast<uint32_t>(((g / kStages) & 1) ^ 1));
          sm90_load_k_tile<Traits>(maps, s_a(st), full(st), w, w.kt_begin + it);
        }
      }
    }
    return;
  }

  // Consumers: warpgroup gw of tile group `group` multiplies row blocks [kMmaBlocks gw,
  // kMmaBlocks (gw + 1)) of the group's tiles, the block's work items j with j % kTileGroups == group.
  if constexpr (Traits::kRebalanceRegs) setmaxnreg_inc<Traits::kConsumerRegs>();
  const int cw = wg - 1, group = cw / Traits::kGroupWarpGroups, gw = cw % Traits::kGroupWarpGroups;
  const int gt = static_cast<int>(threadIdx.x) - 128 - group * Traits::kGroupThreads, lane = gt % 32;
  // A warp's arrival on an empty barrier, once every lane's wgmma reading its stage are done.
  const auto release = [&](uint32_t empty_bar) {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty_bar);
  };
  int64_t g = 0, j = 0;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x, ++j) {
    const Sm90Work w = sm90_work<Traits>(p, item, k_tiles_per_split);
    const bool last = item + gridDim.x >= items;
    if (j % Traits::kTileGroups != group) {  // another group's: its K tiles pass this one by
      g += w.n_kt;
      continue;
    }
    // Tile groups take turns at the main loop (named barrier kMainloopTurn0 + group), so that
    // a group waits for a stage's use only once the stage's previous use has arrived, as a parity
    // wait needs: the group before it has waited for every K tile up to this item's.
    if (kTurns && j > 0) flash::named_barrier_sync(kMainloopTurn0 + group, kTurnThreads);
    Sm90Acc<Traits> acc;
    sm90_zero_acc<Traits>(acc);
    for (int it = 0; it < w.n_kt; ++it, ++g) {
      const int st = static_cast<int>(g % kStages);
      mbarrier_wait(full(st), static_cast<uint32_t>((g / kStages) & 1));
      wgmma_fence();
      sm90_mma_k_tile<Traits>(acc, s_a(st), s_a(st) + static_cast<uint32_t>(Traits::kATileBytes), gw);
      wgmma_commit();
      wgmma_wait<1>();  // this thread's wgmma of the previous K tile are done
      if (it > 0) release(empty(static_cast<int>((g - 1) % kStages)));
    }
    if (kTurns && !last)
      flash::named_barrier_arrive(kMainloopTurn0 + (group + 1) % Traits::kTileGroups, kTurnThreads);
    wgmma_wait<0>();
    sm90_fence_acc<Traits>(acc);
    if (w.n_kt > 0) release(empty(static_cast<int>((g - 1) % kStages)));

    if constexpr (Traits::kTmaStore) {
      // Each warpgroup its own staging block: no turns.
      sm90_tma_epilogue<Traits>(p, maps, staging_u32 + static_cast<uint32_t>(cw * Traits::kStoreBlockBytes),
                                bias_s + cw * Traits::kBlockN, acc, w, cw, gw, gt % 128);
    } else {
      // The groups take turns at the one staging buffer (named barrier kStagingTurn0 + group), in
      // walk order.
      if (kTurns && j > 0) flash::named_barrier_sync(kStagingTurn0 + group, kTurnThreads);
      float* slice = partial != nullptr ? partial + w.split * p.m * p.n : nullptr;
      sm90_ws_epilogue<Traits>(p, staging, acc, w, slice, group, gw, gt);
      if (kTurns && !last)
        flash::named_barrier_arrive(kStagingTurn0 + (group + 1) % Traits::kTileGroups, kTurnThreads);
    }
  }
  // The last stores must have read their staging blocks before the block's shared memory goes.
  if (Traits::kTmaStore && gt % 128 == 0) bulk_wait_read<0>();
#else
  __trap();  // only the sm_90a build has this kernel; the planner never selects it elsewhere
#endif
}

}  // namespace fa::cuda::gemm_kernels
