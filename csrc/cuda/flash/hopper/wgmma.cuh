// Warpgroup MMA (sm_90a) building blocks for the Hopper FlashAttention kernels: the 128-byte swizzled
// shared-memory tile layout, the matrix descriptors that describe it to wgmma, and the fence /
// commit / wait instructions around wgmma.mma_async. The instruction wrappers themselves are
// generated (wgmma_ops.cuh).
//
// Tile layout ("SW128"): a [rows, cols] tile of 16-bit elements is stored as ceil(cols / 64) column
// blocks of [rows, 64] elements (128 bytes per row), each block rows * 128 bytes, 1024-byte aligned.
// Inside a block, the 16-byte chunk c (elements 8c .. 8c + 7) of row r lives at
//     r * 128 + ((c ^ (r % 8)) * 16)
// which is the hardware's 128-byte swizzle (address bits [4, 7) ^= bits [7, 10)), so that the 8 rows
// of an 8 x 8 core matrix hit 8 different 16-byte bank groups.
//
// Descriptors (PTX ISA "matrix descriptor"): bits 0-13 start address >> 4, 16-29 leading byte
// offset >> 4, 32-45 stride byte offset >> 4, 62-63 swizzle mode (1 = 128 B).
//  - K-major operand (rows of K contiguous: Q and K for S = Q K^T): a 16-wide k-step starts at
//    block (k / 64), byte (k % 64) * 2 of the row; the stride byte offset is 1024 (8 rows), the
//    leading byte offset is unused with this swizzle (1).
//  - MN-major operand (rows of N contiguous: V for O += P V, N = head dim, K = keys): a 16-key k-step
//    starts 16 rows (2048 bytes) further; the leading byte offset steps from one 64-wide column
//    block to the next (rows * 128 bytes); the stride byte offset steps 8 rows (1024).
#pragma once
#include <cstdint>

#include "cuda/flash/hopper/tma.cuh"  // fence_proxy_async_smem
#include "cuda/flash/hopper/wgmma_ops.cuh"
#include "cuda/flash/ptx.cuh"

