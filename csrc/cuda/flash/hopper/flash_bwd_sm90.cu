// Launcher of the Hopper FA2 backward's kernels: the call's tensor maps (q, dout, k, v; the single
// kernel's dQ accumulator), the dtype x head dim x causal dispatch, dynamic shared-memory attribute,
// launch. The single kernel at head dims 33-128 is the warp-specialized one (flash_bwd_ws_sm90_kernel.cuh,
// its row of flash::kBwdWsSm90Configs; ptxas: 168 registers at launch, setmaxnreg 24 / 240; spill loads
// d128 4 bytes, causal 8; d64 4, causal 24); the main kernel elsewhere. Compiled for every target; the
// kernels have a body only in the sm_90a pass, and flash_bwd_sm90_built() tells the dispatcher whether
// that pass was part of the build.
//
// The main kernel: 64 query rows per step, 128 keys per block (2 warpgroups x 64); dQ split by 64-column
// halves at head dim 128, warpgroup 0's at 32 and 64. Deterministic calls launch ws.splits blocks per
// KV head, each taking every splits-th K/V tile. The two-kernel backward (p.two_kernel) launches the
// same kernel without dQ, then the dQ kernel (128 query rows per block, 64-key K/V tiles; 32-key at
// head dim 256); at head dims 192 and 256 its dK/dV kernel is flash_bwd_wide_sm90_kernel.cuh (64 keys
// per block, warpgroup 0 accumulating dV and warpgroup 1 dK). ptxas (sm_90a, non-causal / causal
// registers, spill stores): single kernel d64 201 / 222, d128 255 (4 bytes) / 255 (168 bytes); dK/dV
// kernel d128 238 / 254, no spills; wide dK/dV kernel d192 166 / 218, d256 199 / 254, no spills; dQ
// kernel d192 190 / 218, d256 187 / 234, no spills (its causal rare path out of line).
// Other head dims of the single kernel run the mma.sync kernel (flash_bwd.cu).
#include "cuda/flash/hopper/flash_bwd_sm90.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/cuda_utils.cuh"
#include "cuda/device_props.h"
#include "cuda/flash/flash_bwd.h"
#include "cuda/flash/flash_configs.h"
#include "cuda/flash/hopper/flash_bwd_dq_sm90_kernel.cuh"
#include "cuda/flash/hopper/flash_bwd_sm90_kernel.cuh"
#include "cuda/flash/hopper/flash_bwd_wide_sm90_kernel.cuh"
#include "cuda/flash/hopper/flash_bwd_ws_sm90_kernel.cuh"
#include "cuda/flash/hopper/tensor_map.h"
#include "cuda/flash/static_switch.h"

