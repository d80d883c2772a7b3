// Naive GPU reference attention (fp32, materialises S): the correctness reference for shapes too large
// for the host reference, and the benchmark's memory baseline (its workspace grows as N^2 on purpose).
// Semantics are those of common/attention_params.h: causal aligned bottom-right, GQA head mapping,
// empty rows give out = 0, lse = +inf and dq = 0. No cuBLAS. Plain C++ header (g++ with the CUDA
// include dir can include it).
//
// Stream and allocation behaviour: every call only enqueues work on `stream`. The fp32 workspace is
// allocated with cudaMallocAsync on `stream` and released with cudaFreeAsync on `stream` before the call
// returns (stream ordered, so safe; the memory comes from the device's current memory pool). No call
// synchronizes, prints or aborts. The first failing CUDA call's error is returned, whatever was allocated
// is released, and the error is not left pending for cudaGetLastError(). An error already pending in
// cudaGetLastError() when a call starts is reported by that call.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/attention_params.h"

namespace fa::cuda {

// Bytes of workspace naive_attention_fwd allocates: the fp32 scores/probabilities
// S = P [batch, heads_q, seqlen_q, seqlen_k] (4 * B * Hq * Sq * Sk bytes, rounded up to 256).
size_t naive_attention_fwd_workspace_bytes(const AttentionFwdParams& p);

// Bytes of workspace naive_attention_bwd allocates: two fp32 [B, Hq, Sq, Sk] buffers (P and dS), the
// fp32 row statistic D [B, Hq, Sq], and, with GQA (heads_q > heads_kv), one fp32 [B, Hkv, Sk, D] buffer
// for the dK / dV sums over each group of query heads. Each part is rounded up to 256 bytes.
size_t naive_attention_bwd_workspace_bytes(const AttentionBwdParams& p);

// out = softmax(mask(softmax_scale * q k^T)) v in p.dtype (rounded to nearest even from fp32), and
// lse = log-sum-exp of the masked, scaled scores (natural log, fp32).
cudaError_t naive_attention_fwd(const AttentionFwdParams& p, cudaStream_t stream);

// dq, dk, dv from dout, q, k, v, out and lse_in (P recomputed as exp(scale q k - lse)). All arithmetic
// in fp32; dk and dv sum over the query heads sharing a KV head in fp32 before one rounding to p.dtype.
// Deterministic: repeated calls give bit-identical results (p.deterministic is implied).
cudaError_t naive_attention_bwd(const AttentionBwdParams& p, cudaStream_t stream);

}  // namespace fa::cuda
