// NaN / ±Inf in Q, K or dO at the hidden pairs of the backward's products (bug B2 of issue 6), for the
// FA2 backward kernels (sm_80 mma.sync, float32 TF32, sm_90a wgmma dK/dV and dQ).
//
// The kernels select P = dS = 0 at hidden pairs (mask.cuh), but three products still multiply those
// zeros by their other operand, and 0 * NaN = 0 * Inf = NaN:
//   dV_j += sum_i P_ij dO_i     a non-finite dO_i[d] reaches the keys that row i does not see
//   dK_j += sum_i dS_ij Q_i     a non-finite Q_i[d] likewise
//   dQ_i += sum_j dS_ij K_j     a non-finite K_j[d] reaches the rows that do not see key j
// Standard attention leaves a hidden pair out of every sum. Only tiles that cross the causal diagonal
// hold hidden pairs with real data: keys past seqlen_k and rows past seqlen_q arrive as zeros.
//
// The rule, on a crossing tile whose operand holds a NaN / ±Inf (a rare path; block-uniform):
//   1. set the operand's non-finite elements to 0 for the product (in shared memory, or in the
//      registers of its fragments), so that the product gives every output exactly what it gives with
//      a finite value there, minus that element's terms: outputs that involve the element only through
//      hidden pairs are bit-identical to a run without it (0 * 0 = 0 * x = 0);
//   2. add the element's terms back for the visible pairs only: out += a * x with a the other factor
//      as the tensor core saw it (P or dS rounded to Elem; dS from shared memory where it is there).
//      The terms are non-finite, so their order against the product's finite sum does not matter.
// For Q, step 2 can be left out: a row whose q holds NaN / ±Inf has lse NaN (it sees a key) or +inf
// (it sees none), so its dS is NaN at every visible pair and 0 at the hidden ones; dK_j gets NaN from
// the product whether q holds 0 or x there. For dO and K the visible terms P_ij dO_i[d] and
// dS_ij K_j[d] decide the class (±Inf or NaN) and must be added.
//
// Finding the rare path without scanning every tile:
//   - Q and dO: a non-finite q row gives a non-finite lse (above); a non-finite dO row a non-finite
//     D = rowsum(dO o out) (Inf * 0 and NaN are NaN, Inf * x is ±Inf). Both are read per query tile
//     anyway; bwd_row_suspect flags the row (a flagged row may be clean: a NaN in k or v also makes lse or
//     D non-finite; the rare path is exact either way, only slower).
//   - K: the block scans its K tile's chunks once (tile_nonfinite, nonfinite_tile.cuh) and votes.
#pragma once
#include <cmath>

#include "cuda/cuda_utils.cuh"
#include "cuda/flash/nonfinite_tile.cuh"

namespace fa::cuda::flash {

// Whether query row `row`'s statistics flag its q or dO as possibly holding NaN / ±Inf (lse2 = lse
// log2(e), d = D). Rows past seqlen_q hold placeholders and zeros: never flagged.
__device__ __forceinline__ bool bwd_row_suspect(int row, int seqlen_q, float lse2, float d) {
  return (row < seqlen_q) & !(isfinite(lse2) & isfinite(d));
}

// Step 2 of the rule for one source row in global memory (src: dO row i for dV, K row j for dQ): for
// this thread's accumulator columns c = 8 jt + 2 t + e (c < head_dim) whose element of src is NaN /
// ±Inf, acc[jt][2 h + e] += a[h] src[c] for the fragment rows h = 0, 1 (keys key0 / key0 + 8 of dV,
// query rows of dQ) where visible(h): a[h] is the other factor as the tensor core read it.
template <int kTiles, typename Elem, typename Visible>
__device__ __forceinline__ void add_nonfinite_terms(float (&acc)[kTiles][4], const Elem* src, const float (&a)[2], int t,
                                                    int head_dim, const Visible& visible) {
#pragma unroll
  for (int jt = 0; jt < kTiles; ++jt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int col = 8 * jt + 2 * t + e;
      if (col >= head_dim) continue;
      const float x = to_float(src[col]);
      if (isfinite(x)) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (visible(h)) acc[jt][2 * h + e] += a[h] * x;
    }
}

// x rounded to Elem and back: the value of a P or dS element as the tensor-core product read it.
template <typename Elem>
__device__ __forceinline__ float as_operand(float x) {
  return to_float(from_float<Elem>(x));
}

}  // namespace fa::cuda::flash