namespace fa::cuda {
namespace {

// The rows of flash::kBwdSm90Configs (the main kernel: query rows per step) and kBwdDqSm90Configs
// (the two-kernel backward's dQ kernel: keys per K/V tile; 128 query rows per block, 2 warpgroups),
// flash_configs.h. A head dim without a row has no Hopper backward.
template <int kHeadDim>
constexpr flash::FlashConfig kSm90Config = flash::config_for(flash::kBwdSm90Configs, kHeadDim);
template <int kHeadDim>
constexpr flash::FlashConfig kDqSm90Config = flash::config_for(flash::kBwdDqSm90Configs, kHeadDim);
template <int kHeadDim>
constexpr flash::FlashConfig kWideSm90Config = flash::config_for(flash::kBwdWideSm90Configs, kHeadDim);
template <int kHeadDim>
constexpr bool kSm90Supported = kSm90Config<kHeadDim>.head_dim == kHeadDim;
template <int kHeadDim>
constexpr bool kWideSupported = kWideSm90Config<kHeadDim>.head_dim == kHeadDim;

CUtensorMapDataType map_type(const AttentionBwdParams& p) {
  return p.dtype == DType::kFloat16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}

// q / dout boxes of q_rows rows, k / v boxes of kv_rows rows.
template <typename Maps>
cudaError_t make_bwd_maps(Maps* maps, const AttentionBwdParams& p, int q_rows, int kv_rows) {
  const CUtensorMapDataType type = map_type(p);
  FA_CUDA_TRY(make_map(&maps->q, type, p.q, p.head_dim, p.seqlen_q, p.heads_q, p.batch, p.q_row_stride,
                       p.q_head_stride, p.q_batch_stride, q_rows));
  FA_CUDA_TRY(make_map(&maps->dout, type, p.dout, p.head_dim, p.seqlen_q, p.heads_q, p.batch, p.do_row_stride,
                       p.do_head_stride, p.do_batch_stride, q_rows));
  FA_CUDA_TRY(make_map(&maps->k, type, p.k, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.k_row_stride,
                       p.k_head_stride, p.k_batch_stride, kv_rows));
  FA_CUDA_TRY(make_map(&maps->v, type, p.v, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.v_row_stride,
                       p.v_head_stride, p.v_batch_stride, kv_rows));
  return cudaSuccess;
}

// The main kernel (kComputeDq) or the dK/dV kernel of the two-kernel backward.
template <typename Elem, int kHeadDim, bool kIsCausal, bool kComputeDq>
cudaError_t launch(const AttentionBwdParams& p, const flash::FlashBwdWorkspace& ws, cudaStream_t stream) {
  if constexpr (!kSm90Supported<kHeadDim>) {
    return cudaErrorNotSupported;
  } else {
    using Traits = flash::sm90::FlashBwdSm90Traits<kHeadDim, kSm90Config<kHeadDim>.block_m, Elem>;
    static_assert(flash::row_matches<Traits>(kSm90Config<kHeadDim>), "the row reports the traits' tile");
    flash::sm90::BwdTensorMaps maps{};
    FA_CUDA_TRY(make_bwd_maps(&maps, p, Traits::kBlockM, Traits::kBlockN));
    if constexpr (kComputeDq)
      FA_CUDA_TRY(make_accum_map(&maps.dq_accum, ws.dq_accum, kHeadDim, ws.dq_rows, p.heads_q, p.batch,
                                 ws.splits, ws.split_stride, Traits::kBlockM));
    auto kernel = flash::sm90::flash_bwd_sm90_kernel<Traits, kIsCausal, kComputeDq>;
    constexpr size_t kSmem = kComputeDq ? Traits::kSmemBytes : Traits::kDkDvSmemBytes;
    FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)));
    const int64_t tiles = p.deterministic && kComputeDq ? ws.splits : ceil_div<int64_t>(p.seqlen_k, Traits::kBlockN);
    const int64_t blocks = tiles * p.heads_kv * p.batch;
    kernel<<<static_cast<unsigned>(blocks), Traits::kNThreads, kSmem, stream>>>(p, maps, ws);
    return cudaGetLastError();
  }
}

// The dK/dV kernel of the two-kernel backward at head dims 192 and 256.
template <typename Elem, int kHeadDim, bool kIsCausal>
cudaError_t launch_wide(const AttentionBwdParams& p, const flash::FlashBwdWorkspace& ws, cudaStream_t stream) {
  if constexpr (!kWideSupported<kHeadDim>) {
    return cudaErrorNotSupported;
  } else {
    using Traits = flash::sm90::FlashBwdWideSm90Traits<kHeadDim, Elem>;
    static_assert(flash::row_matches<Traits>(kWideSm90Config<kHeadDim>), "the row reports the traits' tile");
    flash::sm90::BwdTensorMaps maps;
    FA_CUDA_TRY(make_bwd_maps(&maps, p, Traits::kBlockM, Traits::kBlockN));
    auto kernel = flash::sm90::flash_bwd_wide_sm90_kernel<Traits, kIsCausal>;
    FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(Traits::kSmemBytes)));
    const int64_t blocks = ceil_div<int64_t>(p.seqlen_k, Traits::kBlockN) * p.heads_kv * p.batch;
    kernel<<<static_cast<unsigned>(blocks), Traits::kNThreads, Traits::kSmemBytes, stream>>>(p, maps, ws);
    return cudaGetLastError();
  }
}

