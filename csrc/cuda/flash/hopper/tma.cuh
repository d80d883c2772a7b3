// Tensor memory accelerator (TMA, sm_90) loads completing on shared-memory mbarriers: the wrappers
// the Hopper FlashAttention kernels use to stream Q, K and V tiles without per-thread address
// arithmetic; and the TMA stores of the GEMM's epilogue and the backward's dQ reductions (below). A
// tile load is issued by one thread; every consumer waits on the stage's mbarrier with the phase
// parity of that use of the stage.
//
// Protocol per buffer use: the issuing thread arms the barrier with the bytes it expects
// (mbarrier_arrive_expect_tx, the one arrival the barrier was initialised with), then issues the
// copies that complete those bytes; the phase flips when both happened. Boxes that reach past the
// tensor map's bounds are zero-filled and still count their full size.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace fa::cuda::flash::sm90 {

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes barrier initialisation visible to the async proxy (TMA) before the first use.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One arrival (no transaction bytes): a consumer releasing a stage back to its producer.
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Blocks until the barrier's phase with the given parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_AGAIN:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_AGAIN;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// 4-D box at coordinates (c0 innermost .. c3) of `map` into shared memory at dst, completing on bar.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}


// ---- TMA stores and reductions (shared -> global) -------------------------------------------------
// Protocol per staging buffer: every thread that wrote the buffer runs fence_proxy_async_smem (its
// generic-proxy writes become visible to TMA), a barrier, then one thread issues the store and
// commits it as a bulk group. Before the buffer is written again, that thread waits until the
// store has read it (bulk_wait_read), and a barrier passes that on. Boxes past the map's bounds
// are clipped: nothing outside the tensor is written.
// Orders this thread's generic-proxy shared-memory writes before later async-proxy reads (TMA stores
// and reductions from the same bytes, wgmma operands rewritten in place).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// 4-D box of `map` at coordinates (c0 innermost .. c3) from shared memory at src.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}
// Adds a 5-D box of the fp32 tensor behind `map` at coordinates (c0 innermost .. c4) from shared memory
// at src, element by element (a bulk reduction: the additions are atomic, in L2).
__device__ __forceinline__ void tma_reduce_add_5d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3,
                                                  int c4) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.5d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4, %5}], [%6];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(src)
      : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Blocks until at most kPending of this thread's committed store groups still read shared memory.
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Blocks until at most kPending of this thread's committed groups are still pending: the others'
// writes (or reductions) to global memory are done.
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- Bulk reductions in an order fixed across thread blocks ---------------------------------------
// A counter in global memory (zeroed before the launch) admits the blocks that add to one region in
// turn: block n waits until it reads n (ordered_turn_wait), adds, then passes the turn on
// (ordered_turn_pass). Block n must be launched after blocks 0 .. n - 1 (a lower blockIdx), so that
// it never waits on a block that cannot start. One thread of the block runs both.
// Acquire the turn: the earlier blocks' reductions are complete, then ordered before this thread's
// later bulk operations (a generic acquire, then a proxy fence to the async proxy).
__device__ __forceinline__ void ordered_turn_wait(const int* counter, int turn) {
  int seen;
  do {
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
  } while (seen != turn);
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
// Pass the turn on once this thread's bulk reductions are complete (bulk_wait<0> first): a proxy fence
// orders them before the generic release of the counter.
__device__ __forceinline__ void ordered_turn_pass(int* counter) {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}

}  // namespace fa::cuda::flash::sm90
