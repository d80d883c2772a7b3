// Small helpers shared by the CUDA sources (no PTX): integer ceil-div, launch-grid sizing, the one
// DType -> storage-type switch, fp32 <-> storage-dtype conversions on the device, warp reductions, two
// ways to show ptxas that a value is warp-uniform, and the error-propagation macro that launchers use
// after every CUDA call.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/dtype.h"

// Returns the error of a CUDA runtime call from the enclosing function (which returns cudaError_t).
// Launchers write FA_CUDA_TRY(cudaGetLastError()) after every kernel launch.
#define FA_CUDA_TRY(expr)                          \
  do {                                             \
    const cudaError_t fa_cuda_try_err_ = (expr);   \
    if (fa_cuda_try_err_ != cudaSuccess) return fa_cuda_try_err_; \
  } while (0)

namespace fa::cuda {

// Allocates `bytes` from `stream`'s memory pool, runs body(workspace) (which enqueues its work on
// `stream` and returns a cudaError_t), and frees the workspace on `stream`. Returns the first error,
// cleared from cudaGetLastError(): the caller gets it once, through the return value.
template <typename Body>
cudaError_t with_stream_workspace(size_t bytes, cudaStream_t stream, Body&& body) {
  void* workspace = nullptr;
  cudaError_t err = cudaMallocAsync(&workspace, bytes, stream);
  if (err == cudaSuccess) {
    err = body(static_cast<char*>(workspace));
    const cudaError_t free_err = cudaFreeAsync(workspace, stream);
    if (err == cudaSuccess) err = free_err;
  }
  if (err != cudaSuccess) (void)cudaGetLastError();
  return err;
}

inline constexpr int kWarpSize = 32;
// Hardware limit of gridDim.x. Every kernel here walks its work with a grid-stride loop, so a launch
// never needs more blocks than this, whatever the problem size.
inline constexpr int64_t kMaxGridX = 2147483647;

template <typename T>
__host__ __device__ constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

// gridDim.x for `work_items` items handled `items_per_block` at a time (at least 1 block).
inline unsigned int grid_size(int64_t work_items, int64_t items_per_block) {
  const int64_t blocks = ceil_div(work_items, items_per_block);
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > kMaxGridX ? kMaxGridX : blocks));
}

// Storage type for each DType, as a value the dispatcher can pass to a generic lambda.
template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the device storage type of `t`; the only runtime-to-template switch.
template <typename F>
cudaError_t dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: return f(TypeTag<float>{});
    case DType::kFloat16: return f(TypeTag<__half>{});
    case DType::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
    case DType::kInt32: break;  // not a floating dtype: the callers' validation refuses it first
  }
  return cudaErrorInvalidValue;
}

// Storage dtype -> fp32 (exact for all three).
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// fp32 -> storage dtype, round to nearest even (NaN stays NaN, overflow goes to Inf).
template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// A 16-bit storage dtype from its bits (a half of a packed register, a 16-bit shared-memory load).
template <typename T>
__device__ __forceinline__ T elem_from_bits(uint16_t bits);
template <>
__device__ __forceinline__ __half elem_from_bits<__half>(uint16_t bits) {
  return __ushort_as_half(bits);
}
template <>
__device__ __forceinline__ __nv_bfloat16 elem_from_bits<__nv_bfloat16>(uint16_t bits) {
  return __ushort_as_bfloat16(bits);
}

// Butterfly reductions over a full warp (all 32 lanes must call them); every lane gets the result.
__device__ __forceinline__ float warp_max(float x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
template <typename V>  // float or double
__device__ __forceinline__ V warp_sum(V x) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// A block vote's result (__syncthreads_or), as ptxas can see it is the same in every lane: through a
// warp vote it lands in a uniform predicate. Branching on the barrier's own result register instead
// made ptxas treat the rare path as divergent and move the whole causal backward loop's address
// arithmetic off the uniform datapath (sm_90a, d64 dK/dV kernel: 457 uniform instructions before B2,
// 228 with it, 705 with this; H100, 2026-11-21: the causal backward from 1.05-1.09x to 1.02-1.05x the
// time of the kernels before B2). All 32 lanes must be active.
__device__ __forceinline__ bool warp_uniform(bool x) { return __any_sync(0xffffffffu, x); }

// A value that is the same in every lane (a warpgroup index), broadcast from lane 0 so that ptxas may
// keep what derives from it in uniform registers (CUTLASS does the same for its warpgroup index).
__device__ __forceinline__ int warp_uniform_int(int x) { return __shfl_sync(0xffffffffu, x, 0); }

}  // namespace fa::cuda
