// FlashAttention-2 forward, Hopper warp-specialized path (sm_90a): a producer warpgroup and two or
// three consumer warpgroups, FA3's structure.
//
// Persistent: a block per SM takes query tiles of kBlockM = 64 x kConsumers rows, one work item at a
// time. Not causal (equal items): block b takes items b, b + gridDim.x, ... (persistent_item). Causal:
// items in sections of heads, the heaviest query tiles of a section first (query_tile_scheduler.h
// QueryTileScheduler), handed out by a global counter, so that a block that finishes early takes the
// next item as the hardware's block scheduler would. Warpgroup 0 is the producer: it gives up
// registers (setmaxnreg) and one thread issues every TMA load: per item Q (into a buffer the consumers are
// done with: two buffers where shared memory allows, so that it lands while the previous item runs), then K
// tile j and V tile j into the stages in turn, each on its own full barrier,
// each stage waiting for its empty barrier (the consumers' release of its last use). It runs ahead
// into the next item while the consumers finish one. K and V have separate barriers so that
// S = Q K^T can start while V is still in flight, and a K stage is refilled as soon as its S is
// computed.
// Warpgroups 1 .. kConsumers are the consumers: they take the registers the producer gave up, and
// warpgroup 1 + w owns query rows [64 w, 64 w + 64) of the tile (wgmma M = 64). Each runs the loop of
// flash_fwd_sm90_kernel.cuh (the softmax of tile j overlaps the tensor cores' P V of tile j - 1
// inside the warpgroup), and they take turns at issuing their wgmma in a ring (named barriers,
// "pingpong"): one warpgroup's softmax runs while the others' GEMMs occupy the tensor cores.
// NaN / ±Inf in V on tiles that cross the diagonal (causal): the producer warpgroup's other three
// warps check each such tile once it lands (scan, vote on a named barrier of their own, zero the
// elements) and release it to the consumers on a "checked" barrier with a flag; the consumers add the
// elements back in the epilogue (nonfinite_pv.cuh). The check costs the consumers no registers: done
// by them, it made ptxas spill 88-340 bytes in the causal kernels. Masking (mask.cuh) and the
// epilogue (epilogue.cuh) are the shared ones.
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "common/attention_params.h"
#include "cuda/flash/epilogue.cuh"
#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/hopper/flash_fwd_sm90_kernel.cuh"
#include "cuda/flash/hopper/tma.cuh"
#include "cuda/flash/hopper/wgmma.cuh"
#include "cuda/flash/mask.cuh"
#include "cuda/flash/nonfinite_pv.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/flash/tile_scheduler.cuh"
#include "cuda/smem_limits.h"

