// CPU FlashAttention-2 backend: the two entry points the addon calls.
//
// Both run synchronously on the calling thread, use `pool` for parallelism and return when done.
// They read the params exactly as csrc/common/attention_params.h documents (strides, masking,
// GQA). Compute is fp32 for every storage dtype; outputs are rounded to p.dtype with RNE.
// Extra memory, allocated per call and freed before returning: forward O(tile) per worker (under
// 0.5 MiB at head_dim 256); backward a [batch, heads_q, seqlen_q] fp32 workspace plus, per worker,
// either (2 seqlen_k + 3 seqlen_q) * head_dim fp32 (fused schedule, capped at 1 GiB in total) or
// O(tile) (split schedule); never seqlen^2.
//
// Errors: they throw std::bad_alloc when a workspace cannot be allocated, before any output is
// written (nothing else is thrown).
// Thread-safety: no global state (apart from the test-only set_isa_limit of cpu_isa.h); calls may
// run concurrently on different pools. Calls sharing one ThreadPool are serialised by it.
// Determinism: results are bit-identical across runs and across pool sizes on one machine; they can
// differ between machines whose best instruction set differs (AVX-512 vs AVX2+FMA vs generic).
#pragma once

#include "common/attention_params.h"

namespace fa::cpu {

class ThreadPool;  // csrc/cpu/thread_pool.h

// Fills p.out and p.lse (natural log; +inf for rows that see no key).
void flash_fwd(const AttentionFwdParams& p, ThreadPool& pool);

// Fills p.dq, p.dk, p.dv from q, k, v, out, dout and lse_in. Always deterministic (p.deterministic
// is honoured trivially).
void flash_bwd(const AttentionBwdParams& p, ThreadPool& pool);

}  // namespace fa::cpu
