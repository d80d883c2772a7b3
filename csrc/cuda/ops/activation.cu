// GELU (tanh form), SwiGLU and the residual add (csrc/common/op_params.h): memory-bound elementwise
// kernels built on elementwise.cuh (GELU, add) and one row-aware kernel (SwiGLU, whose gate and value
// halves sit cols apart in each row).
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/ops/elementwise.cuh"
#include "cuda/ops/op_utils.cuh"
#include "cuda/ops/ops_cuda.h"

namespace fa::cuda {
namespace {

using ops::kFlatThreads;

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
struct GeluFwdOp {
  static constexpr int kInputs = 1;
  __device__ float operator()(float x, float) const {
    const float inner = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
  }
};

// dx = dout * gelu'(x), gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2)
struct GeluBwdOp {
  static constexpr int kInputs = 2;
  __device__ float operator()(float x, float dout) const {
    const float inner = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    const float t = tanhf(inner);
    const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    return dout * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dinner);
  }
};

// out = a + alpha * b
struct AddOp {
  static constexpr int kInputs = 2;
  float alpha;
  __device__ float operator()(float a, float b) const { return a + alpha * b; }
};

// __fdividef (2 ulp; 0 when the denominator passes 2^126, i.e. a < -87, where sigmoid < 1e-38): the
// IEEE division's slow-path call made ptxas spill 16-20 bytes in the scalar fp32 SwiGLU kernels
// (1.0f / x and __frcp_rn alike).
__device__ __forceinline__ float sigmoid(float a) { return __fdividef(1.0f, 1.0f + expf(-a)); }

// SwiGLU over x [rows, 2 cols] = [a | b]. Work item = N consecutive output columns of one row
// (N = kVecElems<T> when every pointer is 16-byte aligned and cols * sizeof(T) is a multiple of 16,
// else 1). Forward: out [rows, cols] = silu(a) * b. Backward: dx [rows, 2 cols] = [da | db].
// ptxas (nvcc 13.0, sm_80 / sm_90a): 16-36 registers, 0 spills.
template <typename T, int N, bool kBackward>
__global__ void __launch_bounds__(kFlatThreads)
    swiglu_kernel(int64_t rows, int64_t cols, const T* __restrict__ x, const T* __restrict__ dout, T* __restrict__ out) {
  const int64_t items_per_row = cols / N;
  const int64_t items = rows * items_per_row;
  for (int64_t item = ops::global_thread(); item < items; item += ops::grid_threads()) {
    const int64_t r = item / items_per_row;
    const int64_t c = (item - r * items_per_row) * N;
    const T* xa = x + r * 2 * cols + c;  // gate
    const T* xb = xa + cols;             // value
    float a[N], b[N];
    ops::load_float<N>(xa, a);
    ops::load_float<N>(xb, b);
    if constexpr (!kBackward) {
      float y[N];
#pragma unroll
      for (int i = 0; i < N; ++i) y[i] = a[i] * sigmoid(a[i]) * b[i];
      ops::store_float<N>(out + r * cols + c, y);
    } else {
      float g[N], da[N], db[N];
      ops::load_float<N>(dout + r * cols + c, g);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const float s = sigmoid(a[i]);
        da[i] = g[i] * b[i] * s * (1.0f + a[i] * (1.0f - s));
        db[i] = g[i] * (a[i] * s);
      }
      T* dx = out + r * 2 * cols + c;
      ops::store_float<N>(dx, da);
      ops::store_float<N>(dx + cols, db);
    }
  }
}

template <bool kBackward>
cudaError_t launch_swiglu(const SwigluParams& p, cudaStream_t stream) {
  if (p.rows < 1 || p.cols < 1) return cudaSuccess;
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kN = ops::kVecElems<T>;
    const T* x = static_cast<const T*>(p.x);
    const T* dout = static_cast<const T*>(p.dout);
    T* out = static_cast<T*>(p.out);
    const bool vec = ops::vec_aligned(p.x) && ops::vec_aligned(p.out) && (!kBackward || ops::vec_aligned(p.dout)) &&
                     ops::vec_rows<T>(p.cols);
    if (vec) {
      swiglu_kernel<T, kN, kBackward><<<grid_size(p.rows * (p.cols / kN), kFlatThreads), kFlatThreads, 0, stream>>>(
          p.rows, p.cols, x, dout, out);
    } else {
      swiglu_kernel<T, 1, kBackward><<<grid_size(p.rows * p.cols, kFlatThreads), kFlatThreads, 0, stream>>>(
          p.rows, p.cols, x, dout, out);
    }
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t gelu_fwd(const GeluParams& p, cudaStream_t stream) {
  return ops::launch_flat_map(p.dtype, p.numel, GeluFwdOp{}, p.x, nullptr, p.out, stream);
}

cudaError_t gelu_bwd(const GeluParams& p, cudaStream_t stream) {
  return ops::launch_flat_map(p.dtype, p.numel, GeluBwdOp{}, p.x, p.dout, p.out, stream);
}

cudaError_t swiglu_fwd(const SwigluParams& p, cudaStream_t stream) { return launch_swiglu<false>(p, stream); }

cudaError_t swiglu_bwd(const SwigluParams& p, cudaStream_t stream) { return launch_swiglu<true>(p, stream); }

cudaError_t add(const AddParams& p, cudaStream_t stream) {
  return ops::launch_flat_map(p.dtype, p.numel, AddOp{p.alpha}, p.a, p.b, p.out, stream);
}

}  // namespace fa::cuda
