// Compile-time configuration of one float32 FA2 forward kernel instance (sm_80+ mma.sync on TF32
// tensor cores): tile sizes, warps, where Q lives, and the shared-memory layout derived from them.
// Everything the kernel and the launcher need to agree on lives here; no literal sizes elsewhere.
#pragma once
#include <cstddef>

#include "cuda/smem_limits.h"

namespace fa::cuda::flash {

template <int kHeadDim_, int kBlockN_, int kNWarps_, bool kQInRegs_, int kMinBlocksPerSm_>
struct FlashFwdFp32Traits {
  using Elem = float;                         // tile_load.cuh's element type
  static constexpr int kHeadDim = kHeadDim_;  // the specialisation; the call's head_dim may be smaller
  static constexpr int kBlockN = kBlockN_;    // key / value rows per K/V tile
  static constexpr int kStages = 1;           // one K and one V tile: K of the next tile loads during P V
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kNThreads = kNWarps * 32;
  // Q fragments held in registers for the whole K/V loop (else re-read from shared memory per tile:
  // the large head dims, whose O accumulator already takes kHeadDim / 2 registers).
  static constexpr bool kQInRegs = kQInRegs_;
  // __launch_bounds__ occupancy target: caps registers at 65536 / (kNThreads * kMinBlocksPerSm) (255 at
  // most), which keeps ptxas from hoisting every K fragment of a tile into registers.
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;

  // mma.sync m16n8k8 (tf32) shape.
  static constexpr int kMmaM = 16, kMmaN = 8, kMmaK = 8;
  // Each warp owns one 16-row mma tile of Q; the warps split Q, not K/V.
  static constexpr int kBlockM = kNWarps * kMmaM;   // query rows per thread block
  static constexpr int kKSteps = kHeadDim / kMmaK;  // k-steps of S = Q K^T (over head_dim)
  static constexpr int kSTiles = kBlockN / kMmaN;   // n8 tiles of S per warp: (16, kBlockN); also the
                                                    // k-steps of O += P V (one S tile = 8 keys)
  static constexpr int kOTiles = kHeadDim / kMmaN;  // n8 tiles of O per warp: (16, kHeadDim)

  // cp.async moves 16 bytes = 4 floats. Rows are padded by one chunk: a pitch of 4 mod 32 floats (16
  // mod 128 bytes) puts the 8 row addresses of an ldmatrix (Q, K) on 8 distinct 16-byte bank groups,
  // and the P V B-operand loads (V rows 2t and 2t + 1, column g: banks 8t + g and 8t + 4 + g) on 32
  // distinct banks: both conflict-free.
  static constexpr int kChunk = 4;
  static constexpr int kSmemPitch = kHeadDim + kChunk;  // floats per shared-memory row
  static constexpr int kChunksPerRow = kHeadDim / kChunk;

  static constexpr size_t kQTileElems = static_cast<size_t>(kBlockM) * kSmemPitch;
  static constexpr size_t kKvTileElems = static_cast<size_t>(kBlockN) * kSmemPitch;
  // Layout: sQ [kBlockM][pitch] | sK [kBlockN][pitch] | sV [kBlockN][pitch]. One buffer each for K and
  // V, loads interleaved with compute (V_j lands during S_j = Q K_j^T and the softmax, K_(j+1) during
  // O += P_j V_j), which halves the footprint of a double-buffered K/V pair.
  static constexpr size_t kSmemBytes = (kQTileElems + 2 * kKvTileElems) * sizeof(float);
  // Every configuration fits the smallest per-block opt-in limit of the targets, 99 KiB on sm_86 and
  // sm_89 (sm_80: 163 KiB, sm_90: 227 KiB), so one build runs everywhere without a per-device table.
  static constexpr size_t kPortableSmemBytes = kPortableMaxSmemPerBlock;

  static_assert(kHeadDim % 32 == 0, "the specialised head dim must be a multiple of 32 (pitch 4 mod 32 floats)");
  static_assert(kBlockN % (2 * kMmaN) == 0, "kBlockN must be a multiple of 16 (ldmatrix x4 covers two n8 tiles)");
  static_assert((kBlockM * kChunksPerRow) % kNThreads == 0, "Q tile chunks must split evenly over threads");
  static_assert((kBlockN * kChunksPerRow) % kNThreads == 0, "K/V tile chunks must split evenly over threads");
  static_assert((kSmemPitch * sizeof(float)) % 128 == 16, "row pitch must be 16 mod 128 bytes (no bank conflicts)");
  static_assert(kSmemBytes <= kPortableSmemBytes, "shared memory exceeds the 99 KiB per-block limit of sm_86/sm_89");
};

}  // namespace fa::cuda::flash
