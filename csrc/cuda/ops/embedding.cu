// Embedding gather and its deterministic scatter-add backward (csrc/common/op_params.h).
//
// Forward: one thread per (row, N columns); an id outside [0, vocab) writes a row of NaN.
//
// Backward, deterministic without a workspace or float atomics: every element dtable[v, c] is owned by
// exactly one thread, which adds the dout rows with id v in increasing row order. A block owns a range
// of vocabulary rows and a tile of columns; it walks all ids in chunks of kIdChunk, compacts the
// rows whose id falls in its range into an ordered list in shared memory (warp ballots + a block
// prefix in warp order), and adds those rows. Two policies, by vocabulary size:
//   - RowGroups (vocab <= kRowGroupVocabMax, e.g. characters, vocab 65): one vocabulary row per block;
//     its kEmbWarps warps take list entries w, w + kEmbWarps, ... into register sums (independent
//     loads in flight, where one chain of ~250 rows would wait on each), which are added in warp
//     order at the end: one read-modify-write of dtable per element. Each block reads all ids
//     (vocab x column tiles x rows x 4 bytes from L2: 65 x 2 x 64 KiB = 8 MiB at 16384 rows).
//   - VocabRanges (larger vocabularies, e.g. GPT-2's 50257): a block owns vocab_per_block rows (up to
//     kMaxVocabPerBlock = 64: 786 blocks at 50257, each scanning the ids once: 50 MiB from L2 at 16384
//     rows, not 3.3 GB as one block per vocabulary row would). Matches are few per block (~21 at 16384
//     rows); each thread keeps a register sum while consecutive matches share an id and adds it to
//     dtable when the id changes.
// A sort of the ids (one pass per 8 bits of the vocabulary) would read the ids less often but needs a
// workspace that EmbeddingParams does not carry.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/ops/op_utils.cuh"
#include "cuda/ops/ops_cuda.h"

