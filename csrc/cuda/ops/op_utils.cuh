// Device building blocks of the training ops (csrc/cuda/ops/*.cu): 16-byte vector loads and stores
// with the alignment check their launchers make once, grid-stride indexing in 64 bits, and the two
// row-group policies (one row per warp, one row per block) with their deterministic reductions.
// The dtype switch and the fp32 <-> storage conversions are cuda/cuda_utils.cuh's.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"

namespace fa::cuda::ops {

// ---- vector access ----------------------------------------------------------------------------------
// The widest global access: 16 bytes = 4 float or 8 half / bfloat16 elements.
inline constexpr int kVecBytes = 16;
template <typename T>
inline constexpr int kVecElems = kVecBytes / static_cast<int>(sizeof(T));

// Host side, once per launch: may a kernel read / write p with kVecBytes accesses? (A view's offset
// may leave a pointer aligned to its element size only; null pointers are unused and pass.)
inline bool vec_aligned(const void* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(kVecBytes) == 0;
}
// ... and does every row of `cols` elements of T start on a kVecBytes boundary when the first does?
template <typename T>
inline bool vec_rows(int64_t cols) {
  return (cols * static_cast<int64_t>(sizeof(T))) % kVecBytes == 0;
}

// N elements of T in one aligned access (N * sizeof(T) is 2, 4, 8 or 16 bytes).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// N elements at p (aligned to N * sizeof(T)) as fp32.
template <int N, typename T>
__device__ __forceinline__ void load_float(const T* p, float (&x)[N]) {
  const Pack<T, N> pk = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = to_float(pk.v[i]);
}

// N fp32 values rounded to T (nearest even) at p (aligned to N * sizeof(T)).
template <int N, typename T>
__device__ __forceinline__ void store_float(T* p, const float (&x)[N]) {
  Pack<T, N> pk;
#pragma unroll
  for (int i = 0; i < N; ++i) pk.v[i] = from_float<T>(x[i]);
  *reinterpret_cast<Pack<T, N>*>(p) = pk;
}

// ---- indexing -----------------------------------------------------------------------------------------
__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_threads() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

// ---- row groups ---------------------------------------------------------------------------------------
// A kernel that reduces along rows is written once over a RowGroup: the threads that share a row
// (rank in [0, kThreads)), the rows they walk (first_row, then row_stride apart: a grid-stride loop, so
// any number of rows fits the grid), and their reductions. Every thread of a group gets the reduced
// value, bit-identical across the group and across runs (fixed order: a butterfly within warps, then
// the warps in index order). The loop over rows is uniform across the group (warp shuffles and block
// barriers inside are safe). `scratch` is shared memory of kScratchValues values of the type summed
// (float or double; unused by warps).

// One row per warp: short rows (a whole row is a few 16-byte accesses per lane).
template <int kBlockThreads_>
struct WarpPerRow {
  static constexpr int kBlockThreads = kBlockThreads_;
  static constexpr int kThreads = kWarpSize;
  static constexpr int kScratchValues = 1;
  static_assert(kBlockThreads % kWarpSize == 0, "whole warps");
  __device__ static int rank() { return static_cast<int>(threadIdx.x) % kWarpSize; }
  __device__ static int64_t first_row() { return global_thread() / kWarpSize; }
  __device__ static int64_t row_stride() { return grid_threads() / kWarpSize; }
  template <typename V, int N>
  __device__ static void sum(V (&v)[N], V* /*scratch*/) {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = warp_sum(v[i]);
  }
  __device__ static float max(float v, float* /*scratch*/) { return warp_max(v); }
  static unsigned int grid(int64_t rows) { return grid_size(rows, kBlockThreads / kWarpSize); }
};

// One row per block: long rows (a vocabulary of 50k logits, a norm over thousands of columns).
template <int kBlockThreads_>
struct BlockPerRow {
  static constexpr int kBlockThreads = kBlockThreads_;
  static constexpr int kThreads = kBlockThreads_;
  static constexpr int kWarps = kBlockThreads_ / kWarpSize;
  static constexpr int kMaxSums = 2;  // values reduced together by one sum()
  static constexpr int kScratchValues = kWarps * kMaxSums;
  static_assert(kBlockThreads % kWarpSize == 0, "whole warps");
  __device__ static int rank() { return static_cast<int>(threadIdx.x); }
  __device__ static int64_t first_row() { return blockIdx.x; }
  __device__ static int64_t row_stride() { return gridDim.x; }
  template <typename V, int N>
  __device__ static void sum(V (&v)[N], V* scratch) {
    static_assert(N <= kMaxSums, "scratch holds kMaxSums values per warp");
    const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      v[i] = warp_sum(v[i]);
      if (threadIdx.x % kWarpSize == 0) scratch[warp * N + i] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N; ++i) {
      V acc = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) acc += scratch[w * N + i];
      v[i] = acc;
    }
    __syncthreads();  // scratch is free again
  }
  __device__ static float max(float v, float* scratch) {
    const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
    v = warp_max(v);
    if (threadIdx.x % kWarpSize == 0) scratch[warp] = v;
    __syncthreads();
    float m = scratch[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) m = fmaxf(m, scratch[w]);
    __syncthreads();
    return m;
  }
  static unsigned int grid(int64_t rows) { return grid_size(rows, 1); }
};

// Thread blocks of the row-wise kernels (norms, cross-entropy), and the resident blocks per SM their
// __launch_bounds__ ask for: 2 x 256 threads leaves ptxas 128 registers. Without it ptxas squeezed the
// fp32 LayerNorm backward (block per row, 4-wide) to 32 registers for full occupancy and spilled 8
// bytes on sm_90a; with 4 blocks (64 registers) the fp32 warp-per-row backward spilled 4-8 bytes.
// With 2: 32-96 registers, 0 spills (nvcc 13.0, sm_80 and sm_90a).
inline constexpr int kRowBlockThreads = 256;
inline constexpr int kRowMinBlocks = 2;

// Sums of kBlockThreads values, one per thread, in a fixed order (block-wide, all threads call it;
// every thread gets the result). scratch: kBlockThreads / 32 floats of shared memory.
template <int kBlockThreads>
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  float one[1] = {v};
  BlockPerRow<kBlockThreads>::sum(one, scratch);
  return one[0];
}

}  // namespace fa::cuda::ops
