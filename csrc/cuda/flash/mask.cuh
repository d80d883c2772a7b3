// The masking policy of the FlashAttention-2 kernels: which (query row i, key j) pairs a call hides,
// as one object that every kernel asks, forward and backward, sm_80 mma.sync, sm_90a wgmma and float32.
// A new visibility rule (a sliding window, varlen segments) changes this struct, not the seven kernels.
//
// The rule today: row i sees key j unless
//   hidden(i, j) = j >= seqlen_k || i >= seqlen_q || (causal && j > i + diag),  diag = seqlen_k - seqlen_q
// (bottom-right causal alignment; rows i >= seqlen_q are the padding rows of the last query tile, keys
// j >= seqlen_k those of the last key tile). The pairs hidden by the third term, the band, hold real
// data: they occur only on tiles that `cross` the band's edge, and those are the tiles where the
// NaN / Inf containment (nonfinite_pv.cuh, bwd_nonfinite.cuh) runs.
//
// The questions, by who asks them:
//   - tile loops: the keys a query tile reads (query_tile_keys), the first query tile a key tile
//     meets (first_query_tile), whether a tile needs the per-element test (fwd_tile_needs_mask,
//     bwd_tile_needs_mask) and whether it crosses the band's edge (crosses);
//   - per element: the forward's -inf mask of a score fragment (mask_scores), the backward's hidden(),
//     and the bounds its tuned selects compare against (key_end, first_row);
//   - the epilogue: whether a row sees any key (row_sees_key), which decides O = 0 and lse = +inf.
//
// The backward hides a pair by a select, not by arithmetic, because with non-finite data the
// arithmetic does not give 0: a padding row holds zeros, so a key holding -inf scores 0 * (-inf) = NaN
// there; the forward gives lse = NaN to a row whose visible scores hold NaN or +inf or are all -inf,
// so 2^(-inf - lse2) = NaN at its hidden keys; and dP = dO V^T is a full product, so a NaN / Inf in V
// row j makes dP NaN at every query, and P (dP - D) = 0 * NaN at the queries that do not see key j.
// Each of these would reach dV = P^T dO, dK = dS^T Q or dQ = dS K. The kernels select either P and dS
// themselves to 0, or the argument of 2^x to -inf (2^-inf = +0 exactly) and dP - D to 0 (then dS =
// 0 * 0), whichever ptxas compiled with fewer registers; visible pairs keep the unmasked formulas bit
// for bit. Those products still multiply the zeros by their other operand, so a non-finite element of
// dO, Q or K at a hidden pair would give 0 * Inf = NaN inside the mma: bwd_nonfinite.cuh's rare path
// handles that.
//
// Every method is a few integer operations that inline into the caller. Where a test runs once per
// element or per tile in a hot loop, its expression is written out whole: built from the smaller
// methods, the backward's tile test made LLVM lay out the masked and unmasked blocks the other way
// round, and the Hopper dK/dV kernel at d128 (bf16, 8k, not causal) took 2.3% longer (H100).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

namespace fa::cuda::flash {

// The keys a query tile reads, [0, end), and that range in K/V tiles of kBlockN keys (0 when the tile
// sees no key).
struct KeyRange {
  int end, tiles;
};

template <bool kIsCausal>
struct AttentionMask {
  int seqlen_q, seqlen_k;
  int diag;  // seqlen_k - seqlen_q: causal row i sees keys j <= i + diag

  __device__ __forceinline__ AttentionMask(int seqlen_q_, int seqlen_k_)
      : seqlen_q(seqlen_q_), seqlen_k(seqlen_k_), diag(seqlen_k_ - seqlen_q_) {}

  // --- rows and keys ---

  // Whether `key` lies outside the band that row `row` sees (causal: past its diagonal). Padding rows
  // and keys are not part of this test (hidden() adds them).
  __device__ __forceinline__ bool off_band(int row, int key) const { return kIsCausal && key > row + diag; }

  // hidden(row, key) as in the header: the padding terms and off_band(). Bitwise operators, not || and
  // &&: short-circuit forms made LLVM branch per element, splitting the P / dS code into basic blocks.
  __device__ __forceinline__ bool hidden(int row, int key) const {
    return (key >= seqlen_k) | (row >= seqlen_q) | (kIsCausal & (key > row + diag));
  }

