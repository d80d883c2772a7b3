// Launcher of the float32 FA2 backward (flash_bwd_fp32.h): support check, workspace (flash_bwd_plan.h),
// preprocess, the mma.sync TF32 kernel with its head dim x causal x precision dispatch (static_switch.h),
// dQ conversion.
//
// Configurations (FlashBwdFp32Traits: query rows per step kBlockM, warps along the K/V tile x along the
// head dim, Q / dO stages, __launch_bounds__ blocks per SM), the same for both precisions. ptxas -v, CUDA
// 13.0, the build's flags (registers sm_80 / sm_90a; tf32 full, tf32 causal, highest full, highest
// causal; spill stores/loads in bytes where not 0):
//   d    kBlockM  warps  kBlockN  stages  min blocks/SM  smem (bytes)  registers
//   32   32       4 x 1  64       2       2              46592         152/156, 151/159, 172/169, 168/172
//   64   32       4 x 1  64       2       2              79360         213/224, 199/208, 249/251, 219/215
//   96   32       4 x 2  64       1       1              86272         189/203, 170/179, 245/252, 194/189
//   128  16       4 x 2  64       2       1              110848        173/183, 173/182, 183/190, 197/191
//   192  32       2 x 2  32       1       2              105216        255/255 in all four; spills sm_80 0,
//                                                                      24/28, 0, 24/28; sm_90a 64/112,
//                                                                      24/28, 100/176, 24/28
//   256  16       2 x 2  32       1       2              104576        255/255 in all four; spills sm_80
//                                                                      8/12, 24/28, 24/48, 40/60; sm_90a
//                                                                      96/156, 28/36, 80/140, 84/148
// Head dims <= 128 have 0 bytes spill in all 32; 192 and 256 spill a few long-lived scalars (no
// alternative found in the time: the per-warp dK / dV of d/2 = 96 / 128 columns already take 96 / 128
// registers). Every configuration fits the 163 KiB of an A100; d32 to d96 also the 99 KiB of sm_86/89.
// "warps a x b" = kKeyTiles x kDSplit: with kDSplit 2 the two warps of a key tile compute the same S^T
// and dP^T (1.4x the tensor-core work of the five products) to halve dK / dV's registers.
// Rejected for spills (none timed: no GPU run yet): d128 with 4 x 1 warps (dK / dV 128 registers per
// thread: 255 registers, kBlockM 16 0-20 bytes on sm_80 but 20-96 on sm_90a, kBlockM 32 up to 140),
// d96 with 4 x 1 warps (kBlockM 32: 8-112 bytes; kBlockM 16: 0 except 20 bytes sm_90a highest causal;
// no S^T duplication, worth timing against 4 x 2), d32 with 8 x 1 warps at 2 blocks/SM (128-register
// cap: 8-28 bytes), fully unrolled S^T / dQ k-step loops (d64 at 255 registers and 20-104 bytes; the
// loops are unrolled by 2, see the kernel).
// Deterministic mode (p.deterministic): the kernel launches deterministic_splits() blocks per KV head
// (flash_bwd_plan.h, as the fp16 / bf16 backward), each walking every splits-th K/V tile and adding its
// dQ into its own fp32 accumulator slice (each element by one thread, in program order); the conversion
// sums the slices in order. Bit-identical dq, for splits x the accumulator's memory.
#include "cuda/flash/flash_bwd_fp32.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/device_props.h"
#include "cuda/flash/flash_bwd_aux.cuh"
#include "cuda/flash/flash_bwd_fp32_kernel.cuh"
#include "cuda/flash/flash_configs.h"
#include "cuda/flash/flash_bwd_fp32_traits.h"
#include "cuda/flash/flash_bwd_plan.h"
#include "cuda/flash/head_dims.h"
#include "cuda/flash/launch_checks.h"
#include "cuda/flash/static_switch.h"

