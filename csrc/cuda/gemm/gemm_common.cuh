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

// Where a kernel's accumulators go: the epilogue into C, or (split-K) raw sums into
// partial + split * m * n.
struct GemmOut {
  float* partial;  // null: no split
};

}  // namespace fa::cuda::gemm_kernels