namespace fa::cuda::flash::sm90 {

inline constexpr int kSw128RowBytes = 128;    // one row of a column block
inline constexpr int kSw128BlockCols = 64;    // 16-bit elements per row of a column block
inline constexpr int kSw128F32Cols = 32;      // fp32 elements per row of a column block (the dQ staging tile)
inline constexpr int kSw128AtomBytes = 1024;  // 8 rows: the swizzle period, and the alignment

// The shared-memory address of the dynamic allocation rounded up to kSw128AtomBytes: the base of the
// Hopper kernels' layouts (each asks for kSw128AtomBytes more than its layout takes).
__device__ __forceinline__ uint32_t sw128_aligned_base(const void* smem_raw) {
  return (smem_u32(smem_raw) + kSw128AtomBytes - 1) & ~uint32_t(kSw128AtomBytes - 1);
}

__device__ __forceinline__ uint64_t make_desc(uint32_t smem_addr, uint32_t leading_bytes, uint32_t stride_bytes) {
  constexpr uint64_t kSwizzle128 = 1;
  return static_cast<uint64_t>((smem_addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(leading_bytes >> 4) << 16) |
         (static_cast<uint64_t>(stride_bytes >> 4) << 32) | (kSwizzle128 << 62);
}

// The descriptor of the operand `bytes` past the one `desc` describes: only the start-address field
// moves. Shared addresses stay below 2^18, so the field (address >> 4, 14 bits) cannot carry into the
// next one, and the addition stays in the low word. The k-step loops below add a constant to one
// descriptor made per tile. Made per k-step from its address, the descriptors cost uniform-datapath
// instructions (ncu, H200, warp-specialized d128 forward at 512 without a causal mask: ULOP3, USHF
// and UMOV 8.5M of the 56M instructions executed, 3.4M this way). Bought (H200, bf16,
// FA2 grid, two rounds in turns with the build before): the two-warpgroup forward 1.02-1.05x, the
// head-dim-64 causal backward 1.01-1.03x, the warp-specialized forward within the spread (0.98-1.01x).
__device__ __forceinline__ uint64_t desc_plus(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}

// K-major SW128 operand whose k-step `ks` (16 elements) is wanted; tile_addr is the tile's (row 0)
// shared address and kRows its row count (the distance between column blocks).
template <int kRows>
__device__ __forceinline__ uint64_t desc_k_major(uint32_t tile_addr, int ks) {
  constexpr int kStepsPerBlock = kSw128BlockCols / 16;  // 4
  return desc_plus(make_desc(tile_addr, 16, kSw128AtomBytes),
                   (ks / kStepsPerBlock) * kRows * kSw128RowBytes + (ks % kStepsPerBlock) * 32);
}

// MN-major SW128 operand (N across the row, K down the rows) at k-step `ks` (16 rows).
template <int kRows>
__device__ __forceinline__ uint64_t desc_mn_major(uint32_t tile_addr, int ks) {
  return desc_plus(make_desc(tile_addr, kRows * kSw128RowBytes, kSw128AtomBytes), ks * 16 * kSw128RowBytes);
}

// Orders this thread's earlier register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

// The k-step loops of the kernels' products (issued only: the fence before and the commit / wait after
// are the caller's, as they group products differently).
// acc = A B^T over kKSteps 16-wide k-steps, A and B K-major SW128 tiles of kARows / kBRows rows (the
// distance between their column blocks); the first k-step overwrites acc (kAccumulate: adds to it).
template <int kN, int kARows, int kBRows, int kKSteps, typename Elem, bool kAccumulate = false, int kTiles>
__device__ __forceinline__ void wgmma_ss_k_major(float (&acc)[kTiles][4], uint32_t a_tile, uint32_t b_tile) {
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks)
    Wgmma<kN, Elem>::ss(acc, desc_k_major<kARows>(a_tile, ks), desc_k_major<kBRows>(b_tile, ks), kAccumulate || ks > 0);
}
// The backward's S and dP: two such products, each committed as its own group (the caller can wait
// for the first while the second runs), with the fence before them.
template <int kN, int kARows, int kBRows, int kKSteps, typename Elem, int kTiles>
__device__ __forceinline__ void wgmma_ss_k_major_two_groups(float (&c0)[kTiles][4], uint32_t a0, uint32_t b0,
                                                            float (&c1)[kTiles][4], uint32_t a1, uint32_t b1) {
  wgmma_fence();
  wgmma_ss_k_major<kN, kARows, kBRows, kKSteps, Elem>(c0, a0, b0);
  wgmma_commit();
  wgmma_ss_k_major<kN, kARows, kBRows, kKSteps, Elem>(c1, a1, b1);
  wgmma_commit();
}
// acc += A B over kKSteps k-steps, A from registers (a[ks]: k-step ks's fragment, the mma.sync A
// layout), B an MN-major SW128 tile of kBRows rows.
template <int kN, int kBRows, int kKSteps, typename Elem, int kAFrags, int kTiles>
__device__ __forceinline__ void wgmma_rs_mn_major(float (&acc)[kTiles][4], const uint32_t (&a)[kAFrags][4],
                                                  uint32_t b_tile) {
  static_assert(kKSteps <= kAFrags, "a fragment per k-step");
#pragma unroll
  for (int ks = 0; ks < kKSteps; ++ks) Wgmma<kN, Elem>::rs_tb(acc, a[ks], desc_mn_major<kBRows>(b_tile, ks), 1);
}

// Hands registers back to / asks for them from the block's pool: every thread of a warpgroup calls
// it, with kRegs a multiple of 8 in [24, 256]; an increase waits until the pool holds enough.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes multiples of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes multiples of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Pins an accumulator array in registers across the asynchronous wgmma window, so the compiler does
// not move or read it between issue and wait.
template <int kTiles>
__device__ __forceinline__ void fence_operands(float (&d)[kTiles][4]) {
#pragma unroll
  for (int j = 0; j < kTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

}  // namespace fa::cuda::flash::sm90
