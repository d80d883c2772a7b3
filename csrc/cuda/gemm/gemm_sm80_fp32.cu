// sm_80+ GEMM launches for fp32 operands on TF32 tensor cores (mma.sync m16n8k8; 3xTF32 for
// Fp32Precision::kHighest); see gemm_sm80_kernel.cuh.
#include "cuda/gemm/gemm_sm80_launch.cuh"

namespace fa::cuda::gemm_kernels {

cudaError_t gemm_sm80_fp32(const GemmParams& p, const GemmPlan& plan, float* partial, cudaStream_t stream) {
  if (p.fp32_precision == Fp32Precision::kHighest)
    return run_sm80<float, Fp32Precision::kHighest>(p, plan, partial, stream);
  return run_sm80<float, Fp32Precision::kTf32>(p, plan, partial, stream);
}

}  // namespace fa::cuda::gemm_kernels
