// Device pieces shared by the CUDA GEMM kernels (sm_80 mma.sync, sm_90a wgmma) and the split-K
// reduction: the predicated partial cp.async, the staged epilogue, and the fused epilogue of
// common/gemm_params.h applied to 8 consecutive outputs of a row.
//
// Accumulator layout both kernel families stage: per warp, the mma.sync m16n8 layout (lane g =
// lane / 4, t = lane % 4 holds rows g and g + 8, columns 2t and 2t + 1), written as pairs of
// adjacent columns of one row.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "common/gemm_params.h"
#include "cuda/cuda_utils.cuh"

namespace fa::cuda::gemm_kernels {

// 16-byte global -> shared copy of which only the first `src_bytes` (0..16) are read; the rest of
// the 16 shared bytes are zero-filled. src must be a valid address even when src_bytes is 0.
__device__ __forceinline__ void cp_async_16_partial(uint32_t dst_smem, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_smem), "l"(src), "r"(src_bytes));
}

// GELU, tanh form: 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), computed as the equal
// x / (1 + exp(-2u)): one exp and one reciprocal on the special-function unit instead of tanhf's
// instruction sequence (H100, bf16, fwd fc with bias, GELU and pre_out, 16384 x 1536 x 384: the
// epilogue's GELU cost 43 us over the plain product with tanhf). Error: a few fp32 units of |x|,
// inside gemm_check's epilogue allowance. The exponent is capped so that the divisor stays finite.
__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kMinusTwoSqrt2OverPi = -1.5957691216057308f;
  constexpr float kCubic = 0.044715f;
  constexpr float kMaxExponent = 80.0f;
  const float e = __expf(fminf(kMinusTwoSqrt2OverPi * (x + kCubic * x * x * x), kMaxExponent));
  return __fdividef(x, 1.0f + e);
}

// ---- staged epilogue -------------------------------------------------------------------------------
// The accumulators of a kRows x kCols tile go through shared memory (fp32, rows padded by
// kStagePad floats: the float2 fragment writes of a half warp, 4 rows x 8 columns, hit 32
// different banks), then each thread finishes 8 consecutive columns of a row: one 16-byte store
// per 8 outputs (16-bit C) when the row allows it, coalesced across the warp, instead of 4-byte
// stores scattered over 8 rows per warp instruction straight from the fragments.
inline constexpr int kStagePad = 8;
template <int kRows, int kCols>
inline constexpr int kStagedTileBytes = kRows * (kCols + kStagePad) * 4;

// Fragment pair (row, col), (row, col + 1) of the tile into the staging buffer.
template <int kCols>
__device__ __forceinline__ void stage_pair(float* stage, int row, int col, float v0, float v1) {
  *reinterpret_cast<float2*>(stage + row * (kCols + kStagePad) + col) = make_float2(v0, v1);
}

// kW (2, 4 or 8) consecutive values to Elem / float storage at base + idx, the first `count` of
// them; `vec`: all kW as whole aligned words (a float2 or float4s; 4, 8 or 16 bytes of 16-bit
// values).
template <typename Elem, int kW>
__device__ __forceinline__ void store_n(void* base, int64_t idx, const float (&t)[kW], int count, bool vec, bool is_f32) {
  static_assert(kW == 2 || kW == 4 || kW == 8, "2, 4 or 8 values");
  if (is_f32) {
    float* d = static_cast<float*>(base) + idx;
    if (vec) {
      if constexpr (kW == 2) {
        *reinterpret_cast<float2*>(d) = make_float2(t[0], t[1]);
      } else {
#pragma unroll
        for (int q = 0; q < kW / 4; ++q)
          reinterpret_cast<float4*>(d)[q] = make_float4(t[4 * q], t[4 * q + 1], t[4 * q + 2], t[4 * q + 3]);
      }
      return;
    }
#pragma unroll
    for (int e = 0; e < kW; ++e)
      if (e < count) d[e] = t[e];
  } else {
    Elem* d = static_cast<Elem*>(base) + idx;
    if constexpr (!std::is_same_v<Elem, float>) {
      if (vec) {
        using Words = std::conditional_t<kW == 8, uint4, std::conditional_t<kW == 4, uint2, uint32_t>>;
        Words u;
        uint32_t* w = reinterpret_cast<uint32_t*>(&u);
#pragma unroll
        for (int e = 0; e < kW / 2; ++e) {
          const Elem lo = from_float<Elem>(t[2 * e]), hi = from_float<Elem>(t[2 * e + 1]);
          w[e] = static_cast<uint32_t>(reinterpret_cast<const uint16_t&>(lo)) |
                 (static_cast<uint32_t>(reinterpret_cast<const uint16_t&>(hi)) << 16);
        }
        *reinterpret_cast<Words*>(d) = u;
        return;
      }
    }
#pragma unroll
    for (int e = 0; e < kW; ++e)
      if (e < count) d[e] = from_float<Elem>(t[e]);
  }
}

