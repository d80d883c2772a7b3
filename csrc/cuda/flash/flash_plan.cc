// The FlashAttention-2 planners (flash_plan.h).
#include "cuda/flash/flash_plan.h"

#include "cuda/flash/flash_bwd.h"
#include "cuda/flash/flash_bwd_fp32.h"
#include "cuda/flash/flash_fwd.h"
#include "cuda/flash/flash_fwd_fp32.h"
#include "cuda/flash/head_dims.h"

namespace fa::cuda {

const char* family_name(FlashFamily family) {
  switch (family) {
    case FlashFamily::kSm80Mma: return "sm80-mma";
    case FlashFamily::kSm90Wgmma: return "sm90-wgmma";
    case FlashFamily::kFp32Mma: return "fp32-mma";
    default: return nullptr;
  }
}

FwdPlan plan_forward(const AttentionFwdParams& p) {
  FwdPlan plan;
  if (p.dtype == DType::kFloat32) {
    plan.unsupported = flash_fwd_fp32_unsupported_reason(p);
    plan.family = FlashFamily::kFp32Mma;
  } else {
    plan.unsupported = flash_fwd_unsupported_reason(p);
    plan.family = flash_fwd_runs_sm90() ? FlashFamily::kSm90Wgmma : FlashFamily::kSm80Mma;
    if (plan.unsupported == nullptr) plan.workspace_bytes = flash_fwd_workspace_bytes(p);
  }
  const int padded = flash::padded_head_dim(p.head_dim);
  switch (plan.family) {
    case FlashFamily::kFp32Mma: plan.config = flash::fwd_fp32_config(p.fp32_precision, padded); break;
    case FlashFamily::kSm90Wgmma: plan.config = flash::fwd_sm90_config(padded, p); break;
    default: plan.config = flash::config_for(flash::kFwdSm80Configs, padded); break;
  }
  if (plan.unsupported != nullptr) plan.family = FlashFamily::kNone, plan.config = {};
  return plan;
}

cudaError_t run_forward(const AttentionFwdParams& p, const FwdPlan& plan, cudaStream_t stream) {
  switch (plan.family) {
    case FlashFamily::kFp32Mma: return flash_fwd_fp32(p, stream);
    case FlashFamily::kSm80Mma:
    case FlashFamily::kSm90Wgmma: return flash_fwd(p, stream);  // the same rule (flash_fwd_runs_sm90) picks the path
    default: return cudaErrorNotSupported;
  }
}

BwdPlan plan_backward(const AttentionBwdParams& p, BwdAlgorithm algorithm) {
  BwdPlan plan;
  if (p.dtype == DType::kFloat32) {
    plan.unsupported = algorithm == BwdAlgorithm::kTwoKernel
                           ? "the two-kernel backward takes float16 and bfloat16 inputs (float32 has the "
                             "single-kernel one)"
                           : flash_bwd_fp32_unsupported_reason(p);
    plan.family = FlashFamily::kFp32Mma;
    if (plan.unsupported == nullptr) plan.workspace_bytes = flash_bwd_fp32_workspace_bytes(p);
  } else {
    // 'auto' takes the warp-specialized single kernel where it is faster (flash_configs.h
    // kBwdWsMinSeqlen), else tries the two kernels first and falls back to the single kernel where
    // they cannot run.
    AttentionBwdParams q = p;
    q.two_kernel = false;
    const bool single_faster = flash_bwd_runs_sm90(q) && flash_bwd_sm90_ws(q) && p.seqlen_q >= flash::kBwdWsMinSeqlen &&
                               p.seqlen_k >= flash::kBwdWsMinSeqlen;
    q.two_kernel = algorithm == BwdAlgorithm::kTwoKernel || (algorithm == BwdAlgorithm::kAuto && !single_faster);
    plan.unsupported = flash_bwd_unsupported_reason(q);
    if (algorithm == BwdAlgorithm::kAuto && plan.unsupported != nullptr) {
      q.two_kernel = false;
      plan.unsupported = flash_bwd_unsupported_reason(q);
    }
    plan.two_kernel = q.two_kernel;
    plan.family = flash_bwd_runs_sm90(q) ? FlashFamily::kSm90Wgmma : FlashFamily::kSm80Mma;
    if (plan.unsupported == nullptr) plan.workspace_bytes = flash_bwd_workspace_bytes(q);
  }
  const int padded = flash::padded_head_dim(p.head_dim);
  switch (plan.family) {
    case FlashFamily::kFp32Mma: plan.config = flash::config_for(flash::kBwdFp32Configs, padded); break;
    case FlashFamily::kSm90Wgmma: {
      AttentionBwdParams q = p;
      q.two_kernel = plan.two_kernel;
      if (flash_bwd_sm90_ws(q)) {
        plan.config = flash::config_for(flash::kBwdWsSm90Configs, flash_bwd_sm90_padded(p.head_dim));
        break;
      }
      const int sm90 = flash_bwd_sm90_padded(p.head_dim);
      plan.config = flash::config_for(flash::kBwdSm90Configs, sm90);
      if (plan.config.head_dim == 0) plan.config = flash::config_for(flash::kBwdWideSm90Configs, sm90);
      break;
    }
    default: plan.config = flash::config_for(flash::kBwdSm80Configs, padded); break;
  }
  if (plan.unsupported != nullptr) plan.family = FlashFamily::kNone, plan.two_kernel = false, plan.config = {};
  return plan;
}

cudaError_t run_backward(const AttentionBwdParams& p, const BwdPlan& plan, cudaStream_t stream) {
  AttentionBwdParams q = p;
  q.two_kernel = plan.two_kernel;
  switch (plan.family) {
    case FlashFamily::kFp32Mma: return flash_bwd_fp32(q, stream);
    case FlashFamily::kSm80Mma:
    case FlashFamily::kSm90Wgmma: return flash_bwd(q, stream);  // the same rule (flash_bwd_runs_sm90) picks the path
    default: return cudaErrorNotSupported;
  }
}

}  // namespace fa::cuda
