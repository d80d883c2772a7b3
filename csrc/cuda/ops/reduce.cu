// The reductions (csrc/common/op_params.h): the global L2 norm of a list of tensors (gradient
// clipping), the sum of one tensor, and column sums (a linear layer's bias gradient). All are
// deterministic: fixed partials in the workspace, then one fixed-order final pass; no float atomics.
//   norm_of / sum: a tensor of n elements gets min(ceil(n / kSpanBlockElems), kMaxBlocksPerSpan)
//     blocks; thread t of block j sums (the squares of) the 16-byte vectors (single elements when the
//     tensor is not 16-byte aligned) j * 256 + t, then every 256 * blocks further, and the block adds
//     its threads in a fixed order into partials[first_block + j]. Up to kSpansPerLaunch tensors go in one
//     launch (their descriptors are kernel parameters: no host-to-device copy), so a GPT's ~75
//     gradients take two launches, not 75. One block then adds all partials in order.
//   column_sum: column_partials.cuh (per-chunk partials, then a fixed-order sum per column).
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "cuda/cuda_utils.cuh"
#include "cuda/ops/column_partials.cuh"
#include "cuda/ops/op_utils.cuh"
#include "cuda/ops/ops_cuda.h"

namespace fa::cuda {
namespace {

constexpr int kSpanThreads = 256;
constexpr int64_t kSpanBlockElems = 16 * kSpanThreads;  // elements per block before a tensor gets another
constexpr int64_t kMaxBlocksPerSpan = 256;
constexpr int kSpansPerLaunch = 64;  // 64 x 32-byte descriptors: 2 KiB of the 4 KiB kernel parameters
constexpr int kFinishThreads = 1024;

struct SpanDesc {
  const void* data;
  int64_t numel;
  int64_t first_block;  // its first partial, counted from the batch's first
  int32_t blocks;
  DType dtype;
  int32_t vec;  // data is 16-byte aligned
};

struct SpanBatch {
  SpanDesc spans[kSpansPerLaunch];
  int32_t count;
};

int64_t span_blocks(int64_t numel) {
  const int64_t b = ceil_div<int64_t>(numel, kSpanBlockElems);
  return b < 1 ? 1 : (b > kMaxBlocksPerSpan ? kMaxBlocksPerSpan : b);
}

// This thread's share of span s (block j of s.blocks): sum of x or x^2, in float32.
template <typename T, int N, bool kSquare>
__device__ float span_thread_sum(const SpanDesc& s, int64_t j) {
  const T* x = static_cast<const T*>(s.data);
  const int64_t stride = static_cast<int64_t>(s.blocks) * kSpanThreads;
  const int64_t first = j * kSpanThreads + threadIdx.x;
  float acc = 0.0f;
  const int64_t vectors = s.numel / N;
  for (int64_t i = first; i < vectors; i += stride) {
    float v[N];
    ops::load_float<N>(x + i * N, v);
#pragma unroll
    for (int k = 0; k < N; ++k) acc += kSquare ? v[k] * v[k] : v[k];
  }
  if constexpr (N > 1) {
    for (int64_t i = vectors * N + first; i < s.numel; i += stride) {
      const float v = to_float(x[i]);
      acc += kSquare ? v * v : v;
    }
  }
  return acc;
}

template <typename T, bool kSquare>
__device__ float span_thread_sum_any(const SpanDesc& s, int64_t j) {
  return s.vec ? span_thread_sum<T, ops::kVecElems<T>, kSquare>(s, j) : span_thread_sum<T, 1, kSquare>(s, j);
}

// ptxas (nvcc 13.0, sm_80 / sm_90a): all kernels of this file 31-32 registers, 0 spills.
template <bool kSquare>
__global__ void __launch_bounds__(kSpanThreads) span_partials_kernel(const SpanBatch batch, int64_t batch_first,
                                                                     float* __restrict__ partials) {
  __shared__ float scratch[kSpanThreads / kWarpSize];
  const int64_t block = blockIdx.x;  // within the batch; its partial is batch_first + block
  int si = 0;
  while (si + 1 < batch.count && batch.spans[si + 1].first_block <= block) ++si;
  const SpanDesc& s = batch.spans[si];
  const int64_t j = block - s.first_block;
  float acc = 0.0f;
  switch (s.dtype) {
    case DType::kFloat16: acc = span_thread_sum_any<__half, kSquare>(s, j); break;
    case DType::kBFloat16: acc = span_thread_sum_any<__nv_bfloat16, kSquare>(s, j); break;
    default: acc = span_thread_sum_any<float, kSquare>(s, j); break;
  }
  acc = ops::block_sum<kSpanThreads>(acc, scratch);
  if (threadIdx.x == 0) partials[batch_first + block] = acc;
}

// out[0] = the sum of partials[0..count) in a fixed order, or its square root.
__global__ void __launch_bounds__(kFinishThreads)
    span_finish_kernel(const float* __restrict__ partials, int64_t count, bool root, float* __restrict__ out) {
  __shared__ float scratch[kFinishThreads / kWarpSize];
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < count; i += kFinishThreads) acc += partials[i];
  acc = ops::block_sum<kFinishThreads>(acc, scratch);
  if (threadIdx.x == 0) out[0] = root ? sqrtf(acc) : acc;
}

int64_t total_blocks(const std::vector<TensorSpan>& tensors) {
  int64_t n = 0;
  for (const TensorSpan& t : tensors) n += span_blocks(t.numel);
  return n;
}

// Partials of every tensor (squares when kSquare), batch by batch, then the final sum.
template <bool kSquare>
cudaError_t launch_span_sums(const std::vector<TensorSpan>& tensors, float* out, void* workspace, bool root,
                             cudaStream_t stream) {
  if (tensors.empty() || out == nullptr || workspace == nullptr) return cudaErrorInvalidValue;
  float* partials = static_cast<float*>(workspace);
  int64_t next_block = 0;
  for (size_t first = 0; first < tensors.size(); first += kSpansPerLaunch) {
    SpanBatch batch{};
    const int64_t batch_first = next_block;
    batch.count = 0;
    for (size_t i = first; i < tensors.size() && batch.count < kSpansPerLaunch; ++i) {
      const TensorSpan& t = tensors[i];
      if (t.dtype == DType::kInt32 || (t.numel > 0 && t.data == nullptr)) return cudaErrorInvalidValue;
      SpanDesc& d = batch.spans[batch.count++];
      d.data = t.data;
      d.numel = t.numel < 0 ? 0 : t.numel;
      d.first_block = next_block - batch_first;
      d.blocks = static_cast<int32_t>(span_blocks(d.numel));
      d.dtype = t.dtype;
      d.vec = ops::vec_aligned(t.data) ? 1 : 0;
      next_block += d.blocks;
    }
    span_partials_kernel<kSquare><<<static_cast<unsigned int>(next_block - batch_first), kSpanThreads, 0, stream>>>(
        batch, batch_first, partials);
    FA_CUDA_TRY(cudaGetLastError());
  }
  span_finish_kernel<<<1, kFinishThreads, 0, stream>>>(partials, next_block, root, out);
  return cudaGetLastError();
}

// Column-sum contribution of element (r, c): x[r, c].
template <typename T>
struct ColumnValue {
  static constexpr int kOuts = 1;
  const T* x;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t c, float (&v)[1]) const { v[0] = to_float(x[r * cols + c]); }
};

}  // namespace

