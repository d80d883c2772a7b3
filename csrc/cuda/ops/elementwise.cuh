// The elementwise building block: out[i] = op(a[i], b[i]) over a flat range, fp32 math, one rounding
// on store. The launcher picks the vector width once: kVecElems<T> elements per access when every
// pointer is 16-byte aligned, else 1 (a view at any element offset). The vector loop covers
// numel / N whole vectors; the last numel % N elements take the scalar tail of the same kernel.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/ops/op_utils.cuh"

namespace fa::cuda::ops {

// ptxas (nvcc 13.0, sm_80 / sm_90a) for the instances in activation.cu: 12-32 registers, 0 spills.
inline constexpr int kFlatThreads = 256;

// Op: `static constexpr int kInputs` (1: b unused and may be null, or 2) and
// `__device__ float operator()(float a, float b) const`.
template <typename T, int N, typename Op>
__global__ void __launch_bounds__(kFlatThreads)
    flat_map_kernel(int64_t numel, Op op, const T* a, const T* b, T* out) {
  const int64_t vectors = numel / N;
  for (int64_t v = global_thread(); v < vectors; v += grid_threads()) {
    float xa[N], xb[N], y[N];
    load_float<N>(a + v * N, xa);
    if constexpr (Op::kInputs == 2) {
      load_float<N>(b + v * N, xb);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) xb[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < N; ++i) y[i] = op(xa[i], xb[i]);
    store_float<N>(out + v * N, y);
  }
  if constexpr (N > 1) {
    for (int64_t i = vectors * N + global_thread(); i < numel; i += grid_threads()) {
      out[i] = from_float<T>(op(to_float(a[i]), Op::kInputs == 2 ? to_float(b[i]) : 0.0f));
    }
  }
}

// `out` may equal `a` (in place): each element is read, then written, by one thread (no __restrict__).
template <typename Op>
cudaError_t launch_flat_map(DType dtype, int64_t numel, Op op, const void* a, const void* b, void* out,
                            cudaStream_t stream) {
  if (numel < 1) return cudaSuccess;
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kN = kVecElems<T>;
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    if (vec_aligned(a) && vec_aligned(b) && vec_aligned(out)) {
      flat_map_kernel<T, kN, Op><<<grid_size(ceil_div<int64_t>(numel, kN), kFlatThreads), kFlatThreads, 0, stream>>>(
          numel, op, pa, pb, po);
    } else {
      flat_map_kernel<T, 1, Op><<<grid_size(numel, kFlatThreads), kFlatThreads, 0, stream>>>(numel, op, pa, pb, po);
    }
    return cudaGetLastError();
  });
}

}  // namespace fa::cuda::ops
