// Device pieces shared by the CUDA GEMM kernels (sm_80 mma.sync, sm_90a wgmma): the predicated
// partial cp.async, the fused epilogue of common/gemm_params.h applied to accumulator pairs, and
// the raw fp32 store of split-K partial sums.
//
// Accumulator layout both kernel families hand to the epilogue: per warp, the mma.sync m16n8
// layout (lane g = lane / 4, t = lane % 4 holds rows g and g + 8, columns 2t and 2t + 1), so the
// epilogue works on pairs of adjacent columns of one row.
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

__device__ __forceinline__ float gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCubic = 0.044715f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + kCubic * x * x * x)));
}

// Element `idx` of a tensor stored as float (is_f32) or as Elem.
template <typename Elem>
__device__ __forceinline__ float load_as_float(const void* base, int64_t idx, bool is_f32) {
  return is_f32 ? static_cast<const float*>(base)[idx] : to_float(static_cast<const Elem*>(base)[idx]);
}

// Stores t[0] at idx and, when `two`, t[1] at idx + 1, as float (is_f32) or as Elem; one 8-byte
// (float) or 4-byte (16-bit) store when both go and the address allows it.
template <typename Elem>
__device__ __forceinline__ void store_pair(void* base, int64_t idx, const float (&t)[2], bool two, bool is_f32) {
  if (is_f32) {
    float* d = static_cast<float*>(base) + idx;
    if (two && (reinterpret_cast<uintptr_t>(d) & 7u) == 0) {
      *reinterpret_cast<float2*>(d) = make_float2(t[0], t[1]);
    } else {
      d[0] = t[0];
      if (two) d[1] = t[1];
    }
  } else {
    Elem* d = static_cast<Elem*>(base) + idx;
    if constexpr (!std::is_same_v<Elem, float>) {
      if (two && (reinterpret_cast<uintptr_t>(d) & 3u) == 0) {
        using Elem2 = std::conditional_t<std::is_same_v<Elem, __half>, __half2, __nv_bfloat162>;
        Elem2 v;
        v.x = from_float<Elem>(t[0]);
        v.y = from_float<Elem>(t[1]);
        *reinterpret_cast<Elem2*>(d) = v;
        return;
      }
    }
    d[0] = from_float<Elem>(t[0]);
    if (two) d[1] = from_float<Elem>(t[1]);
  }
}

// The epilogue (gemm_params.h) for C(row, col) and C(row, col + 1) from their accumulators; columns
// or rows outside C are skipped. Elem is the operands' storage type (C is Elem or float).
template <typename Elem>
__device__ __forceinline__ void epilogue_pair(const GemmParams& p, int64_t row, int64_t col, float v0, float v1) {
  if (row >= p.m || col >= p.n) return;
  const bool two = col + 1 < p.n;
  const bool c_f32 = p.c_dtype == DType::kFloat32;
  const int64_t idx = row * p.ldc + col;
  float t[2] = {p.alpha * v0, p.alpha * v1};
  if (p.bias != nullptr) {
    const bool b_f32 = p.bias_dtype == DType::kFloat32;
    t[0] += load_as_float<Elem>(p.bias, col, b_f32);
    if (two) t[1] += load_as_float<Elem>(p.bias, col + 1, b_f32);
  }
  if (p.pre_out != nullptr) store_pair<Elem>(p.pre_out, idx, t, two, c_f32);
  if (p.activation == GemmActivation::kGeluTanh) {
    t[0] = gelu_tanh(t[0]);
    t[1] = gelu_tanh(t[1]);
  }
  if (p.beta != 0.0f) {
    t[0] += p.beta * load_as_float<Elem>(p.c, idx, c_f32);
    if (two) t[1] += p.beta * load_as_float<Elem>(p.c, idx + 1, c_f32);
  }
  store_pair<Elem>(p.c, idx, t, two, c_f32);
}

