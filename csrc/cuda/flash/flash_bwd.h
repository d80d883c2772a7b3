// FlashAttention-2 backward on CUDA (fp16 / bf16): the single-kernel backward of FA2's Algorithm 2 with
// dQ accumulated through fp32 atomic adds. Plain C++ header.
//
// Three launches on `stream`, all stream-ordered:
//   1. preprocess  D = rowsum(dO o O) in fp32 [B, Hq, Sq], and the fp32 dQ accumulator zeroed;
//   2. main kernel (Hopper wgmma for head dims 32 / 64 / 128 on sm_90a builds, else mma.sync)
//                  one thread block per (K/V tile, KV head, batch): K_j and V_j stay on chip, the
//                  (Q_i, dO_i, LSE_i, D_i) tiles of every query head of the KV head's group stream
//                  through shared memory; dK and dV accumulate in registers (GQA sums in the kernel,
//                  no expanded buffers) and dQ_i += dS K_j goes to the accumulator by atomic adds;
//   3. convert     dq = softmax_scale * accumulator, rounded to the input dtype.
// Workspace (cudaMallocAsync on `stream`, released with cudaFreeAsync before the call returns):
// flash_bwd_workspace_bytes(p), O(N d): the dQ accumulator and D; never O(N^2).
//
// p.deterministic: each block of a KV head adds into its own accumulator slice (up to 8 slices, or up to 64 within 256 MiB: flash_bwd_plan.h), every
// element by one thread in a fixed order, and the conversion sums the slices in order: bit-identical dq.
// p.two_kernel (Hopper, head dims 32 / 64 / 128): the dK/dV kernel without dQ, then a dQ kernel (one
// block per query tile, looping over the keys) that writes dq directly: no atomics and no accumulator
// (workspace D only), deterministic, for two more matrix products per tile (S and dP are recomputed).
// Supported: what flash_bwd_supported says (fp16 / bf16, head_dim a multiple of 8 up to 256, the same
// alignment rules as flash_fwd, a device of compute capability 8.0+ whose shared memory fits the
// configuration). Anything else returns cudaErrorNotSupported without launching.
// Semantics are those of common/attention_params.h (the forward's lse in natural log, +inf for rows
// that see no key: their dq is 0 and they add nothing to dk / dv). No call synchronizes, prints or
// aborts; the first failing CUDA call's error is returned and the workspace is released.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/attention_params.h"

namespace fa::cuda {

// Why flash_bwd cannot run p on the current device (a sentence for an error message), or nullptr when it can.
const char* flash_bwd_unsupported_reason(const AttentionBwdParams& p);

// True when flash_bwd has a kernel for p on the current device (flash_bwd_unsupported_reason is nullptr).
bool flash_bwd_supported(const AttentionBwdParams& p);

// Bytes of workspace flash_bwd allocates for p: the fp32 dQ accumulator [B, Hq, Sq rounded up to 128,
// padded head dim] (times the slices in deterministic mode) and D [B, Hq, Sq], each rounded up to 256
// bytes.
size_t flash_bwd_workspace_bytes(const AttentionBwdParams& p);

// dq, dk, dv (p.dtype) from dout, q, k, v, out and lse_in.
cudaError_t flash_bwd(const AttentionBwdParams& p, cudaStream_t stream);

// Whether flash_bwd runs p's main kernels on the Hopper (wgmma) path on the current device (sm_90a
// builds: the two-kernel algorithm at every head dim, the single kernel at head dims that round to
// 32, 64 or 128), else the mma.sync one.
bool flash_bwd_runs_sm90(const AttentionBwdParams& p);

// The head dim whose Hopper kernels run head_dim: the smallest compiled one with a row of
// flash::kBwdSm90Configs (32, 64, 128) at least as large (its columns past head_dim are zeros), else
// the padded head dim where flash::kBwdWideSm90Configs has a row (192, 256: two kernels only), or 0.
// Defined with the Hopper kernels (hopper/flash_bwd_sm90.cu).
int flash_bwd_sm90_padded(int64_t head_dim);

// Whether the Hopper single kernel for p is the warp-specialized one (head dims 97-128;
// hopper/flash_bwd_ws_sm90_kernel.cuh) rather than the main kernel.
// Defined with the Hopper kernels.
bool flash_bwd_sm90_ws(const AttentionBwdParams& p);

// The main kernel flash_bwd runs for p on the current device: "sm90-wgmma" or "sm80-mma".
const char* flash_bwd_path(const AttentionBwdParams& p);

// flash_bwd with the mma.sync kernel on any sm_80+ device (its path elsewhere; on Hopper, for
// side-by-side checks).
cudaError_t flash_bwd_sm80(const AttentionBwdParams& p, cudaStream_t stream);

}  // namespace fa::cuda
