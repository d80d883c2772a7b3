// NaN / ±Inf detection and zeroing for tiles of Elem values, by 32-bit word and by 16-byte chunk of a
// tile in shared memory. Shared by the forward's P V containment (nonfinite_pv.cuh) and the backward's
// products (bwd_nonfinite.cuh): a tensor-core product multiplies the zero P or dS of a hidden pair by
// its other operand, so a NaN / ±Inf there must be taken out of the product and put back for the
// visible pairs only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

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

// The scan's accumulator: acc + w * 0 in Elem arithmetic (two lanes per word for 16-bit types), which
// turns NaN as soon as an element of w is NaN or ±Inf (Inf * 0 = NaN) and stays NaN: one fma a word,
// where testing each element's exponent took two to three integer instructions an element.
template <typename Elem>
__device__ __forceinline__ uint32_t fold_nonfinite(uint32_t acc, uint32_t w) {
  uint32_t out;
  if constexpr (std::is_same_v<Elem, __nv_bfloat16>)
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(out) : "r"(w), "r"(0u), "r"(acc));
  else if constexpr (std::is_same_v<Elem, __half>)
    asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(out) : "r"(w), "r"(0u), "r"(acc));
  else
    asm("fma.rn.f32 %0, %1, %2, %3;\n" : "=r"(out) : "r"(w), "r"(0u), "r"(acc));
  return out;
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
  if constexpr (!kZero) {
    // Detection only (the common path): one fma a word into four accumulators, four chunks in flight;
    // an unpitched tile is one run of chunks. With per-element exponent tests, one chunk at a time, the
    // scan of each diagonal V tile cost the causal warp-specialized forward 12% of its time at 512 keys
    // (its checkers' scan holds up that tile's P V). This way (H200, bf16, queued, two rounds in turns
    // with the build before, TFLOP/s ratios at 512 / 1k / 2k / 4k / 8k / 16k): d128 1.14 / 1.12 / 1.09
    // / 1.05 / 1.02 / 1.01x, within 2% of the kernel with no scan at all; d64 three consumers 1.05 /
    // 1.03 / 1.02 / 1.02 / 1.00 / 1.00x; the two-warpgroup d64 kernel within the spread.
    uint32_t acc[4] = {0u, 0u, 0u, 0u};  // one chain per word of a chunk
#pragma unroll 4
    for (int c = tid; c < kChunks; c += kThreads) {
      const uint4 w = kPitch == kCols ? reinterpret_cast<const uint4*>(tile)[c]
                                      : *reinterpret_cast<const uint4*>(tile + (c / kChunksPerRow) * kPitch +
                                                                        (c % kChunksPerRow) * kPerChunk);
      acc[0] = fold_nonfinite<Elem>(acc[0], w.x);
      acc[1] = fold_nonfinite<Elem>(acc[1], w.y);
      acc[2] = fold_nonfinite<Elem>(acc[2], w.z);
      acc[3] = fold_nonfinite<Elem>(acc[3], w.w);
    }
    // The chains hold zeros or NaN: folding one into another keeps a NaN.
    return word_nonfinite<Elem>(
        fold_nonfinite<Elem>(fold_nonfinite<Elem>(fold_nonfinite<Elem>(acc[0], acc[1]), acc[2]), acc[3]));
  }
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
