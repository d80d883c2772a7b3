// Naive GPU reference attention in fp32 (see naive_attention.h for the contract).
//
// Forward:  S = scale * Q K^T            (GEMM, fp32 workspace [B, Hq, Sq, Sk])
//           P = softmax(mask(S)), lse    (one warp per row, in place)
//           O = P V                      (GEMM, rounded to the dtype on store)
// Backward: D = rowsum(dO o O)           (one thread per row)
//           S = scale * Q K^T, dP = dO V^T          (GEMMs into the two [B, Hq, Sq, Sk] buffers)
//           P = exp(S - lse) masked, dS = P o (dP - D)   (one warp per row, in place)
//           dV = P^T dO, dK = scale dS^T Q  (summed over each GQA group in fp32), dQ = scale dS K
// Every product goes through the one strided GEMM in gemm_naive.cuh, reading the [B, S, H, D] tensors
// in place; all index arithmetic is 64-bit (B * Hq * Sq * Sk may exceed 2^31).
#include "cuda/naive_attention.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/gemm_naive.cuh"

namespace fa::cuda {
namespace {

// Row kernels (softmax forward, softmax gradient): one warp per row of S, kRowWarps rows per block.
// ptxas (nvcc 13.0, sm_80 and sm_90a): 32 registers each, 0 spills.
constexpr int kRowWarps = 8;
constexpr int kRowThreads = kRowWarps * kWarpSize;
// D = rowsum(dO o O): one thread per (b, h, i). ptxas: 28 registers (sm_80), 24 (sm_90a), 0 spills.
constexpr int kDeltaThreads = 256;
// Every workspace part starts on this byte boundary.
constexpr size_t kWorkspaceAlign = 256;

size_t align_up(size_t bytes) { return ceil_div(bytes, kWorkspaceAlign) * kWorkspaceAlign; }

// Keys 0 .. n-1 are visible to query row i, n returned: all seqlen_k of them, or under the causal mask
// (bottom-right aligned: key j visible iff j <= i + sk - sq) clamped to [0, sk]. 0 means an empty row.
__device__ __forceinline__ int64_t visible_keys(int64_t i, int64_t sq, int64_t sk, bool causal) {
  if (!causal) return sk;
  const int64_t n = i + sk - sq + 1;
  return n < 0 ? 0 : (n > sk ? sk : n);
}

// In place over S [rows, sk] (rows = B * Hq * Sq, row r is query i = r % sq): P = softmax over the visible
// keys, 0 on masked keys; lse[r] = max + log(sum) (natural log), +inf for an empty row (whose P is all 0).
__global__ void __launch_bounds__(kRowThreads)
    softmax_rows_kernel(float* s, float* lse, int64_t rows, int64_t sq, int64_t sk, bool causal) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarpSize;
  for (int64_t row = warp; row < rows; row += static_cast<int64_t>(gridDim.x) * kRowWarps) {
    float* x = s + row * sk;
    const int64_t visible = visible_keys(row % sq, sq, sk, causal);
    float mx = -INFINITY;
    for (int64_t j = lane; j < visible; j += kWarpSize) mx = fmaxf(mx, x[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int64_t j = lane; j < visible; j += kWarpSize) sum += expf(x[j] - mx);
    sum = warp_sum(sum);
    for (int64_t j = lane; j < sk; j += kWarpSize) x[j] = j < visible ? expf(x[j] - mx) / sum : 0.0f;
    if (lane == 0) lse[row] = visible > 0 ? mx + logf(sum) : INFINITY;
  }
}

// delta[r] = sum_d dO[b, i, h, d] * O[b, i, h, d] for row r = (b * heads + h) * sq + i, summed in d order
// (the order the GEMM sums dP = dO V^T in). dO has the do_* strides, O the o_* strides.
struct RowStrides {
  int64_t batch, row, head;
};
template <typename T>
__global__ void __launch_bounds__(kDeltaThreads)
    delta_kernel(const T* dout, const T* out, float* delta, int64_t rows, int64_t sq, int64_t heads,
                 int64_t head_dim, RowStrides do_strides, RowStrides o_strides) {
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kDeltaThreads + threadIdx.x; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kDeltaThreads) {
    const int64_t i = row % sq;
    const int64_t h = (row / sq) % heads;
    const int64_t b = row / (sq * heads);
    const int64_t do_off = b * do_strides.batch + i * do_strides.row + h * do_strides.head;
    const int64_t o_off = b * o_strides.batch + i * o_strides.row + h * o_strides.head;
    float acc = 0.0f;
    for (int64_t d = 0; d < head_dim; ++d) acc += to_float(dout[do_off + d]) * to_float(out[o_off + d]);
    delta[row] = acc;
  }
}

// In place over S and dP [rows, sk]: P = exp(S - lse) on visible keys of rows with finite lse, else 0
// (written over S); dS = P * (dP - delta) (written over dP). Masked entries get P = dS = 0 exactly.
__global__ void __launch_bounds__(kRowThreads)
    softmax_grad_rows_kernel(float* s_to_p, float* dp_to_ds, const float* lse, const float* delta, int64_t rows,
                             int64_t sq, int64_t sk, bool causal) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * kRowWarps + threadIdx.x / kWarpSize;
  for (int64_t row = warp; row < rows; row += static_cast<int64_t>(gridDim.x) * kRowWarps) {
    float* s = s_to_p + row * sk;
    float* dp = dp_to_ds + row * sk;
    const float row_lse = lse[row];
    const float row_delta = delta[row];
    const int64_t visible = row_lse == INFINITY ? 0 : visible_keys(row % sq, sq, sk, causal);
    for (int64_t j = lane; j < sk; j += kWarpSize) {
      const float prob = j < visible ? expf(s[j] - row_lse) : 0.0f;
      s[j] = prob;
      dp[j] = prob * (dp[j] - row_delta);
    }
  }
}