namespace fa::cuda::flash::sm90 {

template <int kHeadDim_, int kBlockN_, int kStages_, typename Elem_, int kConsumers_ = 2,
          uint32_t kL2SectionKiB_ = kCausalSectionKiB, int kQStages_ = 0, bool kTmaStoreO_ = true,
          uint32_t kL2SectionMaxHeads_ = kCausalSectionMaxHeads, bool kWideConsumers_ = false>
struct FlashFwdSm90WsTraits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kConsumers = kConsumers_;             // consumer warpgroups
  static constexpr int kNThreads = 128 * (1 + kConsumers);   // + the producer warpgroup
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kWgRows = 64;
  static constexpr int kBlockM = kWgRows * kConsumers;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  // Causal: the heads whose query tiles the blocks take longest first together (a section,
  // query_tile_scheduler.h QueryTileScheduler): as many as have K and V within kL2SectionKiB, at most
  // kL2SectionMaxHeads. Measured (flash_configs.h kFwdSm90WsCausalConfigs): 32 MiB and 32 heads beat
  // one head and all heads from 512 to 16k keys at head dims 64-256, or match them within the spread.
  static constexpr uint32_t kL2SectionKiB = kL2SectionKiB_;
  static constexpr uint32_t kL2SectionMaxHeads = kL2SectionMaxHeads_;
  // Causal work items: the producer takes them (the block's first is its index, the next ones come from
  // a global counter, atomicAdd, zeroed by the launcher) and hands them to the other warps through
  // kItemSlots slots of shared memory.
  static constexpr int kItemSlots = 4;
  // setmaxnreg budgets: the launch gives each thread 65,536 / kNThreads registers (in steps of 8), and
  // the consumers can take only what the producer gives up. Two consumers: 128 x 40 + 256 x 232 =
  // 384 x 168; the producer's checker warps spilled at 24 (ptxas, causal); at 232 the consumers of
  // d128 with 128-key tiles spill nothing, with 176-key tiles the causal kernel spills (non-causal
  // does not). Three consumers: 128 x 32 + 384 x 160 = 512 x 128. kWideConsumers_: without a causal
  // mask the producer's warps 1-3 check nothing, and two consumers take 240 (128 x 24 + 256 x 240;
  // where that measured faster: hopper/flash_fwd_sm90.cu).
  static constexpr bool kWideConsumers = kWideConsumers_;
  template <bool kIsCausal>
  static constexpr int kProducerRegs = kConsumers == 3 ? 32 : kWideConsumers && !kIsCausal ? 24 : 40;
  template <bool kIsCausal>
  static constexpr int kConsumerRegs = kConsumers == 3 ? 160 : kWideConsumers && !kIsCausal ? 240 : 232;
  // Causal: the epilogue's rare path that adds V's NaN / ±Inf elements back (nonfinite_pv.cuh
  // add_nonfinite_v) is called out of line above head dim 128, O copied through local memory around
  // the call. Inlined, its unrolled loops over O's columns made ptxas (sm_90a) spill 360 / 572 bytes
  // (stores / loads) in the d256 n80 consumers and 28 / 28 at d192 n96; out of line none. At head dims
  // 64-128 neither spills (d64 three consumers: 12 / 8 bytes either way).
  static constexpr bool kNonfiniteVOutOfLine = kHeadDim > 128;

  static constexpr int kMmaK = 16;
  static constexpr int kKSteps = kHeadDim / kMmaK;
  static constexpr int kPvKSteps = kBlockN / kMmaK;
  static constexpr int kSTiles = kBlockN / 8;
  static constexpr int kOTiles = kHeadDim / 8;

  static constexpr int kColBlocks = (kHeadDim + 63) / 64;
  static constexpr size_t kQBytes = static_cast<size_t>(kColBlocks) * kBlockM * 128;
  static constexpr size_t kKvTileBytes = static_cast<size_t>(kColBlocks) * kBlockN * 128;
  // Layout: sQ [kQStages] | sK [kStages] | sV [kStages] | mbarriers: per Q buffer full and empty, then
  // per stage full K, full V, empty K, empty V, V checked | per stage the checked V tile's NaN / ±Inf
  // flag (an int in an 8-byte slot) | causal: per item slot full and empty barriers and the item (8
  // bytes); +1024 to align the dynamic base.
  static constexpr size_t kBarrierBytes(int q_stages) {
    return 8 * (2 * q_stages + 5 * kStages) + 8 * kStages + 24 * kItemSlots;
  }
  static constexpr size_t kSmemBytesFor(int q_stages) {
    return q_stages * kQBytes + 2 * kStages * kKvTileBytes + kBarrierBytes(q_stages) + 1024;
  }
  // Q buffers: two where they fit, so that the producer loads the next work item's Q while the
  // consumers still compute S with this one's (with one, the load starts only after the item's last
  // S, and short items wait for it); kQStages_ forces 1 or 2.
  static constexpr int kQStages = kQStages_ != 0 ? kQStages_ : (kSmemBytesFor(2) <= kSm90MaxSmemPerBlock ? 2 : 1);
  static constexpr size_t kSmemBytes = kSmemBytesFor(kQStages);
  // The epilogue: each consumer warpgroup stages O / l in its rows of the item's Q buffer and one
  // thread stores them with TMA (epilogue.cuh stage_fwd_rows_sw128); the buffer is released once the
  // store has read it: with two buffers after the warpgroup's first S of its next item, with one at
  // once (the next Q waits for it). kTmaStoreO_ false: every thread stores its fragments from registers.
  static constexpr bool kStagedO = kTmaStoreO_;

