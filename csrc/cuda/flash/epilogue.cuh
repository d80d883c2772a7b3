// The epilogue writer of the FlashAttention-2 kernels: every kernel ends by storing m16n8-layout
// fp32 accumulators (mma.sync and wgmma alike: acc[j][2 h + e] = row g + 8 h, column 8 j + 2 t + e of
// a warp's 16-row slice, g = lane / 4, t = lane % 4) as rows of Elem in global memory, scaled per
// row and bounded by the sequence and head_dim:
//   forward    O / l and lse                      write_fwd_rows
//              O / l into a swizzled shared tile   stage_fwd_rows_sw128 (a TMA store writes it out)
//   any        acc * scale into the same tile      stage_rows_sw128 (the warp-specialized backward's
//                                                  dK / dV)
//   dQ kernel  dQ * softmax_scale                  store_fragment_row
// Each thread stores two adjacent columns per fragment tile: one 32-bit store of two 16-bit values, or
// one float2.
// The backward's dK / dV stores stay in the other main kernels' own loops. The mma.sync ones run at
// the 255-register cap, and every shared form of that loop (row pointers hoisted, addresses
// per store, the params by value or by reference) moved ptxas's spills in their main loops both ways
// (sm_90a, -Xptxas -v): +4 to +44 bytes in eight fp16 / bf16 kernels (d96, d192, d256), -24 to -96
// in four, -8 to -224 in four float32 d192 kernels. Untimed, those stay as the kernels were tuned.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/ptx.cuh"

namespace fa::cuda::flash {

// Stores (a, b) rounded to Elem at dst[0], dst[1] (dst 4- or 8-byte aligned: an even column).
template <typename Elem>
__device__ __forceinline__ void store_pair(Elem* dst, float a, float b) {
  *reinterpret_cast<uint32_t*>(dst) = pack2<Elem>(a, b);
}
template <>
__device__ __forceinline__ void store_pair<float>(float* dst, float a, float b) {
  *reinterpret_cast<float2*>(dst) = make_float2(a, b);
}

// Row h (0 or 1) of an m16n8-layout accumulator, acc[j][2 h + e] = column col0 + 8 j + e (col0: the
// fragment's first column plus this thread's 2 t), times `scale`, into the row at `dst`: the columns
// below col_end (head_dim: a multiple of 8, so a pair is stored whole or not at all).
template <typename Elem, int kTiles>
__device__ __forceinline__ void store_fragment_row(const float (&acc)[kTiles][4], int h, float scale, Elem* dst,
                                                   int col0, int col_end) {
  Elem* const first = dst + col0;  // then constant offsets 8 j: immediates of the stores
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
    if (col0 + 8 * j < col_end) store_pair<Elem>(first + 8 * j, acc[j][2 * h] * scale, acc[j][2 * h + 1] * scale);
}

// The forward's result for a warp's 16 rows, this thread's rows row0 and row0 + 8 (column 2 t of each
// fragment tile): O / l and, from the group's first thread, lse in natural log. The rows past
// seqlen_q (padding of the last query tile) are not stored. A row's end follows from the mask, not
// from l (OnlineSoftmax::finish): one that sees no key gets O = 0 and lse = +inf; one whose l is NaN or
// 0 gets NaN.
template <typename Elem, int kOTiles, typename Mask>
__device__ __forceinline__ void write_fwd_rows(const float (&o)[kOTiles][4], const OnlineSoftmax& softmax,
                                               const Mask& mask, int row0, int t, Elem* out, int64_t row_stride,
                                               float* lse, int head_dim) {
  const bool sees_key[2] = {mask.row_sees_key(row0), mask.row_sees_key(row0 + 8)};
  float inv_l[2], row_lse[2];
  softmax.finish(sees_key, inv_l, row_lse);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + h * 8;
    if (row < mask.seqlen_q) {
      store_fragment_row<Elem>(o, h, inv_l[h], out + static_cast<int64_t>(row) * row_stride, 2 * t, head_dim);
      if (t == 0) lse[row] = row_lse[h];
    }
  }
}

// Row h (0 or 1) of a warp's m16n8-layout accumulator (this thread's columns 2 t of each fragment
// tile) times `scale`, rounded to Elem, as row r of a shared tile of 64-column blocks with the
// 128-byte swizzle: block cb at tile + cb * block_bytes (each 1024-aligned), row r at r * 128 bytes,
// its 16-byte chunk c at (c ^ (r % 8)) * 16, the layout TMA reads a box of 64 columns from. In a warp
// the 8 rows' chunks differ (c ^ g): the 32-bit stores of one fragment tile fall in 32 different banks.
template <typename Elem, int kTiles>
__device__ __forceinline__ void stage_row_sw128(const float (&acc)[kTiles][4], int h, float scale, int t,
                                                uint32_t tile, uint32_t block_bytes, int r) {
  constexpr int kChunksPerBlock = 8;  // 16-byte chunks of a 128-byte row: n8 fragment tiles
  const uint32_t row_addr = tile + static_cast<uint32_t>(r * 128 + 4 * t);
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const uint32_t chunk = static_cast<uint32_t>((j % kChunksPerBlock) ^ (r % 8));
    st_shared_b32(row_addr + static_cast<uint32_t>(j / kChunksPerBlock) * block_bytes + chunk * 16,
                  pack2<Elem>(acc[j][2 * h] * scale, acc[j][2 * h + 1] * scale));
  }
}

// A warp's 16 accumulator rows times `scale` as rows tile_row .. tile_row + 15 of such a tile (this
// thread's: tile_row and tile_row + 8). Every row and column of the tile is written; a TMA store clips
// what lies past the tensor.
template <typename Elem, int kTiles>
__device__ __forceinline__ void stage_rows_sw128(const float (&acc)[kTiles][4], float scale, int t, uint32_t tile,
                                                 uint32_t block_bytes, int tile_row) {
#pragma unroll
  for (int h = 0; h < 2; ++h) stage_row_sw128<Elem>(acc, h, scale, t, tile, block_bytes, tile_row + 8 * h);
}

// write_fwd_rows with O / l staged in shared memory for a TMA store (Hopper): the warp's 16 rows are
// rows tile_row .. tile_row + 15 of the tile (stage_row_sw128); lse as in write_fwd_rows.
template <typename Elem, int kOTiles, typename Mask>
__device__ __forceinline__ void stage_fwd_rows_sw128(const float (&o)[kOTiles][4], const OnlineSoftmax& softmax,
                                                     const Mask& mask, int row0, int t, uint32_t tile,
                                                     uint32_t block_bytes, int tile_row, float* lse) {
  const bool sees_key[2] = {mask.row_sees_key(row0), mask.row_sees_key(row0 + 8)};
  float inv_l[2], row_lse[2];
  softmax.finish(sees_key, inv_l, row_lse);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    stage_row_sw128<Elem>(o, h, inv_l[h], t, tile, block_bytes, tile_row + 8 * h);
    if (t == 0 && row0 + 8 * h < mask.seqlen_q) lse[row0 + 8 * h] = row_lse[h];
  }
}

}  // namespace fa::cuda::flash
