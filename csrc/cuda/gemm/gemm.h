// CUDA GEMM (csrc/common/gemm_params.h): a planner picks the kernel (wgmma + TMA on sm_90a, mma.sync
// elsewhere) and its tile configuration for the shape, then launches it on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/gemm_params.h"

namespace fa::cuda {

// Why no CUDA GEMM exists for `p` on the current device (a static string), or nullptr.
const char* gemm_unsupported_reason(const GemmParams& p);
// Workspace the chosen plan needs (split-K partials, packed copies of operands that 16-byte loads
// cannot read); the caller allocates it. gemm() without it runs unsplit, reading such operands
// element by element.
size_t gemm_workspace_bytes(const GemmParams& p);
cudaError_t gemm(const GemmParams& p, void* workspace, cudaStream_t stream);

}  // namespace fa::cuda
