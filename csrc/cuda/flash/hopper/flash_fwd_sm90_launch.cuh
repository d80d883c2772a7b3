// Host side of the Hopper FA2 forward: the TMA tensor maps of a call and the launch of one kernel
// configuration. A header so that checks can launch configurations other than the shipped ones
// (test/native/flash_fwd_check.cu times alternatives side by side); flash_fwd_sm90.cu picks the
// shipped configuration per head dim.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <mutex>

#include "common/attention_params.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/flash/hopper/flash_fwd_sm90_kernel.cuh"

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

// Builds the call's tensor maps and launches the kernel of configuration Traits.
template <typename Traits, bool kIsCausal>
cudaError_t launch_flash_fwd_sm90(const AttentionFwdParams& p, cudaStream_t stream) {
  const CUtensorMapDataType type =
      p.dtype == DType::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  flash::sm90::FwdTensorMaps maps;
  FA_CUDA_TRY(make_map(&maps.q, type, p.q, p.head_dim, p.seqlen_q, p.heads_q, p.batch, p.q_row_stride,
                       p.q_head_stride, p.q_batch_stride, Traits::kBlockM));
  FA_CUDA_TRY(make_map(&maps.k, type, p.k, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.k_row_stride,
                       p.k_head_stride, p.k_batch_stride, Traits::kBlockN));
  FA_CUDA_TRY(make_map(&maps.v, type, p.v, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.v_row_stride,
                       p.v_head_stride, p.v_batch_stride, Traits::kBlockN));
  auto kernel = flash::sm90::flash_fwd_sm90_kernel<Traits, kIsCausal>;
  FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(Traits::kSmemBytes)));
  const int64_t blocks = ceil_div<int64_t>(p.seqlen_q, Traits::kBlockM) * p.heads_q * p.batch;
  kernel<<<static_cast<unsigned>(blocks), Traits::kNThreads, Traits::kSmemBytes, stream>>>(p, maps);
  return cudaGetLastError();
}

}  // namespace fa::cuda
