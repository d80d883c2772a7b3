// The online softmax over one thread's piece of a score accumulator (masked before it by
// AttentionMask::mask_scores, mask.cuh), shared by the mma.sync (sm_80) and wgmma (sm_90a)
// FlashAttention kernels: both hold S in the m16n8 accumulator layout, s[j][e] = row (g + 8 (e / 2)),
// column (8 j + 2 t + e % 2) of the warp's 16-row slice, with g = lane / 4 and t = lane % 4. The 4
// threads of a group (same g) share a row.
//
// Numerics: the scaled score x = s * scale_log2 is rounded once, the running max is taken over x and
// P = 2^(x - max). So two keys with equal scores get bit-equal P, and an unchanged max rescales by
// exactly 2^0 = 1. (Folding the scale into one fma, fma(s, c, -max * c), saves a multiply but leaves
// max * c's rounding error in every P: at scores ~1e4 it split exact ties 0.4956 / 0.5044.)
#pragma once
#include <cmath>

#include "common/attention_params.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/flash/ptx.cuh"

namespace fa::cuda::flash {

// Running max (in scaled base-2 units) and partial row sums of the thread's two rows.
struct OnlineSoftmax {
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's columns only; reduced over the group in finish()

  // Turns the (masked) scores s into P = 2^(s * scale_log2 - max) in place, updating max and sums;
  // rescale[h] is the factor the caller applies to row h of its O accumulator.
  template <int kTiles>
  __device__ __forceinline__ void update(float (&s)[kTiles][4], float scale_log2, float (&rescale)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = row_max[h];
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          s[j][2 * h + e] *= scale_log2;
          mx = fmaxf(mx, s[j][2 * h + e]);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row with no visible key so far keeps max -inf: subtract 0 instead so 2^-inf = 0, never NaN.
      const float base = mx == -INFINITY ? 0.0f : mx;
      rescale[h] = exp2_approx(row_max[h] - base);
      row_max[h] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < kTiles; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float pe = exp2_approx(s[j][2 * h + e] - base);
          s[j][2 * h + e] = pe;
          sum += pe;
        }
      row_sum[h] = row_sum[h] * rescale[h] + sum;
    }
  }

  // Full row sums; inv_l[h] (the factor of row h of O) and lse[h] in natural log. A row ends by its
  // structure, not by l: one that sees no key (sees_key[h] false, AttentionMask::row_sees_key) gets
  // inv_l = 0 and lse = +inf (O = 0). One that sees keys gets 1 / l and max + log l, and when l is NaN (a NaN or
  // +inf score) or 0 (every score -inf: softmax's 0/0) that is NaN, as standard attention gives:
  // O = O * (1 / 0) = 0 * inf = NaN, and lse NaN. (Taking !(l > 0) for "no key" instead made such
  // rows look empty: O = 0, lse = +inf, and the backward then dropped their NaN.)
  __device__ __forceinline__ void finish(const bool (&sees_key)[2], float (&inv_l)[2], float (&lse)[2]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float l = row_sum[h];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      inv_l[h] = sees_key[h] ? 1.0f / l : 0.0f;
      lse[h] = !sees_key[h] ? INFINITY : l > 0.0f ? (row_max[h] + __log2f(l)) * kLn2 : NAN;
    }
  }
};

// dst = src, element by element (an accumulator copied to or from local memory around an out-of-line
// call, so that the original stays in registers).
template <int kTiles>
__device__ __forceinline__ void copy_fragments(float (&dst)[kTiles][4], const float (&src)[kTiles][4]) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) dst[j][e] = src[j][e];
}

// Multiplies rows h of an m16n8-layout accumulator by scale[h].
template <int kTiles>
__device__ __forceinline__ void scale_rows(float (&o)[kTiles][4], const float (&scale)[2]) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    o[j][0] *= scale[0];
    o[j][1] *= scale[0];
    o[j][2] *= scale[1];
    o[j][3] *= scale[1];
  }
}

// P (an m16n8-layout accumulator over 16 k columns: tiles 2 ks and 2 ks + 1) re-packed as the
// 16x16 A operand of an m16n8k16 mma / m64nNk16 wgmma k-step ks.
template <typename Elem, int kTiles>
__device__ __forceinline__ void p_to_a_operand(const float (&p)[kTiles][4], int ks, uint32_t (&a)[4]) {
  a[0] = pack2<Elem>(p[2 * ks][0], p[2 * ks][1]);
  a[1] = pack2<Elem>(p[2 * ks][2], p[2 * ks][3]);
  a[2] = pack2<Elem>(p[2 * ks + 1][0], p[2 * ks + 1][1]);
  a[3] = pack2<Elem>(p[2 * ks + 1][2], p[2 * ks + 1][3]);
}