template <typename Elem, int kHeadDim, bool kIsCausal>
cudaError_t launch_dq(const AttentionBwdParams& p, const float* d_rows, cudaStream_t stream) {
  if constexpr (kDqSm90Config<kHeadDim>.head_dim != kHeadDim) {
    return cudaErrorNotSupported;
  } else {
    using Traits = flash::sm90::FlashBwdDqSm90Traits<kHeadDim, kDqSm90Config<kHeadDim>.block_n, Elem>;
    static_assert(flash::row_matches<Traits>(kDqSm90Config<kHeadDim>), "the row reports the traits' tile");
    flash::sm90::BwdDqTensorMaps maps;
    FA_CUDA_TRY(make_bwd_maps(&maps, p, Traits::kBlockM, Traits::kBlockN));
    auto kernel = flash::sm90::flash_bwd_dq_sm90_kernel<Traits, kIsCausal>;
    FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(Traits::kSmemBytes)));
    flash::QueryTileScheduler sched;  // one block per work item
    if (!flash::make_query_tile_scheduler<Traits::kBlockM>(&sched, p))
      return cudaErrorInvalidConfiguration;
    kernel<<<sched.items, Traits::kNThreads, Traits::kSmemBytes, stream>>>(p, maps, d_rows, sched);
    return cudaGetLastError();
  }
}

// The warp-specialized single kernel (head dims 64 and 128).
template <typename Elem, int kHeadDim, bool kIsCausal>
cudaError_t launch_ws(const AttentionBwdParams& p, const flash::FlashBwdWorkspace& ws, cudaStream_t stream) {
  constexpr flash::FlashConfig kRow = flash::config_for(flash::kBwdWsSm90Configs, kHeadDim);
  using Traits = flash::sm90::FlashBwdWsSm90Traits<kHeadDim, Elem, kIsCausal, kRow.block_m>;
  static_assert(flash::row_matches<Traits>(kRow), "the row reports the traits' tile");
  flash::sm90::BwdTensorMaps maps{};
  FA_CUDA_TRY(make_bwd_maps(&maps, p, Traits::kBlockM, Traits::kBlockN));
  FA_CUDA_TRY(make_accum_map(&maps.dq_accum, ws.dq_accum, kHeadDim, ws.dq_rows, p.heads_q, p.batch, ws.splits,
                             ws.split_stride, Traits::kDqRows));
  const CUtensorMapDataType type = map_type(p);
  FA_CUDA_TRY(make_map(&maps.dk, type, p.dk, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.dk_row_stride,
                       p.dk_head_stride, p.dk_batch_stride, Traits::kWgKeys));
  FA_CUDA_TRY(make_map(&maps.dv, type, p.dv, p.head_dim, p.seqlen_k, p.heads_kv, p.batch, p.dv_row_stride,
                       p.dv_head_stride, p.dv_batch_stride, Traits::kWgKeys));
  const int64_t n_tiles = ceil_div<int64_t>(p.seqlen_k, Traits::kBlockN);
  const int64_t blocks = n_tiles * p.heads_kv * p.batch;
  // Deterministic without a causal mask, where the K/V tiles of a KV head fit on half of the SMs (one
  // block per SM): the rotated walks (tile_scheduler.cuh; a block may wait on a later block of its
  // head). H100, bf16, queued ms at 1k / 2k, two rounds, same run (2026-11-27): d128 1.005 / 1.625
  // against 1.045 / 1.71 in lockstep (the atomic kernel: 0.90 / 1.50); d64 1.576 / 2.700 against
  // 1.850 / 3.188 (atomic 1.24 / 2.05).
  const bool rotated = !kIsCausal && p.deterministic && n_tiles <= current_device_props().sms / 2;
  const auto launch = [&](auto kernel) {
    FA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(Traits::kSmemBytes)));
    kernel<<<static_cast<unsigned>(blocks), Traits::kNThreads, Traits::kSmemBytes, stream>>>(p, maps, ws);
    return cudaGetLastError();
  };
  if constexpr (!kIsCausal) {
    if (rotated) return launch(flash::sm90::flash_bwd_ws_sm90_kernel<Traits, true>);
  }
  return launch(flash::sm90::flash_bwd_ws_sm90_kernel<Traits, false>);
}

}  // namespace

