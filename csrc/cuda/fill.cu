// Device fill kernel behind fill.h: one grid-stride loop, one element per thread per step.
#include "cuda/fill.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"

namespace fa::cuda {
namespace {

// ptxas (nvcc 13.0, sm_80 and sm_90a): 24 registers, 0 spills.
constexpr int kFillThreads = 256;

template <typename T>
__global__ void __launch_bounds__(kFillThreads) fill_kernel(T* ptr, int64_t count, float value) {
  const T v = from_float<T>(value);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kFillThreads + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * kFillThreads) {
    ptr[i] = v;
  }
}

}  // namespace

cudaError_t fill(void* ptr, DType t, size_t count, float value, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (ptr == nullptr) return cudaErrorInvalidValue;
  return dispatch_dtype(t, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t n = static_cast<int64_t>(count);
    fill_kernel<T><<<grid_size(n, kFillThreads), kFillThreads, 0, stream>>>(static_cast<T*>(ptr), n, value);
    return cudaGetLastError();
  });
}

}  // namespace fa::cuda
