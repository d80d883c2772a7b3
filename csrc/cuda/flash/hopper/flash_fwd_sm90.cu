// Launcher of the Hopper FA2 forward: dtype x head dim x causal dispatch, one traits configuration per
// head dim, dynamic shared-memory attribute, launch, cudaGetLastError. Compiled for every target; the
// kernels have bodies only in the sm_90a pass (flash_fwd_sm90_kernel.cuh), and flash_fwd_sm90_built()
// tells the dispatcher whether that pass was part of the build.
//
// Configurations (keys per tile kBlockN, warpgroups of 64 query rows, K/V stages), chosen by timing
// alternatives side by side (test/native/flash_fwd_check.cu; H200, bf16, B*S = 16k, H*D = 2048,
// median of 20, TFLOP/s at seqlen 2k / 8k, non-causal | causal):
//   d64  n128 w3 s3: 341 / 386 | 259 / 337   <- non-causal from seqlen 2048 (192-row tiles)
//        n128 w2 s3: 329 / 361 | 275 / 340   <- causal (finer tiles skip more of the masked half), and short
//        n128 w2 s4: 327 / 357 | 276 / 347;  n64 w3 s4: 317 / 361 | 248 / 314
//   d128 n128 w2 s3: 493 / 555 | 392 / 505   <- shipped
//        n96 w2 s3: 453 / 517 | 374 / 488;  n64 w3 s4: 455 / 503 | 351 / 454;  n64 w2 s4: 447 / 497 | 361 / 455
//   d256 n32 w2 s3: 421 / 461 | 338 / 415    (n64 spilled at 255 registers before TMA loads)
// Without the intra-warpgroup overlap and with cp.async loads (first cut) d128 ran at 344 / 370 | 287 / 342.
// ptxas -v (CUDA 13.0, sm_90a; fp16 = bf16; non-causal / causal registers), 0 spills, shared memory
// Q + 3 stages of K and V + barriers:
//   d32 155/157, d64 168/154 (w3: see the config), d96 189/175, d128 186/195 (224 KiB smem),
//   d192 170/213, d256 182/215.
#include "cuda/flash/hopper/flash_fwd_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/flash/hopper/flash_fwd_sm90_launch.cuh"
#include "cuda/flash/static_switch.h"

namespace fa::cuda {
namespace {

// Per head dim, causality and tile height: keys per tile, warpgroups (64 query rows each), K/V stages.
template <int kHeadDim, bool kIsCausal, int kWarpGroups_>
struct Sm90Config {
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : kHeadDim <= 192 ? 64 : 32;
  static constexpr int kWarpGroups = kWarpGroups_;
  static constexpr int kStages = 3;
};

// 192-row tiles (3 warpgroups) pay off for head dim <= 64 without causal masking at long query
// sequences (table above). Below 2048 rows 128-row tiles run instead; measured at seqlen 512 (bf16 /
// fp16, d64): 192-row 227 / 221 TFLOP/s, 128-row 218 / 219 (SDPA flash 265): neither reaches 0.85x
// there yet, the open cell of the grid (bench/RESULTS.md).
constexpr int64_t kTallTileMinSeqlen = 2048;

template <typename Elem, int kHeadDim, bool kIsCausal>
cudaError_t launch(const AttentionFwdParams& p, cudaStream_t stream) {
  if constexpr (kHeadDim <= 64 && !kIsCausal) {
    if (p.seqlen_q >= kTallTileMinSeqlen) {
      using C = Sm90Config<kHeadDim, kIsCausal, 3>;
      using Traits = flash::sm90::FlashFwdSm90Traits<kHeadDim, C::kBlockN, C::kWarpGroups, C::kStages, Elem>;
      return launch_flash_fwd_sm90<Traits, kIsCausal>(p, stream);
    }
  }
  using C = Sm90Config<kHeadDim, kIsCausal, 2>;
  using Traits = flash::sm90::FlashFwdSm90Traits<kHeadDim, C::kBlockN, C::kWarpGroups, C::kStages, Elem>;
  return launch_flash_fwd_sm90<Traits, kIsCausal>(p, stream);
}

}  // namespace

bool flash_fwd_sm90_built() {
#ifdef FA_HAS_SM90A
  return true;
#else
  return false;
#endif
}

cudaError_t flash_fwd_sm90(const AttentionFwdParams& p, cudaStream_t stream) {
  return FA_HEADDIM_SWITCH(p.head_dim, kHeadDim, [&] {
    return FA_BOOL_SWITCH(p.causal, kIsCausal, [&] {
      if (p.dtype == DType::kFloat16) return launch<__half, kHeadDim, kIsCausal>(p, stream);
      return launch<__nv_bfloat16, kHeadDim, kIsCausal>(p, stream);
    });
  });
}

}  // namespace fa::cuda
