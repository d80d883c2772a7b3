// NaN / ±Inf detection and zeroing for tiles of Elem values, by 32-bit word and by 16-byte chunk of a
// tile in shared memory. Shared by the forward's P V containment (nonfinite_pv.cuh) and the backward's
// products (bwd_nonfinite.cuh): a tensor-core product multiplies the zero P or dS of a hidden pair by
// its other operand, so a NaN / ±Inf there must be taken out of the product and put back for the
// visible pairs only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fa::cuda::flash {

// Exponent bits of one element type: an element is NaN or ±Inf when all of them are set.
template <typename Elem>
struct NonFiniteBits;
template <>
struct NonFiniteBits<__half> {
  static constexpr uint32_t kExp = 0x7C00u;
  static constexpr int kPerWord = 2;
};
template <>
struct NonFiniteBits<__nv_bfloat16> {
  static constexpr uint32_t kExp = 0x7F80u;
  static constexpr int kPerWord = 2;
};
template <>
struct NonFiniteBits<float> {
  static constexpr uint32_t kExp = 0x7F800000u;
  static constexpr int kPerWord = 1;
};

// Whether a 32-bit word of Elem values holds a NaN or ±Inf.
template <typename Elem>
__device__ __forceinline__ bool word_nonfinite(uint32_t w) {
  constexpr uint32_t kExp = NonFiniteBits<Elem>::kExp;
  if constexpr (NonFiniteBits<Elem>::kPerWord == 2) return (w & kExp) == kExp || ((w >> 16) & kExp) == kExp;
  else return (w & kExp) == kExp;
}

// Whether a 16-byte chunk of Elem values holds a NaN or ±Inf.
template <typename Elem>
__device__ __forceinline__ bool chunk_nonfinite(uint4 c) {
  return word_nonfinite<Elem>(c.x) | word_nonfinite<Elem>(c.y) | word_nonfinite<Elem>(c.z) | word_nonfinite<Elem>(c.w);
}

// The word with its NaN / ±Inf elements replaced by +0.
template <typename Elem>
__device__ __forceinline__ uint32_t word_zero_nonfinite(uint32_t w) {
  constexpr uint32_t kExp = NonFiniteBits<Elem>::kExp;
  if constexpr (NonFiniteBits<Elem>::kPerWord == 2) {
    const uint32_t lo = (w & kExp) == kExp ? 0u : (w & 0xFFFFu);
    const uint32_t hi = ((w >> 16) & kExp) == kExp ? 0u : (w & 0xFFFF0000u);
    return lo | hi;
  } else {
    return (w & kExp) == kExp ? 0u : w;
  }
}

// Scans this thread's 16-byte chunks of a [kRows][kCols] tile in shared memory (row pitch kPitch
// elements; chunks dealt round-robin to kThreads threads) for NaN / ±Inf; with kZero, also replaces
// them by 0 in place. Returns whether this thread's chunks held any. Only columns < kCols are read:
// the padding of a pitched row is never written by the loads. `tid`: this thread's index among the
// kThreads (the block's thread index unless a subset of the block scans).
template <typename Elem, int kRows, int kCols, int kPitch, int kThreads, bool kZero>
__device__ __forceinline__ bool tile_nonfinite(Elem* tile, int tid = static_cast<int>(threadIdx.x)) {
  constexpr int kPerChunk = 16 / static_cast<int>(sizeof(Elem));
  static_assert(kCols % kPerChunk == 0 && kPitch % kPerChunk == 0, "rows must be made of whole chunks");
  constexpr int kChunksPerRow = kCols / kPerChunk;
  constexpr int kChunks = kRows * kChunksPerRow;
  bool any = false;
#pragma unroll 1
  for (int c = tid; c < kChunks; c += kThreads) {
    uint4* chunk = reinterpret_cast<uint4*>(tile + (c / kChunksPerRow) * kPitch + (c % kChunksPerRow) * kPerChunk);
    const uint4 w = *chunk;
    const bool bad = chunk_nonfinite<Elem>(w);
    any |= bad;
    if (kZero && bad)
      *chunk = make_uint4(word_zero_nonfinite<Elem>(w.x), word_zero_nonfinite<Elem>(w.y),
                          word_zero_nonfinite<Elem>(w.z), word_zero_nonfinite<Elem>(w.w));
  }
  return any;
}

}  // namespace fa::cuda::flash
