// The CUDA copy-and-cast engine behind copy.h: a dense vectorised kernel and a general strided one,
// both grid-stride loops; conversions go through float32 (cuda_utils.cuh) except int32 -> int32 and
// same-dtype copies, which move the bits.
#include "cuda/copy.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "cuda/cuda_utils.cuh"

namespace fa::cuda {
namespace {

constexpr int kCopyThreads = 256;
constexpr int kVec = 4;  // elements per thread in the dense kernel

// Storage <-> float32 for the four dtypes (int32 -> float rounds to nearest).
template <typename T>
__device__ __forceinline__ float load_as_float(const T* p, int64_t i) {
  return to_float(p[i]);
}
template <>
__device__ __forceinline__ float load_as_float<int32_t>(const int32_t* p, int64_t i) {
  return __int2float_rn(p[i]);
}

template <typename S, typename D>
__device__ __forceinline__ void convert_one(const S* src, int64_t si, D* dst, int64_t di) {
  if constexpr (std::is_same_v<S, D>) {
    dst[di] = src[si];
  } else {
    dst[di] = from_float<D>(load_as_float(src, si));
  }
}

// Vector types of kVec elements, for the aligned dense path.
template <int kBytes>
struct VecOf;
template <>
struct VecOf<8> {
  using type = uint2;
};
template <>
struct VecOf<16> {
  using type = uint4;
};

// Dense: dst[i] = convert(src[i]) for i < n, kVec at a time; both pointers are aligned to kVec
// elements (the launcher checked). The tail (n % kVec) is done one element per thread.
template <typename S, typename D>
__global__ void __launch_bounds__(kCopyThreads) copy_dense_vec_kernel(const S* __restrict__ src, D* __restrict__ dst,
                                                                      int64_t n) {
  using SV = typename VecOf<sizeof(S) * kVec>::type;
  using DV = typename VecOf<sizeof(D) * kVec>::type;
  const int64_t vecs = n / kVec;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kCopyThreads;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * kCopyThreads + threadIdx.x; v < vecs; v += step) {
    const SV in = reinterpret_cast<const SV*>(src)[v];
    const S* s = reinterpret_cast<const S*>(&in);
    DV out;
    D* d = reinterpret_cast<D*>(&out);
#pragma unroll
    for (int k = 0; k < kVec; ++k) convert_one(s, k, d, k);
    reinterpret_cast<DV*>(dst)[v] = out;
  }
  const int64_t t = vecs * kVec + static_cast<int64_t>(blockIdx.x) * kCopyThreads + threadIdx.x;
  if (t < n) convert_one(src, t, dst, t);
}

// Dense without the alignment for vectors: one element per thread per step.
template <typename S, typename D>
__global__ void __launch_bounds__(kCopyThreads) copy_dense_kernel(const S* __restrict__ src, D* __restrict__ dst,
                                                                  int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * kCopyThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kCopyThreads + threadIdx.x; i < n; i += step) {
    convert_one(src, i, dst, i);
  }
}

// Offsets of linear index `i` (row-major over sizes) in both views.
__device__ __forceinline__ void strided_offsets(const CopyParams& p, int64_t i, int64_t* so, int64_t* dof) {
  int64_t s = 0, d = 0;
#pragma unroll
  for (int k = kMaxCopyRank - 1; k >= 0; --k) {
    if (k < p.rank) {
      const int64_t idx = i % p.sizes[k];
      i /= p.sizes[k];
      s += idx * p.src_strides[k];
      d += idx * p.dst_strides[k];
    }
  }
  *so = s;
  *dof = d;
}

template <typename S, typename D>
__global__ void __launch_bounds__(kCopyThreads) copy_strided_kernel(const CopyParams p) {
  const S* src = static_cast<const S*>(p.src);
  D* dst = static_cast<D*>(p.dst);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kCopyThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kCopyThreads + threadIdx.x; i < p.numel; i += step) {
    int64_t so, dof;
    strided_offsets(p, i, &so, &dof);
    convert_one(src, so, dst, dof);
  }
}

