// Which (query row i, key j) pairs the FlashAttention-2 backward kernels hide, shared by the mma.sync
// (flash_bwd_kernel.cuh, flash_bwd_fp32_kernel.cuh) and wgmma (hopper/flash_bwd_sm90_kernel.cuh,
// hopper/flash_bwd_dq_sm90_kernel.cuh) kernels:
//   hidden(i, j) = j >= seqlen_k || i >= seqlen_q || (causal && j > i + diag),  diag = seqlen_k - seqlen_q
// (bottom-right causal alignment; rows i >= seqlen_q are the padding rows of the last query tile).
//
// A hidden pair gets P = 0 and dS = 0 by a select, not by arithmetic, because with non-finite data the
// arithmetic does not give 0: a padding row holds zeros, so a key holding -inf scores 0 * (-inf) = NaN
// there; the forward gives lse = NaN to a row whose visible scores hold NaN or +inf or are all -inf,
// so 2^(-inf - lse2) = NaN at its hidden keys; and dP = dO V^T is a full product, so a NaN / Inf in V
// row j makes dP NaN at every query, and P (dP - D) = 0 * NaN at the queries that do not see key j.
// Each of these would reach dV = P^T dO, dK = dS^T Q or dQ = dS K. The kernels select either P and dS
// themselves to 0, or the argument of 2^x to -inf (2^-inf = +0 exactly) and dP - D to 0 (then dS =
// 0 * 0), whichever ptxas compiled with fewer registers; visible pairs keep the unmasked formulas bit
// for bit. Those products still multiply the zeros by their other operand, so a non-finite element of
// dO, Q or K at a hidden pair would give 0 * Inf = NaN inside the mma: bwd_nonfinite.cuh's rare path
// (bug B2) handles that.
#pragma once

namespace fa::cuda::flash {

// Whether the tile of kBlockM query rows from m0 and kBlockN keys from n0 holds a hidden pair: it
// reaches past seqlen_k or seqlen_q, or (causal) its last key lies past its first row's diagonal. The
// kernels run their per-element test (bwd_hidden, or the same rule as per-key / per-row bounds) on such
// tiles only.
template <int kBlockM, int kBlockN, bool kIsCausal>
__device__ __forceinline__ bool bwd_tile_needs_mask(int m0, int n0, int seqlen_q, int seqlen_k, int diag) {
  return n0 + kBlockN > seqlen_k || m0 + kBlockM > seqlen_q || (kIsCausal && n0 + kBlockN - 1 > m0 + diag);
}

// hidden(row, key) as above. Bitwise operators, not || and &&: short-circuit forms made LLVM branch
// per element, splitting the P / dS code into basic blocks.
template <bool kIsCausal>
__device__ __forceinline__ bool bwd_hidden(int row, int key, int seqlen_q, int seqlen_k, int diag) {
  return (key >= seqlen_k) | (row >= seqlen_q) | (kIsCausal & (key > row + diag));
}

}  // namespace fa::cuda::flash
