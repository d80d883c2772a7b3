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

// A tiled tensor map of `rank` dimensions (dims[0] innermost, strides in elements of elem_bytes for
// dimensions 1 .., boxes of box[] elements), 128-byte swizzle: box[0] x elem_bytes must be 128.
inline cudaError_t encode_sw128_map(CUtensorMap* map, CUtensorMapDataType type, int64_t elem_bytes, const void* base,
                                    int rank, const int64_t* dims, const int64_t* strides, const int* box) {
  const auto encode = encode_tiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  cuuint64_t d[5], st[4];
  cuuint32_t b[5], elem_strides[5];
  for (int i = 0; i < rank; ++i) {
    d[i] = static_cast<cuuint64_t>(dims[i]);
    b[i] = static_cast<cuuint32_t>(box[i]);
    elem_strides[i] = 1;
    if (i > 0) st[i - 1] = static_cast<cuuint64_t>(strides[i - 1] * elem_bytes);
  }
  const CUresult r = encode(map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), d, st, b, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// A (head_dim, seqlen, heads, batch) view of a [batch, seqlen, heads, head_dim] tensor with strides in
// elements, read in boxes of 64 columns x box_rows rows (128 bytes x box_rows, 128-byte swizzle).
// Out-of-bounds box elements (rows >= seqlen, columns >= head_dim) arrive as zeros.
inline cudaError_t make_map(CUtensorMap* map, CUtensorMapDataType type, const void* base, int64_t head_dim, int64_t seqlen,
                     int64_t heads, int64_t batch, int64_t row_stride, int64_t head_stride, int64_t batch_stride,
                     int box_rows) {
  const int64_t dims[4] = {head_dim, seqlen, heads, batch};
  const int64_t strides[3] = {row_stride, head_stride, batch_stride};
  const int box[4] = {flash::sm90::kSw128BlockCols, box_rows, 1, 1};
  return encode_sw128_map(map, type, 2, base, 4, dims, strides, box);
}

// The backward's fp32 dQ accumulator [splits][batch, heads, rows, cols] (contiguous, split_stride
// floats apart) as a (cols, rows, heads, batch, splits) view, in boxes of 32 columns x box_rows rows
// (128 bytes x box_rows, 128-byte swizzle): the target of the single kernel's bulk reductions.
inline cudaError_t make_accum_map(CUtensorMap* map, const float* base, int64_t cols, int64_t rows, int64_t heads,
                                  int64_t batch, int64_t splits, int64_t split_stride, int box_rows) {
  const int64_t dims[5] = {cols, rows, heads, batch, splits};
  const int64_t strides[4] = {cols, rows * cols, heads * rows * cols, split_stride};
  const int box[5] = {flash::sm90::kSw128F32Cols, box_rows, 1, 1, 1};
  return encode_sw128_map(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, base, 5, dims, strides, box);
}

}  // namespace fa::cuda
