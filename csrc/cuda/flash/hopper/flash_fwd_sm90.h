// Launcher of the Hopper (sm_90a, wgmma) FA2 forward. Plain C++ header; see flash_fwd.h for the
// contract (flash_fwd picks this path on compute capability 9.0 when the build has sm_90a code).
#pragma once
#include <cuda_runtime_api.h>

#include "common/attention_params.h"

namespace fa::cuda {

// True when this build carries the sm_90a kernels (FA_CUDA_ARCHS includes 90a).
bool flash_fwd_sm90_built();

// Enqueues the forward for p (already checked by flash_fwd_supported) on `stream`.
cudaError_t flash_fwd_sm90(const AttentionFwdParams& p, cudaStream_t stream);

}  // namespace fa::cuda
