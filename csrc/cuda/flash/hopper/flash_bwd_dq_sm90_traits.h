// Compile-time configuration of the Hopper (sm_90a) dQ kernel of the two-kernel FA2 backward: tile
// sizes, warpgroups, K/V stages and the shared-memory layout derived from them.
#pragma once
#include <cstddef>

#include "cuda/smem_limits.h"

namespace fa::cuda::flash::sm90 {

template <int kHeadDim_, int kBlockN_, typename Elem_>
struct FlashBwdDqSm90Traits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarpGroups = 2;
  static constexpr int kNThreads = kNWarpGroups * 128;
  static constexpr int kWgRows = 64;                      // wgmma M: query rows per warpgroup
  static constexpr int kBlockM = kWgRows * kNWarpGroups;  // query rows per thread block
  static constexpr int kBlockN = kBlockN_;                // keys per K/V tile
  static constexpr int kStages = 2;                       // K/V double buffering
  // Blocks per SM that the register budget must allow (__launch_bounds__): two up to d64, whose 256
  // threads fit 128 registers (and twice the shared memory) without spills. Without it, B2's rare path
  // took d64 causal to 141 registers, one block per SM, and the two-kernel backward 1.2x slower
  // (H100, 2026-11-21).
  static constexpr int kMinBlocksPerSm = kHeadDim <= 64 ? 2 : 1;

  static constexpr int kMmaK = 16;
  static constexpr int kKSteps = kHeadDim / kMmaK;   // k-steps of S = Q K^T and dP = dO V^T
  static constexpr int kDqKSteps = kBlockN / kMmaK;  // k-steps of dQ += dS K (over the tile's keys)
  static constexpr int kSTiles = kBlockN / 8;        // n8 tiles of a warp's S / dP: (16 rows, kBlockN)
  static constexpr int kDqTiles = kHeadDim / 8;      // n8 tiles of a warp's dQ: (16 rows, kHeadDim)

  // SW128 tiles (wgmma.cuh): ceil(kHeadDim / 64) column blocks of 128-byte rows.
  static constexpr int kColBlocks = (kHeadDim + 63) / 64;
  static constexpr size_t kQTileBytes = static_cast<size_t>(kColBlocks) * kBlockM * 128;
  static constexpr size_t kKvTileBytes = static_cast<size_t>(kColBlocks) * kBlockN * 128;
  // Layout: sQ | sdO | sK [kStages] | sV [kStages] (each 1024-aligned) | mbarriers: Q/dO, then one per
  // K/V stage; +1024 to align the dynamic base.
  static constexpr size_t kBarrierBytes = 8 * (1 + kStages);
  static constexpr size_t kSmemBytes = 2 * kQTileBytes + 2 * kStages * kKvTileBytes + kBarrierBytes + 1024;

  static_assert(sizeof(Elem) == 2, "the wgmma path takes fp16 or bf16");
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head dim: a multiple of 16 up to 256");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "kBlockN: wgmma N of S and a multiple of the dQ k-step");
  static_assert(kSmemBytes <= kSm90MaxSmemPerBlock, "shared memory exceeds the sm_90 per-block limit");
};

}  // namespace fa::cuda::flash::sm90
