// TF32 tensor-core primitives of the float32 FA2 forward (sm_80+ mma.sync path): rounding fp32 to TF32,
// the 3xTF32 split, and mma.sync m16n8k8 with TF32 operands and fp32 accumulation, plain and as the
// product of the chosen Fp32Precision. The generic primitives (cp.async, ldmatrix, ex2) are in ptx.cuh.
//
// TF32 is fp32 with a 10-bit explicit mantissa (19 significant bits in a 32-bit register, the low 13
// zero). Fragment layouts of mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, from the PTX ISA
// ("Matrix Fragments for mma.m16n8k8", .tf32 figures), with g = lane / 4 and t = lane % 4:
//   A (16x8, row major), (row, k):   a0 = (g, t)    a1 = (g + 8, t)    a2 = (g, t + 4)    a3 = (g + 8, t + 4)
//   B (8x8, column major), (k, n):   b0 = (t, g)    b1 = (t + 4, g)
//   C/D (16x8 f32), (row, n):        c0 = (g, 2t)   c1 = (g, 2t + 1)   c2 = (g + 8, 2t)   c3 = (g + 8, 2t + 1)
// Unlike the 16-bit types, one register holds one element, and A's k index runs t, t + 4 (not 2t, 2t + 1).
//
// ldmatrix on fp32 data: ldmatrix .b16 moves 8x8 matrices of 16-bit elements, i.e. 8 rows of 4 floats;
// lane l receives the 32-bit word of row l / 4, float l % 4 of each matrix. With rows = the mma's rows
// (or, for B, its n index) and 4 consecutive k columns, that is exactly a0..a3 / b0, b1 above.
#pragma once
#include <cstdint>

#include "common/attention_params.h"

namespace fa::cuda::flash {

// fp32 -> TF32, rounding to nearest with ties away from zero (cvt.rna: the only TF32 rounding that
// sm_80 has). Finite values past the largest TF32 round to +-inf; +-inf and NaN keep their class.
__device__ __forceinline__ uint32_t tf32_round(float x) {
  uint32_t y;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float tf32_as_float(uint32_t x) { return __uint_as_float(x); }

// N fp32 values as TF32 mma operands for a precision mode: kTf32 uses `big` = tf32(x) only; kHighest
// (3xTF32) also keeps `small` = tf32(x - big), so that x = big + small + r with |r| <= 2^-22 |x|
// (each rounding is within half a TF32 ulp, 2^-11 relative).
template <int N>
struct Tf32Operand {
  uint32_t big[N];
  uint32_t small[N];
};

template <Fp32Precision kPrecision, int N>
__device__ __forceinline__ Tf32Operand<N> to_tf32(const float (&x)[N]) {
  Tf32Operand<N> r;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    r.big[i] = tf32_round(x[i]);
    if constexpr (kPrecision == Fp32Precision::kHighest) r.small[i] = tf32_round(x[i] - tf32_as_float(r.big[i]));
  }
  return r;
}

// D (16x8 f32) += A (16x8 tf32, row) * B (8x8 tf32, col); fragments as in the header comment.
__device__ __forceinline__ void mma_m16n8k8_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// D += A * B in the precision mode. kTf32: one mma on the rounded operands (relative error of each
// product <= ~2^-10, 2 roundings of 2^-11). kHighest (3xTF32): small*big + big*small, then big*big;
// the dropped small*small term and the split remainders leave a relative error <= ~3 * 2^-22 per
// product (an fp32 FMA has 2^-24), accumulated in fp32. Every TF32 x TF32 product is exact in fp32.
template <Fp32Precision kPrecision>
__device__ __forceinline__ void mma_fp32_operands(float (&d)[4], const Tf32Operand<4>& a, const Tf32Operand<2>& b) {
  if constexpr (kPrecision == Fp32Precision::kHighest) {
    mma_m16n8k8_tf32(d, a.small, b.big);
    mma_m16n8k8_tf32(d, a.big, b.small);
  }
  mma_m16n8k8_tf32(d, a.big, b.big);
}

// D += A * B as mma_fp32_operands, with 3xTF32's two small-term products accumulated apart, in
// d_small, which the caller adds to d once at the end. Each tensor-core accumulation rounds towards
// zero; sharing one accumulator puts three such roundings on the running sum per k8 step (a K =
// 129 linear went 1.0008x over ops-train.test's bound, twice a sequential fp32 product's error, on
// one seed: H100, 2026-11-26; apart, it passes). Apart, the running sum takes one rounding per
// step and the small terms' own roundings are 2^-11 smaller.
template <Fp32Precision kPrecision>
__device__ __forceinline__ void mma_fp32_operands_apart(float (&d)[4], float (&d_small)[4], const Tf32Operand<4>& a,
                                                        const Tf32Operand<2>& b) {
  if constexpr (kPrecision == Fp32Precision::kHighest) {
    mma_m16n8k8_tf32(d_small, a.small, b.big);
    mma_m16n8k8_tf32(d_small, a.big, b.small);
  }
  mma_m16n8k8_tf32(d, a.big, b.big);
}

}  // namespace fa::cuda::flash
