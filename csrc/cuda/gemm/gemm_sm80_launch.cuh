// Host side of the sm_80+ GEMM: the launch of one (configuration, operand type, layout, load path)
// of gemm_sm80_kernel.cuh, and the switch from a plan to it. Included by gemm_sm80.cu (fp16 / bf16)
// and gemm_sm80_fp32.cu (TF32), which compile in parallel.
#pragma once
#include <cuda_runtime.h>

#include "cuda/cuda_utils.cuh"
#include "cuda/gemm/gemm_plan.h"
#include "cuda/gemm/gemm_sm80_kernel.cuh"
#include "cuda/gemm/gemm_sm80_traits.h"

namespace fa::cuda::gemm_kernels {

template <typename Elem, typename Config, bool kAK, bool kBK, bool kVec, Fp32Precision kPrecision>
cudaError_t launch_sm80(const GemmParams& p, const GemmPlan& plan, float* partial, cudaStream_t stream) {
  using Traits = Sm80Traits<Elem, Config, kAK, kBK>;
  auto kernel = gemm_sm80_kernel<Traits, kVec, kPrecision>;
  FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Traits::kSmemBytes));
  kernel<<<static_cast<unsigned>(plan.blocks), Traits::kNThreads, Traits::kSmemBytes, stream>>>(
      p, partial, plan.splits, plan.k_tiles_per_split);
  return cudaGetLastError();
}

// Layout switch; the element-by-element fallback exists in the small configuration only.
template <typename Elem, Fp32Precision kPrecision>
cudaError_t run_sm80(const GemmParams& p, const GemmPlan& plan, float* partial, cudaStream_t stream) {
  auto by_layout = [&](auto config_tag, auto vec_tag) -> cudaError_t {
    using Config = typename decltype(config_tag)::type;
    constexpr bool kVec = decltype(vec_tag)::value;
    if (p.a_k_major && p.b_k_major) return launch_sm80<Elem, Config, true, true, kVec, kPrecision>(p, plan, partial, stream);
    if (p.a_k_major) return launch_sm80<Elem, Config, true, false, kVec, kPrecision>(p, plan, partial, stream);
    if (p.b_k_major) return launch_sm80<Elem, Config, false, true, kVec, kPrecision>(p, plan, partial, stream);
    return launch_sm80<Elem, Config, false, false, kVec, kPrecision>(p, plan, partial, stream);
  };
  if (!plan.vec) return by_layout(TypeTag<Sm80Small>{}, std::false_type{});
  if (plan.tile == Sm80Tile::kLarge) return by_layout(TypeTag<Sm80Large>{}, std::true_type{});
  return by_layout(TypeTag<Sm80Small>{}, std::true_type{});
}

}  // namespace fa::cuda::gemm_kernels