// Split-K: the raw sums of C(row, col), C(row, col + 1) into the split's [m, n] fp32 slice.
__device__ __forceinline__ void partial_pair(const GemmParams& p, float* slice, int64_t row, int64_t col, float v0,
                                             float v1) {
  if (row >= p.m || col >= p.n) return;
  float* d = slice + row * p.n + col;
  d[0] = v0;
  if (col + 1 < p.n) d[1] = v1;
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

// 8 values to Elem / float storage at base + idx; `vec`: one or two 16-byte stores.
template <typename Elem>
__device__ __forceinline__ void store8(void* base, int64_t idx, const float (&t)[8], int count, bool vec, bool is_f32) {
  if (is_f32) {
    float* d = static_cast<float*>(base) + idx;
    if (vec) {
      reinterpret_cast<float4*>(d)[0] = make_float4(t[0], t[1], t[2], t[3]);
      reinterpret_cast<float4*>(d)[1] = make_float4(t[4], t[5], t[6], t[7]);
      return;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (e < count) d[e] = t[e];
  } else {
    Elem* d = static_cast<Elem*>(base) + idx;
    if constexpr (!std::is_same_v<Elem, float>) {
      if (vec) {
        uint4 u;
        uint32_t* w = reinterpret_cast<uint32_t*>(&u);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const Elem lo = from_float<Elem>(t[2 * e]), hi = from_float<Elem>(t[2 * e + 1]);
          w[e] = static_cast<uint32_t>(reinterpret_cast<const uint16_t&>(lo)) |
                 (static_cast<uint32_t>(reinterpret_cast<const uint16_t&>(hi)) << 16);
        }
        *reinterpret_cast<uint4*>(d) = u;
        return;
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e)
      if (e < count) d[e] = from_float<Elem>(t[e]);
  }
}

template <typename Elem>
__device__ __forceinline__ void load8(const void* base, int64_t idx, float (&t)[8], int count, bool vec, bool is_f32) {
  if (is_f32) {
    const float* s = static_cast<const float*>(base) + idx;
    if (vec) {
      const float4 a = reinterpret_cast<const float4*>(s)[0], b = reinterpret_cast<const float4*>(s)[1];
      t[0] = a.x, t[1] = a.y, t[2] = a.z, t[3] = a.w, t[4] = b.x, t[5] = b.y, t[6] = b.z, t[7] = b.w;
      return;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) t[e] = e < count ? s[e] : 0.0f;
  } else {
    const Elem* s = static_cast<const Elem*>(base) + idx;
    if constexpr (!std::is_same_v<Elem, float>) {
      if (vec) {
        const uint4 u = *reinterpret_cast<const uint4*>(s);
        const Elem* h = reinterpret_cast<const Elem*>(&u);
#pragma unroll
        for (int e = 0; e < 8; ++e) t[e] = to_float(h[e]);
        return;
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) t[e] = e < count ? to_float(s[e]) : 0.0f;
  }
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
  const bool c_f32 = p.c_dtype == DType::kFloat32;
  const int64_t c_es = c_f32 ? 4 : 2;
  // 16-byte stores need 16-byte aligned rows of C (and pre_out, which shares ldc and dtype).
  const bool c_rows_vec = (p.ldc * c_es) % 16 == 0 && (reinterpret_cast<uintptr_t>(p.c) & 15u) == 0 &&
                          (reinterpret_cast<uintptr_t>(p.pre_out) & 15u) == 0;
  const bool slice_vec = p.n % 4 == 0;
  const bool gelu = p.activation == GemmActivation::kGeluTanh;
  const bool b_f32 = p.bias_dtype == DType::kFloat32;
#pragma unroll 2
  for (int it = 0; it < kIters; ++it) {
    const int c = tid + it * kThreads;
    const int r = c / kChunksPerRow, cc = (c % kChunksPerRow) * 8;
    const int64_t row = i0 + r, col = j0 + cc;
    if (row >= p.m || col >= p.n) continue;
    const int count = p.n - col < 8 ? static_cast<int>(p.n - col) : 8;
    float t[8];
    const float4 a = *reinterpret_cast<const float4*>(stage + r * kPitch + cc);
    const float4 b = *reinterpret_cast<const float4*>(stage + r * kPitch + cc + 4);
    t[0] = a.x, t[1] = a.y, t[2] = a.z, t[3] = a.w, t[4] = b.x, t[5] = b.y, t[6] = b.z, t[7] = b.w;
    if (slice != nullptr) {
      store8<float>(slice, row * p.n + col, t, count, slice_vec && count == 8, true);
      continue;
    }
    const bool vec = c_rows_vec && count == 8;
    const int64_t idx = row * p.ldc + col;
#pragma unroll
    for (int e = 0; e < 8; ++e) t[e] *= p.alpha;
    if (p.bias != nullptr) {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < count) t[e] += load_as_float<Elem>(p.bias, col + e, b_f32);
    }
    if (p.pre_out != nullptr) store8<Elem>(p.pre_out, idx, t, count, vec, c_f32);
    if (gelu) {
#pragma unroll
      for (int e = 0; e < 8; ++e) t[e] = gelu_tanh(t[e]);
    }
    if (p.beta != 0.0f) {
      float c0[8];
      load8<Elem>(p.c, idx, c0, count, vec, c_f32);
#pragma unroll
      for (int e = 0; e < 8; ++e) t[e] += p.beta * c0[e];
    }
    store8<Elem>(p.c, idx, t, count, vec, c_f32);
  }
}

// Where a kernel's accumulators go: the epilogue into C, or (split-K) raw sums into
// partial + split * m * n.
struct GemmOut {
  float* partial;  // null: no split
};

}  // namespace fa::cuda::gemm_kernels
