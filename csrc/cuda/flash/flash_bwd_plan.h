// Host-side workspace plan shared by the FA2 backward launchers: how many fp32 dQ accumulator slices
// deterministic mode uses, the accumulator's and D's sizes, and the stream-ordered allocation around a
// backward run. Include from .cu files only (CUDA runtime API, no device code).
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/attention_params.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/device_props.h"
#include "cuda/flash/dq_accum.cuh"
#include "cuda/flash/launch_checks.h"

namespace fa::cuda::flash {

inline constexpr size_t kBwdWorkspaceAlign = 256;
// Bytes rounded up to kBwdWorkspaceAlign: each workspace part starts aligned.
inline size_t workspace_bytes(size_t bytes) {
  return (bytes + kBwdWorkspaceAlign - 1) / kBwdWorkspaceAlign * kBwdWorkspaceAlign;
}
// Deterministic mode: accumulator slices per KV head (each is a whole accumulator). Always up to
// kMinDeterministicSplitCap; beyond that, up to kMaxDeterministicSplits while all slices together stay
// within kDeterministicAccumBudget bytes.
inline constexpr int kMinDeterministicSplitCap = 8;
inline constexpr int kMaxDeterministicSplits = 64;
inline constexpr size_t kDeterministicAccumBudget = size_t{256} << 20;

// Deterministic mode: accumulator slices per KV head (= blocks per KV head, each walking every splits-th
// K/V tile of block_n keys), for slices of slice_bytes each. The count minimises the waves of blocks
// times the K/V tiles per block (a block of one SM each: whole waves, equal blocks), fewer slices on
// ties. Measured with the fp16 / bf16 kernel first with ceil(SMs / (B Hkv)) slices (H200, d128 8k: 5
// slices, 160 blocks on 132 SMs): 2 waves, the second 28 blocks, 2.9x the atomic mode's time with plain
// read-modify-writes. With at most 8 slices, few heads left SMs idle: B4 H1 d64 8k (4 KV heads) ran 32
// blocks on 132 SMs, 3.67x the atomic mode's time (bf16, H200); 32 slices (256 MiB) fill one wave.
inline int deterministic_splits(const AttentionBwdParams& p, int block_n, size_t slice_bytes) {
  const int64_t sms = std::max(1, current_device_props().sms);
  const int64_t tiles = ceil_div<int64_t>(p.seqlen_k, block_n);
  const int64_t heads = p.batch * p.heads_kv;
  const int64_t by_budget = static_cast<int64_t>(kDeterministicAccumBudget / std::max<size_t>(slice_bytes, 1));
  const int64_t cap = std::max<int64_t>(kMinDeterministicSplitCap, std::min<int64_t>(kMaxDeterministicSplits, by_budget));
  int best = 1;
  int64_t best_cost = INT64_MAX;
  for (int s = 1; s <= cap && s <= tiles; ++s) {
    const int64_t cost = ceil_div<int64_t>(heads * s, sms) * ceil_div<int64_t>(tiles, s);
    if (cost < best_cost) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

struct BwdWorkspacePlan {
  int64_t dq_rows;       // seqlen_q rounded up to the launcher's row multiple (whole query tiles)
  int splits;            // accumulator slices: 1, or deterministic_splits
  int64_t split_stride;  // elements per slice
  size_t accum_bytes;    // fp32 [splits][B, Hq, dq_rows, accum_cols]
  size_t d_bytes;        // fp32 [B, Hq, Sq]
  size_t turn_bytes = 0; // int32 [B, Hq, query tiles, turns a tile]: FlashBwdWorkspace::dq_turns (0: none)
};

// accum_cols: the accumulator's row width (the padded head dim); dq_row_multiple: a multiple of every
// query tile of the launcher's kernels; block_n: keys per K/V tile (for the deterministic slice count).
inline BwdWorkspacePlan bwd_workspace_plan(const AttentionBwdParams& p, int block_n, int dq_row_multiple,
                                           int accum_cols) {
  BwdWorkspacePlan w;
  w.dq_rows = ceil_div<int64_t>(p.seqlen_q, dq_row_multiple) * dq_row_multiple;
  w.split_stride = p.batch * p.heads_q * w.dq_rows * accum_cols;
  w.splits = p.deterministic ? deterministic_splits(p, block_n, static_cast<size_t>(w.split_stride) * sizeof(float)) : 1;
  w.accum_bytes = workspace_bytes(static_cast<size_t>(w.splits * w.split_stride) * sizeof(float));
  w.d_bytes = workspace_bytes(static_cast<size_t>(p.batch * p.heads_q * p.seqlen_q) * sizeof(float));
  return w;
}

// One accumulator slice and turns_per_tile turn counters per (batch, query head, query tile of block_m
// rows): the deterministic mode of kernels that add to the accumulator in a fixed order of K/V tiles.
inline void use_ordered_turns(BwdWorkspacePlan* w, const AttentionBwdParams& p, int block_m, int turns_per_tile) {
  w->splits = 1;
  w->accum_bytes = workspace_bytes(static_cast<size_t>(w->split_stride) * sizeof(float));
  w->turn_bytes = workspace_bytes(
      static_cast<size_t>(p.batch * p.heads_q * ceil_div<int64_t>(p.seqlen_q, block_m) * turns_per_tile) * sizeof(int));
}

// Allocates the plan's workspace on `stream` (cudaMallocAsync), zeroes the accumulator (and turns), calls
// run(ws) for the preprocess, main kernel and conversion, and releases the workspace (cudaFreeAsync,
// stream ordered) whatever run returned. The first error is returned and not left pending.
template <typename Run>
cudaError_t with_bwd_workspace(const BwdWorkspacePlan& plan, cudaStream_t stream, Run&& run) {
  return with_stream_workspace(plan.accum_bytes + plan.turn_bytes + plan.d_bytes, stream, [&](char* base) {
    // Layout: accumulator | turns | D (the first two zeroed together).
    FlashBwdWorkspace ws;
    ws.dq_accum = reinterpret_cast<float*>(base);
    ws.dq_turns = plan.turn_bytes > 0 ? reinterpret_cast<int*>(base + plan.accum_bytes) : nullptr;
    ws.d = reinterpret_cast<float*>(base + plan.accum_bytes + plan.turn_bytes);
    ws.dq_rows = plan.dq_rows;
    ws.splits = plan.splits;
    ws.split_stride = plan.split_stride;
    FA_CUDA_TRY(cudaMemsetAsync(base, 0, plan.accum_bytes + plan.turn_bytes, stream));
    return run(ws);
  });
}

}  // namespace fa::cuda::flash