size_t norm_of_workspace_bytes(const NormOfParams& p) {
  return static_cast<size_t>(total_blocks(p.tensors)) * sizeof(float);
}

cudaError_t norm_of(const NormOfParams& p, cudaStream_t stream) {
  return launch_span_sums<true>(p.tensors, p.out, p.workspace, true, stream);
}

size_t sum_workspace_bytes(const SumParams& p) { return static_cast<size_t>(span_blocks(p.numel)) * sizeof(float); }

cudaError_t sum(const SumParams& p, cudaStream_t stream) {
  const std::vector<TensorSpan> one{TensorSpan{p.x, p.numel, p.dtype}};
  return launch_span_sums<false>(one, p.out, p.workspace, false, stream);
}

size_t column_sum_workspace_bytes(const ColumnSumParams& p) {
  if (p.rows < 1 || p.cols < 1) return 0;
  return ops::column_partials_bytes(p.rows, p.cols, 1);
}

cudaError_t column_sum(const ColumnSumParams& p, cudaStream_t stream) {
  if (p.rows < 1 || p.cols < 1) return cudaSuccess;
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ColumnValue<T> f{static_cast<const T*>(p.x), p.cols};
    return ops::launch_column_sums(f, p.rows, p.cols, p.out, nullptr, p.accumulate, p.workspace, stream);
  });
}

}  // namespace fa::cuda
