// The FA2 tile schedulers: the tile of the head a work item (a thread block's flat blockIdx.x, or a
// persistent block's item) stands for (the grids are flat: batch x heads may exceed gridDim.y / z's
// 65535). The divisions are 32-bit: the launchers keep grids below 2^31 blocks, and a 64-bit division
// is a slow call; the query-tile grids divide by FastDivmods built on the host.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention_params.h"
#include "cuda/flash/query_tile_scheduler.h"

namespace fa::cuda::flash {

// The work item of a persistent block's round `round` when the items are equal (no causal mask):
// round * gridDim.x + blockIdx.x.
__device__ __forceinline__ uint32_t persistent_item(uint32_t round) { return round * gridDim.x + blockIdx.x; }

// Grids of K/V tiles (the backward's main kernels): one block per (K/V tile, KV head, batch), tiles
// fastest. tile_stride blocks per KV head: with one K/V tile each (the tiles' count), or, in
// deterministic mode, block first_tile taking tiles first_tile, first_tile + tile_stride, ... in turn.
// Causal, a head's heaviest tile (tile 0, which meets the most query tiles) comes first, but the heads
// go in order: heaviest-first sections as the query grids' (query_tile_scheduler.h), tried here (H100, bf16, FA2 grid,
// 512-16k, two runs each beside the build without them, 2026-11-27), read 0.97-1.03x the
// warp-specialized single kernel's TFLOP/s at d64 / d128: no gain outside the spread, although a model
// of the grid (equal steps, blocks started in order on 132 SMs) put the head-by-head tail at 5-7%.
struct KeyTileWork {
  int first_tile;
  int head_kv;
  int64_t batch;
};
__device__ __forceinline__ KeyTileWork key_tile_work(const AttentionFwdParams& p, uint32_t tile_stride) {
  KeyTileWork w;
  w.first_tile = static_cast<int>(blockIdx.x % tile_stride);
  const uint32_t bh = blockIdx.x / tile_stride;
  w.head_kv = static_cast<int>(bh % static_cast<uint32_t>(p.heads_kv));
  w.batch = bh / static_cast<uint32_t>(p.heads_kv);
  return w;
}

// Rotated walks (the warp-specialized backward without a causal mask): block n of a KV head's n_tiles
// K/V tile blocks walks the m_count query tiles from tile rotated_start(n) on and wraps around, so
// that the blocks reach a query tile at different steps: their dQ reductions land on different tiles
// at once, and in deterministic mode the turns at a query tile follow the order in which the blocks
// arrive there (rotated_turn) rather than the blocks' order, in which block n, walking in lockstep
// with the others, waits at every tile for blocks 0 .. n - 1. A block may then wait on a block with a
// higher blockIdx: the launcher rotates only where all the blocks of a KV head can be resident at once,
// so n_tiles is small and the 32-bit products below (n_tiles x m_count) cannot overflow.
__device__ __forceinline__ int rotated_start(int n, int n_tiles, int m_count) {
  return static_cast<int>(static_cast<uint32_t>(n) * static_cast<uint32_t>(m_count) / static_cast<uint32_t>(n_tiles));
}
// How many blocks start before query tile x (0 <= x <= m_count): those with n m_count / n_tiles < x.
__device__ __forceinline__ int rotated_starts_before(int x, int n_tiles, int m_count) {
  return static_cast<int>((static_cast<uint32_t>(x) * static_cast<uint32_t>(n_tiles) + static_cast<uint32_t>(m_count) - 1) /
                          static_cast<uint32_t>(m_count));
}
// Block n's turn at query tile m: how many blocks reach m before it. Those at an earlier step of their
// walks started in the tiles (m - step, m], cyclically; at the same step, those that started at its
// own tile with a lower index.
__device__ __forceinline__ int rotated_turn(int n, int n_tiles, int m, int m_count) {
  const int start = rotated_start(n, n_tiles, m_count);
  const int step = m >= start ? m - start : m - start + m_count;
  const int lo = m - step + 1;  // the window's first tile, before wrapping
  const int earlier = lo >= 0 ? rotated_starts_before(m + 1, n_tiles, m_count) - rotated_starts_before(lo, n_tiles, m_count)
                              : rotated_starts_before(m + 1, n_tiles, m_count) + n_tiles -
                                    rotated_starts_before(lo + m_count, n_tiles, m_count);
  return earlier + n - rotated_starts_before(start, n_tiles, m_count);
}

}  // namespace fa::cuda::flash