// kW consecutive values from Elem / float storage (zeros past `count`); `vec` as for store_n.
template <typename Elem, int kW>
__device__ __forceinline__ void load_n(const void* base, int64_t idx, float (&t)[kW], int count, bool vec, bool is_f32) {
  static_assert(kW == 2 || kW == 4 || kW == 8, "2, 4 or 8 values");
  if (is_f32) {
    const float* s = static_cast<const float*>(base) + idx;
    if (vec) {
      if constexpr (kW == 2) {
        const float2 a = *reinterpret_cast<const float2*>(s);
        t[0] = a.x, t[1] = a.y;
      } else {
#pragma unroll
        for (int q = 0; q < kW / 4; ++q) {
          const float4 a = reinterpret_cast<const float4*>(s)[q];
          t[4 * q] = a.x, t[4 * q + 1] = a.y, t[4 * q + 2] = a.z, t[4 * q + 3] = a.w;
        }
      }
      return;
    }
#pragma unroll
    for (int e = 0; e < kW; ++e) t[e] = e < count ? s[e] : 0.0f;
  } else {
    const Elem* s = static_cast<const Elem*>(base) + idx;
    if constexpr (!std::is_same_v<Elem, float>) {
      if (vec) {
        using Words = std::conditional_t<kW == 8, uint4, std::conditional_t<kW == 4, uint2, uint32_t>>;
        const Words u = *reinterpret_cast<const Words*>(s);
        const Elem* h = reinterpret_cast<const Elem*>(&u);
#pragma unroll
        for (int e = 0; e < kW; ++e) t[e] = to_float(h[e]);
        return;
      }
    }
#pragma unroll
    for (int e = 0; e < kW; ++e) t[e] = e < count ? to_float(s[e]) : 0.0f;
  }
}

// Which whole-word accesses the epilogue of a call may use (2, 4 or 8 columns starting at a
// multiple of that): C's rows (and pre_out's, which shares ldc and dtype) when 16-byte aligned; the bias when
// its base is. Scalar bias loads cost H100, bf16, fwd fc with bias + GELU, 16384 x 1536 x 384: 86.9 us
// against 69.7 with 16-byte ones.
struct EpilogueVec {
  bool c_rows, bias;
};
__device__ __forceinline__ EpilogueVec epilogue_vec(const GemmParams& p) {
  const int64_t c_es = p.c_dtype == DType::kFloat32 ? 4 : 2;
  EpilogueVec v;
  v.c_rows = (p.ldc * c_es) % 16 == 0 && (reinterpret_cast<uintptr_t>(p.c) & 15u) == 0 &&
             (reinterpret_cast<uintptr_t>(p.pre_out) & 15u) == 0;
  v.bias = (reinterpret_cast<uintptr_t>(p.bias) & 15u) == 0;
  return v;
}

