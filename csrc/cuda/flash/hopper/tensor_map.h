// TMA tensor maps of the Hopper FA2 kernels (host side): cuTensorMapEncodeTiled reached through the
// runtime (no link against libcuda), and the one map shape the kernels use.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <mutex>

#include "cuda/flash/hopper/wgmma.cuh"

namespace fa::cuda {

// cuTensorMapEncodeTiled, from the driver through the runtime (no link against libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &ptr, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(ptr);
  });
  return fn;
}

// A (head_dim, seqlen, heads, batch) view of a [batch, seqlen, heads, head_dim] tensor with strides in
// elements, read in boxes of 64 columns x box_rows rows (128 bytes x box_rows, 128-byte swizzle).
// Out-of-bounds box elements (rows >= seqlen, columns >= head_dim) arrive as zeros.
inline cudaError_t make_map(CUtensorMap* map, CUtensorMapDataType type, const void* base, int64_t head_dim, int64_t seqlen,
                     int64_t heads, int64_t batch, int64_t row_stride, int64_t head_stride, int64_t batch_stride,
                     int box_rows) {
  const auto encode = encode_tiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  constexpr int64_t kElemBytes = 2;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(seqlen),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(row_stride * kElemBytes),
                                 static_cast<cuuint64_t>(head_stride * kElemBytes),
                                 static_cast<cuuint64_t>(batch_stride * kElemBytes)};
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(flash::sm90::kSw128BlockCols), static_cast<cuuint32_t>(box_rows),
                             1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode(map, type, 4, const_cast<void*>(base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace fa::cuda
