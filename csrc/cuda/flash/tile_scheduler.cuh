// The FA2 tile schedulers: the tile of the head a thread block owns, from its flat blockIdx.x (the
// grids are flat: batch x heads may exceed gridDim.y / z's 65535). The divisions are 32-bit: the
// launchers keep grids below 2^31 blocks, and a 64-bit division is a slow call.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "common/attention_params.h"

namespace fa::cuda::flash {

// Grids of query tiles (the forward kernels, the two-kernel backward's dQ kernel): one block per
// (query tile of kBlockM rows, query head, batch), query tiles fastest so that the blocks of a head
// run side by side and share its K/V in L2, and each head's heaviest causal tile first.
struct QueryTileWork {
  int m_block, m0;    // the query tile and its first row
  int head, head_kv;  // the query head and the KV head it reads (GQA / MQA)
  int64_t batch;
};
template <int kBlockM>
__device__ __forceinline__ QueryTileWork query_tile_work(const AttentionFwdParams& p) {
  const int m_blocks = (static_cast<int>(p.seqlen_q) + kBlockM - 1) / kBlockM;
  QueryTileWork w;
  w.m_block = m_blocks - 1 - static_cast<int>(blockIdx.x % m_blocks);
  const uint32_t bh = blockIdx.x / static_cast<uint32_t>(m_blocks);
  w.head = static_cast<int>(bh % static_cast<uint32_t>(p.heads_q));
  w.batch = bh / static_cast<uint32_t>(p.heads_q);
  w.head_kv = w.head / static_cast<int>(p.heads_q / p.heads_kv);
  w.m0 = w.m_block * kBlockM;
  return w;
}

// Grids of K/V tiles (the backward's main kernels): one block per (K/V tile, KV head, batch), tiles
// fastest. tile_stride blocks per KV head: with one K/V tile each (the tiles' count), or, in
// deterministic mode, block first_tile taking tiles first_tile, first_tile + tile_stride, ... in turn.
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

}  // namespace fa::cuda::flash