namespace fa::cuda {
namespace {

constexpr int kEmbThreads = 256;
constexpr int kEmbWarps = kEmbThreads / kWarpSize;
// Backward: ids read per block and step (kIdsPerThread per thread). 1024 rows per step: 16 steps (and
// 32 barriers) per block for 16384 rows, where one id per thread took 64 steps, each waiting on its id
// load and then on its dout loads.
constexpr int kIdsPerThread = 4;
constexpr int kIdChunk = kIdsPerThread * kEmbThreads;
// Resident blocks the backward's __launch_bounds__ ask for (128 registers at most): left to its
// occupancy heuristic, ptxas held the scalar ranges kernel to 32 registers and spilled 4 bytes (sm_90a).
constexpr int kEmbMinBlocks = 2;
constexpr int64_t kRowGroupVocabMax = 512;
constexpr int64_t kMaxVocabPerBlock = 64;
constexpr int64_t kTargetRangeBlocks = 512;  // VocabRanges: aim for this many vocabulary ranges

// ---- forward ----------------------------------------------------------------------------------------
// ptxas (nvcc 13.0, sm_80 / sm_90a): 16-32 registers, 0 spills.
template <typename T, int N>
__global__ void __launch_bounds__(kEmbThreads) embedding_fwd_kernel(const EmbeddingParams p) {
  const T* table = static_cast<const T*>(p.table);
  T* out = static_cast<T*>(p.out);
  const int64_t per_row = p.dim / N;
  const int64_t items = p.rows * per_row;
  for (int64_t item = ops::global_thread(); item < items; item += ops::grid_threads()) {
    const int64_t r = item / per_row;
    const int64_t c = (item - r * per_row) * N;
    const int32_t id = p.ids[r];
    float v[N];
    if (id >= 0 && id < p.vocab) {
      ops::load_float<N>(table + static_cast<int64_t>(id) * p.dim + c, v);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = NAN;
    }
    ops::store_float<N>(out + r * p.dim + c, v);
  }
}

// ---- backward building block: the ordered list of matching rows -----------------------------------
// Rows [base, base + kIdChunk) whose id is in [v0, v1), in increasing order, into list[0..count);
// returns count (the same in every thread). All threads of the block call it. Thread t reads the ids
// of rows base + k kEmbThreads + t (k < kIdsPerThread: independent loads in flight); the list is
// ordered by k, then warp, then lane, which is row order.
__device__ __forceinline__ int compact_matches(const int32_t* ids, int64_t rows, int64_t base, int64_t v0,
                                               int64_t v1, int32_t* list_rows, int32_t* list_ids,
                                               int (*warp_counts)[kEmbWarps]) {
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  int32_t id[kIdsPerThread];
  bool hit[kIdsPerThread];
  unsigned int mask[kIdsPerThread];
#pragma unroll
  for (int k = 0; k < kIdsPerThread; ++k) {
    const int64_t r = base + k * kEmbThreads + threadIdx.x;
    id[k] = r < rows ? ids[r] : -1;
  }
#pragma unroll
  for (int k = 0; k < kIdsPerThread; ++k) {
    hit[k] = id[k] >= v0 && id[k] < v1;  // -1 (past the rows) never hits: v0 >= 0
    mask[k] = __ballot_sync(0xffffffffu, hit[k]);
    if (lane == 0) warp_counts[k][warp] = __popc(mask[k]);
  }
  __syncthreads();
  int count = 0;
#pragma unroll
  for (int k = 0; k < kIdsPerThread; ++k) {
    int before = count;
#pragma unroll
    for (int w = 0; w < kEmbWarps; ++w) {
      before += w < warp ? warp_counts[k][w] : 0;
      count += warp_counts[k][w];
    }
    if (hit[k]) {
      const int at = before + __popc(mask[k] & ((1u << lane) - 1u));
      list_rows[at] = k * kEmbThreads + static_cast<int>(threadIdx.x);  // offset from base
      list_ids[at] = id[k];
    }
  }
  __syncthreads();
  return count;
}

// RowGroups: block (vocabulary row v, column tile); lane l of every warp owns columns
// tile * kWarpSize * N + l * N + [0, N). ptxas (nvcc 13.0, sm_80 / sm_90a): see embedding_bwd.
template <typename T, int N>
__global__ void __launch_bounds__(kEmbThreads, kEmbMinBlocks) embedding_bwd_rowgroups_kernel(const EmbeddingParams p) {
  __shared__ int32_t list_rows[kIdChunk], list_ids[kIdChunk];
  __shared__ int warp_counts[kIdsPerThread][kEmbWarps];
  __shared__ float sums[kEmbWarps][kWarpSize * N];
  const T* dout = static_cast<const T*>(p.dout);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  constexpr int64_t kTile = kWarpSize * N;
  const int64_t tiles = ceil_div<int64_t>(p.dim, kTile);
  for (int64_t tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
    const int64_t c = tile * kTile + lane * N;
    const bool active = c < p.dim;
    for (int64_t v = blockIdx.x; v < p.vocab; v += gridDim.x) {
      float acc[N];
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] = 0.0f;
      for (int64_t base = 0; base < p.rows; base += kIdChunk) {
        const int count = compact_matches(p.ids, p.rows, base, v, v + 1, list_rows, list_ids, warp_counts);
        if (active) {
          for (int m = warp; m < count; m += kEmbWarps) {
            float g[N];
            ops::load_float<N>(dout + (base + list_rows[m]) * p.dim + c, g);
#pragma unroll
            for (int i = 0; i < N; ++i) acc[i] += g[i];
          }
        }
      }
#pragma unroll
      for (int i = 0; i < N; ++i) sums[warp][lane * N + i] = acc[i];
      __syncthreads();
      // Thread t adds column t of the tile: the kEmbWarps sums in warp order, then dtable.
      for (int t = static_cast<int>(threadIdx.x); t < kTile; t += kEmbThreads) {
        const int64_t col = tile * kTile + t;
        if (col < p.dim) {
          float s = 0.0f;
#pragma unroll
          for (int w = 0; w < kEmbWarps; ++w) s += sums[w][t];
          p.dtable[v * p.dim + col] += s;
        }
      }
      __syncthreads();
    }
  }
}

// VocabRanges: block (vocabulary rows [v0, v0 + vocab_per_block), column tile); thread t owns columns
// tile * kEmbThreads * N + t * N + [0, N).
template <typename T, int N>
__global__ void __launch_bounds__(kEmbThreads, kEmbMinBlocks)
    embedding_bwd_ranges_kernel(const EmbeddingParams p, int64_t vocab_per_block, int64_t ranges) {
  __shared__ int32_t list_rows[kIdChunk], list_ids[kIdChunk];
  __shared__ int warp_counts[kIdsPerThread][kEmbWarps];
  const T* dout = static_cast<const T*>(p.dout);
  constexpr int64_t kTile = static_cast<int64_t>(kEmbThreads) * N;
  const int64_t tiles = ceil_div<int64_t>(p.dim, kTile);
  for (int64_t tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
    const int64_t c = tile * kTile + static_cast<int64_t>(threadIdx.x) * N;
    const bool active = c < p.dim;
    for (int64_t range = blockIdx.x; range < ranges; range += gridDim.x) {
      const int64_t v0 = range * vocab_per_block;
      const int64_t v1 = v0 + vocab_per_block < p.vocab ? v0 + vocab_per_block : p.vocab;
      int64_t cur = -1;  // the id whose sum acc holds
      float acc[N];
#pragma unroll
      for (int i = 0; i < N; ++i) acc[i] = 0.0f;
      for (int64_t base = 0; base < p.rows; base += kIdChunk) {
        const int count = compact_matches(p.ids, p.rows, base, v0, v1, list_rows, list_ids, warp_counts);
        if (!active) continue;
        for (int m = 0; m < count; ++m) {
          const int64_t id = list_ids[m];
          if (id != cur) {
            if (cur >= 0) {
              float* dst = p.dtable + cur * p.dim + c;
#pragma unroll
              for (int i = 0; i < N; ++i) dst[i] += acc[i];
            }
            cur = id;
#pragma unroll
            for (int i = 0; i < N; ++i) acc[i] = 0.0f;
          }
          float g[N];
          ops::load_float<N>(dout + (base + list_rows[m]) * p.dim + c, g);
#pragma unroll
          for (int i = 0; i < N; ++i) acc[i] += g[i];
        }
      }
      if (active && cur >= 0) {
        float* dst = p.dtable + cur * p.dim + c;
#pragma unroll
        for (int i = 0; i < N; ++i) dst[i] += acc[i];
      }
    }
  }
}

// gridDim.y for `tiles` column tiles: the kernels loop over tiles gridDim.y apart.
unsigned int tile_grid(int64_t tiles) {
  constexpr int64_t kMaxGridY = 65535;
  return static_cast<unsigned int>(tiles < kMaxGridY ? tiles : kMaxGridY);
}

int64_t vocab_per_block(int64_t vocab) {
  int64_t per = vocab / kTargetRangeBlocks;
  return per < 1 ? 1 : (per > kMaxVocabPerBlock ? kMaxVocabPerBlock : per);
}

}  // namespace

