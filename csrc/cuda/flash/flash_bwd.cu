// Launcher of the FA2 backward (flash_bwd.h): support check, workspace, preprocess, the main kernel
// (the Hopper wgmma kernels on compute capability 9.0 when the build has sm_90a code: two kernels at
// every head dim, the single kernel at head dims that round to 32, 64 or 128; else the mma.sync
// kernel) with its dtype x head dim x causal dispatch
// (static_switch.h), dQ conversion.
//
// mma.sync configurations (query rows per step kBlockM, warps along the key tile x along the head dim):
//   head dim <= 128: kBlockM 64, 8 x 1 warps (kBlockN 128 keys per block);
//   192 and 256:     kBlockM 64, 4 x 2 warps (kBlockN 64; the two warps of a key tile split dK / dV's
//                    columns, so each keeps 2 x 16 x d/2 accumulators in registers).
// Deterministic mode (p.deterministic): both kernels launch deterministic_splits() blocks per KV head,
// each walking every splits-th K/V tile and adding its dQ into its own fp32 accumulator slice (each
// element by one thread, in program order); the conversion sums the slices in order. Bit-identical dq,
// for splits x the accumulator's memory.
#include "cuda/flash/flash_bwd.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/device_props.h"
#include "cuda/flash/flash_bwd_aux.cuh"
#include "cuda/flash/flash_configs.h"
#include "cuda/flash/flash_bwd_kernel.cuh"
#include "cuda/flash/flash_bwd_plan.h"
#include "cuda/flash/flash_bwd_traits.h"
#include "cuda/flash/head_dims.h"
#include "cuda/flash/hopper/flash_bwd_sm90.h"
#include "cuda/flash/launch_checks.h"
#include "cuda/flash/static_switch.h"

