// Fused softmax cross-entropy with an ignore index, and its gradient (csrc/common/op_params.h).
// Up to three kernels on the stream, none waiting on the host:
//   1. ce_count_kernel (kMean only): the count of rows whose target is not ignore_index, and
//      1 / count, into the workspace: the gradient's weight is known on the device before step 2.
//   2. ce_rows_kernel: per row, one pass over the logits with an online max / sum (each thread keeps
//      its running max m and sum of exp(x - m); the row group then takes the max of the m and adds
//      the rescaled sums), lse = max + log(sum), the row's loss; with dlogits a second pass (the row
//      is in L1 / L2) writes grad_scale * w * (softmax - onehot). A warp per row up to
//      kWarpVocabMax logits (vocab 65: 8 rows per block), a block per row beyond (vocab 50257).
//   3. ce_reduce_kernel (kSum / kMean): one block adds the per-row losses in a fixed order.
// Deterministic: no atomics on floats anywhere.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/ops/op_utils.cuh"
#include "cuda/ops/ops_cuda.h"

namespace fa::cuda {
namespace {

using ops::kRowBlockThreads;

constexpr int64_t kWarpVocabMax = 1024;
constexpr int kReduceThreads = 1024;  // the one block of steps 1 and 3

// Workspace: [0, 8) the count (int64), [8, 12) 1 / count (float), then the per-row losses from byte
// kRowLossOffset (kSum / kMean).
constexpr size_t kCountOffset = 0;
constexpr size_t kInvCountOffset = 8;
constexpr size_t kRowLossOffset = 16;

struct CeWorkspace {
  long long* count;
  float* inv_count;
  float* row_loss;
};

CeWorkspace workspace_of(void* ws) {
  char* base = static_cast<char*>(ws);
  return {reinterpret_cast<long long*>(base + kCountOffset), reinterpret_cast<float*>(base + kInvCountOffset),
          reinterpret_cast<float*>(base + kRowLossOffset)};
}

__global__ void __launch_bounds__(kReduceThreads)
    ce_count_kernel(const int32_t* __restrict__ targets, int64_t rows, int32_t ignore_index, CeWorkspace ws) {
  __shared__ long long warp_counts[kReduceThreads / kWarpSize];
  long long n = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kReduceThreads) n += targets[r] != ignore_index;
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) n += __shfl_xor_sync(0xffffffffu, n, offset);
  if (threadIdx.x % kWarpSize == 0) warp_counts[threadIdx.x / kWarpSize] = n;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long total = 0;
    for (int w = 0; w < kReduceThreads / kWarpSize; ++w) total += warp_counts[w];
    *ws.count = total;
    *ws.inv_count = 1.0f / static_cast<float>(total);  // inf when nothing is counted (then no row has a gradient)
  }
}

template <typename T_, typename Rows_, int N_>
struct CeTraits {
  using T = T_;
  using Rows = Rows_;
  static constexpr int N = N_;
  static constexpr int kStep = Rows::kThreads * N;
};

// Online softmax state of one thread: running max m and sum of exp(x - m).
__device__ __forceinline__ void online_add(float x, float& m, float& s) {
  if (x > m) {
    s = s * expf(m - x) + 1.0f;
    m = x;
  } else if (x != -INFINITY) {  // a -inf logit adds nothing (and -inf - -inf would be NaN)
    s += expf(x - m);
  }
}

