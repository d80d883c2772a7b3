// AdamW step in place over one flat tensor (csrc/common/op_params.h), float32 master weights for
// float16 / bfloat16 parameters. One memory-bound kernel: per element it reads grad, m, v and the
// master (or the float32 parameter) and writes m, v, the master and the parameter: 20 bytes read and
// 14-16 written per bf16 element. kAdamVec elements per thread and step when every pointer allows
// (16-byte float accesses, 8-byte bf16 ones), else one; the scalar tail of the vector kernel takes
// the last numel % kAdamVec elements.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/ops/op_utils.cuh"
#include "cuda/ops/ops_cuda.h"

namespace fa::cuda {
namespace {

constexpr int kAdamThreads = 256;
constexpr int kAdamVec = 4;
constexpr float kClipEps = 1e-6f;  // clip = min(1, max_norm / (norm + 1e-6)), as PyTorch's clip_grad_norm_

// One element: g is the scaled, clipped gradient; w the float32 weight; m, v the moments.
__device__ __forceinline__ void adamw_element(const AdamWParams& p, float g, float& w, float& m, float& v) {
  w -= p.lr * p.weight_decay * w;
  m = p.beta1 * m + (1.0f - p.beta1) * g;
  v = p.beta2 * v + (1.0f - p.beta2) * (g * g);
  w -= p.lr * (m / p.bias_correction1) / (sqrtf(v / p.bias_correction2) + p.eps);
}

template <typename T, int N>
__global__ void __launch_bounds__(kAdamThreads, 2) adamw_kernel(const AdamWParams p) {
  T* param = static_cast<T*>(p.param);
  // The weights live in the master copy, or in the parameter itself when it is float32 with none.
  float* master = p.master;
  float clip = 1.0f;
  if (p.clip_norm != nullptr) {
    // min(1, ratio) that keeps a NaN ratio (a NaN gradient norm) NaN, as PyTorch's clamp does; fminf
    // would return 1 and hide it.
    const float ratio = p.max_norm / (*p.clip_norm + kClipEps);
    clip = ratio > 1.0f ? 1.0f : ratio;
  }
  const float gmul = p.grad_scale;
  const int64_t vectors = p.numel / N;
  for (int64_t i = ops::global_thread(); i < vectors; i += ops::grid_threads()) {
    const int64_t e = i * N;
    float g[N], m[N], v[N], w[N];
    ops::load_float<N>(p.grad + e, g);
    ops::load_float<N>(p.m + e, m);
    ops::load_float<N>(p.v + e, v);
    if (master != nullptr) {
      ops::load_float<N>(master + e, w);
    } else {
      ops::load_float<N>(param + e, w);
    }
#pragma unroll
    for (int k = 0; k < N; ++k) adamw_element(p, g[k] * gmul * clip, w[k], m[k], v[k]);
    ops::store_float<N>(p.m + e, m);
    ops::store_float<N>(p.v + e, v);
    if (master != nullptr) ops::store_float<N>(master + e, w);
    ops::store_float<N>(param + e, w);
  }
  if constexpr (N > 1) {
    for (int64_t e = vectors * N + ops::global_thread(); e < p.numel; e += ops::grid_threads()) {
      float w = master != nullptr ? master[e] : to_float(param[e]);
      float m = p.m[e], v = p.v[e];
      adamw_element(p, p.grad[e] * gmul * clip, w, m, v);
      p.m[e] = m;
      p.v[e] = v;
      if (master != nullptr) master[e] = w;
      param[e] = from_float<T>(w);
    }
  }
}

bool aligned_to(const void* ptr, size_t bytes) {
  return ptr == nullptr || reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

}  // namespace

// ptxas (nvcc 13.0, sm_80 / sm_90a): 29-54 registers, 0 spills.
cudaError_t adamw(const AdamWParams& p, cudaStream_t stream) {
  if (p.numel < 1) return cudaSuccess;
  if (p.master == nullptr && p.dtype != DType::kFloat32) return cudaErrorInvalidValue;
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = aligned_to(p.param, kAdamVec * sizeof(T)) && ops::vec_aligned(p.master) &&
                     ops::vec_aligned(p.grad) && ops::vec_aligned(p.m) && ops::vec_aligned(p.v);
    if (vec) {
      adamw_kernel<T, kAdamVec><<<grid_size(ceil_div<int64_t>(p.numel, kAdamVec), kAdamThreads), kAdamThreads, 0,
                                  stream>>>(p);
    } else {
      adamw_kernel<T, 1><<<grid_size(p.numel, kAdamThreads), kAdamThreads, 0, stream>>>(p);
    }
    return cudaGetLastError();
  });
}

}  // namespace fa::cuda
