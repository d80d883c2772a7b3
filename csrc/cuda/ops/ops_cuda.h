// CUDA backend of the training ops (csrc/common/op_params.h). Each launcher queues its kernels on
// `stream` and returns the launch status (cudaGetLastError after every launch); none synchronises.
// Workspaces are allocated by the caller (csrc/napi) with the size the matching *_workspace_bytes
// returns, so an out-of-memory error names the op.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/op_params.h"

namespace fa::cuda {

cudaError_t embedding_fwd(const EmbeddingParams& p, cudaStream_t stream);
cudaError_t embedding_bwd(const EmbeddingParams& p, cudaStream_t stream);
cudaError_t norm_fwd(const NormParams& p, cudaStream_t stream);
cudaError_t norm_bwd(const NormParams& p, cudaStream_t stream);
size_t norm_bwd_workspace_bytes(const NormParams& p);  // the parameter-gradient partial sums
cudaError_t rope(const RopeParams& p, cudaStream_t stream);
cudaError_t gelu_fwd(const GeluParams& p, cudaStream_t stream);
cudaError_t gelu_bwd(const GeluParams& p, cudaStream_t stream);
cudaError_t swiglu_fwd(const SwigluParams& p, cudaStream_t stream);
cudaError_t swiglu_bwd(const SwigluParams& p, cudaStream_t stream);
cudaError_t add(const AddParams& p, cudaStream_t stream);
size_t cross_entropy_workspace_bytes(const CrossEntropyParams& p);
cudaError_t cross_entropy(const CrossEntropyParams& p, cudaStream_t stream);
cudaError_t adamw(const AdamWParams& p, cudaStream_t stream);
size_t norm_of_workspace_bytes(const NormOfParams& p);
cudaError_t norm_of(const NormOfParams& p, cudaStream_t stream);
size_t column_sum_workspace_bytes(const ColumnSumParams& p);
cudaError_t column_sum(const ColumnSumParams& p, cudaStream_t stream);
size_t sum_workspace_bytes(const SumParams& p);
cudaError_t sum(const SumParams& p, cudaStream_t stream);

}  // namespace fa::cuda