template <typename D>
__global__ void __launch_bounds__(kCopyThreads) fill_strided_kernel(const CopyParams p, D value) {
  D* dst = static_cast<D*>(p.dst);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kCopyThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kCopyThreads + threadIdx.x; i < p.numel; i += step) {
    int64_t so, dof;
    strided_offsets(p, i, &so, &dof);
    dst[dof] = value;
  }
}

// Calls f(TypeTag<T>{}) for the storage type of any of the four dtypes (int32 included).
template <typename F>
cudaError_t dispatch_any(DType t, F&& f) {
  if (t == DType::kInt32) return f(TypeTag<int32_t>{});
  return dispatch_dtype(t, f);
}

bool aligned_to(const void* ptr, size_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

template <typename S, typename D>
cudaError_t launch_copy(const CopyParams& p, cudaStream_t stream) {
  if (copy_is_contiguous(p)) {
    const int64_t n = p.numel;
    if constexpr (std::is_same_v<S, D>) {
      return cudaMemcpyAsync(p.dst, p.src, static_cast<size_t>(n) * sizeof(S), cudaMemcpyDeviceToDevice, stream);
    } else {
      const S* src = static_cast<const S*>(p.src);
      D* dst = static_cast<D*>(p.dst);
      // Vector loads need both sides aligned to kVec elements (8 or 16 bytes); views at odd offsets
      // take the scalar kernel.
      if (aligned_to(src, sizeof(S) * kVec) && aligned_to(dst, sizeof(D) * kVec)) {
        copy_dense_vec_kernel<S, D><<<grid_size(ceil_div<int64_t>(n, kVec), kCopyThreads), kCopyThreads, 0, stream>>>(
            src, dst, n);
      } else {
        copy_dense_kernel<S, D><<<grid_size(n, kCopyThreads), kCopyThreads, 0, stream>>>(src, dst, n);
      }
      return cudaGetLastError();
    }
  }
  copy_strided_kernel<S, D><<<grid_size(p.numel, kCopyThreads), kCopyThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t copy(const CopyParams& params, cudaStream_t stream) {
  if (params.numel == 0) return cudaSuccess;
  if (params.src == nullptr || params.dst == nullptr) return cudaErrorInvalidValue;
  if (params.dst_dtype == DType::kInt32 && params.src_dtype != DType::kInt32) return cudaErrorInvalidValue;
  CopyParams p = params;
  coalesce_copy_dims(p);
  return dispatch_any(p.src_dtype, [&](auto stag) {
    using S = typename decltype(stag)::type;
    return dispatch_any(p.dst_dtype, [&](auto dtag) -> cudaError_t {
      using D = typename decltype(dtag)::type;
      if constexpr (std::is_same_v<D, int32_t> && !std::is_same_v<S, int32_t>) {
        return cudaErrorInvalidValue;
      } else {
        return launch_copy<S, D>(p, stream);
      }
    });
  });
}

cudaError_t fill_strided(const CopyParams& params, cudaStream_t stream) {
  if (params.numel == 0) return cudaSuccess;
  if (params.dst == nullptr) return cudaErrorInvalidValue;
  CopyParams p = params;
  for (int d = 0; d < p.rank; ++d) p.src_strides[d] = p.dst_strides[d];  // coalesce by dst alone
  coalesce_copy_dims(p);
  return dispatch_any(p.dst_dtype, [&](auto tag) -> cudaError_t {
    using D = typename decltype(tag)::type;
    D value;
    if constexpr (std::is_same_v<D, int32_t>) {
      value = static_cast<int32_t>(p.value);
    } else if constexpr (std::is_same_v<D, float>) {
      value = static_cast<float>(p.value);
    } else if constexpr (std::is_same_v<D, __half>) {
      value = __float2half_rn(static_cast<float>(p.value));
    } else {
      value = __float2bfloat16_rn(static_cast<float>(p.value));
    }
    fill_strided_kernel<D><<<grid_size(p.numel, kCopyThreads), kCopyThreads, 0, stream>>>(p, value);
    return cudaGetLastError();
  });
}

}  // namespace fa::cuda
