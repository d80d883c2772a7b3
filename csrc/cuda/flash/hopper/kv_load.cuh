// The TMA load steps of the Hopper FA2 kernels, each tile as kColBlocks 128-byte-swizzled column
// blocks. Kernels that stream K/V tiles past a resident query tile (the forward, the two-kernel
// backward's dQ kernel): load_kv_tile, K tile j and V tile j into stage j % kStages. Kernels that
// stream query tiles past a resident K/V tile (the backward's single kernel and dK/dV kernels):
// load_resident_kv_tile once, then load_query_tiles per step (with tile_load.cuh load_bwd_row_stats).
#pragma once
#include <cuda.h>

#include <cstdint>

#include "cuda/flash/hopper/tma.cuh"
#include "cuda/flash/hopper/wgmma.cuh"

namespace fa::cuda::flash::sm90 {

// Traits: kBlockN keys per tile, kKvTileBytes per tile and stage, kColBlocks 64-column blocks,
// kStages. One thread issues it; bar_of(stage) is the kernel's barrier of a stage.
template <typename Traits, typename BarOf>
__device__ __forceinline__ void load_kv_tile(const CUtensorMap* k_map, const CUtensorMap* v_map, uint32_t sK, uint32_t sV,
                                             const BarOf& bar_of, int j, int head_kv, int batch) {
  const int st = j % Traits::kStages;
  const uint32_t off = static_cast<uint32_t>(st * Traits::kKvTileBytes);
  mbarrier_arrive_expect_tx(bar_of(st), static_cast<uint32_t>(2 * Traits::kKvTileBytes));
#pragma unroll
  for (int cb = 0; cb < Traits::kColBlocks; ++cb) {
    const uint32_t cb_off = off + static_cast<uint32_t>(cb * Traits::kBlockN * kSw128RowBytes);
    tma_load_4d(sK + cb_off, k_map, bar_of(st), cb * kSw128BlockCols, j * Traits::kBlockN, head_kv, batch);
    tma_load_4d(sV + cb_off, v_map, bar_of(st), cb * kSw128BlockCols, j * Traits::kBlockN, head_kv, batch);
  }
}

// Traits: kBlockN keys, kKvTileBytes, kColBlocks. The K and V tiles of keys [n0, n0 + kBlockN) into
// sK and sV, both completing on bar. One thread issues it.
template <typename Traits>
__device__ __forceinline__ void load_resident_kv_tile(const CUtensorMap* k_map, const CUtensorMap* v_map, uint32_t sK,
                                                      uint32_t sV, uint32_t bar, int n0, int head_kv, int batch) {
  mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>(2 * Traits::kKvTileBytes));
#pragma unroll
  for (int cb = 0; cb < Traits::kColBlocks; ++cb) {
    const uint32_t cb_off = static_cast<uint32_t>(cb * Traits::kBlockN * kSw128RowBytes);
    tma_load_4d(sK + cb_off, k_map, bar, cb * kSw128BlockCols, n0, head_kv, batch);
    tma_load_4d(sV + cb_off, v_map, bar, cb * kSw128BlockCols, n0, head_kv, batch);
  }
}

// Traits: kBlockM query rows, kQTileBytes, kColBlocks. The Q and dO tiles of rows [m0, m0 + kBlockM)
// of head `head` into stage `stage` of sQ and sdO, both completing on bar. One thread issues it.
template <typename Traits>
__device__ __forceinline__ void load_query_tiles(const CUtensorMap* q_map, const CUtensorMap* do_map, uint32_t sQ,
                                                 uint32_t sdO, uint32_t bar, int stage, int m0, int head, int batch) {
  mbarrier_arrive_expect_tx(bar, static_cast<uint32_t>(2 * Traits::kQTileBytes));
  const uint32_t off = static_cast<uint32_t>(stage * Traits::kQTileBytes);
#pragma unroll
  for (int cb = 0; cb < Traits::kColBlocks; ++cb) {
    const uint32_t cb_off = off + static_cast<uint32_t>(cb * Traits::kBlockM * kSw128RowBytes);
    tma_load_4d(sQ + cb_off, q_map, bar, cb * kSw128BlockCols, m0, head, batch);
    tma_load_4d(sdO + cb_off, do_map, bar, cb * kSw128BlockCols, m0, head, batch);
  }
}

}  // namespace fa::cuda::flash::sm90