// --- Operand views of the attention tensors --------------------------------------------------------

// A [B, S, H, D] tensor as a stack of S x D matrices batched over (b, h); head_div maps query heads to
// KV heads.
template <typename T>
GemmOperand<T> seq_by_dim(T* ptr, int64_t batch_stride, int64_t row_stride, int64_t head_stride,
                          int64_t head_div = 1) {
  return make_operand(ptr, row_stride, int64_t{1}, batch_stride, head_stride, head_div);
}

// A contiguous fp32 [B, Hq, Sq, Sk] workspace buffer as Sq x Sk matrices batched over (b, h).
GemmOperand<float> scores(float* ptr, const AttentionFwdParams& p) {
  return make_operand(ptr, p.seqlen_k, int64_t{1}, p.heads_q * p.seqlen_q * p.seqlen_k, p.seqlen_q * p.seqlen_k);
}

int64_t score_count(const AttentionFwdParams& p) { return p.batch * p.heads_q * p.seqlen_q * p.seqlen_k; }
int64_t row_count(const AttentionFwdParams& p) { return p.batch * p.heads_q * p.seqlen_q; }

// S = softmax_scale * Q K^T into the fp32 buffer `s` [B, Hq, Sq, Sk].
template <typename T>
cudaError_t scores_gemm(const AttentionFwdParams& p, float* s, cudaStream_t stream) {
  const int64_t group = p.heads_q / p.heads_kv;
  GemmArgs<T, T, float> qk;
  qk.m = p.seqlen_q;
  qk.n = p.seqlen_k;
  qk.k = p.head_dim;
  qk.batch = p.batch;
  qk.heads = p.heads_q;
  qk.alpha = p.softmax_scale;
  qk.a = seq_by_dim(static_cast<const T*>(p.q), p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  qk.b = transposed(seq_by_dim(static_cast<const T*>(p.k), p.k_batch_stride, p.k_row_stride, p.k_head_stride, group));
  qk.c_out = scores(s, p);
  return launch_gemm(qk, stream);
}

// --- Workspace layouts ---------------------------------------------------------------------------

struct BwdWorkspace {
  size_t p_offset = 0;      // fp32 [B, Hq, Sq, Sk]: S, then P
  size_t ds_offset = 0;     // fp32 [B, Hq, Sq, Sk]: dP, then dS
  size_t delta_offset = 0;  // fp32 [B, Hq, Sq]: D = rowsum(dO o O)
  size_t acc_offset = 0;    // fp32 [B, Hkv, Sk, D]: GQA group sums of dV, then of dK (only if Hq > Hkv)
  size_t bytes = 0;
};

BwdWorkspace bwd_workspace(const AttentionBwdParams& p) {
  const size_t score_bytes = align_up(sizeof(float) * static_cast<size_t>(score_count(p)));
  const size_t delta_bytes = align_up(sizeof(float) * static_cast<size_t>(row_count(p)));
  const size_t acc_bytes =
      p.heads_q > p.heads_kv
          ? align_up(sizeof(float) * static_cast<size_t>(p.batch * p.heads_kv * p.seqlen_k * p.head_dim))
          : 0;
  BwdWorkspace ws;
  ws.p_offset = 0;
  ws.ds_offset = score_bytes;
  ws.delta_offset = 2 * score_bytes;
  ws.acc_offset = 2 * score_bytes + delta_bytes;
  ws.bytes = 2 * score_bytes + delta_bytes + acc_bytes;
  return ws;
}

// --- Forward / backward --------------------------------------------------------------------------

template <typename T>
cudaError_t fwd_impl(const AttentionFwdParams& p, float* s /* [B, Hq, Sq, Sk] */, cudaStream_t stream) {
  const int64_t group = p.heads_q / p.heads_kv;
  const int64_t rows = row_count(p);

  FA_CUDA_TRY(scores_gemm<T>(p, s, stream));

  softmax_rows_kernel<<<grid_size(rows, kRowWarps), kRowThreads, 0, stream>>>(s, p.lse, rows, p.seqlen_q,
                                                                               p.seqlen_k, p.causal);
  FA_CUDA_TRY(cudaGetLastError());

  // O [B, Sq, Hq, D] = P [Sq, Sk] . V [Sk, D]
  GemmArgs<float, T, T> pv;
  pv.m = p.seqlen_q;
  pv.n = p.head_dim;
  pv.k = p.seqlen_k;
  pv.batch = p.batch;
  pv.heads = p.heads_q;
  pv.a = as_const(scores(s, p));
  pv.b = seq_by_dim(static_cast<const T*>(p.v), p.v_batch_stride, p.v_row_stride, p.v_head_stride, group);
  pv.c_out = seq_by_dim(static_cast<T*>(p.out), p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  return launch_gemm(pv, stream);
}

template <typename T>
cudaError_t bwd_impl(const AttentionBwdParams& p, char* workspace, cudaStream_t stream) {
  const BwdWorkspace ws = bwd_workspace(p);
  float* prob = reinterpret_cast<float*>(workspace + ws.p_offset);      // [B, Hq, Sq, Sk]
  float* dscore = reinterpret_cast<float*>(workspace + ws.ds_offset);   // [B, Hq, Sq, Sk]
  float* delta = reinterpret_cast<float*>(workspace + ws.delta_offset); // [B, Hq, Sq]
  float* acc = reinterpret_cast<float*>(workspace + ws.acc_offset);     // [B, Hkv, Sk, D] when Hq > Hkv
  const int64_t group = p.heads_q / p.heads_kv;
  const int64_t rows = row_count(p);

  const T* q = static_cast<const T*>(p.q);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);
  const T* dout = static_cast<const T*>(p.dout);

  delta_kernel<T><<<grid_size(rows, kDeltaThreads), kDeltaThreads, 0, stream>>>(
      dout, static_cast<const T*>(p.out), delta, rows, p.seqlen_q, p.heads_q, p.head_dim,
      RowStrides{p.do_batch_stride, p.do_row_stride, p.do_head_stride},
      RowStrides{p.o_batch_stride, p.o_row_stride, p.o_head_stride});
  FA_CUDA_TRY(cudaGetLastError());

  FA_CUDA_TRY(scores_gemm<T>(p, prob, stream));

  // dP [Sq, Sk] = dO [Sq, D] . V^T [D, Sk]
  GemmArgs<T, T, float> dp;
  dp.m = p.seqlen_q;
  dp.n = p.seqlen_k;
  dp.k = p.head_dim;
  dp.batch = p.batch;
  dp.heads = p.heads_q;
  dp.a = seq_by_dim(dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
  dp.b = transposed(seq_by_dim(v, p.v_batch_stride, p.v_row_stride, p.v_head_stride, group));
  dp.c_out = scores(dscore, p);
  FA_CUDA_TRY(launch_gemm(dp, stream));

  softmax_grad_rows_kernel<<<grid_size(rows, kRowWarps), kRowThreads, 0, stream>>>(
      prob, dscore, p.lse_in, delta, rows, p.seqlen_q, p.seqlen_k, p.causal);
  FA_CUDA_TRY(cudaGetLastError());

  // dV [Sk, D] of KV head kvh = sum over its query heads h of P_h^T [Sk, Sq] . dO_h [Sq, D]; batched over
  // (b, kvh), the group members addressed by group_member().
  GemmArgs<float, T, T> dv;
  dv.m = p.seqlen_k;
  dv.n = p.head_dim;
  dv.k = p.seqlen_q;
  dv.batch = p.batch;
  dv.heads = p.heads_kv;
  dv.a = as_const(transposed(scores(prob, p)));
  dv.b = seq_by_dim(dout, p.do_batch_stride, p.do_row_stride, p.do_head_stride);
  dv.c_out = seq_by_dim(static_cast<T*>(p.dv), p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
  FA_CUDA_TRY(launch_gemm_group_sum(dv, group, acc, stream));

  // dK [Sk, D] = scale * sum over the group of dS_h^T [Sk, Sq] . Q_h [Sq, D] (acc reused: stream ordered).
  GemmArgs<float, T, T> dk;
  dk.m = p.seqlen_k;
  dk.n = p.head_dim;
  dk.k = p.seqlen_q;
  dk.batch = p.batch;
  dk.heads = p.heads_kv;
  dk.alpha = p.softmax_scale;
  dk.a = as_const(transposed(scores(dscore, p)));
  dk.b = seq_by_dim(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  dk.c_out = seq_by_dim(static_cast<T*>(p.dk), p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
  FA_CUDA_TRY(launch_gemm_group_sum(dk, group, acc, stream));

  // dQ [Sq, D] = scale * dS [Sq, Sk] . K [Sk, D]
  GemmArgs<float, T, T> dq;
  dq.m = p.seqlen_q;
  dq.n = p.head_dim;
  dq.k = p.seqlen_k;
  dq.batch = p.batch;
  dq.heads = p.heads_q;
  dq.alpha = p.softmax_scale;
  dq.a = as_const(scores(dscore, p));
  dq.b = seq_by_dim(k, p.k_batch_stride, p.k_row_stride, p.k_head_stride, group);
  dq.c_out = seq_by_dim(static_cast<T*>(p.dq), p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
  return launch_gemm(dq, stream);
}

}  // namespace

size_t naive_attention_fwd_workspace_bytes(const AttentionFwdParams& p) {
  return align_up(sizeof(float) * static_cast<size_t>(score_count(p)));
}

size_t naive_attention_bwd_workspace_bytes(const AttentionBwdParams& p) { return bwd_workspace(p).bytes; }

cudaError_t naive_attention_fwd(const AttentionFwdParams& p, cudaStream_t stream) {
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return with_stream_workspace(naive_attention_fwd_workspace_bytes(p), stream,
                                 [&](char* workspace) { return fwd_impl<T>(p, reinterpret_cast<float*>(workspace), stream); });
  });
}

cudaError_t naive_attention_bwd(const AttentionBwdParams& p, cudaStream_t stream) {
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return with_stream_workspace(naive_attention_bwd_workspace_bytes(p), stream,
                                 [&](char* workspace) { return bwd_impl<T>(p, workspace, stream); });
  });
}

}  // namespace fa::cuda
