// Launcher of the float32 FA2 forward (sm_80+ mma.sync on TF32 tensor cores): head dim (padded up to
// a specialisation) x causal x precision dispatch, dynamic shared-memory attribute, launch on the
// caller's stream, cudaGetLastError.
//
// Configurations: 4 warps (kBlockM 64), one K and one V buffer; per head dim and precision, kBlockN,
// where Q lives and the __launch_bounds__ blocks per SM, chosen so that registers fit without spills
// and shared memory stays within the 99 KiB of sm_86/89. ptxas -v, CUDA 13.0, the build's flags
// (registers sm_80 / sm_90a, non-causal, then causal; 0 bytes stack frame and 0 bytes spill in all 48):
//   d    precision  kBlockN  Q     blocks/SM  smem (bytes)  registers
//   32   tf32       64       regs  3          27648         141/146, causal 160/148
//   32   highest    64       regs  3          27648         168/168, causal 168/168
//   64   tf32       64       regs  2          52224         196/203, causal 222/214
//   64   highest    32       regs  3          34816         168/168, causal 168/168
//   96   tf32       32       regs  2          51200         198/196, causal 201/197
//   96   highest    32       smem  2          51200         164/156, causal 167/160
//   128  tf32       32       regs  2          67584         252/234, causal 254/238
//   128  highest    32       smem  2          67584         192/184, causal 193/189
//   192  tf32       32       smem  2          100352        252/230, causal 254/234
//   192  highest    32       smem  2          100352        255/241, causal 254/245
//   256  tf32       16       smem  2          99840         239/229, causal 242/232
//   256  highest    16       smem  2          99840         241/233, causal 247/237
// Rejected on sm_80 for spills: d64 kBlockN 64 at 3 blocks/SM (168 registers; tf32 8-24 bytes,
// highest 156-160); Q in registers for 3xTF32 at d128 (255 registers, 140-144 bytes); d96 kBlockN 64
// with Q in registers (highest 112-124 bytes); d32 at 4 blocks/SM (128 registers: highest 12-16
// bytes). Alternatives without spills, not yet timed: d64 tf32 kBlockN 32 at 3 blocks/SM (160/155
// registers, sm_80), d64 highest kBlockN 64 at 2 blocks/SM (255), d96 highest with Q in registers
// (255), d192 kBlockN 16 (188-193). None of this is timed on a GPU yet. For comparison, PyTorch's
// memory-efficient fp32 kernel (3xTF32 on sm_80+) runs 64 x 64 tiles with 4 warps at 3 blocks per SM.
#include "cuda/flash/flash_fwd_fp32.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/device_props.h"
#include "cuda/flash/flash_configs.h"
#include "cuda/flash/flash_fwd_fp32_kernel.cuh"
#include "cuda/flash/flash_fwd_fp32_traits.h"
#include "cuda/flash/head_dims.h"
#include "cuda/flash/launch_checks.h"
#include "cuda/flash/static_switch.h"

