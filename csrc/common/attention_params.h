// The plain parameter structs that every attention backend (CPU FA2, CUDA naive reference, CUDA FA2)
// receives. Validation has already happened when one of these is filled (lib/ validates, csrc/napi
// re-validates): backends may rely on every invariant written here.
//
// Layout (like FlashAttention-2): q, k, v, out, dout, dq, dk, dv are [batch, seqlen, heads, head_dim]
// and contiguous unless the strides below say otherwise. Strides are in elements, not bytes.
// lse and the backward's D are float32 [batch, heads_q, seqlen_q], contiguous.
//
// Masking semantics, shared by all backends:
//  - causal is aligned to the bottom-right corner: query row i sees key j iff
//        j <= i + (seqlen_k - seqlen_q).
//    With seqlen_q > seqlen_k the first (seqlen_q - seqlen_k) rows see no key at all.
//  - A row that sees no key writes out = 0 and lse = +inf; in the backward, P = exp(s - lse) = 0
//    for it, so its dq is 0 and it adds nothing to dk/dv. Never NaN.
//  - GQA/MQA: query head h reads key/value head h / (heads_q / heads_kv).
#pragma once
#include <algorithm>
#include <cstdint>

#include "dtype.h"
#include "enum_codes.h"

namespace fa {

// How the CUDA FlashAttention-2 backward computes dq (the planner resolves kAuto: cuda/flash/flash_plan.h).
// The numbers are part of the JS contract (csrc/enums.json).
enum class BwdAlgorithm : int32_t {
  kAuto = codes::kBwdAlgorithmAuto,                  // the planner's choice
  kSingleKernel = codes::kBwdAlgorithmSingleKernel,  // dK, dV and dQ in one kernel, dQ through atomic (or ordered) adds
  kTwoKernel = codes::kBwdAlgorithmTwoKernel,        // a dK/dV kernel, then a dQ kernel (Hopper, head dims 32 / 64 / 128)
};

// log2(e): folds the natural-exp softmax into exp2 (seed 002).
inline constexpr float kLog2e = 1.4426950408889634f;
// ln(2): converts a base-2 log-sum-exp back to natural log for the stored LSE.
inline constexpr float kLn2 = 0.6931471805599453f;

// How the CUDA FlashAttention-2 forward runs float32 inputs on the tensor cores. Read only for
// dtype float32 by that kernel (csrc/cuda/flash/flash_fwd_fp32.cu); the CPU backend and the naive
// CUDA kernel always compute in full fp32 FMA. The numbers are part of the JS contract
// (csrc/enums.json).
enum class Fp32Precision : int32_t {
  // q, k, v and P rounded to TF32 (10-bit mantissa, round to nearest, ties away) before the two
  // matrix products, fp32 accumulation: each product is off by up to ~2^-10 relative.
  kTf32 = codes::kFp32PrecisionTf32,
  // 3xTF32: each operand x = big + small (big = tf32(x), small = tf32(x - big)), products as
  // big*big + big*small + small*big, fp32 accumulation: ~3 * 2^-22 per product, fp32-level results.
  kHighest = codes::kFp32PrecisionHighest,
};

struct AttentionFwdParams {
  // Sizes. All >= 1; head_dim is a multiple of 8 in [8, 256]; heads_q % heads_kv == 0.
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;

  // Element strides of q and out ([batch, seqlen_q, heads_q, head_dim]); the last dim has stride 1.
  int64_t q_batch_stride = 0, q_row_stride = 0, q_head_stride = 0;
  // Element strides of k and v ([batch, seqlen_k, heads_kv, head_dim]).
  int64_t k_batch_stride = 0, k_row_stride = 0, k_head_stride = 0;
  int64_t v_batch_stride = 0, v_row_stride = 0, v_head_stride = 0;
  int64_t o_batch_stride = 0, o_row_stride = 0, o_head_stride = 0;

  DType dtype = DType::kFloat32;  // of q, k, v and out (lse is always float32)
  float softmax_scale = 1.0f;     // finite and > 0; multiplies q.k before the softmax
  float scale_log2 = kLog2e;      // softmax_scale * kLog2e, for exp2
  bool causal = false;
  Fp32Precision fp32_precision = Fp32Precision::kTf32;  // float32 inputs only (see the enum)
  // Softcapping (Gemma 2): with softcap = c > 0 every scaled score s = softmax_scale * q.k becomes
  // c * tanh(s / c) before the mask and the softmax; the backward chains dS through the tanh. 0: none.
  // Finite and >= 0. Taken by the CPU backend; the binding refuses it for CUDA. (It fills the hole
  // before the pointers: the kernels' parameter layout is unchanged.)
  float softcap = 0.0f;

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* out = nullptr;
  float* lse = nullptr;  // natural log; +inf for rows with no visible key
  // Sliding window, bottom-right aligned like the causal mask (diag = seqlen_k - seqlen_q): query row i
  // sees key j iff i + diag - window_left <= j <= i + diag + window_right; -1 leaves a side unbounded,
  // and with `causal` the right side is bounded at 0 (VisibleKeys). Each is -1 or in [0, 2^53). Taken
  // by the CPU backend; the binding refuses a bounded window for CUDA.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // ALiBi: with alibi_slopes set, -slope * |i + diag - j| joins score (i, j) after the softcap, slope =
  // alibi_slopes[b * alibi_batch_stride + h] for batch b and query head h (alibi_batch_stride 0: one
  // slope per head for every batch, else heads_q). Finite float32. Taken by the CPU backend; the
  // binding refuses it for CUDA.
  const float* alibi_slopes = nullptr;
  int64_t alibi_batch_stride = 0;

