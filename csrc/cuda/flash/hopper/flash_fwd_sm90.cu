// Launcher of the Hopper FA2 forward: dtype x head dim x causal dispatch, one traits configuration per
// head dim, dynamic shared-memory attribute, launch, cudaGetLastError. Compiled for every target; the
// kernels have bodies only in the sm_90a pass (flash_fwd_sm90_kernel.cuh), and flash_fwd_sm90_built()
// tells the dispatcher whether that pass was part of the build.
//
// Configurations: 2 warpgroups (kBlockM 128), 2 K/V stages, kBlockN 128 up to head dim 128, 64 at
// 192, 32 at 256. ptxas -v (CUDA 13.0, sm_90a; fp16 = bf16; non-causal / causal), 0 spills:
//   d32 153/155 regs, d64 181/194, d96 219/226, d128 252/252, d192 222/243, d256 (kBlockN 32) 216/236
//   (kBlockN 64 at d256 spilled 32-40 bytes at 255 registers).
// First measurement (H200, bf16, B*S = 16k, H*D = 2048, median of 20), TFLOP/s:
//   d64 259 (causal 230) at 2k, 279 (275) at 8k; d128 344 (287) at 2k, 370 (342) at 8k;
//   d256 320 (255) at 2k, 344 (302) at 8k.
#include "cuda/flash/hopper/flash_fwd_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/flash/hopper/flash_fwd_sm90_kernel.cuh"
#include "cuda/flash/static_switch.h"

namespace fa::cuda {
namespace {

// Per head dim: keys per tile, warpgroups (64 query rows each), K/V stages.
template <int kHeadDim>
struct Sm90Config {
  static constexpr int kBlockN = kHeadDim <= 128 ? 128 : kHeadDim <= 192 ? 64 : 32;
  static constexpr int kWarpGroups = 2;
  static constexpr int kStages = 2;
};

template <typename Elem, int kHeadDim, bool kIsCausal>
cudaError_t launch(const AttentionFwdParams& p, cudaStream_t stream) {
  using Config = Sm90Config<kHeadDim>;
  using Traits = flash::sm90::FlashFwdSm90Traits<kHeadDim, Config::kBlockN, Config::kWarpGroups, Config::kStages, Elem>;
  auto kernel = flash::sm90::flash_fwd_sm90_kernel<Traits, kIsCausal>;
  FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(Traits::kSmemBytes)));
  const int64_t blocks = ceil_div<int64_t>(p.seqlen_q, Traits::kBlockM) * p.heads_q * p.batch;
  kernel<<<static_cast<unsigned>(blocks), Traits::kNThreads, Traits::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
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
