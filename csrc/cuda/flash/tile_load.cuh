// cp.async loading of one tile of rows of a [seq, head_dim] slice into padded shared memory, shared
// by the sm_80+ mma.sync FlashAttention kernels (forward and backward). Traits supplies the thread
// count and the shared-memory geometry: kNThreads, kChunk (elements per 16-byte copy), kChunksPerRow
// (kHeadDim / kChunk) and kSmemPitch (elements per shared-memory row).
#pragma once
#include <cstdint>

#include "cuda/flash/ptx.cuh"

namespace fa::cuda::flash {

// Copies rows [row0, row0 + kRows) of a [seq, head_dim] slice (row stride in elements) into shared
// memory of pitch kSmemPitch; rows >= seq_limit and columns >= head_dim are zero-filled (so masked V
// rows add exact zeros and padded head-dim columns contribute nothing).
template <typename Traits, int kRows>
__device__ __forceinline__ void load_tile_async(typename Traits::Elem* smem, const typename Traits::Elem* gmem,
                                                int64_t row_stride, int row0, int seq_limit, int head_dim) {
  constexpr int kIters = kRows * Traits::kChunksPerRow / Traits::kNThreads;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = static_cast<int>(threadIdx.x) + it * Traits::kNThreads;
    const int r = c / Traits::kChunksPerRow;
    const int col = (c % Traits::kChunksPerRow) * Traits::kChunk;
    const bool valid = row0 + r < seq_limit && col < head_dim;
    const typename Traits::Elem* src = valid ? gmem + static_cast<int64_t>(row0 + r) * row_stride + col : gmem;
    cp_async_16(smem_u32(smem + r * Traits::kSmemPitch + col), src, valid);
  }
}

}  // namespace fa::cuda::flash
