// sm_90a GEMM launches (wgmma + TMA, gemm_sm90_kernel.cuh) for fp16 / bf16: the TMA tensor maps of a
// call and the configurations the planner chooses from.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/cuda_utils.cuh"
#include "cuda/device_props.h"
#include "cuda/flash/launch_checks.h"
#include "cuda/flash/hopper/tensor_map.h"
#include "cuda/gemm/gemm_plan.h"
#include "cuda/gemm/gemm_sm90_kernel.cuh"

namespace fa::cuda::gemm_kernels {
namespace {

// Configurations. Two or three blocks per SM let one block's prologue and epilogue overlap
// another's main loop: the model's K of 384 is only 6 K tiles. H100, bf16, M = 16384 products (us,
// queued mean of 20) for 0 / 3 / 4 and three configurations no longer built (128 x 64 with 4
// stages, 128 x 256 with 3 stages and 1 block per SM, 64 x 192 with 2 stages and 3 blocks per SM):
// fwd qkv 43.3 / 48.7 / 38.4 (51.9, 53.2, 45.3); fwd fc 51.6 / 64.6 / 49.1 (67.2, 60.5, 62.5); dx fc
// 44.2 / 41.8 / 40.4 (49.2, 51.0, 57.8): more blocks per SM beat deeper pipelines at K = 384 when
// the epilogue is staged. The planner (gemm.cu) takes 16 for large products with a 16-bit C it
// can store by TMA; else 4 for large products, 12 for large ones with a long K and for small ones
// split over a long K, 0 where 192-wide tiles would pad N more (the lm head), 3 for small ones
// unsplit. Other values of a plan's sm90_config run 0.
struct Sm90Config0 : Sm90ConfigBase {  // 128 x 128, 3 stages of 32 KiB
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 3, kBlocksPerSm = 2;
};
struct Sm90Config3 : Sm90ConfigBase {  // 64 x 128 (one warpgroup), 3 stages of 24 KiB, three blocks per SM
  static constexpr int kBlockM = 64, kBlockN = 128, kStages = 3, kBlocksPerSm = 3;
};
struct Sm90Config4 : Sm90ConfigBase {  // 128 x 192, 2 stages of 40 KiB, two blocks per SM
  static constexpr int kBlockM = 128, kBlockN = 192, kStages = 2, kBlocksPerSm = 2;
};
// Warp-specialized and persistent (gemm_sm90_ws_kernel): one block per SM, a producer warpgroup and
// two consumer warpgroups, 128 x 128 tiles, 6 stages of 32 KiB and a 20 KiB staging buffer (four
// passes of 32 columns). Each consumer warpgroup owns whole tiles (two m64 blocks, 128 accumulator
// registers a thread; the producer hands its registers over), the two on alternate work items and
// taking turns at the main loop and at the staging buffer: one finishes a tile while the other
// multiplies. H100, bf16, us, queued means, 2026-11-26, for 12 and the configurations it replaced
// or beat (cooperative: both warpgroups on one tile, 64 or 128 rows each):
//   tiles, stages, passes        12: 128 x 128 | 128 x 192, 4, 2   128 x 128, 6, 4   256 x 192, 3, 4 | 128 x 192, 5, 6
//                                 (turns)      | (cooperative)     (cooperative)     (cooperative)   | (turns)
//   fwd fc2 (K = 1536)              37.7       |    39.9              42.6              43.9         |    39.6
//   dx fc (K = 1536)                37.8       |    40.4              42.5              42.8         |    39.3
//   dx qkv (K = 1152)               33.0       |    34.3              36.1              34.9         |    34.3
//   fwd qkv (K = 384)               66.4       |    51.6              64.2              49.1         |    65.4
//   dW qkv / proj / fc / fc2        35.9       |    42.8              37.3              56.4         |    39.2
//     (K = 16384, split at           20.0      |    29.8              21.1              40.9         |    27.5
//     one wave)                      42.0      |    49.2              43.6              64.2         |    44.4
//                                    44.0      |    48.8              44.7              62.6         |    45.1
// Deeper pipelines win where the main loop is long. At K = 384 the epilogue dominates: with the
// staging buffer shared the tiles' epilogues queue up (fwd qkv 45.4 us with one buffer per group
// and fewer stages), and 4 (39.0) stays ahead of every persistent configuration tried. Also slower
// at K = 384: B kept resident in shared memory for 128 x 192 tiles (its 6 K tiles, A streamed),
// half the bytes from L2 (fwd qkv 67.1 us); pairs of blocks in a cluster, each loading half of the
// tile both share and multicasting it (fwd qkv 68 us with 128 x 192 tiles).
struct Sm90Config12 : Sm90ConfigBase {
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 6;
  static constexpr bool kWarpSpecialized = true;
  static constexpr int kEpiloguePasses = 4;
  static constexpr int kMmaBlocks = 2, kTileGroups = 2;
};
// Configuration 16: 12's tiles, stages and turns with the TMA-store epilogue (gemm_sm90_kernel.cuh:
// each consumer warpgroup converts its tile to 16-bit in registers, 64 columns at a time, into its
// own staging block, and goes on to its next tile while TMA stores it). Only for 16-bit C written
// without reading it (sm90_tma_store_ok), unsplit; the planner's choice there for large products.
// H100, bf16, us, queued means, 2026-11-26, against the staged epilogues (4, 12) and three other
// TMA-store configurations measured in the same call (cooperative: both warpgroups on one tile,
// 128 rows each; turns: each warpgroup on its own tiles, as 12):
//                       16: 128 x 128, | 4     12    | 256 x 192, 3    256 x 128, 4    128 x 192, 4
//                       6 stages, turns |             | (cooperative)   (cooperative)   (turns)
//   fwd qkv (K = 384)        28.0       | 39.3   67.6 |     31.3            32.7            29.0
//   fwd fc (K = 384)         35.9       | 50.2   87.6 |     39.0            38.0            35.9
//   fwd fc2 (K = 1536)       32.7       | 44.1   37.6 |     38.0            41.2            33.3
//   dx qkv (K = 1152)        26.3       | 33.5   33.6 |     29.7            33.0            27.6
//   dx fc (K = 1536)         32.3       | 40.4   37.3 |     36.1            40.8            33.4
//   dx fc2 (K = 384)         36.0       | 50.1   87.5 |     38.8            37.6            35.9
//   fwd / dx proj            11.7       | 13.7   24.4 |     12.9            14.3            11.1
// With the stores off the warpgroups' path, one warpgroup's epilogue hides under the other's main
// loop even at K = 384, and 128 x 128 tiles beat the bigger ones whose L2 bytes are fewer: the
// epilogue, not the bytes, was what limited the staged kernels.
struct Sm90Config16 : Sm90ConfigBase {
  static constexpr int kBlockM = 128, kBlockN = 128, kStages = 6;
  static constexpr bool kWarpSpecialized = true, kTmaStore = true;
  static constexpr int kMmaBlocks = 2, kTileGroups = 2;
};

template <typename Config>
Sm90Tile tile_of() {
  Sm90Tile t;
  t.block_m = Config::kBlockM;
  t.block_n = Config::kBlockN;
  t.blocks_per_sm = Config::kBlocksPerSm;
  t.tma_store = Config::kTmaStore;
  return t;
}

template <typename Elem, typename Config, bool kAK, bool kBK>
cudaError_t launch(const GemmParams& p, const GemmPlan& plan, float* partial, cudaStream_t stream) {
  constexpr bool kWs = Config::kWarpSpecialized;
  using Traits = Sm90Traits<Elem, Config, kAK, kBK>;
  const CUtensorMapDataType type =
      p.ab_dtype == DType::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  GemmTensorMaps maps;
  // 2-D views (inner, outer) as make_map's 4-D ones with two unit dimensions.
  const auto map2d = [&](CUtensorMap* map, const void* ptr, int64_t inner, int64_t outer, int64_t ld, int box_rows) {
    return make_map(map, type, ptr, inner, outer, 1, 1, ld, ld * outer, ld * outer, box_rows);
  };
  if (kAK)
    FA_CUDA_TRY(map2d(&maps.a, p.a, p.k, p.m, p.lda, Traits::kBlockM));
  else
    FA_CUDA_TRY(map2d(&maps.a, p.a, p.m, p.k, p.lda, Traits::kBlockK));
  if (kBK)
    FA_CUDA_TRY(map2d(&maps.b, p.b, p.k, p.n, p.ldb, Traits::kBlockN));
  else
    FA_CUDA_TRY(map2d(&maps.b, p.b, p.n, p.k, p.ldb, Traits::kBlockK));
  if constexpr (Traits::kTmaStore) {
    // The planner picks these configurations only for calls they can store, unsplit.
    if (!sm90_tma_store_ok(p) || partial != nullptr) return cudaErrorInvalidValue;
    FA_CUDA_TRY(map2d(&maps.c, p.c, p.n, p.m, p.ldc, Traits::kStoreRows));
    if (p.pre_out != nullptr) FA_CUDA_TRY(map2d(&maps.pre, p.pre_out, p.n, p.m, p.ldc, Traits::kStoreRows));
  }
  if constexpr (kWs) {
    // Persistent: at most one block per SM, each walking work items gridDim.x apart.
    auto kernel = gemm_sm90_ws_kernel<Traits>;
    FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
    const int64_t sms = std::max(current_device_props().sms, 1);
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(plan.blocks, sms));
    kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(p, maps, partial, plan.blocks, plan.k_tiles_per_split);
  } else {
    auto kernel = gemm_sm90_kernel<Traits>;
    FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
    kernel<<<static_cast<unsigned>(plan.blocks), Traits::kNThreads, Traits::kSmemBytes, stream>>>(
        p, maps, partial, plan.splits, plan.k_tiles_per_split);
  }
  return cudaGetLastError();
}

template <typename Elem, typename Config>
cudaError_t by_layout(const GemmParams& p, const GemmPlan& plan, float* partial, cudaStream_t stream) {
  if (p.a_k_major && p.b_k_major) return launch<Elem, Config, true, true>(p, plan, partial, stream);
  if (p.a_k_major) return launch<Elem, Config, true, false>(p, plan, partial, stream);
  if (p.b_k_major) return launch<Elem, Config, false, true>(p, plan, partial, stream);
  return launch<Elem, Config, false, false>(p, plan, partial, stream);
}

template <typename Elem>
cudaError_t by_config(const GemmParams& p, const GemmPlan& plan, float* partial, cudaStream_t stream) {
  if (plan.sm90_config == 3) return by_layout<Elem, Sm90Config3>(p, plan, partial, stream);
  if (plan.sm90_config == 4) return by_layout<Elem, Sm90Config4>(p, plan, partial, stream);
  if (plan.sm90_config == 12) return by_layout<Elem, Sm90Config12>(p, plan, partial, stream);
  if (plan.sm90_config == 16) return by_layout<Elem, Sm90Config16>(p, plan, partial, stream);
  return by_layout<Elem, Sm90Config0>(p, plan, partial, stream);
}

}  // namespace

bool gemm_sm90_built() {
#ifdef FA_HAS_SM90A
  return true;
#else
  return false;
#endif
}

Sm90Tile gemm_sm90_tile(int config) {
  switch (config) {
    case 3: return tile_of<Sm90Config3>();
    case 4: return tile_of<Sm90Config4>();
    case 12: return tile_of<Sm90Config12>();
    case 16: return tile_of<Sm90Config16>();
    default: return tile_of<Sm90Config0>();
  }
}

cudaError_t gemm_sm90(const GemmParams& p, const GemmPlan& plan, float* partial, cudaStream_t stream) {
#ifdef FA_HAS_SM90A
  if (p.ab_dtype == DType::kFloat16) return by_config<__half>(p, plan, partial, stream);
  if (p.ab_dtype == DType::kBFloat16) return by_config<__nv_bfloat16>(p, plan, partial, stream);
  return cudaErrorNotSupported;
#else
  (void)p, (void)plan, (void)partial, (void)stream;
  return cudaErrorNotSupported;
#endif
}

}  // namespace fa::cuda::gemm_kernels
