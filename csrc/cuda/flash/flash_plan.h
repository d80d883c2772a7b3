// The FlashAttention-2 planners, one per pass: for one call on the current device, the kernel
// family that runs it (and, for the backward, the algorithm, 'auto' resolved, and the workspace),
// or why none can. The napi layer plans before it allocates and launches what the plan says; the
// result it returns to JS names the algorithm that ran. The rules each planner applies live beside
// their launchers (flash_fwd.h, flash_bwd.h, flash_fwd_fp32.h, flash_bwd_fp32.h); this is the one
// place that combines them. Host only (CUDA runtime API).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/attention_params.h"
#include "cuda/flash/flash_configs.h"

namespace fa::cuda {

// The kernel families of the FA2 passes.
enum class FlashFamily : int {
  kNone = 0,   // no FA2 kernel can run the call (the plan's `unsupported` says why)
  kSm80Mma,    // mma.sync, fp16 / bf16, sm_80+
  kSm90Wgmma,  // wgmma + TMA, fp16 / bf16, Hopper on sm_90a builds
  kFp32Mma,    // mma.sync on TF32 (or 3xTF32), float32, sm_80+
};
// The family's name in results and reports ('sm80-mma', 'sm90-wgmma', 'fp32-mma'; lib/attention.ts
// KernelFamily); nullptr for kNone.
const char* family_name(FlashFamily family);

struct FwdPlan {
  FlashFamily family = FlashFamily::kNone;
  flash::FlashConfig config{};        // the family's row for the call's padded head dim (flash_configs.h)
  size_t workspace_bytes = 0;         // what the launch allocates on its stream (and frees)
  const char* unsupported = nullptr;  // a sentence for an error message when family is kNone
};
FwdPlan plan_forward(const AttentionFwdParams& p);
// Launches the planned forward on `stream` (cudaErrorNotSupported for a plan of kNone).
cudaError_t run_forward(const AttentionFwdParams& p, const FwdPlan& plan, cudaStream_t stream);

struct BwdPlan {
  FlashFamily family = FlashFamily::kNone;  // of the main kernels
  flash::FlashConfig config{};              // the main kernel's row for the padded head dim (flash_configs.h)
  // The algorithm: the two-kernel backward (dK/dV, then dQ without atomics) or the single kernel.
  // BwdAlgorithm::kAuto takes the two kernels wherever they exist (Hopper, fp16 / bf16): they need no
  // fp32 dq accumulator and are deterministic. Except the single kernel on Hopper where it is faster:
  // the warp-specialized kernel at head dims 33-128 from flash_configs.h kBwdWsMinSeqlen queries and
  // keys.
  bool two_kernel = false;
  const char* unsupported = nullptr;  // a sentence for an error message when family is kNone
  size_t workspace_bytes = 0;         // what the launch allocates on its stream (and frees)
};
// p.two_kernel is ignored: the algorithm decides it.
BwdPlan plan_backward(const AttentionBwdParams& p, BwdAlgorithm algorithm);
// Launches the planned backward on `stream` with p.two_kernel as the plan says (cudaErrorNotSupported
// for a plan of kNone).
cudaError_t run_backward(const AttentionBwdParams& p, const BwdPlan& plan, cudaStream_t stream);

}  // namespace fa::cuda
