// Launcher of the FA2 forward: support check, then the Hopper (wgmma) path on compute capability 9.0
// when the build has sm_90a code, else the sm_80+ mma.sync path with its dtype x head dim x causal
// dispatch (static_switch.h), dynamic shared-memory attribute, launch, cudaGetLastError.
//
// mma.sync configurations: head dim <= 128: kBlockM 64 (4 warps x 16 rows), kBlockN 64, Q fragments
// in registers; 192 and 256: kBlockM 128 (8 warps), kBlockN 32, Q re-read from shared memory (its
// registers go to the 16 x 256 O accumulator). ptxas -v (CUDA 13.0, sm_80; non-causal / causal), 0
// spills: d32 101/128 regs, d64 167/175, d96 217/219, d128 254/249, d192 214/217, d256 241/242.
// Shared memory: (kBlockM + 4 kBlockN) x (d + 8) x 2 bytes: d128 85 KiB, d256 135 KiB.
// On the H200 (bf16, B*S = 16k, H*D = 2048) this path runs at 214-249 TFLOP/s; the wgmma path is
// the one used there.
#include "cuda/flash/flash_fwd.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/device_props.h"
#include "cuda/flash/flash_configs.h"
#include "cuda/flash/flash_fwd_kernel.cuh"
#include "cuda/flash/flash_fwd_traits.h"
#include "cuda/flash/head_dims.h"
#include "cuda/flash/launch_checks.h"
#include "cuda/flash/hopper/flash_fwd_sm90.h"
#include "cuda/flash/static_switch.h"

namespace fa::cuda {
namespace {

constexpr int64_t kAlignElems = 8;  // 16 bytes of fp16 / bf16: the cp.async granule
constexpr int64_t kMaxBlocks = INT32_MAX;  // gridDim.x limit; the grid is flattened into x

// The traits of a compiled head dim's row of flash::kFwdSm80Configs (flash_configs.h): query rows
// per block, keys per tile, warps, Q in registers.
template <int kHeadDim, typename Elem>
struct Sm80Traits {
  static constexpr flash::FlashConfig kC = flash::config_for(flash::kFwdSm80Configs, kHeadDim);
  static_assert(kC.head_dim == kHeadDim, "every compiled head dim has a row");
  using type = flash::FlashFwdTraits<kHeadDim, kC.block_m, kC.block_n, kC.warps, Elem, kC.q_in_regs>;
  static_assert(flash::row_matches<type>(kC), "the row reports the traits' tile");
};

template <typename Elem, int kHeadDim, bool kIsCausal>
cudaError_t launch_sm80(const AttentionFwdParams& p, cudaStream_t stream) {
  using Traits = typename Sm80Traits<kHeadDim, Elem>::type;
  auto kernel = flash::flash_fwd_kernel<Traits, kIsCausal>;
  FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(Traits::kSmemBytes)));
  flash::QueryTileScheduler sched;  // one block per work item
  if (!flash::make_query_tile_scheduler<Traits::kBlockM>(&sched, p))
    return cudaErrorInvalidConfiguration;
  kernel<<<sched.items, Traits::kNThreads, Traits::kSmemBytes, stream>>>(p, sched);
  return cudaGetLastError();
}


template <int kHeadDim>
constexpr size_t sm80_smem_bytes() {
  return Sm80Traits<kHeadDim, __half>::type::kSmemBytes;
}
// Shared memory of the mma.sync kernel for a compiled head dim (sm_86 / sm_89 allow 99 KiB per block,
// sm_80 163 KiB: the 192 and 256 configurations need the latter).
size_t sm80_smem_bytes(int padded) {
  switch (padded) {
    case 32: return sm80_smem_bytes<32>();
    case 64: return sm80_smem_bytes<64>();
    case 96: return sm80_smem_bytes<96>();
    case 128: return sm80_smem_bytes<128>();
    case 192: return sm80_smem_bytes<192>();
    default: return sm80_smem_bytes<256>();
  }
}

}  // namespace

bool flash_fwd_runs_sm90() { return current_device_props().major == 9 && flash_fwd_sm90_built(); }

const char* flash_fwd_unsupported_reason(const AttentionFwdParams& p) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    return "flash_fwd takes float16 and bfloat16 inputs (float32 has its own kernel: flash_fwd_fp32.h)";
  const int padded = flash::padded_head_dim(p.head_dim);
  if (p.head_dim % 8 != 0 || padded == 0)
    return "this build has no FlashAttention-2 forward kernel for the head dim (FA_HEAD_DIMS left out every "
           "specialisation at least as large)";
  const DeviceProps props = current_device_props();
  if (props.major < 8)
    return "the CUDA FlashAttention-2 forward needs a GPU of compute capability 8.0 (sm_80) or newer";
  if (!flash_fwd_runs_sm90() && sm80_smem_bytes(padded) > static_cast<size_t>(props.smem_optin))
    return "the GPU has less shared memory per block than the FlashAttention-2 forward kernel for this head dim "
           "needs";
  if (p.seqlen_q > INT32_MAX || p.seqlen_k > INT32_MAX)
    return "seqlens must be below 2^31";  // row indices are int in the kernels
  // Blocks of the flattened grid, for the smaller (sm_80) tile: the larger one needs fewer.
  if (ceil_div<int64_t>(p.seqlen_q, 64) * p.heads_q * p.batch > kMaxBlocks)
    return "batch * headsQ * ceil(seqlenQ / 64) must be below 2^31";
  return flash::fwd_layout_reason(p, kAlignElems, "every stride of q, k, v and out must be a multiple of 8 elements");
}

bool flash_fwd_supported(const AttentionFwdParams& p) { return flash_fwd_unsupported_reason(p) == nullptr; }

const char* flash_fwd_path() { return flash_fwd_runs_sm90() ? "sm90-wgmma" : "sm80-mma"; }

size_t flash_fwd_workspace_bytes(const AttentionFwdParams& p) {
  const bool counter = flash_fwd_runs_sm90() && p.causal &&
                       flash::fwd_sm90_ws_causal(flash::padded_head_dim(p.head_dim), p.seqlen_q, p.seqlen_k);
  return counter ? flash::kFwdSm90ItemCounterBytes : 0;
}

cudaError_t flash_fwd(const AttentionFwdParams& p, cudaStream_t stream) {
  if (!flash_fwd_supported(p)) return cudaErrorNotSupported;
  FA_CUDA_TRY(cudaGetLastError());  // report an error left pending by earlier work
  if (flash_fwd_runs_sm90()) return flash_fwd_sm90(p, stream);
  return flash_fwd_sm80(p, stream);
}

cudaError_t flash_fwd_sm80(const AttentionFwdParams& p, cudaStream_t stream) {
  return FA_HEADDIM_SWITCH(p.head_dim, kHeadDim, [&] {
    return FA_BOOL_SWITCH(p.causal, kIsCausal, [&] {
      if (p.dtype == DType::kFloat16) return launch_sm80<__half, kHeadDim, kIsCausal>(p, stream);
      return launch_sm80<__nv_bfloat16, kHeadDim, kIsCausal>(p, stream);
    });
  });
}

}  // namespace fa::cuda