// Element (j, e) of an accumulator that p_to_a_operand packed into a (k-step j / 2), as the tensor
// core reads it: rounded to Elem.
template <typename Elem, int kAFrags>
__device__ __forceinline__ float a_operand_elem(const uint32_t (&a)[kAFrags][4], int j, int e) {
  const uint32_t w = a[j / 2][(j % 2) * 2 + e / 2];
  return to_float(elem_from_bits<Elem>(static_cast<uint16_t>(e % 2 == 0 ? w & 0xffffu : w >> 16)));
}

// A per-query statistic (lse2, D) already subtracted inside the product's accumulator (the product
// accumulated onto -stat): the helpers below then subtract 0.
struct FoldedRowStat {};
__device__ __forceinline__ float row_stat(const float* rows, int q) { return rows[q]; }
__device__ __forceinline__ float row_stat(FoldedRowStat, int) { return 0.0f; }

// The backward's P^T and dS^T over a transposed accumulator fragment (the Hopper dK/dV kernels hold
// S^T = K Q^T and dP^T = V dO^T: rows are keys, columns queries): element (j, e) is key key0 + 8 (e / 2)
// and query q = q_base + 8 j + 2 t + e % 2 of the step (m0 + q absolute), whose lse2 / D rows are
// lse2[q] / dvec[q] (or FoldedRowStat{}: already in the accumulator). x = S^T scale_log2 is rounded
// before lse2 is subtracted (__fmul_rn: ptxas would contract a plain multiply and subtract into one fma
// and change P's bits). With kMasked, a pair the mask hides gets P^T = dS^T = 0 by a select, whatever
// S, lse, dP and D hold; without it the test is not compiled.
template <bool kMasked, int kTiles, typename Mask, typename LseRows>
__device__ __forceinline__ void bwd_p_transposed(float (&st)[kTiles][4], const Mask& mask, float scale_log2,
                                                 const LseRows& lse2, int m0, int q_base, int t, int key0) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pe = exp2_approx(__fmul_rn(st[j][e], scale_log2) - row_stat(lse2, q_base + 8 * j + 2 * t + e % 2));
      st[j][e] = (kMasked & mask.hidden(m0 + q_base + 8 * j + 2 * t + e % 2, key0 + 8 * (e / 2))) ? 0.0f : pe;
    }
}
// dS^T = P^T o (dP^T - D), in place over dP^T, from bwd_p_transposed's P^T (same element mapping); D
// from dvec[q], or with dvec = FoldedRowStat{} already subtracted.
template <bool kMasked, int kTiles, typename Mask, typename DRows>
__device__ __forceinline__ void bwd_ds_transposed(float (&dpt)[kTiles][4], const float (&pt)[kTiles][4],
                                                  const Mask& mask, const DRows& dvec, int m0, int q_base, int t,
                                                  int key0) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float ds = pt[j][e] * (dpt[j][e] - row_stat(dvec, q_base + 8 * j + 2 * t + e % 2));
      dpt[j][e] = (kMasked & mask.hidden(m0 + q_base + 8 * j + 2 * t + e % 2, key0 + 8 * (e / 2))) ? 0.0f : ds;
    }
}
// The same with P^T from its A operand (p_to_a_operand of bwd_p_transposed's P^T), rounded to Elem as
// the dV product read it, so that the fp32 P^T need not stay live until dP^T is ready.
template <bool kMasked, typename Elem, int kTiles, int kAFrags, typename Mask, typename DRows>
__device__ __forceinline__ void bwd_ds_transposed_packed_p(float (&dpt)[kTiles][4], const uint32_t (&pa)[kAFrags][4],
                                                           const Mask& mask, const DRows& dvec, int m0, int q_base,
                                                           int t, int key0) {
  static_assert(2 * kAFrags == kTiles, "an A fragment per two accumulator tiles");
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float ds = a_operand_elem<Elem>(pa, j, e) * (dpt[j][e] - row_stat(dvec, q_base + 8 * j + 2 * t + e % 2));
      dpt[j][e] = (kMasked & mask.hidden(m0 + q_base + 8 * j + 2 * t + e % 2, key0 + 8 * (e / 2))) ? 0.0f : ds;
    }
}

}  // namespace fa::cuda::flash