// The epilogue (gemm_params.h) of C(row, col .. col + count - 1) from the sums t (kW of them, col a
// multiple of kW): alpha, bias, pre_out, GELU, beta C, the store. Elem is the operands' storage
// type (C is Elem or float).
template <typename Elem, int kW>
__device__ __forceinline__ void epilogue_n(const GemmParams& p, int64_t row, int64_t col, float (&t)[kW], int count,
                                           const EpilogueVec& ev) {
  const bool c_f32 = p.c_dtype == DType::kFloat32;
  const bool vec = ev.c_rows && count == kW;
  const int64_t idx = row * p.ldc + col;
#pragma unroll
  for (int e = 0; e < kW; ++e) t[e] *= p.alpha;
  if (p.bias != nullptr) {
    float b[kW];
    load_n<Elem, kW>(p.bias, col, b, count, ev.bias && count == kW, p.bias_dtype == DType::kFloat32);
#pragma unroll
    for (int e = 0; e < kW; ++e) t[e] += b[e];
  }
  if (p.pre_out != nullptr) store_n<Elem, kW>(p.pre_out, idx, t, count, vec, c_f32);
  if (p.activation == GemmActivation::kGeluTanh) {
#pragma unroll
    for (int e = 0; e < kW; ++e) t[e] = gelu_tanh(t[e]);
  }
  if (p.beta != 0.0f) {
    float c0[kW];
    load_n<Elem, kW>(p.c, idx, c0, count, vec, c_f32);
#pragma unroll
    for (int e = 0; e < kW; ++e) t[e] += p.beta * c0[e];
  }
  store_n<Elem, kW>(p.c, idx, t, count, vec, c_f32);
}

// Finishes the staged tile at C(i0, j0): the epilogue into C (and pre_out), or raw sums into the
// split-K slice. All kThreads threads (`tid` 0 .. kThreads - 1) call it after a barrier that follows
// the staging writes.
template <typename Elem, int kRows, int kCols, int kThreads>
__device__ __forceinline__ void finish_staged_tile(const GemmParams& p, const float* stage, int64_t i0, int64_t j0,
                                                   float* slice, int tid) {
  constexpr int kPitch = kCols + kStagePad;
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kIters = kRows * kChunksPerRow / kThreads;
  static_assert(kRows * kChunksPerRow % kThreads == 0, "staged chunks must split evenly over the threads");
  const EpilogueVec ev = epilogue_vec(p);
  const bool slice_vec = p.n % 4 == 0;
#pragma unroll 2
  for (int it = 0; it < kIters; ++it) {
    const int c = tid + it * kThreads;
    const int r = c / kChunksPerRow, cc = (c % kChunksPerRow) * 8;
    const int64_t row = i0 + r, col = j0 + cc;
    if (row >= p.m || col >= p.n) continue;
    const int count = p.n - col < 8 ? static_cast<int>(p.n - col) : 8;
    // Lanes 4-7 of each group of 8 read their chunk's second half first, so that one 16-byte read
    // of a quarter warp covers all 32 banks (chunks 32 bytes apart alone put lanes l and l + 4 on
    // the same banks: H100, fwd qkv, 714k bank conflicts per call before).
    const int first = ((tid >> 2) & 1) * 4;
    const float4 x = *reinterpret_cast<const float4*>(stage + r * kPitch + cc + first);
    const float4 y = *reinterpret_cast<const float4*>(stage + r * kPitch + cc + 4 - first);
    const float4 a = first == 0 ? x : y, b = first == 0 ? y : x;
    float t[8];
    t[0] = a.x, t[1] = a.y, t[2] = a.z, t[3] = a.w, t[4] = b.x, t[5] = b.y, t[6] = b.z, t[7] = b.w;
    if (slice != nullptr)
      store_n<float, 8>(slice, row * p.n + col, t, count, slice_vec && count == 8, true);
    else
      epilogue_n<Elem, 8>(p, row, col, t, count, ev);
  }
}

}  // namespace fa::cuda::gemm_kernels
