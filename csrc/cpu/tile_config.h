// Tile sizes of the CPU FlashAttention-2 backend, shared by the forward and the backward.
// Timings below: B1 H8 S2048 D64 fp32 (or B1 H4 D128, the same FLOPs), not causal, one core of a
// 2-core Xeon (Sapphire Rapids class), AVX-512 path, CPU seconds.
#pragma once

namespace fa::cpu {

// Every vectorised tile extent (query rows, key rows) is padded up to this many elements: the
// widest vector (16 fp32 lanes), so one tile shape serves all instruction sets.
inline constexpr int kTileAlign = 16;

// Forward: query rows per work item (Br) and keys per K/V tile (Bc). Each item streams all of K
// and V of its head through L1, so a taller Q tile reuses them more: Br 128 is 6-8% faster than 64
// (fwd 0.090 vs 0.095 s per core at D64, 0.077 vs 0.084 s at D128); Br 256 gains nothing more;
// Bc 32 or 128 lose 2-5% to 64. Br 128 is used while it still gives every thread
// kFwdMinItemsPerThread items (for load balance), else Br 64.
inline constexpr int kFwdBlockQ = 128;
inline constexpr int kFwdBlockQSmall = 64;
inline constexpr int kFwdMinItemsPerThread = 4;
inline constexpr int kFwdBlockK = 64;

// Backward: query rows per Q tile and keys per K/V tile. Bwd CPU seconds at D64 / D128 (same
// FLOPs): 64x64 0.169 / 0.157, 64x128 0.16 / 0.17, 128x128 0.16 / 0.17, 128x64 0.170 / 0.166,
// 32x64 0.175 / 0.168, 64x32 0.18 / 0.18: 64x64 is the best compromise.
inline constexpr int kBwdBlockQ = 64;
inline constexpr int kBwdBlockK = 64;
// Backward: Q tiles per Q block. A work item converts Q and dO (and accumulates dQ) one block of
// kBwdQBlockTiles * kBwdBlockQ rows at a time and sweeps its K/V tiles over each block, so its
// Q-side buffers do not grow with seqlen_q and stay in L2 (3 * 1024 * d fp32: 768 KiB at D64). Bwd
// CPU seconds, B1 H1 S8192 D64 / S4096 D128: 8 tiles 0.323 / 0.163, 16 tiles 0.316 / 0.164,
// 32 tiles 0.316 / 0.171; no blocking (whole sequence) 0.324 at S8192 D64.
inline constexpr int kBwdQBlockTiles = 16;

// Largest head_dim of the contract (attention_params.h): stack rows of one head_dim.
inline constexpr int kMaxHeadDim = 256;

static_assert(kFwdBlockQ % kTileAlign == 0 && kFwdBlockQSmall % kTileAlign == 0 &&
                  kFwdBlockK % kTileAlign == 0 && kFwdBlockQSmall <= kFwdBlockQ,
              "forward tiles must be multiples of kTileAlign; scratch is sized for kFwdBlockQ");
static_assert(kBwdBlockQ % kTileAlign == 0 && kBwdBlockK % kTileAlign == 0,
              "backward tiles must be multiples of kTileAlign");

inline constexpr int pad_to_tile(int x) { return (x + kTileAlign - 1) / kTileAlign * kTileAlign; }

}  // namespace fa::cpu
