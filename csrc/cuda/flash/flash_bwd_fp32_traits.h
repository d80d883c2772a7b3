// Compile-time configuration of one float32 FA2 backward kernel instance (sm_80+ mma.sync m16n8k8 on
// TF32 tensor cores): tile sizes, the warps' split of the work, Q / dO staging, and the shared-memory
// layout derived from them. Everything the kernel and the launcher need to agree on lives here; no
// literal sizes elsewhere.
#pragma once
#include <cstddef>

#include "cuda/smem_limits.h"

namespace fa::cuda::flash {

// kKeyTiles warps along the K/V tile (16 keys each) times kDSplit warps along the head dim: warp w owns
// keys [16 (w % kKeyTiles), +16) of the tile and, for dK / dV, head-dim columns
// [(w / kKeyTiles) kDPart, +kDPart). The kDSplit warps of one key tile compute the same S^T / dP^T (the
// price of keeping dK and dV of large head dims in registers: kDPart floats per thread for the two).
// kStages: 2 = Q / dO / lse / D of the next query tile load during the whole current one; 1 = one
// buffer, the next tile loads during the dQ product (which reads only K and dS), for shared memory.
template <int kHeadDim_, int kBlockM_, int kKeyTiles_, int kDSplit_, int kStages_, int kMinBlocksPerSm_>
struct FlashBwdFp32Traits {
  using Elem = float;                         // tile_load.cuh's element type
  static constexpr int kHeadDim = kHeadDim_;  // the specialisation; the call's head_dim may be smaller
  static constexpr int kBlockM = kBlockM_;    // query rows per Q / dO tile (the loop's step)
  static constexpr int kKeyTiles = kKeyTiles_;
  static constexpr int kDSplit = kDSplit_;
  static constexpr int kStages = kStages_;
  // __launch_bounds__ occupancy target: caps registers at 65536 / (kNThreads * kMinBlocksPerSm).
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  static constexpr int kBlockN = 16 * kKeyTiles;  // keys per thread block (its K / V tile)
  static constexpr int kNWarps = kKeyTiles * kDSplit;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kDPart = kHeadDim / kDSplit;  // dK / dV columns per warp

  // mma.sync m16n8k8 (tf32) shape.
  static constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 8;
  static constexpr int kKSteps = kHeadDim / kMmaK;  // k-steps of S^T = K Q^T and dP^T = V dO^T
  static constexpr int kSTiles = kBlockM / kMmaN;   // n8 tiles of a warp's S^T: (16 keys, kBlockM queries);
                                                    // also the k-steps (8 queries each) of dV and dK
  static constexpr int kKvTiles = kDPart / kMmaN;   // n8 tiles of a warp's dK / dV: (16 keys, kDPart)

  // dQ_i = dS K_j: (kBlockM, kHeadDim) split as kDqRowTiles 16-row tiles x kDqSplit column parts.
  static constexpr int kDqRowTiles = kBlockM / kMmaM;
  static constexpr int kDqSplit = kNWarps / kDqRowTiles;
  static constexpr int kDqCols = kHeadDim / kDqSplit;
  static constexpr int kDqTiles = kDqCols / kMmaN;   // n8 tiles of a warp's dQ piece
  static constexpr int kDqKSteps = kBlockN / kMmaK;  // k-steps (8 keys each) of dQ

  // cp.async moves 16 bytes = 4 floats. Rows are padded by one chunk: a pitch of 4 mod 32 floats puts the
  // 8 row addresses of an ldmatrix (K, V as A; Q, dO as B) on 8 distinct 16-byte bank groups, and the
  // scalar B-operand loads of dV, dK and dQ (rows 2t and 2t + 1, column g: banks 8t + g, 8t + 4 + g) on
  // 32 distinct banks.
  static constexpr int kChunk = 4;
  static constexpr int kSmemPitch = kHeadDim + kChunk;  // floats per K / V / Q / dO row
  static constexpr int kChunksPerRow = kHeadDim / kChunk;
  // dS^T [kBlockN keys][kBlockM queries] with a pitch of 4 mod 32 floats: the float2 stores of the S^T
  // accumulator and dQ's scalar A loads (rows 2t, 2t + 1, column g) are conflict-free.
  static constexpr int kDsPitch = (kBlockM + 31) / 32 * 32 + 4;

  static constexpr size_t kKvTileElems = static_cast<size_t>(kBlockN) * kSmemPitch;
  static constexpr size_t kQTileElems = static_cast<size_t>(kBlockM) * kSmemPitch;
  static constexpr size_t kDsElems = static_cast<size_t>(kBlockN) * kDsPitch;
  // Layout (floats): sK [kBlockN][pitch] | sV [kBlockN][pitch] | sQ [kStages][kBlockM][pitch] |
  // sdO [kStages][kBlockM][pitch] | sdS [kBlockN][kDsPitch] | sLse2 [kStages][kBlockM] | sD [kStages][kBlockM].
  static constexpr size_t kSmemBytes =
      (2 * kKvTileElems + 2 * kStages * kQTileElems + kDsElems + 2 * kStages * kBlockM) * sizeof(float);

  static_assert(kHeadDim % 32 == 0, "the specialised head dim must be a multiple of 32 (pitch 4 mod 32 floats)");
  static_assert(kBlockM % (2 * kMmaN) == 0, "kBlockM must be a multiple of 16 (ldmatrix x4 covers two n8 tiles)");
  static_assert(kStages == 1 || kStages == 2, "Q / dO are single or double buffered");
  static_assert(kHeadDim % kDSplit == 0 && kDPart % kMmaN == 0, "dK / dV column parts: whole n8 tiles");
  static_assert(kNWarps % kDqRowTiles == 0, "the warps must split dQ's 16-row tiles evenly");
  static_assert(kHeadDim % kDqSplit == 0 && kDqCols % kMmaN == 0, "dQ column parts: whole n8 tiles");
  static_assert((kBlockN * kChunksPerRow) % kNThreads == 0, "K/V tile chunks must split evenly over threads");
  static_assert((kBlockM * kChunksPerRow) % kNThreads == 0, "Q/dO tile chunks must split evenly over threads");
  static_assert(kBlockM <= kNThreads, "one thread per query row loads lse and D");
  static_assert(kSmemPitch % 32 == kChunk && kDsPitch % 32 == kChunk,
                "row pitches must be 4 mod 32 floats (conflict-free ldmatrix and scalar operand loads)");
  static_assert(kSmemBytes <= kSm90MaxSmemPerBlock, "shared memory exceeds the sm_90 per-block limit");
};

}  // namespace fa::cuda::flash