bool flash_bwd_sm90_built() {
#ifdef FA_HAS_SM90A
  return true;
#else
  return false;
#endif
}

int flash_bwd_sm90_padded(int64_t head_dim) {
  for (const flash::FlashConfig& c : flash::kBwdSm90Configs)
    if (head_dim <= c.head_dim && flash::padded_head_dim(c.head_dim) == c.head_dim) return c.head_dim;
  const int padded = flash::padded_head_dim(head_dim);
  return flash::config_for(flash::kBwdWideSm90Configs, padded).head_dim == padded ? padded : 0;
}

bool flash_bwd_sm90_ws(const AttentionBwdParams& p) {
  const int sm90 = flash_bwd_sm90_padded(p.head_dim);
  return sm90 != 0 && flash::config_for(flash::kBwdWsSm90Configs, sm90).head_dim == sm90 && !p.two_kernel;
}

cudaError_t flash_bwd_sm90(const AttentionBwdParams& p, const flash::FlashBwdWorkspace& ws, cudaStream_t stream) {
  if (flash_bwd_sm90_ws(p))
    return FA_BOOL_SWITCH(p.causal, kIsCausal, [&] {
      if (flash_bwd_sm90_padded(p.head_dim) == 64)
        return p.dtype == DType::kFloat16 ? launch_ws<__half, 64, kIsCausal>(p, ws, stream)
                                          : launch_ws<__nv_bfloat16, 64, kIsCausal>(p, ws, stream);
      return p.dtype == DType::kFloat16 ? launch_ws<__half, 128, kIsCausal>(p, ws, stream)
                                        : launch_ws<__nv_bfloat16, 128, kIsCausal>(p, ws, stream);
    });
  return FA_HEADDIM_SWITCH(flash_bwd_sm90_padded(p.head_dim), kHeadDim, [&] {
    return FA_BOOL_SWITCH(p.causal, kIsCausal, [&] {
      if (p.dtype == DType::kFloat16) return launch<__half, kHeadDim, kIsCausal, true>(p, ws, stream);
      return launch<__nv_bfloat16, kHeadDim, kIsCausal, true>(p, ws, stream);
    });
  });
}

cudaError_t flash_bwd_two_kernel_sm90(const AttentionBwdParams& p, float* d_rows, cudaStream_t stream) {
  flash::FlashBwdWorkspace ws{};  // the dK/dV kernel reads D only
  ws.d = d_rows;
  return FA_HEADDIM_SWITCH(flash_bwd_sm90_padded(p.head_dim), kHeadDim, [&] {
    return FA_BOOL_SWITCH(p.causal, kIsCausal, [&] {
      if (p.dtype == DType::kFloat16) {
        if constexpr (kWideSupported<kHeadDim>)
          FA_CUDA_TRY((launch_wide<__half, kHeadDim, kIsCausal>(p, ws, stream)));
        else
          FA_CUDA_TRY((launch<__half, kHeadDim, kIsCausal, false>(p, ws, stream)));
        return launch_dq<__half, kHeadDim, kIsCausal>(p, d_rows, stream);
      }
      if constexpr (kWideSupported<kHeadDim>)
        FA_CUDA_TRY((launch_wide<__nv_bfloat16, kHeadDim, kIsCausal>(p, ws, stream)));
      else
        FA_CUDA_TRY((launch<__nv_bfloat16, kHeadDim, kIsCausal, false>(p, ws, stream)));
      return launch_dq<__nv_bfloat16, kHeadDim, kIsCausal>(p, d_rows, stream);
    });
  });
}

}  // namespace fa::cuda
