// Compile-time configuration of one Hopper (sm_90a, wgmma) FA2 backward kernel instance: tile sizes,
// how the two warpgroups split dQ, and the shared-memory layout derived from them.
#pragma once
#include <cstddef>

#include "cuda/smem_limits.h"

namespace fa::cuda::flash::sm90 {

template <int kHeadDim_, int kBlockM_, typename Elem_>
struct FlashBwdSm90Traits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarpGroups = 2;
  static constexpr int kNThreads = kNWarpGroups * 128;
  // Blocks per SM that the register budget must allow (__launch_bounds__) for the dK/dV kernel of the
  // two-kernel backward: two at d32, whose 256 threads fit 128 registers (B2's rare path took its
  // causal variant to 166, and its non-causal one to 129). The single kernel and larger head dims need
  // more registers than that anyway: one.
  static constexpr int kDkDvMinBlocksPerSm = kHeadDim <= 32 ? 2 : 1;
  static constexpr int kWgKeys = 64;                        // wgmma M of S^T = K Q^T: keys per warpgroup
  static constexpr int kBlockN = kWgKeys * kNWarpGroups;    // keys per thread block (its K / V tile)
  static constexpr int kBlockM = kBlockM_;                  // query rows per Q / dO tile (wgmma N of S^T)
  static constexpr int kStages = 2;                         // Q / dO / lse / D double buffering

  // dQ_i = dS K_j (kBlockM x kHeadDim, k = the block's keys). With whole 64-column halves (head dim
  // 128, 256) each warpgroup computes one half (N = kHeadDim / 2); otherwise warpgroup 0 computes all of
  // it (N = kHeadDim) while warpgroup 1 goes on: one warpgroup's wgmma keeps all four tensor cores busy.
  static constexpr bool kDqSplitCols = (kHeadDim / 2) % 64 == 0;
  static constexpr int kDqN = kDqSplitCols ? kHeadDim / 2 : kHeadDim;

  static constexpr int kMmaK = 16;
  static constexpr int kKSteps = kHeadDim / kMmaK;     // k-steps of S^T, dP^T (over the head dim)
  static constexpr int kQKSteps = kBlockM / kMmaK;     // k-steps of dV, dK (over the tile's queries)
  static constexpr int kDqKSteps = kBlockN / kMmaK;    // k-steps of dQ (over the block's keys)
  static constexpr int kSTiles = kBlockM / 8;          // n8 tiles of a warp's S^T / dP^T
  static constexpr int kKvTiles = kHeadDim / 8;        // n8 tiles of a warp's dK / dV
  static constexpr int kDqTiles = kDqN / 8;            // n8 tiles of a warp's dQ piece

  // SW128 tiles (wgmma.cuh): ceil(cols / 64) column blocks of 128-byte rows.
  static constexpr int kColBlocks = (kHeadDim + 63) / 64;
  static constexpr size_t kKvTileBytes = static_cast<size_t>(kColBlocks) * kBlockN * 128;
  static constexpr size_t kQTileBytes = static_cast<size_t>(kColBlocks) * kBlockM * 128;
  // dS^T [kBlockN keys][kBlockM = 64 queries]: the MN-major A operand of dQ (queries contiguous, one
  // 128-byte row per key).
  static constexpr size_t kDsBytes = static_cast<size_t>(kBlockN) * 128;
  // Layout: sK | sV | sQ [kStages] | sdO [kStages] | sdS (each 1024-aligned) | lse2, D [kStages][kBlockM]
  // floats | mbarriers: K/V, then Q/dO per stage | the K tile's NaN / ±Inf flag (an int, in an 8-byte
  // slot) | (the single kernel) sdQ, 1024-aligned; +1024 to align the dynamic base.
  static constexpr size_t kFloatBytes = 2 * kStages * kBlockM * sizeof(float);
  static constexpr size_t kBarrierBytes = 8 * (1 + kStages) + 8;
  static constexpr size_t kDkDvSmemBytes =
      2 * kKvTileBytes + 2 * kStages * kQTileBytes + kDsBytes + kFloatBytes + kBarrierBytes + 1024;
  // The single kernel's dQ staging tile: a step's dQ_i in fp32, [kHeadDim / 32 column blocks][kBlockM
  // rows][32 columns] (128-byte rows, SW128: the boxes of its bulk reductions, tensor_map.h
  // make_accum_map). Warpgroup w's piece is column blocks [w kDqN / 32, (w + 1) kDqN / 32).
  static constexpr int kDqBoxes = kDqN / 32;  // column blocks per warpgroup piece
  static constexpr int kDqBarrier0 = 1;       // named barriers 1, 2: warpgroup w's piece is staged
  static constexpr size_t kDqStageBytes = static_cast<size_t>(kBlockM) * kHeadDim * sizeof(float);
  static constexpr size_t kDqStageOffset = (kDkDvSmemBytes - 1024 + 1023) / 1024 * 1024;  // SW128 atoms: 1024 B
  static constexpr size_t kSmemBytes = kDqStageOffset + kDqStageBytes + 1024;

  static_assert(sizeof(Elem) == 2, "the wgmma path takes fp16 or bf16");
  static_assert(kHeadDim % 64 == 0 || kHeadDim == 32, "head dim: whole 64-column blocks (or 32)");
  static_assert(kBlockM == 64, "query tile: the wgmma M of dQ");
  static_assert(kSmemBytes <= kSm90MaxSmemPerBlock, "shared memory exceeds the sm_90 per-block limit");
  static_assert(kDqN % 32 == 0, "dQ pieces: whole 32-column blocks of the staging tile");
};

}  // namespace fa::cuda::flash::sm90