  // The end of the keys row `row` sees: [0, key_end(row)).
  __device__ __forceinline__ int key_end(int row) const {
    return kIsCausal ? min(seqlen_k, row + diag + 1) : seqlen_k;
  }

  // The first row that sees `key` when causal (rows before it are past their diagonal).
  __device__ __forceinline__ int first_row(int key) const { return key - diag; }

  // Whether query row `row` sees any key: seqlen_k > 0 and, when causal, row + diag >= 0 (key 0 is
  // visible). The structure that the forward's finish() ends a row by.
  __device__ __forceinline__ bool row_sees_key(int row) const {
    return seqlen_k > 0 && (!kIsCausal || row + diag >= 0);
  }

  // --- tiles ---

  // The keys of the query tile of kBlockM rows from m0: all of them or, causal, up to its last row's
  // diagonal.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ KeyRange query_tile_keys(int m0) const {
    const int end = kIsCausal ? min(seqlen_k, m0 + kBlockM + diag) : seqlen_k;
    return {end, end > 0 ? (end + kBlockN - 1) / kBlockN : 0};
  }

  // The first of m_blocks query tiles that sees a key of the key tile from n0: causal, the tile of the
  // first row whose diagonal reaches n0.
  template <int kBlockM>
  __device__ __forceinline__ int first_query_tile(int n0, int m_blocks) const {
    return kIsCausal ? min(m_blocks, max(0, n0 - diag) / kBlockM) : 0;
  }

  // Whether the tile (kBlockM rows from m0, kBlockN keys from n0) holds pairs off the band: causal,
  // its last key lies past its first row's diagonal.
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ bool crosses(int m0, int n0) const {
    return kIsCausal && n0 + kBlockN - 1 > m0 + diag;
  }

  // A key from which on every key tile of kBlockN keys that a query tile from m0 crosses lies (causal:
  // the tiles whose last key is past row m0's diagonal).
  template <int kBlockN>
  __device__ __forceinline__ int crossing_keys_begin(int m0) const { return max(0, m0 + diag + 2 - kBlockN); }

  // Whether the key tile from n0 reaches past seqlen_k.
  template <int kBlockN>
  __device__ __forceinline__ bool past_keys(int n0) const { return n0 + kBlockN > seqlen_k; }

  // The forward masks the scores of a tile that reaches past seqlen_k or crosses the band's edge (its
  // padding rows are never stored). `crossing` is crosses() of the tile, which the kernels keep.
  template <int kBlockN>
  __device__ __forceinline__ bool fwd_tile_needs_mask(int n0, bool crossing) const {
    return past_keys<kBlockN>(n0) || crossing;
  }

  // The backward tests its elements on a tile that holds any hidden pair: it reaches past seqlen_k
  // (past_keys) or seqlen_q, or crosses the band's edge (crosses).
  template <int kBlockM, int kBlockN>
  __device__ __forceinline__ bool bwd_tile_needs_mask(int m0, int n0) const {
    return n0 + kBlockN > seqlen_k || m0 + kBlockM > seqlen_q || (kIsCausal && n0 + kBlockN - 1 > m0 + diag);
  }

  // --- the forward's score fragments ---

  // Sets to -inf every element of an m16n8-layout score accumulator (s[j][e]: row row0 + 8 (e / 2),
  // column col0 + 8 j + e % 2; col0 is the tile's first key plus this thread's 2 t) whose key the row
  // does not see.
  template <int kTiles>
  __device__ __forceinline__ void mask_scores(float (&s)[kTiles][4], int col0, int row0) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int limit = key_end(row0 + h * 8);
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (col0 + j * 8 + e >= limit) s[j][2 * h + e] = -INFINITY;
    }
  }
};

// Runs f(std::true_type{}) on a tile that needs the per-element test (`masked`, from
// fwd_tile_needs_mask / bwd_tile_needs_mask), f(std::false_type{}) on the others: f compiles both ways,
// the unmasked one without the test.
template <typename F>
__device__ __forceinline__ void by_tile_mask(bool masked, F&& f) {
  if (masked)
    f(std::true_type{});
  else
    f(std::false_type{});
}

}  // namespace fa::cuda::flash
