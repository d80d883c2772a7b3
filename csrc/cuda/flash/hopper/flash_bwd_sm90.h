// The Hopper (sm_90a, wgmma + TMA) path of the FA2 backward, reached through flash_bwd (flash_bwd.h),
// which owns the support check, the workspace and the two small kernels around this one.
#pragma once
#include <cuda_runtime_api.h>

#include "common/attention_params.h"
#include "cuda/flash/dq_accum.cuh"

namespace fa::cuda {

// True when this build has the sm_90a kernels (the build's architectures include 90a).
bool flash_bwd_sm90_built();

// The single kernel for p (dQ into ws.dq_accum, dK and dV into p.dk, p.dv): the warp-specialized one
// where flash_bwd_sm90_ws(p) (flash_bwd.h), else the main kernel; ws.d must be written.
cudaError_t flash_bwd_sm90(const AttentionBwdParams& p, const flash::FlashBwdWorkspace& ws, cudaStream_t stream);

// The two-kernel backward: the dK/dV kernel (the main kernel without dQ), then the dQ kernel writing
// p.dq directly. d_rows = D = rowsum(dO o O) [B, Hq, Sq] must be written.
cudaError_t flash_bwd_two_kernel_sm90(const AttentionBwdParams& p, float* d_rows, cudaStream_t stream);

}  // namespace fa::cuda
