// The K/V load pipeline's step of the Hopper FA2 kernels that stream K/V tiles past a resident
// query tile (the forward, the two-kernel backward's dQ kernel): one TMA load of K tile j and one
// of V tile j into stage j % kStages, each as kColBlocks 128-byte-swizzled column blocks, both
// completing on the stage's mbarrier.
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

}  // namespace fa::cuda::flash::sm90
