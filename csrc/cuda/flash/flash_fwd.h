// FlashAttention-2 forward on CUDA, sm_80+ (mma.sync) path. Plain C++ header.
//
// Supported now: dtype float16 / bfloat16, head_dim 64 / 128, causal or not, GQA/MQA; q, k, v, out
// 16-byte aligned with row / head / batch strides that are multiples of 8 elements (cp.async moves 16
// bytes). Anything else returns cudaErrorNotSupported without launching (the caller picks another
// backend). Semantics are those of common/attention_params.h (lse natural log, +inf for empty rows).
// Only enqueues work on `stream`; no allocation, no synchronization. A launch error is returned.
#pragma once
#include <cuda_runtime_api.h>

#include "common/attention_params.h"

namespace fa::cuda {

// True when flash_fwd has a kernel for p (dtype, head_dim, alignment, grid limits) on the current device.
bool flash_fwd_supported(const AttentionFwdParams& p);

cudaError_t flash_fwd(const AttentionFwdParams& p, cudaStream_t stream);

}  // namespace fa::cuda