cudaError_t embedding_fwd(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.rows < 1 || p.dim < 1) return cudaSuccess;
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kN = ops::kVecElems<T>;
    if (ops::vec_aligned(p.table) && ops::vec_aligned(p.out) && ops::vec_rows<T>(p.dim)) {
      embedding_fwd_kernel<T, kN><<<grid_size(p.rows * (p.dim / kN), kEmbThreads), kEmbThreads, 0, stream>>>(p);
    } else {
      embedding_fwd_kernel<T, 1><<<grid_size(p.rows * p.dim, kEmbThreads), kEmbThreads, 0, stream>>>(p);
    }
    return cudaGetLastError();
  });
}

// ptxas (nvcc 13.0, sm_80 / sm_90a): backward 51-68 registers, 0 spills.
cudaError_t embedding_bwd(const EmbeddingParams& p, cudaStream_t stream) {
  if (p.rows < 1 || p.dim < 1 || p.vocab < 1) return cudaSuccess;
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    // dtable is float32: its rows must also start on 16-byte boundaries for the ranges' vector path.
    const bool vec = ops::vec_aligned(p.dout) && ops::vec_aligned(p.dtable) && ops::vec_rows<T>(p.dim) &&
                     ops::vec_rows<float>(p.dim);
    constexpr int kN = ops::kVecElems<T>;
    if (p.vocab <= kRowGroupVocabMax) {
      const int64_t tile = static_cast<int64_t>(kWarpSize) * (vec ? kN : 1);
      const dim3 grid(static_cast<unsigned int>(p.vocab), tile_grid(ceil_div(p.dim, tile)));
      if (vec) {
        embedding_bwd_rowgroups_kernel<T, kN><<<grid, kEmbThreads, 0, stream>>>(p);
      } else {
        embedding_bwd_rowgroups_kernel<T, 1><<<grid, kEmbThreads, 0, stream>>>(p);
      }
    } else {
      const int64_t per = vocab_per_block(p.vocab);
      const int64_t tile = static_cast<int64_t>(kEmbThreads) * (vec ? kN : 1);
      const int64_t ranges = ceil_div(p.vocab, per);
      const dim3 grid(grid_size(ranges, 1), tile_grid(ceil_div(p.dim, tile)));
      if (vec) {
        embedding_bwd_ranges_kernel<T, kN><<<grid, kEmbThreads, 0, stream>>>(p, per, ranges);
      } else {
        embedding_bwd_ranges_kernel<T, 1><<<grid, kEmbThreads, 0, stream>>>(p, per, ranges);
      }
    }
    return cudaGetLastError();
  });
}

}  // namespace fa::cuda