namespace fa::cuda {
namespace {

constexpr int kMinComputeMajor = 8;        // mma.sync tf32 and cp.async: sm_80
constexpr int64_t kAlignElems = 4;         // 16 bytes of fp32: the cp.async granule
constexpr int64_t kMaxBlocks = INT32_MAX;  // the flat grid's gridDim.x (2^31 - 1)
constexpr int kHeadDimMultiple = 8;        // one mma k-step / n8 tile: the padding granule
constexpr int kDqRowMultiple = 64;         // a multiple of every configuration's kBlockM: the accumulator's rows

// Per specialised head dim (both precisions), the row of flash::kBwdFp32Configs (flash_configs.h):
// FlashBwdFp32Traits<kHeadDim, kBlockM, kKeyTiles, kDSplit, kStages, kMinBlocksPerSm>; measured ptxas
// numbers in the header comment.
template <int kHeadDim>
struct Fp32BwdConfig {
  static constexpr flash::FlashConfig kC = flash::config_for(flash::kBwdFp32Configs, kHeadDim);
  static_assert(kC.head_dim == kHeadDim, "every specialised head dim has a row");
  using Traits = flash::FlashBwdFp32Traits<kHeadDim, kC.block_m, kC.key_tiles, kC.d_split, kC.stages, kC.blocks_per_sm>;
  static_assert(flash::row_matches<Traits>(kC), "the row reports the traits' tile");
};

// What the host needs to know of a specialisation's configuration before launching it.
struct LaunchShape {
  size_t smem_bytes;
  int block_n;
};

template <int kHeadDim>
LaunchShape launch_shape() {
  using Traits = typename Fp32BwdConfig<kHeadDim>::Traits;
  static_assert(kDqRowMultiple % Traits::kBlockM == 0, "the accumulator's rows are padded to whole query tiles");
  return {Traits::kSmemBytes, Traits::kBlockN};
}

LaunchShape launch_shape_for(int padded) {
  switch (padded) {
    case 32: return launch_shape<32>();
    case 64: return launch_shape<64>();
    case 96: return launch_shape<96>();
    case 128: return launch_shape<128>();
    case 192: return launch_shape<192>();
    case 256: return launch_shape<256>();
    default: return {0, 0};
  }
}

flash::BwdWorkspacePlan workspace_plan(const AttentionBwdParams& p) {
  const int padded = flash::padded_head_dim(p.head_dim);
  return flash::bwd_workspace_plan(p, launch_shape_for(padded).block_n, kDqRowMultiple, padded);
}

template <int kHeadDim, bool kIsCausal, Fp32Precision kPrecision>
cudaError_t launch(const AttentionBwdParams& p, const flash::FlashBwdWorkspace& ws, cudaStream_t stream) {
  using Traits = typename Fp32BwdConfig<kHeadDim>::Traits;
  auto kernel = flash::flash_bwd_fp32_kernel<Traits, kIsCausal, kPrecision>;
  FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(Traits::kSmemBytes)));
  const int64_t tiles = p.deterministic ? ws.splits : ceil_div<int64_t>(p.seqlen_k, Traits::kBlockN);
  const int64_t blocks = tiles * p.heads_kv * p.batch;
  kernel<<<static_cast<unsigned>(blocks), Traits::kNThreads, Traits::kSmemBytes, stream>>>(p, ws);
  FA_CUDA_TRY(cudaGetLastError());
  const int64_t vecs = p.batch * p.heads_q * p.seqlen_q * (p.head_dim / flash::kAuxVec);
  flash::flash_bwd_convert_dq_kernel<float, kHeadDim>
      <<<grid_size(vecs, flash::kAuxThreads), flash::kAuxThreads, 0, stream>>>(p, ws.dq_accum, ws.dq_rows, ws.splits,
                                                                               ws.split_stride);
  return cudaGetLastError();
}

// Everything after the workspace exists and its accumulator is zeroed: preprocess, main kernel, conversion.
cudaError_t run(const AttentionBwdParams& p, const flash::FlashBwdWorkspace& ws, cudaStream_t stream) {
  FA_CUDA_TRY(flash::launch_flash_bwd_dot_do_o<float>(p, ws.d, stream));
  return FA_HEADDIM_SWITCH(p.head_dim, kHeadDim, [&] {
    return FA_BOOL_SWITCH(p.causal, kIsCausal, [&] {
      if (p.fp32_precision == Fp32Precision::kHighest)
        return launch<kHeadDim, kIsCausal, Fp32Precision::kHighest>(p, ws, stream);
      return launch<kHeadDim, kIsCausal, Fp32Precision::kTf32>(p, ws, stream);
    });
  });
}

}  // namespace

const char* flash_bwd_fp32_unsupported_reason(const AttentionBwdParams& p) {
  if (p.dtype != DType::kFloat32) return "the float32 FlashAttention-2 backward takes float32 inputs only";
  if (p.head_dim < kHeadDimMultiple || p.head_dim % kHeadDimMultiple != 0)
    return "the CUDA FlashAttention-2 backward needs a head dim that is a multiple of 8";
  const int padded = flash::padded_head_dim(p.head_dim);
  if (padded == 0)
    return "this build has no float32 FlashAttention-2 backward kernel for the head dim (FA_HEAD_DIMS left out "
           "every specialisation at least as large)";
  const DeviceProps props = current_device_props();
  if (!props.valid) return "the CUDA device could not be queried";
  const int major = props.major, smem_optin = props.smem_optin;
  if (major < kMinComputeMajor)
    return "the CUDA FlashAttention-2 backward needs a GPU of compute capability 8.0 (sm_80) or newer";
  const LaunchShape shape = launch_shape_for(padded);
  if (static_cast<size_t>(smem_optin) < shape.smem_bytes)
    return "the GPU has less shared memory per block than the float32 FlashAttention-2 backward kernel for this "
           "head dim needs";
  if (p.seqlen_q > INT32_MAX || p.seqlen_k > INT32_MAX || p.heads_q > INT32_MAX)
    return "seqlens and heads must be below 2^31";  // row and head indices are int in the kernel
  if (ceil_div<int64_t>(p.seqlen_k, shape.block_n) * p.heads_kv * p.batch > kMaxBlocks)
    return "batch * headsKV * ceil(seqlenK / keys per block) must be below 2^31";
  return flash::bwd_layout_reason(
      p, kAlignElems, "every stride of q, k, v, out, dout and the gradients must be a multiple of 4 elements");
}

size_t flash_bwd_fp32_workspace_bytes(const AttentionBwdParams& p) {
  const flash::BwdWorkspacePlan w = workspace_plan(p);
  return w.accum_bytes + w.d_bytes;
}

cudaError_t flash_bwd_fp32(const AttentionBwdParams& p, cudaStream_t stream) {
  if (flash_bwd_fp32_unsupported_reason(p) != nullptr) return cudaErrorNotSupported;
  FA_CUDA_TRY(cudaGetLastError());  // report an error left pending by earlier work
  return flash::with_bwd_workspace(workspace_plan(p), stream,
                                   [&](const flash::FlashBwdWorkspace& ws) { return run(p, ws, stream); });
}

}  // namespace fa::cuda
