// Compile-time configuration of one FA2 forward kernel instance (sm_80+ mma.sync path): tile sizes,
// warps, and the shared-memory layout derived from them. Everything the kernel and the launcher need
// to agree on lives here; no literal sizes elsewhere.
#pragma once
#include <cstddef>

#include "cuda/smem_limits.h"

namespace fa::cuda::flash {

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, typename Elem_, bool kQInRegs_ = true>
struct FlashFwdTraits {
  using Elem = Elem_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per thread block
  static constexpr int kBlockN = kBlockN_;  // key / value rows per K/V tile
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  // Q fragments held in registers for the whole K/V loop (else re-read from shared memory per k-step).
  static constexpr bool kQInRegs = kQInRegs_;

  // mma.sync m16n8k16 shape.
  static constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 16;
  // Each warp owns kRowTiles row tiles of 16 query rows; the warps split Q, not K/V.
  static constexpr int kRowsPerWarp = kBlockM / kNWarps;
  static constexpr int kRowTiles = kRowsPerWarp / kMmaM;
  static constexpr int kKSteps = kHeadDim / kMmaK;   // k-steps of S = Q K^T (over head_dim)
  static constexpr int kSTiles = kBlockN / kMmaN;    // n8 tiles of S per row tile: (16, kBlockN)
  static constexpr int kPvKSteps = kBlockN / kMmaK;  // k-steps of O += P V (over the key tile)
  static constexpr int kOTiles = kHeadDim / kMmaN;   // n8 tiles of O per row tile: (16, kHeadDim)

  // cp.async moves 16 bytes = kChunk elements; rows are padded by one chunk so that the row pitch is an
  // odd number of 16-byte chunks: the 8 row addresses of an ldmatrix then land on 8 distinct 16-byte
  // bank groups (r * pitch mod 128 bytes is distinct for r = 0..7): conflict-free.
  static constexpr int kChunk = 16 / static_cast<int>(sizeof(Elem));
  static constexpr int kSmemPitch = kHeadDim + kChunk;  // elements per shared-memory row
  static constexpr int kChunksPerRow = kHeadDim / kChunk;
  static constexpr int kStages = 2;  // K/V double buffering

  static constexpr size_t kQTileElems = static_cast<size_t>(kBlockM) * kSmemPitch;
  static constexpr size_t kKvTileElems = static_cast<size_t>(kBlockN) * kSmemPitch;
  // Layout: sQ [kBlockM][pitch] | sK [kStages][kBlockN][pitch] | sV [kStages][kBlockN][pitch].
  static constexpr size_t kSmemBytes = (kQTileElems + 2 * kStages * kKvTileElems) * sizeof(Elem);

  static_assert(sizeof(Elem) == 2, "the mma.sync path takes fp16 or bf16 only");
  static_assert(kHeadDim % kMmaK == 0, "head_dim must be a multiple of 16 (mma k and ldmatrix x4 pairs)");
  static_assert(kBlockM % (kNWarps * kMmaM) == 0, "each warp must own whole 16-row mma tiles of Q");
  static_assert(kBlockN % kMmaK == 0, "kBlockN must be a multiple of 16 (P V k-steps, ldmatrix x4 pairs)");
  static_assert((kBlockM * kChunksPerRow) % kNThreads == 0, "Q tile chunks must split evenly over threads");
  static_assert((kBlockN * kChunksPerRow) % kNThreads == 0, "K/V tile chunks must split evenly over threads");
  static_assert((kSmemPitch * sizeof(Elem)) % 32 == 16,
                "row pitch must be an odd number of 16-byte chunks (no ldmatrix conflicts)");
  static_assert(kSmemBytes <= kSm90MaxSmemPerBlock, "shared memory exceeds the sm_80/sm_90 per-block limit");
};

}  // namespace fa::cuda::flash
