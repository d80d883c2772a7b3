// NaN / ±Inf in V on the tiles that cross the causal diagonal, for the forward kernels' O += P V
// (sm_80 mma.sync, sm_90a wgmma and the float32 TF32 kernel).
//
// Standard attention leaves a key that a row does not see out of that row's sum entirely. A tensor-core
// product cannot: a hidden position holds P = 0, and 0 * NaN = 0 * Inf = NaN, so one non-finite V
// element on a tile that crosses the diagonal would reach the rows of the tile that do not see its key.
// The fix, on crossing tiles only:
//   1. every thread scans its 16-byte chunks of the V tile in shared memory; a block vote
//      (__syncthreads_or, the barrier the kernel needs there anyway) says whether any element is NaN or
//      ±Inf (the common case: no, and the tile runs as before: the scan is the only cost, a few
//      shared loads per thread per crossing tile);
//   2. if one is, those elements are set to 0 in shared memory before the product, so P V gives every
//      row exactly what it gives with a finite value there for the rows that do not see the key
//      (0 * 0 = 0 * x = 0: the outputs of those rows are bit-identical to a run without the NaN);
//   3. in the epilogue, each warp adds the non-finite V elements (read again from global memory,
//      where they are unchanged) of the tiles that had any to the rows that see their key only
//      (add_nonfinite_v: why V and not P * V).
// Steps 2-3 are a rare path: they run only when V holds NaN or ±Inf, and then the outputs are
// non-finite anyway.
// Keys past seqlen_k arrive as zeros (the loads zero-fill them), so tiles that cross seqlen_k only
// need nothing of this.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/nonfinite_tile.cuh"
#include "cuda/flash/ptx.cuh"