namespace fa::cuda {
namespace {

constexpr int kFp32Warps = 4;
constexpr int kFp32BlockM = 64;               // kFp32Warps x 16 query rows, in every configuration
constexpr int kMinComputeMajor = 8;           // mma.sync tf32 and cp.async: sm_80
constexpr int64_t kAlignElems = 4;            // 16 bytes of fp32: the cp.async granule
constexpr int64_t kMaxBlocks = INT32_MAX;     // the flat grid's gridDim.x (2^31 - 1)
constexpr int kHeadDimMultiple = 8;           // one mma k-step / n8 tile: the padding granule

// Per specialised head dim and precision, the row of flash::kFwdFp32Tf32Configs or
// kFwdFp32HighestConfigs (flash_configs.h): K/V tile rows, whether Q stays in registers, and the
// __launch_bounds__ blocks per SM (the register cap); measured ptxas numbers in the header comment.
// 3xTF32 holds the big/small halves of every operand: it keeps Q in shared memory from head dim 96 on.
template <int kHeadDim, Fp32Precision kPrecision>
struct Fp32FwdConfig {
  static constexpr flash::FlashConfig kC = flash::fwd_fp32_config(kPrecision, kHeadDim);
  static_assert(kC.head_dim == kHeadDim && kC.warps == kFp32Warps && kC.block_m == kFp32BlockM,
                "every specialised head dim has a row of kFp32Warps warps");
  using Traits = flash::FlashFwdFp32Traits<kHeadDim, kC.block_n, kC.warps, kC.q_in_regs, kC.blocks_per_sm>;
  static_assert(flash::row_matches<Traits>(kC), "the row reports the traits' tile");
};

// What the host needs to know of a specialisation's configuration before launching it.
struct LaunchShape {
  size_t smem_bytes;
  int block_m;
};

template <int kHeadDim, Fp32Precision kPrecision>
LaunchShape launch_shape() {
  using Traits = typename Fp32FwdConfig<kHeadDim, kPrecision>::Traits;
  static_assert(Traits::kBlockM == kFp32BlockM, "the support check's grid bound assumes kFp32BlockM rows per block");
  return {Traits::kSmemBytes, Traits::kBlockM};
}

template <Fp32Precision kPrecision>
LaunchShape launch_shape_for(int padded) {
  switch (padded) {
    case 32: return launch_shape<32, kPrecision>();
    case 64: return launch_shape<64, kPrecision>();
    case 96: return launch_shape<96, kPrecision>();
    case 128: return launch_shape<128, kPrecision>();
    case 192: return launch_shape<192, kPrecision>();
    case 256: return launch_shape<256, kPrecision>();
    default: return {0, 0};
  }
}

LaunchShape launch_shape_for(int padded, Fp32Precision precision) {
  return precision == Fp32Precision::kHighest ? launch_shape_for<Fp32Precision::kHighest>(padded)
                                              : launch_shape_for<Fp32Precision::kTf32>(padded);
}

int64_t grid_blocks(const AttentionFwdParams& p, int block_m) {
  return ceil_div<int64_t>(p.seqlen_q, block_m) * p.heads_q * p.batch;
}

template <int kHeadDim, bool kIsCausal, Fp32Precision kPrecision>
cudaError_t launch_flash_fwd_fp32(const AttentionFwdParams& p, cudaStream_t stream) {
  using Traits = typename Fp32FwdConfig<kHeadDim, kPrecision>::Traits;
  auto kernel = flash::flash_fwd_fp32_kernel<Traits, kIsCausal, kPrecision>;
  FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(Traits::kSmemBytes)));
  flash::QueryTileScheduler sched;  // one block per work item
  if (!flash::make_query_tile_scheduler<Traits::kBlockM>(&sched, p))
    return cudaErrorInvalidConfiguration;
  kernel<<<sched.items, Traits::kNThreads, Traits::kSmemBytes, stream>>>(p, sched);
  return cudaGetLastError();
}

}  // namespace

const char* flash_fwd_fp32_unsupported_reason(const AttentionFwdParams& p) {
  if (p.dtype != DType::kFloat32) return "the float32 FlashAttention-2 forward takes float32 inputs only";
  if (p.head_dim < kHeadDimMultiple || p.head_dim % kHeadDimMultiple != 0) {
    return "the CUDA FlashAttention-2 forward needs a head dim that is a multiple of 8";
  }
  const int padded = flash::padded_head_dim(p.head_dim);
  if (padded == 0) {
    return "this build has no float32 FlashAttention-2 kernel for the head dim (FA_HEAD_DIMS left out every "
           "specialisation at least as large)";
  }
  const DeviceProps props = current_device_props();
  if (!props.valid) return "the CUDA device could not be queried";
  const int major = props.major, smem_optin = props.smem_optin;
  if (major < kMinComputeMajor) {
    return "the CUDA FlashAttention-2 forward needs a GPU of compute capability 8.0 (sm_80) or newer";
  }
  const LaunchShape shape = launch_shape_for(padded, p.fp32_precision);
  if (static_cast<size_t>(smem_optin) < shape.smem_bytes) {
    return "the GPU has less shared memory per block than the float32 FlashAttention-2 kernel needs";
  }
  if (p.seqlen_q > INT32_MAX || p.seqlen_k > INT32_MAX || p.heads_q > INT32_MAX) {
    return "seqlens and heads must be below 2^31";  // row and head indices are int in the kernel
  }
  if (grid_blocks(p, shape.block_m) > kMaxBlocks) {
    return "batch * headsQ * ceil(seqlenQ / 64) must be below 2^31 (one thread block per 64 query rows of a head)";
  }
  return flash::fwd_layout_reason(p, kAlignElems, "every stride of q, k, v and out must be a multiple of 4 elements");
}

bool flash_fwd_fp32_supported(const AttentionFwdParams& p) { return flash_fwd_fp32_unsupported_reason(p) == nullptr; }

cudaError_t flash_fwd_fp32(const AttentionFwdParams& p, cudaStream_t stream) {
  if (!flash_fwd_fp32_supported(p)) return cudaErrorNotSupported;
  FA_CUDA_TRY(cudaGetLastError());  // report an error left pending by earlier work
  return FA_HEADDIM_SWITCH(p.head_dim, kHeadDim, [&] {
    return FA_BOOL_SWITCH(p.causal, kIsCausal, [&] {
      if (p.fp32_precision == Fp32Precision::kHighest)
        return launch_flash_fwd_fp32<kHeadDim, kIsCausal, Fp32Precision::kHighest>(p, stream);
      return launch_flash_fwd_fp32<kHeadDim, kIsCausal, Fp32Precision::kTf32>(p, stream);
    });
  });
}

}  // namespace fa::cuda
