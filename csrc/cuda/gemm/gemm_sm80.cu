// sm_80+ GEMM launches for fp16 / bf16 operands (mma.sync m16n8k16); see gemm_sm80_kernel.cuh.
#include "cuda/gemm/gemm_sm80_launch.cuh"

namespace fa::cuda::gemm_kernels {

cudaError_t gemm_sm80_16bit(const GemmParams& p, const GemmPlan& plan, float* partial, cudaStream_t stream) {
  if (p.ab_dtype == DType::kFloat16) return run_sm80<__half, Fp32Precision::kTf32>(p, plan, partial, stream);
  return run_sm80<__nv_bfloat16, Fp32Precision::kTf32>(p, plan, partial, stream);
}

}  // namespace fa::cuda::gemm_kernels
