// The GEMM under linear layers: C = alpha * A·B + beta * C, with an epilogue (bias, GELU), for the
// three products a linear layer needs (y = x·Wᵀ + b, dx = dy·W, dW += dyᵀ·x). One struct for every
// backend: the CPU GEMM (csrc/cpu/gemm) and the CUDA GEMMs (csrc/cuda/gemm: mma.sync on sm_80+,
// wgmma + TMA on sm_90a).
//
// Layouts, all strides in elements (the innermost stride is 1):
//   A is M×K. a_k_major: A(i, k) = a[i * lda + k] (row-major A, e.g. x for y = x·Wᵀ);
//                  else: A(i, k) = a[k * lda + i] (A stored transposed, e.g. dyᵀ for dW).
//   B is K×N. b_k_major: B(k, j) = b[j * ldb + k] (B stored transposed, e.g. Wᵀ for y = x·Wᵀ);
//                  else: B(k, j) = b[k * ldb + j] (row-major B, e.g. W for dx = dy·W).
//   C is M×N row-major: C(i, j) = c[i * ldc + j].
// The linear layer's products (x [rows, in], W [out, in], dy [rows, out]):
//   y  = x·Wᵀ : M = rows, N = out, K = in;   A = x  (k-major, lda = in),  B = W (k-major, ldb = in)
//   dx = dy·W : M = rows, N = in,  K = out;  A = dy (k-major, lda = out), B = W (n-major, ldb = in)
//   dW += dyᵀ·x: M = out, N = in,  K = rows; A = dy (m-major, lda = out), B = x (n-major, ldb = in),
//               C float32, beta = 1
//
// Precision: A and B share ab_dtype. float16 / bfloat16 run on tensor cores with float32
// accumulation. float32 runs in TF32 on CUDA tensor cores (fp32_precision kTf32: operands rounded to
// TF32, as PyTorch with allow_tf32) or 3xTF32 (kHighest, float32-level accuracy); the CPU computes
// float32 FMA for every dtype. The epilogue runs in float32 on the accumulator:
//   t = alpha * acc + (bias ? bias[j] : 0);   (bias: [N] of bias_dtype)
//   pre = t;  t = activation(t);  t += beta * C(i, j)   (beta != 0 reads C; beta == 0 never reads C,
//   so C may hold NaN garbage)
//   C(i, j) = c_dtype(t); pre_out(i, j) = c_dtype(pre) when pre_out is set (GELU's backward input)
// Sizes: M, N, K >= 1 (any values: tails are handled).
#pragma once
#include <cstdint>

#include "attention_params.h"  // Fp32Precision
#include "dtype.h"

namespace fa {

enum class GemmActivation : int32_t { kNone = 0, kGeluTanh = 1 };

struct GemmParams {
  int64_t m = 0, n = 0, k = 0;
  DType ab_dtype = DType::kFloat32;
  const void* a = nullptr;
  int64_t lda = 0;
  bool a_k_major = true;
  const void* b = nullptr;
  int64_t ldb = 0;
  bool b_k_major = true;

  void* c = nullptr;
  int64_t ldc = 0;
  DType c_dtype = DType::kFloat32;  // ab_dtype or float32
  float alpha = 1.0f;
  float beta = 0.0f;

  const void* bias = nullptr;        // [n] or null
  DType bias_dtype = DType::kFloat32;  // ab_dtype or float32
  GemmActivation activation = GemmActivation::kNone;
  void* pre_out = nullptr;           // [m, n] row-major with ldc, c_dtype; only with an activation; may be null

  Fp32Precision fp32_precision = Fp32Precision::kTf32;  // ab_dtype float32 on CUDA only
};

}  // namespace fa