  // Named barriers (0 is __syncthreads'): the consumers' turns, one per warpgroup, and the V checkers'
  // vote (the producer warpgroup's warps 1-3).
  static constexpr int kTurnBarrier0 = 1;
  static constexpr int kCheckBarrier = kTurnBarrier0 + kConsumers;
  static constexpr int kCheckThreads = 96;
  static constexpr int kEpilogueBarrier0 = kCheckBarrier + 1;  // one per consumer warpgroup (staged O)

  static_assert(sizeof(Elem) == 2, "the wgmma path takes fp16 or bf16");
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head dim: a multiple of 16 up to 256");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "kBlockN: wgmma N of S and a multiple of the P V k-step");
  static_assert(kStages >= 2, "K and V double-buffered at least");
  static_assert(kQStages == 1 || kQStages == 2, "one or two Q buffers");
  static_assert(kConsumers == 2 || kConsumers == 3, "two or three consumer warpgroups (register budgets above)");
  static_assert(128 * kProducerRegs<false> + kConsumerThreads * kConsumerRegs<false> <= (65536 / kNThreads) / 8 * 8 * kNThreads &&
                    128 * kProducerRegs<true> + kConsumerThreads * kConsumerRegs<true> <= (65536 / kNThreads) / 8 * 8 * kNThreads,
                "setmaxnreg: the consumers take only what the producer gives up");
  static_assert(kSmemBytes <= kSm90MaxSmemPerBlock, "shared memory exceeds the sm_90 per-block limit");
};

