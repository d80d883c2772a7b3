// Launcher of the FA2 forward (sm_80+ mma.sync path): dtype x head_dim x causal dispatch through
// static_switch.h, dynamic shared-memory attribute, launch on the caller's stream, cudaGetLastError.
//
// Configuration (first cut): kBlockM 64 (4 warps x one 16-row mma tile), kBlockN 64, 2 K/V stages.
// ptxas -v (CUDA 13.0, sm_80 and sm_90a; the same for fp16 and bf16, causal and not):
//   head_dim  64: 128 registers (causal 167), 0 bytes stack, 0 bytes spill, dynamic smem 46080 bytes
//   head_dim 128: 236 registers (causal 242; sm_90a 239 / 243), 0 bytes spill, dynamic smem 87040 bytes
// Occupancy by registers (65536 per SM): head_dim 64 non-causal 4 blocks/SM, causal 3; head_dim 128
// 2 blocks/SM. A 128-row tile (2 row tiles per warp) at head_dim 128 would exceed 255 and spill.
#include "cuda/flash/flash_fwd.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/flash/flash_fwd_kernel.cuh"
#include "cuda/flash/flash_fwd_traits.h"
#include "cuda/flash/static_switch.h"

namespace fa::cuda {
namespace {

constexpr int kFwdBlockM = 64;
constexpr int kFwdBlockN = 64;
constexpr int kFwdWarps = 4;
constexpr int kMaxGridYZ = 65535;  // hardware limit of gridDim.y and gridDim.z
constexpr int64_t kAlignElems = 8;  // 16 bytes of fp16 / bf16: the cp.async granule
constexpr uintptr_t kAlignBytes = 16;

template <typename Elem, int kHeadDim, bool kIsCausal>
cudaError_t launch_flash_fwd(const AttentionFwdParams& p, cudaStream_t stream) {
  using Traits = flash::FlashFwdTraits<kHeadDim, kFwdBlockM, kFwdBlockN, kFwdWarps, Elem>;
  auto kernel = flash::flash_fwd_kernel<Traits, kIsCausal>;
  FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(Traits::kSmemBytes)));
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(p.seqlen_q, Traits::kBlockM)),
                  static_cast<unsigned>(p.heads_q), static_cast<unsigned>(p.batch));
  kernel<<<grid, Traits::kNThreads, Traits::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

bool aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kAlignBytes == 0; }

}  // namespace

bool flash_fwd_supported(const AttentionFwdParams& p) {
  if (p.dtype != DType::kFloat16 && p.dtype != DType::kBFloat16) return false;
  if (p.head_dim != 64 && p.head_dim != 128) return false;
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess || major < 8) return false;
  if (p.heads_q > kMaxGridYZ || p.batch > kMaxGridYZ) return false;
  if (p.seqlen_q > INT32_MAX || p.seqlen_k > INT32_MAX) return false;  // row indices are int in the kernel
  if (!aligned(p.q) || !aligned(p.k) || !aligned(p.v) || !aligned(p.out)) return false;
  const int64_t strides[] = {p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.k_batch_stride,
                             p.k_row_stride,   p.k_head_stride, p.v_batch_stride, p.v_row_stride,
                             p.v_head_stride,  p.o_batch_stride, p.o_row_stride, p.o_head_stride};
  for (int64_t s : strides)
    if (s % kAlignElems != 0) return false;
  return true;
}

cudaError_t flash_fwd(const AttentionFwdParams& p, cudaStream_t stream) {
  if (!flash_fwd_supported(p)) return cudaErrorNotSupported;
  FA_CUDA_TRY(cudaGetLastError());  // report an error left pending by earlier work
  return FA_HEADDIM_SWITCH(p.head_dim, kHeadDim, [&] {
    return FA_BOOL_SWITCH(p.causal, kIsCausal, [&] {
      if (p.dtype == DType::kFloat16) return launch_flash_fwd<__half, kHeadDim, kIsCausal>(p, stream);
      return launch_flash_fwd<__nv_bfloat16, kHeadDim, kIsCausal>(p, stream);
    });
  });
}

}  // namespace fa::cuda
