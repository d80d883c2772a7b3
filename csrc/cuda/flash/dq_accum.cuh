// The backward's fp32 dQ accumulator, shared by the mma.sync and wgmma backward kernels: where the
// launcher's workspace lives, and the mma.sync kernels' atomic add of two neighbouring accumulator
// elements (the wgmma single kernel adds whole tiles by bulk reductions: flash_bwd_sm90_kernel.cuh).
#pragma once
#include <cstdint>

namespace fa::cuda::flash {

// Where the main kernel finds the launcher's workspace.
struct FlashBwdWorkspace {
  float* dq_accum;  // [splits][batch, heads_q, dq_rows, kHeadDim], zeroed
  float* d;         // D = rowsum(dO o O) [batch, heads_q, seqlen_q] (the preprocess writes it)
  int64_t dq_rows;  // seqlen_q rounded up to a multiple of every kernel's query tile (flash_bwd.cu)
  // Deterministic mode: accumulator slices (one per block of a KV head), split_stride elements apart,
  // summed in order by the conversion. Atomic mode: 1 slice.
  // Each element of a slice is added to by one thread only, in its program order: the atomics then
  // apply in that order (per-location coherence), so the slice's sums are the same in every run. (The
  // wgmma single kernel: by one thread's bulk reductions, each K/V tile's completed before the next.)
  int splits;
  int64_t split_stride;
  // Deterministic mode of the warp-specialized Hopper kernel (one slice): a counter per (batch, query
  // head, 64-row query tile, dQ column half), [batch, heads_q, ceil(seqlen_q / 64), 2], zeroed; the K/V
  // tiles of a KV head add to a query tile's half in a fixed tile order (tma.cuh ordered_turn_wait).
  // nullptr otherwise.
  int* dq_turns;
};

// Adds (a, b) to two consecutive floats of global memory (8-byte aligned): one vector reduction on
// sm_90, two scalar atomics before it.
// Measured (H100 SXM, 2026-11-21, flash_bwd_check --bench-only, bf16 single-kernel atomic backward,
// FA2 grid of 16 cells, best median of two runs each): the v2 reduction is 1.25x faster than two
// scalar atomicAdds as the geometric mean (1.14x at 512 d64, 1.40x at 8k d128; no cell slower). The
// mma accumulator fragment holds two neighbouring columns per thread, so v2 needs no shuffle; v4
// would need one exchange per pair of quads and was not tried.
__device__ __forceinline__ void atomic_add_f32x2(float* addr, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(addr, a);
  atomicAdd(addr + 1, b);
#endif
}

}  // namespace fa::cuda::flash
