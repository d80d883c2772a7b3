// CPU FlashAttention-2 backend: the two entry points the addon calls.
//
// Both run synchronously on the calling thread, use `pool` for parallelism and return when done.
// They read the params exactly as csrc/common/attention_params.h documents (strides, masking,
// GQA). Compute is fp32 for every storage dtype; outputs are rounded to p.dtype with RNE.
// `isa` selects the instruction-set variant (cpu_isa.h); it is clamped to what the CPU runs, so the
// default, detected_isa(), is the fastest, and a lower one (tests, benchmarks) is always safe.
//
// Backward schedule: a D = rowsum(dO ∘ O) pre-pass, then a single pass over the K/V tiles with dQ
// accumulated across them (FlashAttention-2 Algorithm 2) in work items (batch, kv head, K/V chunk).
// With fewer than 16 (batch, kv head) pairs, each pair's K/V tiles are split into up to 16 chunks
// (the count depends on the shape only) that own their tiles' dK and dV; their fp32 dQ partials are
// then summed in chunk order. Never a second pass over K/V, never atomics (flash_bwd_cpu.cc).
//
// Extra memory, allocated per call and freed before returning, never seqlen^2:
//  - forward: O(tile) per worker (under 0.5 MiB at head_dim 256);
//  - backward: a [batch, heads_q, seqlen_q] fp32 D; for each item running at once (at most
//    min(threads, items), fewer if their scratch would pass 1 GiB) 2 * head_dim fp32 per key of its
//    chunk (its dK and dV; with one chunk per pair that is 2 * seqlen_k * head_dim) plus under
//    3 * 1024 * head_dim fp32 for one Q block (3 MiB at head_dim 256); with several chunks the dQ
//    partials, chunks * batch * heads_q * seqlen_q * head_dim fp32 (only while batch * heads_kv
//    < 16, and kept under 1 GiB by lowering the chunk count).
//
// Errors: they throw std::bad_alloc when a workspace cannot be allocated, before any output is
// written (nothing else is thrown).
// Thread-safety: no global mutable state (the ISA detection is a function-local static const);
// calls may run concurrently on different pools and threads. Calls sharing one ThreadPool are
// serialised by it.
// Determinism: results are bit-identical across runs and across pool sizes on one machine for one
// `isa`; variants (AVX-512 vs AVX2+FMA vs generic) give slightly different results.
#pragma once

#include "common/attention_params.h"
#include "cpu/cpu_isa.h"

namespace fa::cpu {

class ThreadPool;  // csrc/cpu/thread_pool.h

// Fills p.out and p.lse (natural log; +inf for rows that see no key).
void flash_fwd(const AttentionFwdParams& p, ThreadPool& pool, Isa isa = detected_isa());

// Fills p.dq, p.dk, p.dv from q, k, v, out, dout and lse_in. Always deterministic (p.deterministic
// is honoured trivially).
void flash_bwd(const AttentionBwdParams& p, ThreadPool& pool, Isa isa = detected_isa());

}  // namespace fa::cpu
