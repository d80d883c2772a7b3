// FlashAttention-2 forward on CUDA (fp16 / bf16). Plain C++ header.
//
// Two paths behind one entry point, chosen at run time from the device's compute capability:
// Hopper (9.0, when the build has sm_90a code) runs the wgmma kernels (csrc/cuda/flash/hopper/);
// every other sm_80+ GPU runs the mma.sync kernels.
//
// Supported: dtype float16 / bfloat16; every head_dim that is a multiple of 8 up to 256 (compiled for
// 32, 64, 96, 128, 192 and 256; the others run zero-padded to the next); any seqlens; causal or not;
// GQA/MQA; q, k, v, out 16-byte aligned with row / head / batch strides that are multiples of 8
// elements (cp.async moves 16 bytes). Anything else returns cudaErrorNotSupported without launching.
// Semantics are those of common/attention_params.h (lse natural log, +inf for empty rows).
// Only enqueues work on `stream`, no synchronization. Workspace: flash_fwd_workspace_bytes (causal calls on
// Hopper's warp-specialized kernel take a work-item counter from `stream`'s memory pool, cudaMallocAsync,
// and release it with cudaFreeAsync before the call returns). A launch or allocation error is returned.
#pragma once
#include <cuda_runtime_api.h>

#include "common/attention_params.h"

namespace fa::cuda {

// Why flash_fwd cannot run p on the current device (a sentence for an error message: dtype, head_dim,
// alignment, grid limits), or nullptr when it can.
const char* flash_fwd_unsupported_reason(const AttentionFwdParams& p);

// True when flash_fwd has a kernel for p on the current device (flash_fwd_unsupported_reason is nullptr).
bool flash_fwd_supported(const AttentionFwdParams& p);

// Whether flash_fwd runs the Hopper (wgmma) kernels on the current device, else the mma.sync ones.
bool flash_fwd_runs_sm90();

// The path flash_fwd takes on the current device: "sm90-wgmma" or "sm80-mma".
const char* flash_fwd_path();

// Bytes of workspace flash_fwd allocates on its stream for p on the current device.
size_t flash_fwd_workspace_bytes(const AttentionFwdParams& p);

cudaError_t flash_fwd(const AttentionFwdParams& p, cudaStream_t stream);

// The mma.sync path on any sm_80+ device (flash_fwd's fallback; also for side-by-side checks on Hopper).
cudaError_t flash_fwd_sm80(const AttentionFwdParams& p, cudaStream_t stream);

}  // namespace fa::cuda
