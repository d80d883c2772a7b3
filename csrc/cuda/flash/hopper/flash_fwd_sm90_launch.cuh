// Host side of the Hopper FA2 forward: the TMA tensor maps of a call and the launch of one kernel
// configuration. A header so that checks can launch configurations other than the shipped ones
// (test/native/flash_fwd_check.cu times alternatives side by side); flash_fwd_sm90.cu picks the
// shipped configuration per head dim.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/attention_params.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/device_props.h"
#include "cuda/flash/flash_configs.h"
#include "cuda/flash/hopper/flash_fwd_sm90_kernel.cuh"
#include "cuda/flash/hopper/flash_fwd_sm90_ws_kernel.cuh"
#include "cuda/flash/hopper/tensor_map.h"

namespace fa::cuda {

// The call's tensor maps for tiles of Traits::kBlockM query rows and Traits::kBlockN keys.
template <typename Traits>
cudaError_t make_fwd_maps(flash::sm90::FwdTensorMaps* maps, const AttentionFwdParams& p) {
  const CUtensorMapDataType type =
      p.dtype == DType::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  FA_CUDA_TRY(make_map(&maps->q, type, p.q, p.head_dim, p.seqlen_q, p.heads_q, p.batch, p.q_row_stride,
                       p.q_head_stride, p.q_batch_stride, Traits::kBlockM));
  FA_CUDA_TRY(make_map(&maps->k, type, p.k, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.k_row_stride,
                       p.k_head_stride, p.k_batch_stride, Traits::kBlockN));
  FA_CUDA_TRY(make_map(&maps->v, type, p.v, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.v_row_stride,
                       p.v_head_stride, p.v_batch_stride, Traits::kBlockN));
  if constexpr (Traits::kStagedO)
    FA_CUDA_TRY(make_map(&maps->o, type, p.out, p.head_dim, p.seqlen_q, p.heads_q, p.batch, p.o_row_stride,
                         p.o_head_stride, p.o_batch_stride, Traits::kWgRows));
  return cudaSuccess;
}

// Builds the call's tensor maps and launches `kernel` of configuration Traits: one block per query
// tile (work item), or, persistent, one per SM and never more than the items (the warp-specialized
// kernel's shared memory allows no second block on an SM). sched: the call's work items
// (query_tile_scheduler.h, fewer than 2^31); `extra`: the kernel's arguments after the params, maps and
// scheduler.
template <typename Traits, typename Kernel, typename... Extra>
cudaError_t launch_fwd_kernel(Kernel kernel, bool persistent, const AttentionFwdParams& p,
                              const flash::QueryTileScheduler& sched, cudaStream_t stream, Extra... extra) {
  flash::sm90::FwdTensorMaps maps;
  FA_CUDA_TRY(make_fwd_maps<Traits>(&maps, p));
  FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   static_cast<int>(Traits::kSmemBytes)));
  const int64_t items = sched.items;
  const int64_t blocks = persistent ? std::min<int64_t>(items, current_device_props().sms) : items;
  kernel<<<static_cast<unsigned>(blocks), Traits::kNThreads, Traits::kSmemBytes, stream>>>(p, maps, sched, extra...);
  return cudaGetLastError();
}

// The kernel of configuration Traits: the two-warpgroup one (flash_fwd_sm90_kernel.cuh) or the
// warp-specialized persistent one (flash_fwd_sm90_ws_kernel.cuh).
template <typename Traits, bool kIsCausal>
cudaError_t launch_flash_fwd_sm90(const AttentionFwdParams& p, cudaStream_t stream) {
  flash::QueryTileScheduler sched;
  if (!flash::make_query_tile_scheduler<Traits::kBlockM>(&sched, p))
    return cudaErrorInvalidConfiguration;
  return launch_fwd_kernel<Traits>(flash::sm90::flash_fwd_sm90_kernel<Traits, kIsCausal>, false, p, sched, stream);
}
// Causal calls hand out their work items from a counter (flash_fwd_sm90_ws_kernel.cuh), taken from the
// stream's memory pool (flash::kFwdSm90ItemCounterBytes), zeroed on the stream before the launch and
// freed after it. The first error is returned and not left pending.
template <typename Traits, bool kIsCausal>
cudaError_t launch_flash_fwd_sm90_ws(const AttentionFwdParams& p, cudaStream_t stream) {
  const auto kernel = flash::sm90::flash_fwd_sm90_ws_kernel<Traits, kIsCausal>;
  flash::QueryTileScheduler sched;
  if (!flash::make_query_tile_scheduler<Traits::kBlockM>(&sched, p, Traits::kL2SectionKiB, Traits::kL2SectionMaxHeads))
    return cudaErrorInvalidConfiguration;
  if constexpr (!kIsCausal) {
    return launch_fwd_kernel<Traits>(kernel, true, p, sched, stream, static_cast<uint32_t*>(nullptr));
  } else {
    return with_stream_workspace(flash::kFwdSm90ItemCounterBytes, stream, [&](char* counter) {
      FA_CUDA_TRY(cudaMemsetAsync(counter, 0, flash::kFwdSm90ItemCounterBytes, stream));
      return launch_fwd_kernel<Traits>(kernel, true, p, sched, stream, reinterpret_cast<uint32_t*>(counter));
    });
  }
}

}  // namespace fa::cuda