namespace fa::cuda {
namespace {

constexpr int64_t kAlignElems = 8;          // 16 bytes of fp16 / bf16: the cp.async granule
constexpr int64_t kMaxBlocks = INT32_MAX;   // the flat grid's gridDim.x (2^31 - 1)
constexpr int kMinComputeMajor = 8;         // mma.sync m16n8k16 bf16, cp.async, ldmatrix: sm_80
constexpr int kDqRowMultiple = 128;         // a multiple of every kernel's kBlockM: the accumulator's row padding

// The traits of a compiled head dim's row of flash::kBwdSm80Configs (flash_configs.h).
template <int kHeadDim, typename Elem>
struct Sm80BwdTraitsOf {
  static constexpr flash::FlashConfig kC = flash::config_for(flash::kBwdSm80Configs, kHeadDim);
  static_assert(kC.head_dim == kHeadDim, "every compiled head dim has a row");
  using type = flash::FlashBwdTraits<kHeadDim, kC.block_m, kC.key_tiles, kC.d_split, Elem>;
  static_assert(flash::row_matches<type>(kC), "the row reports the traits' tile");
};
template <int kHeadDim, typename Elem>
using Sm80BwdTraits = typename Sm80BwdTraitsOf<kHeadDim, Elem>::type;

size_t smem_bytes(int padded) {
  switch (padded) {
    case 32: return Sm80BwdTraits<32, __half>::kSmemBytes;
    case 64: return Sm80BwdTraits<64, __half>::kSmemBytes;
    case 96: return Sm80BwdTraits<96, __half>::kSmemBytes;
    case 128: return Sm80BwdTraits<128, __half>::kSmemBytes;
    case 192: return Sm80BwdTraits<192, __half>::kSmemBytes;
    default: return Sm80BwdTraits<256, __half>::kSmemBytes;
  }
}
int block_n(int padded) { return padded <= 128 ? 128 : 64; }

// The columns of the dQ accumulator's rows: the head dim of the kernel that adds to it (the Hopper
// single kernels' or the mma.sync kernel's).
int accum_cols(const AttentionBwdParams& p, bool sm90) {
  return sm90 ? flash_bwd_sm90_padded(p.head_dim) : flash::padded_head_dim(p.head_dim);
}

// The workspace of p (flash_bwd_plan.h) on the Hopper path (sm90) or the mma.sync one: the two-kernel
// backward has no dQ accumulator; the warp-specialized kernel's deterministic mode has one slice and
// turn counters.
flash::BwdWorkspacePlan workspace_plan(const AttentionBwdParams& p, bool sm90) {
  const int cols = accum_cols(p, sm90);
  flash::BwdWorkspacePlan plan = flash::bwd_workspace_plan(p, block_n(cols), kDqRowMultiple, cols);
  if (p.two_kernel) {
    plan.accum_bytes = 0;
  } else if (sm90 && p.deterministic && flash_bwd_sm90_ws(p)) {
    flash::use_ordered_turns(&plan, p, flash::config_for(flash::kBwdWsSm90Configs, cols).block_m,
                             flash::kBwdWsDqTurnsPerTile);
  }
  return plan;
}

template <typename Elem, int kHeadDim, bool kIsCausal>
cudaError_t launch(const AttentionBwdParams& p, const flash::FlashBwdWorkspace& ws, bool sm90, cudaStream_t stream) {
  if (sm90) {
    FA_CUDA_TRY(flash_bwd_sm90(p, ws, stream));
  } else {
    using Traits = Sm80BwdTraits<kHeadDim, Elem>;
    static_assert(kDqRowMultiple % Traits::kBlockM == 0, "the accumulator's rows are padded to whole query tiles");
    auto kernel = flash::flash_bwd_kernel<Traits, kIsCausal>;
    FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(Traits::kSmemBytes)));
    const int64_t tiles = p.deterministic ? ws.splits : ceil_div<int64_t>(p.seqlen_k, Traits::kBlockN);
    const int64_t blocks = tiles * p.heads_kv * p.batch;
    kernel<<<static_cast<unsigned>(blocks), Traits::kNThreads, Traits::kSmemBytes, stream>>>(p, ws);
    FA_CUDA_TRY(cudaGetLastError());
  }
  // The accumulator's rows have the columns of the kernel that filled it: on Hopper head dim 96 runs
  // the d128 kernels (accum_cols).
  const int64_t vecs = p.batch * p.heads_q * p.seqlen_q * (p.head_dim / flash::kAuxVec);
  const auto convert = [&](auto kernel) {
    kernel<<<grid_size(vecs, flash::kAuxThreads), flash::kAuxThreads, 0, stream>>>(p, ws.dq_accum, ws.dq_rows,
                                                                                   ws.splits, ws.split_stride);
    return cudaGetLastError();
  };
  const int cols = accum_cols(p, sm90);
  if constexpr (kHeadDim == 96) {
    if (cols == 128) return convert(flash::flash_bwd_convert_dq_kernel<Elem, 128>);
  }
  if (cols != kHeadDim) return cudaErrorInvalidValue;  // no other head dim is padded further
  return convert(flash::flash_bwd_convert_dq_kernel<Elem, kHeadDim>);
}

// The preprocess: D = rowsum(dO o O) into d.
cudaError_t launch_dot_do_o(const AttentionBwdParams& p, float* d, cudaStream_t stream) {
  return p.dtype == DType::kFloat16 ? flash::launch_flash_bwd_dot_do_o<__half>(p, d, stream)
                                    : flash::launch_flash_bwd_dot_do_o<__nv_bfloat16>(p, d, stream);
}

// The two-kernel backward after its workspace (D) exists: preprocess, dK/dV kernel, dQ kernel.
cudaError_t run_two_kernel(const AttentionBwdParams& p, float* d, cudaStream_t stream) {
  FA_CUDA_TRY(launch_dot_do_o(p, d, stream));
  return flash_bwd_two_kernel_sm90(p, d, stream);
}

// The single-kernel backward after its workspace exists (the accumulator zeroed): preprocess, main kernel,
// conversion.
cudaError_t run(const AttentionBwdParams& p, const flash::FlashBwdWorkspace& ws, bool sm90, cudaStream_t stream) {
  FA_CUDA_TRY(launch_dot_do_o(p, ws.d, stream));
  return FA_HEADDIM_SWITCH(p.head_dim, kHeadDim, [&] {
    return FA_BOOL_SWITCH(p.causal, kIsCausal, [&] {
      if (p.dtype == DType::kFloat16) return launch<__half, kHeadDim, kIsCausal>(p, ws, sm90, stream);
      return launch<__nv_bfloat16, kHeadDim, kIsCausal>(p, ws, sm90, stream);
    });
  });
}

}  // namespace

