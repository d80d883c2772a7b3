// NaN / ±Inf in a 128-byte swizzled tile in shared memory (wgmma.cuh's SW128 layout: kColBlocks
// column blocks of [kRows rows][128 bytes], 16-byte chunks swizzled within a row), zeroed for one
// product and restored from global memory afterwards: the backward's resident K tile feeds S^T = K Q^T
// of every query tile and must keep its values there, while dQ = dS K must not multiply a hidden dS = 0
// by them (bwd_nonfinite.cuh).
#pragma once
#include <cstdint>

#include "cuda/flash/hopper/wgmma.cuh"
#include "cuda/flash/nonfinite_tile.cuh"

namespace fa::cuda::flash::sm90 {

// Chunk c of a [kColBlocks][kRows][8 chunks] tile: its row, and the first column it holds in the
// un-swizzled (global) row.
template <int kRows>
__device__ __forceinline__ void sw128_chunk_coords(int c, int& row, int& col) {
  constexpr int kChunksPerRow = kSw128RowBytes / 16;  // 8
  row = (c / kChunksPerRow) % kRows;
  const int col_block = c / (kChunksPerRow * kRows);
  col = col_block * kSw128BlockCols + (((c % kChunksPerRow) ^ (row % 8)) * 8);
}

// Sets the NaN / ±Inf elements of this thread's chunks (dealt round-robin to kThreads threads) to 0.
template <typename Elem, int kRows, int kColBlocks, int kThreads>
__device__ __forceinline__ void sw128_zero_nonfinite(Elem* tile) {
  constexpr int kChunks = kColBlocks * kRows * (kSw128RowBytes / 16);
  static_assert(kChunks % kThreads == 0, "every thread has the same number of chunks");
#pragma unroll 1
  for (int r = 0; r < kChunks / kThreads; ++r) {
    uint4* chunk = reinterpret_cast<uint4*>(tile) + static_cast<int>(threadIdx.x) + r * kThreads;
    const uint4 w = *chunk;
    if (chunk_nonfinite<Elem>(w))
      *chunk = make_uint4(word_zero_nonfinite<Elem>(w.x), word_zero_nonfinite<Elem>(w.y),
                          word_zero_nonfinite<Elem>(w.z), word_zero_nonfinite<Elem>(w.w));
  }
}

// Puts back the chunks that sw128_zero_nonfinite changed: those of this thread whose source in global
// memory holds a NaN / ±Inf (src = the tile's first row, rows 16-byte aligned as TMA requires; only
// the first `rows` rows and `cols` columns exist there, the rest of the tile is TMA's zero fill).
// No mask of the changed chunks is kept: a register live across the dQ product cost d128 a spill.
template <typename Elem, int kRows, int kColBlocks, int kThreads>
__device__ __forceinline__ void sw128_restore_nonfinite(Elem* tile, const Elem* src, int64_t row_stride, int rows,
                                                        int cols) {
  constexpr int kChunks = kColBlocks * kRows * (kSw128RowBytes / 16);
#pragma unroll 1
  for (int r = 0; r < kChunks / kThreads; ++r) {
    const int c = static_cast<int>(threadIdx.x) + r * kThreads;
    int row, col;
    sw128_chunk_coords<kRows>(c, row, col);
    if (row >= rows || col >= cols) continue;
    const uint4 w = *reinterpret_cast<const uint4*>(src + static_cast<int64_t>(row) * row_stride + col);
    if (chunk_nonfinite<Elem>(w)) reinterpret_cast<uint4*>(tile)[c] = w;
  }
}

}  // namespace fa::cuda::flash::sm90