  // The ALiBi slope of batch b, query head h (0 without ALiBi).
  float alibi_slope(int64_t b, int64_t h) const {
    return alibi_slopes == nullptr ? 0.0f : alibi_slopes[b * alibi_batch_stride + h];
  }
};

// The keys [lo(i), hi(i)) that query row i sees under the causal mask and the sliding window of p
// (bottom-right aligned; a row whose range is empty sees no key). lo and hi never decrease with i.
struct VisibleKeys {
  int64_t seqlen_k, diag, left, right;  // left / right: -1 unbounded

  explicit VisibleKeys(const AttentionFwdParams& p)
      : seqlen_k(p.seqlen_k),
        diag(p.seqlen_k - p.seqlen_q),
        left(p.window_left),
        right(p.causal ? 0 : p.window_right) {}

  int64_t lo(int64_t i) const { return left < 0 ? 0 : clamp_key(i + diag - left); }
  int64_t hi(int64_t i) const { return right < 0 ? seqlen_k : clamp_key(i + diag + right + 1); }
  bool sees(int64_t i, int64_t j) const { return lo(i) <= j && j < hi(i); }
  bool any(int64_t i) const { return lo(i) < hi(i); }
  // The first query row whose range reaches past key j (hi(i) > j), and the first whose range starts
  // after key j (lo(i) > j; seqlen_q when none does): rows [first_reaching(j), first_after(j)) are the
  // ones that can see key j.
  int64_t first_reaching(int64_t j, int64_t seqlen_q) const {
    return right < 0 ? 0 : std::clamp<int64_t>(j - diag - right, 0, seqlen_q);
  }
  int64_t first_after(int64_t j, int64_t seqlen_q) const {
    return left < 0 ? seqlen_q : std::clamp<int64_t>(j - diag + left + 1, 0, seqlen_q);
  }

 private:
  int64_t clamp_key(int64_t j) const { return std::clamp<int64_t>(j, 0, seqlen_k); }
};

struct AttentionBwdParams : AttentionFwdParams {
  // Inputs of the backward (same shape and dtype as out / q / k / v respectively).
  const void* dout = nullptr;  // strides: the do_* strides
  const float* lse_in = nullptr;  // the forward's lse (its `lse` field is unused in the backward)
  // Outputs: dq like q, dk like k, dv like v (shape and dtype), each with its own strides below (a
  // packed dqkv [batch, seqlen, 3, heads, head_dim] gives dq/dk/dv row strides of 3 * heads * head_dim).
  // They never share an element with each other or with an input (the binding checks it).
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  // Element strides of dout and of the gradients ([batch, seqlen, heads, head_dim], last stride 1).
  // set_grad_strides_like_inputs() copies the o_ / q_ / k_ / v_ strides into them.
  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;
  // Deterministic accumulation order for dq (backends that have a choice honour it).
  bool deterministic = false;
  // CUDA FA2 backward only: dq by a second kernel (one block per query tile, looping over the keys)
  // instead of atomic adds from the dK/dV kernel. Deterministic by construction.
  bool two_kernel = false;
};

// Fills contiguous [batch, seqlen, heads, head_dim] strides.
inline void set_contiguous_strides(int64_t seqlen, int64_t heads, int64_t head_dim, int64_t* batch_stride,
                                   int64_t* row_stride, int64_t* head_stride) {
  *head_stride = head_dim;
  *row_stride = heads * head_dim;
  *batch_stride = seqlen * heads * head_dim;
}

// Gives dout the strides of out, and dq / dk / dv the strides of q / k / v.
inline void set_grad_strides_like_inputs(AttentionBwdParams* p) {
  p->do_batch_stride = p->o_batch_stride;
  p->do_row_stride = p->o_row_stride;
  p->do_head_stride = p->o_head_stride;
  p->dq_batch_stride = p->q_batch_stride;
  p->dq_row_stride = p->q_row_stride;
  p->dq_head_stride = p->q_head_stride;
  p->dk_batch_stride = p->k_batch_stride;
  p->dk_row_stride = p->k_row_stride;
  p->dk_head_stride = p->k_head_stride;
  p->dv_batch_stride = p->v_batch_stride;
  p->dv_row_stride = p->v_row_stride;
  p->dv_head_stride = p->v_head_stride;
}

}  // namespace fa
