// Compile-time configuration of one Hopper (sm_90a, wgmma) FA2 forward kernel instance: tile sizes,
// warpgroups, pipeline depth and the shared-memory layout derived from them.
#pragma once
#include <cstddef>

#include "cuda/smem_limits.h"

namespace fa::cuda::flash::sm90 {

template <int kHeadDim_, int kBlockN_, int kNWarpGroups_, int kStages_, typename Elem_, int kMinBlocksPerSm_ = 1,
          bool kTmaStoreO_ = true>
struct FlashFwdSm90Traits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;  // compiled head dim; smaller multiples of 8 run zero-padded
  static constexpr int kNWarpGroups = kNWarpGroups_;
  static constexpr int kNThreads = kNWarpGroups * 128;
  static constexpr int kWgRows = 64;                       // wgmma M: query rows per warpgroup
  static constexpr int kBlockM = kWgRows * kNWarpGroups;   // query rows per thread block
  static constexpr int kBlockN = kBlockN_;                 // keys per K/V tile (wgmma N of S = Q K^T)
  static constexpr int kStages = kStages_;                 // K/V tiles in flight
  // Thread blocks that must fit on one SM together (__launch_bounds__): above 1, ptxas caps registers
  // at 65536 / (kNThreads * kMinBlocksPerSm).
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;

  static constexpr int kMmaK = 16;
  static constexpr int kKSteps = kHeadDim / kMmaK;    // wgmma k-steps of S = Q K^T
  static constexpr int kPvKSteps = kBlockN / kMmaK;   // wgmma k-steps of O += P V
  static constexpr int kSTiles = kBlockN / 8;         // n8 tiles of a warp's S accumulator (16, kBlockN)
  static constexpr int kOTiles = kHeadDim / 8;        // n8 tiles of a warp's O accumulator (16, kHeadDim)

  // SW128 tiles (wgmma.cuh): ceil(kHeadDim / 64) column blocks of 128-byte rows.
  static constexpr int kColBlocks = (kHeadDim + 63) / 64;
  static constexpr size_t kQBytes = static_cast<size_t>(kColBlocks) * kBlockM * 128;
  static constexpr size_t kKvTileBytes = static_cast<size_t>(kColBlocks) * kBlockN * 128;
  // Layout: sQ | sK [kStages] | sV [kStages] (each 1024-aligned) | mbarriers: Q, then one per stage
  // (8 bytes each); +1024 to align the dynamic base.
  static constexpr size_t kBarrierBytes = 8 * (1 + kStages);
  static constexpr size_t kSmemBytes = kQBytes + 2 * kStages * kKvTileBytes + kBarrierBytes + 1024;
  // The epilogue: each warpgroup stages O / l in its rows of sQ and one thread stores them with TMA
  // (epilogue.cuh stage_fwd_rows_sw128), or (false) every thread stores its fragments from registers.
  static constexpr bool kStagedO = kTmaStoreO_;
  static constexpr int kEpilogueBarrier0 = 1;  // named barriers, one per warpgroup (0 is __syncthreads')

  static_assert(sizeof(Elem) == 2, "the wgmma path takes fp16 or bf16");
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= 256, "head dim: a multiple of 16 up to 256 (wgmma k, N)");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "kBlockN: wgmma N of S and a multiple of the P V k-step");
  static_assert(kStages >= 3, "the pipelined loop refills a stage two tiles after its use: 3 stages double-buffer");
  static_assert(kSmemBytes <= kSm90MaxSmemPerBlock, "shared memory exceeds the sm_90 per-block limit");
  static_assert(kMinBlocksPerSm * (kSmemBytes + kSmemReservedPerBlock) <= kSm90SmemPerSm, "kMinBlocksPerSm blocks do not fit in one SM's shared memory");
};

}  // namespace fa::cuda::flash::sm90
