// Deterministic column sums over rows, in two kernels and no float atomics: the building block of
// the parameter gradients (LayerNorm / RMSNorm dweight, dbias) and of columnSum (a linear layer's
// dbias).
//   1. column_partials_kernel: the rows are cut into `chunks` fixed chunks (a function of rows only);
//      block (column tile, chunk) sums its chunk's rows for 32 columns and writes one float32 partial
//      per column and output: partials[k][chunk][c] (the workspace).
//   2. column_finish_kernel: out_k[c] (+)= the sum of partials[k][0..chunks)[c], in a fixed order.
// Both blocks are kRowLanes warps x 32 columns: warp w takes rows (or chunks) w, w + kRowLanes, ...,
// lane l column 32 tile + l (a warp reads 32 consecutive elements of a row), and the kRowLanes sums
// are added in warp order through shared memory. Same inputs, same bits, on every run.
// Precision: each lane sums a few rows in float32 (rows_per_chunk / kRowLanes, 8 for the GPT); the
// warps' sums, the chunks' partials and the old value of out are added in double and rounded once, so
// the error is that of the short float32 runs. With float32 adds throughout (1025 rows, 1 column) the
// result was 13 ulps off, above 3x a sequential float32 sum's error on some seeds of ops_check.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/ops/op_utils.cuh"

namespace fa::cuda::ops {

inline constexpr int kColTile = kWarpSize;  // columns per block
inline constexpr int kRowLanes = 8;         // warps per block, each on its own rows
inline constexpr int kColumnThreads = kColTile * kRowLanes;
inline constexpr int64_t kMinChunkRows = 64;  // rows per chunk at least (8 per warp)
inline constexpr int64_t kMaxChunks = 256;    // partials per column at most (gridDim.y <= 65535)

struct ColumnChunks {
  int64_t rows_per_chunk;
  int64_t chunks;
};

// The fixed split of `rows` (>= 1) into chunks: 16384 rows -> 256 chunks of 64 rows.
inline ColumnChunks column_chunks(int64_t rows) {
  int64_t per = ceil_div<int64_t>(rows, kMaxChunks);
  if (per < kMinChunkRows) per = kMinChunkRows;
  return {per, ceil_div<int64_t>(rows, per)};
}

// Workspace of kOuts sums over cols columns: kOuts x chunks x cols floats.
inline size_t column_partials_bytes(int64_t rows, int64_t cols, int outs) {
  return static_cast<size_t>(outs) * static_cast<size_t>(column_chunks(rows).chunks) * static_cast<size_t>(cols) *
         sizeof(float);
}

// Contrib: `static constexpr int kOuts` and `__device__ void operator()(int64_t r, int64_t c,
// float (&v)[kOuts]) const`, the contributions of element (r, c) to each output.
template <typename Contrib>
__global__ void __launch_bounds__(kColumnThreads)
    column_partials_kernel(Contrib f, int64_t rows, int64_t cols, ColumnChunks split, float* __restrict__ partials) {
  constexpr int kOuts = Contrib::kOuts;
  __shared__ float sums[kOuts][kRowLanes][kColTile];
  const int lane = static_cast<int>(threadIdx.x) % kColTile;
  const int rl = static_cast<int>(threadIdx.x) / kColTile;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + lane;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * split.rows_per_chunk;
  const int64_t r1 = r0 + split.rows_per_chunk < rows ? r0 + split.rows_per_chunk : rows;
  float acc[kOuts];
#pragma unroll
  for (int k = 0; k < kOuts; ++k) acc[k] = 0.0f;
  if (c < cols) {
    for (int64_t r = r0 + rl; r < r1; r += kRowLanes) {
      float v[kOuts];
      f(r, c, v);
#pragma unroll
      for (int k = 0; k < kOuts; ++k) acc[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < kOuts; ++k) sums[k][rl][lane] = acc[k];
  __syncthreads();
  if (rl < kOuts && c < cols) {  // warp k writes output k
    double s = 0.0;
#pragma unroll
    for (int w = 0; w < kRowLanes; ++w) s += sums[rl][w][lane];
    partials[(static_cast<int64_t>(rl) * split.chunks + chunk) * cols + c] = static_cast<float>(s);
  }
}

// out_k[c] = (accumulate ? out_k[c] : 0) + sum over chunks of partials[k][chunk][c]; a null out_k is
// skipped. Block = one column tile; warp w sums chunks w, w + kRowLanes, ...
template <int kOuts>
__global__ void __launch_bounds__(kColumnThreads)
    column_finish_kernel(const float* __restrict__ partials, int64_t chunks, int64_t cols, float* out0, float* out1,
                         bool accumulate) {
  __shared__ double sums[kOuts][kRowLanes][kColTile];
  const int lane = static_cast<int>(threadIdx.x) % kColTile;
  const int rl = static_cast<int>(threadIdx.x) / kColTile;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColTile + lane;
#pragma unroll
  for (int k = 0; k < kOuts; ++k) {
    double acc = 0.0;
    if (c < cols) {
      for (int64_t ch = rl; ch < chunks; ch += kRowLanes) acc += partials[(k * chunks + ch) * cols + c];
    }
    sums[k][rl][lane] = acc;
  }
  __syncthreads();
  if (rl < kOuts && c < cols) {
    float* out = rl == 0 ? out0 : out1;
    if (out != nullptr) {
      double s = accumulate ? static_cast<double>(out[c]) : 0.0;
#pragma unroll
      for (int w = 0; w < kRowLanes; ++w) s += sums[rl][w][lane];
      out[c] = static_cast<float>(s);
    }
  }
}

// Queues both kernels. workspace: column_partials_bytes(rows, cols, Contrib::kOuts) bytes.
template <typename Contrib>
cudaError_t launch_column_sums(const Contrib& f, int64_t rows, int64_t cols, float* out0, float* out1,
                               bool accumulate, void* workspace, cudaStream_t stream) {
  static_assert(Contrib::kOuts >= 1 && Contrib::kOuts <= 2, "one or two outputs");
  if (rows < 1 || cols < 1) return cudaSuccess;
  if (workspace == nullptr) return cudaErrorInvalidValue;
  const ColumnChunks split = column_chunks(rows);
  float* partials = static_cast<float*>(workspace);
  const dim3 grid(grid_size(cols, kColTile), static_cast<unsigned int>(split.chunks));
  column_partials_kernel<Contrib><<<grid, kColumnThreads, 0, stream>>>(f, rows, cols, split, partials);
  FA_CUDA_TRY(cudaGetLastError());
  column_finish_kernel<Contrib::kOuts><<<grid_size(cols, kColTile), kColumnThreads, 0, stream>>>(
      partials, split.chunks, cols, out0, out1, accumulate);
  return cudaGetLastError();
}

}  // namespace fa::cuda::ops