template <typename Traits, bool kIsCausal>
__global__ void __launch_bounds__(Traits::kNThreads, 1)
    flash_fwd_sm90_ws_kernel(const __grid_constant__ AttentionFwdParams p, const __grid_constant__ FwdTensorMaps maps,
                             const __grid_constant__ QueryTileScheduler sched, uint32_t* item_counter) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Elem = typename Traits::Elem;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kStages = Traits::kStages;
  constexpr int kSTiles = Traits::kSTiles, kOTiles = Traits::kOTiles;
  constexpr uint32_t kTileBytes = static_cast<uint32_t>(Traits::kKvTileBytes);

  extern __shared__ unsigned char smem_raw[];
  const uint32_t smem_base = sw128_aligned_base(smem_raw);
  constexpr int kQStages = Traits::kQStages;
  constexpr uint32_t kBar0 = 2 * kQStages;  // the first K/V barrier's slot
  const uint32_t sQ = smem_base;
  const uint32_t sK = sQ + static_cast<uint32_t>(kQStages * Traits::kQBytes);
  const uint32_t sV = sK + kStages * kTileBytes;
  const uint32_t bars = sV + kStages * kTileBytes;
  const auto full_q = [&](int b) { return bars + 8u * static_cast<uint32_t>(b); };
  const auto empty_q = [&](int b) { return bars + 8u * static_cast<uint32_t>(kQStages + b); };
  const auto full_k = [&](int st) { return bars + 8u * (kBar0 + static_cast<uint32_t>(st)); };
  const auto full_v = [&](int st) { return bars + 8u * (kBar0 + static_cast<uint32_t>(kStages + st)); };
  const auto empty_k = [&](int st) { return bars + 8u * (kBar0 + static_cast<uint32_t>(2 * kStages + st)); };
  const auto empty_v = [&](int st) { return bars + 8u * (kBar0 + static_cast<uint32_t>(3 * kStages + st)); };
  const auto v_checked = [&](int st) { return bars + 8u * (kBar0 + static_cast<uint32_t>(4 * kStages + st)); };
  int* const v_flag = reinterpret_cast<int*>(smem_raw + (bars + 8u * (kBar0 + 5 * kStages) - smem_u32(smem_raw)));
  // Causal work items: slot i's full and empty barriers, then the items.
  constexpr int kSlots = Traits::kItemSlots;
  const uint32_t item_bars = bars + 8u * (kBar0 + 6 * kStages);
  const auto item_full = [&](int i) { return item_bars + 8u * static_cast<uint32_t>(i); };
  const auto item_empty = [&](int i) { return item_bars + 8u * static_cast<uint32_t>(kSlots + i); };
  volatile uint32_t* const item_slot =
      reinterpret_cast<uint32_t*>(smem_raw + (item_bars + 16u * kSlots - smem_u32(smem_raw)));
  // K/V tile g of the block's walk (over all its work items) is in stage g % kStages; its full
  // barriers complete once per use, (g / kStages) & 1 is the parity of use g, and a stage's empty
  // barrier before use g passes on the parity of the previous use (a fresh barrier counts the phase
  // before its first as complete, so the first kStages waits pass). Q use u (the block's u-th item
  // with keys) is in buffer u % kQStages, with the same parity rule.
  const auto stage_off = [&](int g) { return static_cast<uint32_t>(g % kStages) * kTileBytes; };
  const auto use_parity = [&](int g) { return static_cast<uint32_t>((g / kStages) & 1); };
  const auto q_buf = [&](int u) { return u % kQStages; };
  const auto q_parity = [&](int u) { return static_cast<uint32_t>((u / kQStages) & 1); };
  const auto q_off = [&](int u) { return static_cast<uint32_t>(q_buf(u) * Traits::kQBytes); };

  const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = static_cast<int>(p.seqlen_k);
  const int head_dim = static_cast<int>(p.head_dim);
  const AttentionMask<kIsCausal> mask(seqlen_q, seqlen_k);  // mask.cuh
  const uint32_t items = sched.items;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int b = 0; b < kQStages; ++b) {
      mbarrier_init(full_q(b), 1);                            // the producer's expect_tx
      // every consumer warp after its last S, or (staged O) one thread per warpgroup once O is stored
      mbarrier_init(empty_q(b), Traits::kStagedO ? Traits::kConsumers : Traits::kConsumerThreads / 32);
    }
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      mbarrier_init(full_k(st), 1);
      mbarrier_init(full_v(st), 1);
      mbarrier_init(empty_k(st), Traits::kConsumerThreads / 32);
      // every consumer warp, and (causal) the checkers' first thread
      mbarrier_init(empty_v(st), Traits::kConsumerThreads / 32 + (kIsCausal ? 1 : 0));
      mbarrier_init(v_checked(st), 1);  // the checkers' first thread
    }
    if constexpr (kIsCausal) {
#pragma unroll
      for (int i = 0; i < kSlots; ++i) {
        mbarrier_init(item_full(i), 1);  // the producer
        // every consumer warp and every V checker warp, once it has read the item
        mbarrier_init(item_empty(i), (Traits::kConsumerThreads + Traits::kCheckThreads) / 32);
      }
    }
    fence_mbarrier_init();
  }
  __syncthreads();  // the last block-wide barrier: the roles part here

  // The block's u-th work item. Not causal: persistent_item's stride. Causal: the producer's thread
  // (publish) takes it (the first is the block's index, the next from the counter, fetched one item
  // ahead so that the atomic's round trip overlaps the item's loads) and publishes it in slot
  // u % kSlots; every other warp reads it there and releases the slot (read).
  uint32_t next_item = blockIdx.x;
  const auto publish_item = [&](uint32_t u) {
    if constexpr (!kIsCausal) {
      return persistent_item(u);
    } else {
      const uint32_t item = next_item;
      if (item < items) next_item = gridDim.x + atomicAdd(item_counter, 1u);
      const int slot = static_cast<int>(u % kSlots);
      mbarrier_wait(item_empty(slot), ((u / kSlots) & 1u) ^ 1u);
      item_slot[slot] = item;
      mbarrier_arrive(item_full(slot));
      return item;
    }
  };
  const auto read_item = [&](uint32_t u) {
    if constexpr (!kIsCausal) {
      return persistent_item(u);
    } else {
      const int slot = static_cast<int>(u % kSlots);
      mbarrier_wait(item_full(slot), (u / kSlots) & 1u);
      const uint32_t item = item_slot[slot];
      __syncwarp();
      if (threadIdx.x % 32 == 0) mbarrier_arrive(item_empty(slot));
      return item;
    }
  };

  // The query tile of an item (query_tile_scheduler.h; the launcher built sched with the traits' sections).
  const auto item_tile = [&](uint32_t item) { return sched.work<kBlockM, kIsCausal>(item); };

  const int wg = warp_uniform_int(static_cast<int>(threadIdx.x) / 128);
  if (wg == 0) {
    setmaxnreg_dec<Traits::template kProducerRegs<kIsCausal>>();
    // Producer: per work item, Q once its buffer's previous item is past its last S, then its K and
    // V tiles, each once its stage is released. It runs ahead into the next item while the consumers
    // finish one (their softmax tail and epilogue overlap the next loads).
    // Warps 1-3 (causal): the V checkers. A crossing tile's check completes its stage's "checked"
    // barrier once per crossing use: the consumers count those uses per stage (bit st of a phase mask).
    // The checkers wait for every tile's V, crossing or not, and release each use of a V stage like a
    // consumer warp: the next load into the stage waits for them, so no phase of its full barrier can
    // pass unseen (a parity wait two phases late would block on the wrong phase).
    if (kIsCausal && threadIdx.x >= 32) {
      const int tid = static_cast<int>(threadIdx.x) - 32;
      int g = 0;
      for (uint32_t round = 0, item; (item = read_item(round)) < items; ++round) {
        const QueryTileWork w = item_tile(item);
        const int n_blocks = mask.template query_tile_keys<kBlockM, kBlockN>(w.m0).tiles;
        for (int j = 0; j < n_blocks; ++j, ++g) {
          const int st = g % kStages;
          mbarrier_wait(full_v(st), use_parity(g));
          if (!mask.template crosses<kBlockM, kBlockN>(w.m0, j * kBlockN)) {
            if (tid == 0) mbarrier_arrive(empty_v(st));
            continue;
          }
          Elem* tile = reinterpret_cast<Elem*>(smem_raw + (sV + stage_off(g) - smem_u32(smem_raw)));
          const bool any = named_barrier_zero_tile_nonfinite<Elem, Traits::kColBlocks * kBlockN, kSw128BlockCols,
                                                             kSw128BlockCols, Traits::kCheckThreads>(
              tile, Traits::kCheckBarrier, tid);
          if (tid == 0) {
            v_flag[2 * st] = any;
            mbarrier_arrive(v_checked(st));
            mbarrier_arrive(empty_v(st));
          }
        }
      }
      return;
    }
    if (threadIdx.x == 0) {
      prefetch_tensor_map(&maps.q);
      prefetch_tensor_map(&maps.k);
      prefetch_tensor_map(&maps.v);
      int g = 0, q_uses = 0;
      for (uint32_t round = 0, item; (item = publish_item(round)) < items; ++round) {
        const QueryTileWork w = item_tile(item);
        const int n_blocks = mask.template query_tile_keys<kBlockM, kBlockN>(w.m0).tiles;
        if (n_blocks == 0) continue;
        const uint32_t full = full_q(q_buf(q_uses));
        mbarrier_wait(empty_q(q_buf(q_uses)), q_parity(q_uses) ^ 1u);
        mbarrier_arrive_expect_tx(full, static_cast<uint32_t>(Traits::kQBytes));
#pragma unroll
        for (int cb = 0; cb < Traits::kColBlocks; ++cb)
          tma_load_4d(sQ + q_off(q_uses) + static_cast<uint32_t>(cb * kBlockM * kSw128RowBytes), &maps.q, full,
                      cb * kSw128BlockCols, w.m0, w.head, static_cast<int>(w.batch));
        ++q_uses;
        for (int j = 0; j < n_blocks; ++j, ++g) {
          const int st = g % kStages;
          // Tile j of K (or V) into stage st of sK (sV), once the stage's previous use is released.
          const auto load = [&](uint32_t empty, uint32_t full, uint32_t dst, const CUtensorMap* map) {
            mbarrier_wait(empty, use_parity(g) ^ 1u);
            mbarrier_arrive_expect_tx(full, kTileBytes);
#pragma unroll
            for (int cb = 0; cb < Traits::kColBlocks; ++cb)
              tma_load_4d(dst + stage_off(g) + static_cast<uint32_t>(cb * kBlockN * kSw128RowBytes), map, full,
                          cb * kSw128BlockCols, j * kBlockN, w.head_kv, static_cast<int>(w.batch));
          };
          load(empty_k(st), full_k(st), sK, &maps.k);
          load(empty_v(st), full_v(st), sV, &maps.v);
        }
      }
    }
    return;
  }

  // Consumers.
  setmaxnreg_inc<Traits::template kConsumerRegs<kIsCausal>>();
  const int cw = wg - 1;                               // consumer warpgroup
  const int ct = static_cast<int>(threadIdx.x) - 128;  // consumer thread, [0, kConsumerThreads)
  const int warp = (ct / 32) % 4, lane = ct % 32;
  const int g_row = lane / 4, t = lane % 4;
  const uint32_t sQ_wg0 = sQ + static_cast<uint32_t>(cw * Traits::kWgRows * kSw128RowBytes);

  // A warp's release of a stage (or of Q), once every lane's wgmma reading it are done.
  const auto release = [&](uint32_t empty_bar) {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(empty_bar);
  };
  // Turns at issuing wgmma: warpgroup cw waits for its own barrier, then passes the turn on. They
  // continue from item to item: every consumer warpgroup walks the same items and tiles.
  constexpr int kTurnThreads = 2 * 128;
  const auto take_turn = [&] { named_barrier_sync(Traits::kTurnBarrier0 + cw, kTurnThreads); };
  const auto pass_turn = [&] {
    named_barrier_arrive(Traits::kTurnBarrier0 + (cw + 1) % Traits::kConsumers, kTurnThreads);
  };
  bool turns_started = false;

  int g = 0, q_uses = 0;
  uint32_t cross_phase = 0;  // bit st: parity of stage st's next "checked" completion
  // Staged O: each warpgroup's first thread issues its stores, and releases the Q buffer of use u - 1
  // in use u.
  const auto store_thread = [&] { return threadIdx.x % 128 == 0; };
  for (uint32_t round = 0, item; (item = read_item(round)) < items; ++round) {
    const QueryTileWork w = item_tile(item);
    const int m0 = w.m0;
    const int n_blocks = mask.template query_tile_keys<kBlockM, kBlockN>(m0).tiles;
    const int row0 = m0 + cw * Traits::kWgRows + warp * 16 + g_row;  // this thread's rows: row0, row0 + 8

    // V tile j of this item (use g0 + j): landed, and on a tile that crosses the diagonal checked (its
    // NaN / ±Inf zeroed by the checkers, added back in the epilogue).
    int v_nonfinite_from = INT_MAX;
    const int g0 = g;
    const auto wait_v = [&](int j) {
      const int st = (g0 + j) % kStages;
      if (kIsCausal && mask.template crosses<kBlockM, kBlockN>(m0, j * kBlockN)) {
        mbarrier_wait(v_checked(st), (cross_phase >> st) & 1u);
        cross_phase ^= 1u << st;
        if (v_flag[2 * st] != 0) v_nonfinite_from = min(v_nonfinite_from, j * kBlockN);
      } else {
        mbarrier_wait(full_v(st), use_parity(g0 + j));
      }
    };

    float o[kOTiles][4];
#pragma unroll
    for (int j = 0; j < kOTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[j][e] = 0.0f;
    OnlineSoftmax softmax;

    int q_use = -1;
    if (n_blocks > 0) {
      // The first turn is warpgroup 0's: the last warpgroup passes it before its first tile.
      if (!turns_started && cw == Traits::kConsumers - 1) pass_turn();
      turns_started = true;
      q_use = q_uses++;
      const uint32_t sQ_wg = sQ_wg0 + q_off(q_use);
      mbarrier_wait(full_q(q_buf(q_use)), q_parity(q_use));
      float s[kSTiles][4];
      uint32_t pa[Traits::kPvKSteps][4];  // P_{nb-1} as the A operand of the P V k-steps
      for (int nb = 0; nb < n_blocks; ++nb) {
        const int n0 = nb * kBlockN;
        if (nb > 0) wait_v(nb - 1);
        mbarrier_wait(full_k((g0 + nb) % kStages), use_parity(g0 + nb));
        take_turn();
        issue_s_then_pv<Traits, Elem>(s, o, pa, sQ_wg, sK + stage_off(g0 + nb), sV + stage_off(g0 + nb - 1), nb > 0);
        // The turn passes once S_nb is done (P_{nb-1} V_{nb-1} may still run): passed between the
        // commit and the wait, ptxas serialized the wgmma (C7514, non-wgmma instructions reading
        // accumulators).
        pass_turn();
        release(empty_k((g0 + nb) % kStages));
        if constexpr (Traits::kStagedO) {
          // The previous Q use's O store has long read its buffer: the producer may refill it.
          if (kQStages == 2 && nb == 0 && q_use > 0 && store_thread()) {
            bulk_wait_read<0>();
            mbarrier_arrive(empty_q(q_buf(q_use - 1)));
          }
        } else if (nb == n_blocks - 1) {
          release(empty_q(q_buf(q_use)));  // the item's last S: Q may be replaced
        }

        if (mask.template fwd_tile_needs_mask<kBlockN>(n0, mask.template crosses<kBlockM, kBlockN>(m0, n0)))
          mask.mask_scores(s, n0 + 2 * t, row0);
        float rescale[2];
        softmax.update(s, p.scale_log2, rescale);

        wgmma_wait<0>();
        fence_operands(o);
        if (nb > 0) release(empty_v((g0 + nb - 1) % kStages));
        // Rescaling O here, after its P V, rather than just before the next P V while the next S runs
        // (FA3's order): that order made the causal d128 n128 kernel spill 136 bytes (ptxas, sm_90a).
        scale_rows(o, rescale);
#pragma unroll
        for (int ks = 0; ks < Traits::kPvKSteps; ++ks) p_to_a_operand<Elem>(s, ks, pa[ks]);
      }
      // The last tile's P V (outside the turns).
      const int last = n_blocks - 1;
      wait_v(last);
      wgmma_fence();
      const uint32_t sV_last = sV + stage_off(g0 + last);
      wgmma_rs_mn_major<Traits::kHeadDim, kBlockN, Traits::kPvKSteps, Elem>(o, pa, sV_last);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(o);
      release(empty_v((g0 + last) % kStages));
      g += n_blocks;
    }
    // The epilogue's pointers, made here rather than kept live through the main loop (the causal
    // kernel spilled 132-336 bytes with them made at the item's start).
    const int n_end = mask.template query_tile_keys<kBlockM, kBlockN>(m0).end;
    if (v_nonfinite_from < n_end) {
      const Elem* v = static_cast<const Elem*>(p.v) + w.batch * p.v_batch_stride + w.head_kv * p.v_head_stride;
      if constexpr (Traits::kNonfiniteVOutOfLine)
        add_nonfinite_v_out_of_line<Elem, kOTiles>(o, v, p.v_row_stride, v_nonfinite_from, n_end, row0, mask, head_dim,
                                                   lane);
      else
        add_nonfinite_v<Elem, kOTiles>(o, v, p.v_row_stride, v_nonfinite_from, n_end, row0, mask, head_dim, lane);
    }
    float* lse = p.lse + (w.batch * p.heads_q + w.head) * p.seqlen_q;
    if (Traits::kStagedO && q_use >= 0) {
      // Through this warpgroup's rows of the item's Q buffer (flash_fwd_sm90_kernel.cuh); with one
      // buffer it is released as soon as the store has read it.
      if (store_fwd_rows_tma<Traits>(o, softmax, mask, row0, t, warp * 16 + g_row, sQ_wg0 + q_off(q_use),
                                     Traits::kEpilogueBarrier0 + cw, &maps.o, m0 + cw * Traits::kWgRows, w.head,
                                     static_cast<int>(w.batch), lse) &&
          kQStages == 1) {
        bulk_wait_read<0>();
        mbarrier_arrive(empty_q(0));
      }
    } else {
      Elem* out = static_cast<Elem*>(p.out) + w.batch * p.o_batch_stride + w.head * p.o_head_stride;
      write_fwd_rows<Elem>(o, softmax, mask, row0, t, out, p.o_row_stride, lse, head_dim);
    }
  }
  // The last O stores: complete before the block's shared memory goes.
  if (Traits::kStagedO && store_thread()) bulk_wait<0>();
  // The last warpgroup's last pass has no taker: warpgroup 0 takes it, so that no arrival is left pending
  // on a barrier at exit.
  if (turns_started && cw == 0) take_turn();
#else
  __trap();  // only the sm_90a build has this kernel
#endif
}

}  // namespace fa::cuda::flash::sm90
