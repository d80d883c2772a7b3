// FlashAttention-2 forward on CUDA for float32 inputs, sm_80+ mma.sync path on TF32 tensor cores
// (one build for sm_80/86/89/90). Plain C++ header.
//
// Supported: dtype float32, every head_dim that is a multiple of 8 up to 256 (specialisations 32, 64, 96,
// 128, 192, 256 as the build instantiates them, FA_HEAD_DIMS; others run zero-padded to the next one),
// any seqlens, causal or not, GQA/MQA, any batch * heads (one flat grid); q, k, v, out 16-byte aligned
// with row / head / batch strides that are multiples of 4 elements (cp.async moves 16 bytes). Precision:
// p.fp32_precision (common/attention_params.h). Semantics are those of common/attention_params.h (lse
// natural log, +inf for empty rows). Anything unsupported returns cudaErrorNotSupported without
// launching (the caller picks another backend). Only enqueues work on `stream`; no allocation, no
// synchronization. A launch error is returned.
#pragma once
#include <cuda_runtime_api.h>

#include "common/attention_params.h"

namespace fa::cuda {

// Why flash_fwd_fp32 cannot run p on the current device (a sentence to append to "Expected kernel ...:"),
// or nullptr when it can.
const char* flash_fwd_fp32_unsupported_reason(const AttentionFwdParams& p);

// True when flash_fwd_fp32 has a kernel for p on the current device.
bool flash_fwd_fp32_supported(const AttentionFwdParams& p);

cudaError_t flash_fwd_fp32(const AttentionFwdParams& p, cudaStream_t stream);

}  // namespace fa::cuda
