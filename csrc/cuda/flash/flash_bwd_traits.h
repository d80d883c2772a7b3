// Compile-time configuration of one FA2 backward kernel instance (sm_80+ mma.sync path): tile sizes,
// the warps' split of the work, and the shared-memory layout derived from them. Everything the kernel
// and the launcher need to agree on lives here; no literal sizes elsewhere.
#pragma once
#include <cstddef>

#include "cuda/smem_limits.h"

namespace fa::cuda::flash {

// kKeyTiles warps along the K/V tile (16 keys each) times kDSplit warps along the head dim: warp w owns
// keys [16 (w % kKeyTiles), +16) of the tile and, for dK / dV, head-dim columns
// [(w / kKeyTiles) kDPart, +kDPart). The kDSplit warps of one key tile compute the same S^T / dP^T (the
// price of keeping dK and dV of large head dims in registers).
template <int kHeadDim_, int kBlockM_, int kKeyTiles_, int kDSplit_, typename Elem_>
struct FlashBwdTraits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;    // query rows per Q / dO tile (the loop's step)
  static constexpr int kKeyTiles = kKeyTiles_;
  static constexpr int kDSplit = kDSplit_;
  static constexpr int kBlockN = 16 * kKeyTiles;  // keys per thread block (its K / V tile)
  static constexpr int kNWarps = kKeyTiles * kDSplit;
  static constexpr int kNThreads = kNWarps * 32;
  static constexpr int kDPart = kHeadDim / kDSplit;  // dK / dV columns per warp

  static constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;
  static constexpr int kKSteps = kHeadDim / kMmaK;    // k-steps of S^T = K Q^T and dP^T = V dO^T
  static constexpr int kSTiles = kBlockM / kMmaN;     // n8 tiles of a warp's S^T: (16 keys, kBlockM queries)
  static constexpr int kQKSteps = kBlockM / kMmaK;    // k-steps (over queries) of dV += P^T dO, dK += dS^T Q
  static constexpr int kKvTiles = kDPart / kMmaN;     // n8 tiles of a warp's dK / dV: (16 keys, kDPart)

  // dQ_i = dS K_j: (kBlockM, kHeadDim) split as kDqRowTiles 16-row tiles x kDqSplit column parts.
  static constexpr int kDqRowTiles = kBlockM / kMmaM;
  static constexpr int kDqSplit = kNWarps / kDqRowTiles;
  static constexpr int kDqCols = kHeadDim / kDqSplit;
  static constexpr int kDqTiles = kDqCols / kMmaN;    // n8 tiles of a warp's dQ piece
  static constexpr int kDqKSteps = kBlockN / kMmaK;   // k-steps (over keys) of dQ

  // cp.async moves 16 bytes = kChunk elements. Rows are padded by one chunk so that the row pitch is an
  // odd number of 16-byte chunks: the 8 row addresses of an ldmatrix land on distinct bank groups.
  static constexpr int kChunk = 16 / static_cast<int>(sizeof(Elem));
  static constexpr int kSmemPitch = kHeadDim + kChunk;
  static constexpr int kChunksPerRow = kHeadDim / kChunk;
  static constexpr int kStages = 2;  // Q / dO / lse / D double buffering
  // dS^T [kBlockN keys][kBlockM queries], padded the same way (pitch = odd number of 16-byte chunks).
  static constexpr int kDsPitch = kBlockM + kChunk;

  static constexpr size_t kKvTileElems = static_cast<size_t>(kBlockN) * kSmemPitch;
  static constexpr size_t kQTileElems = static_cast<size_t>(kBlockM) * kSmemPitch;
  static constexpr size_t kDsElems = static_cast<size_t>(kBlockN) * kDsPitch;
  // Layout (Elem): sK [kBlockN][pitch] | sV [kBlockN][pitch] | sQ [kStages][kBlockM][pitch] |
  // sdO [kStages][kBlockM][pitch] | sdS [kBlockN][kDsPitch]; then (float) sLse2 [kStages][kBlockM] |
  // sD [kStages][kBlockM].
  static constexpr size_t kElemBytes = (2 * kKvTileElems + 2 * kStages * kQTileElems + kDsElems) * sizeof(Elem);
  static constexpr size_t kSmemBytes = kElemBytes + 2 * kStages * kBlockM * sizeof(float);

  static_assert(sizeof(Elem) == 2, "the mma.sync path takes fp16 or bf16 only");
  static_assert(kHeadDim % kMmaK == 0, "head_dim must be a multiple of 16 (mma k and ldmatrix x4 pairs)");
  static_assert(kBlockM % kMmaK == 0, "kBlockM must be a multiple of 16 (the k-steps over queries)");
  static_assert(kHeadDim % kDSplit == 0 && kDPart % 16 == 0, "dK / dV column parts: multiples of 16 (ldmatrix x4 pairs)");
  static_assert(kNWarps % kDqRowTiles == 0, "the warps must split dQ's 16-row tiles evenly");
  static_assert(kHeadDim % kDqSplit == 0 && kDqCols % 16 == 0, "dQ column parts: multiples of 16 (ldmatrix x4 pairs)");
  static_assert((kBlockN * kChunksPerRow) % kNThreads == 0, "K/V tile chunks must split evenly over threads");
  static_assert((kBlockM * kChunksPerRow) % kNThreads == 0, "Q/dO tile chunks must split evenly over threads");
  static_assert(kBlockM <= kNThreads, "one thread per query row loads lse and D");
  static_assert((kSmemPitch * sizeof(Elem)) % 32 == 16 && (kDsPitch * sizeof(Elem)) % 32 == 16,
                "row pitches must be odd numbers of 16-byte chunks (no ldmatrix conflicts)");
  static_assert(kSmemBytes <= kSm90MaxSmemPerBlock, "shared memory exceeds the sm_90 per-block limit");
};

}  // namespace fa::cuda::flash
