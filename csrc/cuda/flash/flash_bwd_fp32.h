// FlashAttention-2 backward on CUDA for float32 inputs, sm_80+ mma.sync path on TF32 tensor cores (one
// build for sm_80/86/89/90): the single-kernel backward of FA2's Algorithm 2 with dQ accumulated through
// fp32 atomic adds, as flash_bwd (flash_bwd.h) runs it for fp16 / bf16. Plain C++ header.
//
// Called by attentionBackward (csrc/napi/attention_ops.cc) for float32 inputs on CUDA.
//
// Three launches on `stream`, all stream-ordered:
//   1. preprocess  D = rowsum(dO o O) in fp32 [B, Hq, Sq], and the fp32 dQ accumulator zeroed;
//   2. main kernel one thread block per (K/V tile, KV head, batch) (flash_bwd_fp32_kernel.cuh): dK and
//                  dV in registers (GQA sums in the kernel), dQ_i += dS K_j into the accumulator by
//                  atomic adds;
//   3. convert     dq = softmax_scale * accumulator.
// Workspace (cudaMallocAsync on `stream`, released with cudaFreeAsync before the call returns):
// flash_bwd_fp32_workspace_bytes(p), O(N d): the dQ accumulator and D; never O(N^2).
//
// Precision: p.fp32_precision (common/attention_params.h), as the float32 forward: kTf32 rounds every
// operand of the five products (q, k, v, dout, P, dS) to TF32 at its use, kHighest runs each product
// as 3xTF32. Softmax, D, dS and every accumulation are fp32 in both; kHighest also adds each query
// tile's dK / dV contribution with a rounding fp32 add (the tensor cores' own accumulation truncates).
// p.deterministic: each block of a KV head adds into its own accumulator slice (up to 8 slices, or up to 64 within 256 MiB: flash_bwd_plan.h), every
// element by one thread in a fixed order, and the conversion sums the slices in order: bit-identical dq.
// dk and dv are bit-identical run to run in both modes.
// Supported: what flash_bwd_fp32_unsupported_reason says (float32, head_dim a multiple of 8 up to 256,
// zero-padded to the next compiled specialisation, q, k, v, out, dout, dq, dk, dv 16-byte aligned with
// strides that are multiples of 4 elements, a device of compute capability 8.0+ whose per-block
// shared-memory opt-in limit fits the configuration). Anything else returns cudaErrorNotSupported
// without launching. Semantics are those of common/attention_params.h (the forward's lse in natural
// log, +inf for rows that see no key: their dq is 0 and they add nothing to dk / dv). No call
// synchronizes, prints or aborts; the first failing CUDA call's error is returned and the workspace is
// released.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/attention_params.h"

namespace fa::cuda {

// Why flash_bwd_fp32 cannot run p on the current device (a sentence for an error message), or nullptr
// when it can.
const char* flash_bwd_fp32_unsupported_reason(const AttentionBwdParams& p);

// Bytes of workspace flash_bwd_fp32 allocates for p: the fp32 dQ accumulator [B, Hq, Sq rounded up to 64,
// padded head dim] (times the slices in deterministic mode) and D [B, Hq, Sq], each rounded up to 256
// bytes.
size_t flash_bwd_fp32_workspace_bytes(const AttentionBwdParams& p);

// dq, dk, dv (float32) from dout, q, k, v, out and lse_in.
cudaError_t flash_bwd_fp32(const AttentionBwdParams& p, cudaStream_t stream);

}  // namespace fa::cuda