namespace fa::cuda::flash {

// Steps 1-2 for the whole block, in place of the barrier the caller needs anyway (every thread calls
// it, on a block-uniform condition): each thread scans its own chunks before the barrier, so they must
// already be visible to it: the chunks it copied itself (cp.async after its wait; load_tile_async
// deals chunks in the same order), or any chunk after an mbarrier wait (TMA). The barrier votes. True
// when the tile held NaN / ±Inf, which are then 0 in shared memory for every thread (a second barrier
// follows the stores, on this rare path only). kAsyncProxy (wgmma kernels): the stores are made
// visible to the async proxy, which the tensor cores read shared memory through, before that barrier.
// The common path costs the scan only: the first version voted in a barrier of its own and measured
// up to 9 % slower on causal seqlen 512 (H100, one cell).
template <typename Elem, int kRows, int kCols, int kPitch, int kThreads, bool kAsyncProxy = false>
__device__ __forceinline__ bool barrier_zero_tile_nonfinite(Elem* tile) {
  if (!warp_uniform(__syncthreads_or(tile_nonfinite<Elem, kRows, kCols, kPitch, kThreads, false>(tile)))) return false;
  tile_nonfinite<Elem, kRows, kCols, kPitch, kThreads, true>(tile);
  if constexpr (kAsyncProxy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
  }
  __syncthreads();
  return true;
}

// barrier_zero_tile_nonfinite for the kThreads threads of a named barrier `bar_id` (a subset of the
// block, e.g. the consumer warpgroups of a warp-specialized kernel); tid: this thread's index among
// them. Always async-proxy (wgmma reads the tile).
template <typename Elem, int kRows, int kCols, int kPitch, int kThreads>
__device__ __forceinline__ bool named_barrier_zero_tile_nonfinite(Elem* tile, int bar_id, int tid) {
  if (!named_barrier_or(bar_id, kThreads, tile_nonfinite<Elem, kRows, kCols, kPitch, kThreads, false>(tile, tid)))
    return false;
  tile_nonfinite<Elem, kRows, kCols, kPitch, kThreads, true>(tile, tid);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
  named_barrier_sync(bar_id, kThreads);
  return true;
}

// Step 3, in the epilogue, for one warp's 16 rows: o is the warp's m16n8-layout O accumulator,
// o[nt][2 h + e] = row row0 + 8 h, column 8 nt + 2 t + e (t = lane % 4). For every key in
// [key_begin, key_end) whose V row holds NaN / ±Inf (found here, 32 keys per ballot), the rows that see
// the key (not off the band of `mask`, an AttentionMask: causal, key <= row + diag) get V[key, d] added
// to each of their columns d < head_dim where it is NaN or ±Inf. V itself, not P * V: for a key a row
// sees with a finite score P > 0, and P * (±Inf) = ±Inf and P * NaN = NaN whatever P's size, so the
// sum's class is the same; and the terms do not depend on the running max, so they can wait for the
// end of the loop instead of keeping registers live through it (ptxas spilled in the causal kernels
// when the correction ran per tile).
// Adding a key's terms twice changes nothing (±Inf + ±Inf, NaN + x), so the range may include keys
// whose terms the product already added. Where standard attention differs: a key whose score is
// -inf (P = 0 exactly: a -inf in k) and whose V is ±Inf gives NaN there (0 * Inf) and ±Inf here.
template <typename Elem, int kOTiles, typename Mask>
__device__ __forceinline__ void add_nonfinite_v(float (&o)[kOTiles][4], const Elem* v, int64_t row_stride,
                                                int key_begin, int key_end, int row0, const Mask& mask,
                                                int head_dim, int lane) {
  constexpr int kPerChunk = 16 / static_cast<int>(sizeof(Elem));
  const int t = lane % 4;
#pragma unroll 1
  for (int k0 = key_begin; k0 < key_end; k0 += 32) {
    bool bad = false;
    if (k0 + lane < key_end) {
      const Elem* row = v + static_cast<int64_t>(k0 + lane) * row_stride;
      for (int c = 0; c < head_dim; c += kPerChunk) {
        const uint4 x = *reinterpret_cast<const uint4*>(row + c);
        bad |= chunk_nonfinite<Elem>(x);
      }
    }
    uint32_t bits = __ballot_sync(0xffffffffu, bad);
    while (bits != 0u) {
      const int key = k0 + __ffs(bits) - 1;
      bits &= bits - 1u;
      const Elem* vrow = v + static_cast<int64_t>(key) * row_stride;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (mask.off_band(row0 + 8 * h, key)) continue;
#pragma unroll
        for (int nt = 0; nt < kOTiles; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int d = 8 * nt + 2 * t + e;
            if (d >= head_dim) continue;
            const float x = to_float(vrow[d]);
            if (!isfinite(x)) o[nt][2 * h + e] += x;
          }
      }
    }
  }
}

// add_nonfinite_v called out of line, o copied through local memory around the call: the copies run on
// this rare path only. For kernels whose main loop the inlined loops above crowd (the warp-specialized
// Hopper forward).
template <typename Elem, int kOTiles, typename Mask>
__device__ __noinline__ void add_nonfinite_v_call(float (&o)[kOTiles][4], const Elem* v, int64_t row_stride,
                                                  int key_begin, int key_end, int row0, const Mask mask, int head_dim,
                                                  int lane) {
  add_nonfinite_v<Elem, kOTiles>(o, v, row_stride, key_begin, key_end, row0, mask, head_dim, lane);
}
template <typename Elem, int kOTiles, typename Mask>
__device__ __forceinline__ void add_nonfinite_v_out_of_line(float (&o)[kOTiles][4], const Elem* v, int64_t row_stride,
                                                            int key_begin, int key_end, int row0, const Mask& mask,
                                                            int head_dim, int lane) {
  float o_local[kOTiles][4];
  copy_fragments(o_local, o);
  add_nonfinite_v_call<Elem, kOTiles, Mask>(o_local, v, row_stride, key_begin, key_end, row0, mask, head_dim, lane);
  copy_fragments(o, o_local);
}

}  // namespace fa::cuda::flash