template <typename Tr>
__global__ void __launch_bounds__(kRowBlockThreads, ops::kRowMinBlocks)
    ce_rows_kernel(const CrossEntropyParams p, CeWorkspace ws) {
  using T = typename Tr::T;
  using Rows = typename Tr::Rows;
  constexpr int N = Tr::N;
  __shared__ float scratch[Rows::kScratchValues];
  const T* logits = static_cast<const T*>(p.logits);
  T* dlogits = static_cast<T*>(p.dlogits);
  for (int64_t row = Rows::first_row(); row < p.rows; row += Rows::row_stride()) {
    const T* lr = logits + row * p.vocab;
    float m = -INFINITY, s = 0.0f;
    for (int64_t c = static_cast<int64_t>(Rows::rank()) * N; c < p.vocab; c += Tr::kStep) {
      float v[N];
      ops::load_float<N>(lr + c, v);
#pragma unroll
      for (int i = 0; i < N; ++i) online_add(v[i], m, s);
    }
    const float row_max = Rows::max(m, scratch);
    float sum[1] = {m == row_max ? s : s * expf(m - row_max)};
    Rows::sum(sum, scratch);
    const float lse = row_max + logf(sum[0]);
    const int32_t t = p.targets[row];
    const bool ignored = t == p.ignore_index;
    const bool valid = t >= 0 && static_cast<int64_t>(t) < p.vocab;
    const float loss = ignored ? 0.0f : (valid ? lse - to_float(lr[t]) : NAN);
    if (Rows::rank() == 0) {
      if (p.reduction == Reduction::kNone) {
        p.loss[row] = loss;
      } else {
        ws.row_loss[row] = loss;
      }
    }
    if (dlogits == nullptr) continue;
    const float w = p.reduction == Reduction::kMean ? *ws.inv_count : 1.0f;
    const float scale = p.grad_scale * w;
    T* dr = dlogits + row * p.vocab;
    for (int64_t c = static_cast<int64_t>(Rows::rank()) * N; c < p.vocab; c += Tr::kStep) {
      float v[N], d[N];
      if (ignored) {
#pragma unroll
        for (int i = 0; i < N; ++i) d[i] = 0.0f;
      } else if (!valid) {
#pragma unroll
        for (int i = 0; i < N; ++i) d[i] = NAN;
      } else {
        ops::load_float<N>(lr + c, v);
#pragma unroll
        for (int i = 0; i < N; ++i) d[i] = scale * (expf(v[i] - lse) - (c + i == t ? 1.0f : 0.0f));
      }
      ops::store_float<N>(dr + c, d);
    }
  }
}

// loss[0] = sum of row_loss in a fixed order (kSum), divided by the count (kMean; 0 / 0 = NaN when
// nothing is counted, as PyTorch).
__global__ void __launch_bounds__(kReduceThreads)
    ce_reduce_kernel(int64_t rows, bool mean, CeWorkspace ws, float* __restrict__ loss) {
  __shared__ float scratch[kReduceThreads / kWarpSize];
  float acc = 0.0f;
  for (int64_t r = threadIdx.x; r < rows; r += kReduceThreads) acc += ws.row_loss[r];
  acc = ops::block_sum<kReduceThreads>(acc, scratch);
  if (threadIdx.x == 0) loss[0] = mean ? acc / static_cast<float>(*ws.count) : acc;
}

template <typename T, typename Rows>
void launch_rows(const CrossEntropyParams& p, const CeWorkspace& ws, bool vec, cudaStream_t stream) {
  constexpr int kN = ops::kVecElems<T>;
  if (vec) {
    ce_rows_kernel<CeTraits<T, Rows, kN>><<<Rows::grid(p.rows), kRowBlockThreads, 0, stream>>>(p, ws);
  } else {
    ce_rows_kernel<CeTraits<T, Rows, 1>><<<Rows::grid(p.rows), kRowBlockThreads, 0, stream>>>(p, ws);
  }
}

}  // namespace

size_t cross_entropy_workspace_bytes(const CrossEntropyParams& p) {
  if (p.rows < 1 || p.reduction == Reduction::kNone) return 0;
  return kRowLossOffset + static_cast<size_t>(p.rows) * sizeof(float);
}

// ptxas (nvcc 13.0, sm_80 / sm_90a): rows kernel 30-48 registers, count and reduce 30-31, 0 spills.
cudaError_t cross_entropy(const CrossEntropyParams& p, cudaStream_t stream) {
  if (p.rows < 1 || p.vocab < 1) return cudaSuccess;
  const bool reduced = p.reduction != Reduction::kNone;
  if (reduced && p.workspace == nullptr) return cudaErrorInvalidValue;
  const CeWorkspace ws = reduced ? workspace_of(p.workspace) : CeWorkspace{nullptr, nullptr, nullptr};
  if (p.reduction == Reduction::kMean) {
    ce_count_kernel<<<1, kReduceThreads, 0, stream>>>(p.targets, p.rows, p.ignore_index, ws);
    FA_CUDA_TRY(cudaGetLastError());
  }
  const cudaError_t rows_status = dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = ops::vec_aligned(p.logits) && ops::vec_aligned(p.dlogits) && ops::vec_rows<T>(p.vocab);
    if (p.vocab <= kWarpVocabMax) {
      launch_rows<T, ops::WarpPerRow<kRowBlockThreads>>(p, ws, vec, stream);
    } else {
      launch_rows<T, ops::BlockPerRow<kRowBlockThreads>>(p, ws, vec, stream);
    }
    return cudaGetLastError();
  });
  FA_CUDA_TRY(rows_status);
  if (!reduced) return cudaSuccess;
  ce_reduce_kernel<<<1, kReduceThreads, 0, stream>>>(p.rows, p.reduction == Reduction::kMean, ws, p.loss);
  return cudaGetLastError();
}

}  // namespace fa::cuda