// The backward runs every head dim up to 128 on the Hopper kernels, padded up to their next head dim
// (96 on the d128 kernels: 4/3 of the work on wgmma rather than all of it on mma.sync; the single
// kernel's dQ accumulator then has the Hopper kernel's columns, accum_cols). Head dim 96, bf16, H100,
// B*S = 16k, 21 heads, median of 20, TFLOP/s at 512 / 1k / 2k / 8k (2026-11-26): two kernels on d128
// 192 / 246 / 286 / 306 non-causal, 121 / 179 / 227 / 295 causal; the mma.sync single kernel 145 /
// 182 / 205 / 233 and 84 / 129 / 158 / 206.
bool flash_bwd_runs_sm90(const AttentionBwdParams& p) {
  const int sm90 = flash_bwd_sm90_padded(p.head_dim);
  const bool single = flash::config_for(flash::kBwdSm90Configs, sm90).head_dim == sm90;
  return current_device_props().major == 9 && flash_bwd_sm90_built() && sm90 != 0 && (p.two_kernel || single);
}

const char* flash_bwd_unsupported_reason(const AttentionBwdParams& p) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16)
    return "flash_bwd takes float16 and bfloat16 inputs (float32 has its own kernel: flash_bwd_fp32.h)";
  const int padded = flash::padded_head_dim(p.head_dim);
  if (p.head_dim % 8 != 0 || padded == 0)
    return "this build has no FlashAttention-2 backward kernel for the head dim (FA_HEAD_DIMS left out every "
           "specialisation at least as large)";
  const DeviceProps props = current_device_props();
  if (props.major < kMinComputeMajor)
    return "the CUDA FlashAttention-2 backward needs a GPU of compute capability 8.0 (sm_80) or newer";
  if (p.two_kernel && !flash_bwd_runs_sm90(p))
    return "the two-kernel backward exists for Hopper GPUs (compute capability 9.0, sm_90a builds)";
  if (smem_bytes(padded) > static_cast<size_t>(props.smem_optin))
    return "the GPU has less shared memory per block than the FlashAttention-2 backward kernel for this head dim "
           "needs";
  if (p.seqlen_q > INT32_MAX || p.seqlen_k > INT32_MAX || p.heads_q > INT32_MAX)
    return "seqlens and heads must be below 2^31";  // row and head indices are int in the kernel
  if (ceil_div<int64_t>(p.seqlen_k, block_n(padded)) * p.heads_kv * p.batch > kMaxBlocks)
    return "batch * headsKV * ceil(seqlenK / keys per block) must be below 2^31";
  return flash::bwd_layout_reason(
      p, kAlignElems, "every stride of q, k, v, out, dout and the gradients must be a multiple of 8 elements");
}

bool flash_bwd_supported(const AttentionBwdParams& p) { return flash_bwd_unsupported_reason(p) == nullptr; }

size_t flash_bwd_workspace_bytes(const AttentionBwdParams& p) {
  const flash::BwdWorkspacePlan plan = workspace_plan(p, flash_bwd_runs_sm90(p));
  return plan.accum_bytes + plan.turn_bytes + plan.d_bytes;
}

namespace {

cudaError_t run_with_workspace(const AttentionBwdParams& p, bool sm90, cudaStream_t stream) {
  if (!flash_bwd_supported(p)) return cudaErrorNotSupported;
  FA_CUDA_TRY(cudaGetLastError());  // report an error left pending by earlier work
  return flash::with_bwd_workspace(workspace_plan(p, sm90), stream, [&](const flash::FlashBwdWorkspace& ws) {
    return p.two_kernel ? run_two_kernel(p, ws.d, stream) : run(p, ws, sm90, stream);
  });
}

}  // namespace

const char* flash_bwd_path(const AttentionBwdParams& p) { return flash_bwd_runs_sm90(p) ? "sm90-wgmma" : "sm80-mma"; }

cudaError_t flash_bwd(const AttentionBwdParams& p, cudaStream_t stream) {
  return run_with_workspace(p, flash_bwd_runs_sm90(p), stream);
}

cudaError_t flash_bwd_sm80(const AttentionBwdParams& p, cudaStream_t stream) {
  return run_with_workspace(p, false, stream);
}

}  // namespace fa::cuda
