// The sm_90a GEMM kernel (wgmma + TMA) for fp16 / bf16 operands: C = epilogue(A·B) for every layout
// of gemm_params.h.
//
// Grid: one thread block per (kBlockM x kBlockN tile of C, K split), N tile fastest, as the sm80
// kernel. Warpgroups split the tile's rows: warpgroup w owns rows [64 w, 64 w + 64) (wgmma M = 64)
// and all kBlockN columns, accumulated in registers.
// Operands: K tiles of 64 (one 128-byte swizzled column block, wgmma.cuh) arrive by TMA, issued by
// thread 0, into kStages stages with one mbarrier each. Each operand keeps its global orientation:
//   A k-major: box (64 k, kBlockM rows) -> [kBlockM][64 k], K-major descriptor (trans-a 0)
//   A m-major: kBlockM / 64 boxes (64 m, 64 k) -> column blocks [64 k][64 m], MN-major (trans-a 1)
//   B k-major: box (64 k, kBlockN rows) -> [kBlockN][64 k], K-major (trans-b 0)
//   B n-major: kBlockN / 64 boxes (64 n, 64 k) -> column blocks [64 k][64 n], MN-major (trans-b 1)
// The tensor maps' bounds zero-fill the M, N and K tails. Per K tile: wait for the stage, issue
// four wgmma k16 steps, commit, wait until only this tile's group is in flight (the previous tile's
// reads are done), a block barrier (every warpgroup is past the previous tile), then thread 0 refills
// the previous tile's stage kStages - 1 tiles ahead.
// Epilogue: the accumulators are staged through shared memory (the pipeline's stages) and finished
// 8 columns per thread with 16-byte stores (gemm_common.cuh), or written as raw fp32 sums into the
// split's workspace slice.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/gemm_params.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/flash/hopper/tma.cuh"
#include "cuda/flash/hopper/wgmma.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/gemm/gemm_common.cuh"

namespace fa::cuda::gemm_kernels {

template <typename Elem_, int kBlockM_, int kBlockN_, int kStages_, int kMinBlocksPerSm_, bool kAKMajor_, bool kBKMajor_>
struct Sm90Traits {
  using Elem = Elem_;
  static constexpr int kBlockM = kBlockM_, kBlockN = kBlockN_, kBlockK = 64, kStages = kStages_;
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  static constexpr bool kAKMajor = kAKMajor_, kBKMajor = kBKMajor_;
  static constexpr int kWarpGroups = kBlockM / 64;
  static constexpr int kNThreads = kWarpGroups * 128;
  static constexpr int kNTiles = kBlockN / 8;  // accumulator n8 tiles per thread
  static constexpr int kBlockBytes = 64 * flash::sm90::kSw128RowBytes;  // one [64][64] column block
  static constexpr int kATileBytes = kBlockM * kBlockK * 2;
  static constexpr int kBTileBytes = kBlockN * kBlockK * 2;
  static constexpr int kStageBytes = kATileBytes + kBTileBytes;
  // The staged epilogue reuses the stages' memory (and more when it needs more); the mbarriers sit
  // after both.
  static constexpr int kPipeBytes = kStages * kStageBytes;
  static constexpr int kDataBytes = kPipeBytes > kStagedTileBytes<kBlockM, kBlockN> ? kPipeBytes
                                                                                       : kStagedTileBytes<kBlockM, kBlockN>;
  static constexpr int kSmemBytes = kDataBytes + flash::sm90::kSw128AtomBytes + 8 * kStages;
  static_assert(kBlockM % 64 == 0 && kBlockN % 64 == 0 && kBlockN <= 256, "tiles of whole 64-wide column blocks");
};

struct GemmTensorMaps {
  CUtensorMap a, b;
};

template <typename Traits>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    gemm_sm90_kernel(const __grid_constant__ GemmParams p, const __grid_constant__ GemmTensorMaps maps,
                     float* partial, int splits, int k_tiles_per_split) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace flash::sm90;
  using Elem = typename Traits::Elem;
  constexpr int kBM = Traits::kBlockM, kBN = Traits::kBlockN, kBK = Traits::kBlockK, kStages = Traits::kStages;
  constexpr int kTransA = Traits::kAKMajor ? 0 : 1, kTransB = Traits::kBKMajor ? 0 : 1;

  extern __shared__ unsigned char smem_raw[];
  const uint32_t base = (flash::smem_u32(smem_raw) + kSw128AtomBytes - 1) & ~uint32_t(kSw128AtomBytes - 1);
  const auto s_a = [&](int st) { return base + static_cast<uint32_t>(st * Traits::kStageBytes); };
  const auto s_b = [&](int st) { return s_a(st) + static_cast<uint32_t>(Traits::kATileBytes); };
  const auto bar = [&](int st) { return base + static_cast<uint32_t>(Traits::kDataBytes + 8 * st); };

  const int64_t n_tiles = ceil_div<int64_t>(p.n, kBN), m_tiles = ceil_div<int64_t>(p.m, kBM);
  const int64_t block = blockIdx.x;
  const int64_t tn = block % n_tiles, tm = (block / n_tiles) % m_tiles, split = block / (n_tiles * m_tiles);
  if (split >= splits) return;
  const int i0 = static_cast<int>(tm * kBM), j0 = static_cast<int>(tn * kBN);
  const int64_t k_tiles = ceil_div<int64_t>(p.k, kBK);
  const int64_t kt_begin = split * k_tiles_per_split;
  const int64_t kt_end = kt_begin + k_tiles_per_split < k_tiles ? kt_begin + k_tiles_per_split : k_tiles;
  const int n_kt = static_cast<int>(kt_end > kt_begin ? kt_end - kt_begin : 0);

  if (threadIdx.x == 0) {
    prefetch_tensor_map(&maps.a);
    prefetch_tensor_map(&maps.b);
#pragma unroll
    for (int st = 0; st < kStages; ++st) mbarrier_init(bar(st), 1);
    fence_mbarrier_init();
  }
  __syncthreads();

  // Thread 0: local K tile `it` into stage it % kStages.
  const auto issue = [&](int it) {
    const int st = it % kStages;
    const int k0 = static_cast<int>((kt_begin + it) * kBK);
    mbarrier_arrive_expect_tx(bar(st), static_cast<uint32_t>(Traits::kStageBytes));
    if constexpr (Traits::kAKMajor) {
      tma_load_4d(s_a(st), &maps.a, bar(st), k0, i0, 0, 0);
    } else {
#pragma unroll
      for (int cb = 0; cb < kBM / 64; ++cb)
        tma_load_4d(s_a(st) + cb * Traits::kBlockBytes, &maps.a, bar(st), i0 + 64 * cb, k0, 0, 0);
    }
    if constexpr (Traits::kBKMajor) {
      tma_load_4d(s_b(st), &maps.b, bar(st), k0, j0, 0, 0);
    } else {
#pragma unroll
      for (int cb = 0; cb < kBN / 64; ++cb)
        tma_load_4d(s_b(st) + cb * Traits::kBlockBytes, &maps.b, bar(st), j0 + 64 * cb, k0, 0, 0);
    }
  };

  const int wg = warp_uniform_int(static_cast<int>(threadIdx.x) / 128);
  // This warpgroup's 64 rows of A: rows [64 wg, 64 wg + 64) of a k-major tile, or column block wg.
  const uint32_t a_wg_off = static_cast<uint32_t>(wg * (Traits::kAKMajor ? 64 * kSw128RowBytes : Traits::kBlockBytes));
  const auto desc_a = [&](int st, int ks) {
    return Traits::kAKMajor ? desc_k_major<kBM>(s_a(st) + a_wg_off, ks) : desc_mn_major<kBK>(s_a(st) + a_wg_off, ks);
  };
  const auto desc_b = [&](int st, int ks) {
    return Traits::kBKMajor ? desc_k_major<kBN>(s_b(st), ks) : desc_mn_major<kBK>(s_b(st), ks);
  };

  float acc[Traits::kNTiles][4];
#pragma unroll
  for (int j = 0; j < Traits::kNTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;

  if (threadIdx.x == 0)
    for (int it = 0; it < kStages - 1 && it < n_kt; ++it) issue(it);

  for (int it = 0; it < n_kt; ++it) {
    const int st = it % kStages;
    mbarrier_wait(bar(st), static_cast<uint32_t>((it / kStages) & 1));
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks)
      flash::sm90::Wgmma<kBN, Elem>::template ss_t<kTransA, kTransB>(acc, desc_a(st, ks), desc_b(st, ks), 1);
    wgmma_commit();
    wgmma_wait<1>();  // tile it - 1's wgmma are done in this warpgroup
    __syncthreads();  // ... and in every warpgroup: its stage may be refilled
    if (threadIdx.x == 0 && it + kStages - 1 < n_kt) issue(it + kStages - 1);
  }
  wgmma_wait<0>();
  fence_operands(acc);

  // Staged epilogue (gemm_common.cuh) in the stages' memory: every warpgroup's wgmma reads and every
  // TMA write are complete (each was waited for), the barrier orders the other warpgroups.
  __syncthreads();
  float* stage = reinterpret_cast<float*>(smem_raw + (base - flash::smem_u32(smem_raw)));
  const int warp = (static_cast<int>(threadIdx.x) / 32) % 4, lane = static_cast<int>(threadIdx.x) % 32;
  const int row = wg * 64 + warp * 16 + lane / 4;
#pragma unroll
  for (int j = 0; j < Traits::kNTiles; ++j) {
    const int col = 8 * j + 2 * (lane % 4);
    stage_pair<kBN>(stage, row, col, acc[j][0], acc[j][1]);
    stage_pair<kBN>(stage, row + 8, col, acc[j][2], acc[j][3]);
  }
  __syncthreads();
  float* slice = partial != nullptr ? partial + split * p.m * p.n : nullptr;
  finish_staged_tile<Elem, kBM, kBN, Traits::kNThreads>(p, stage, i0, j0, slice);
#else
  __trap();  // only the sm_90a build has this kernel; the planner never selects it elsewhere
#endif
}

}  // namespace fa::cuda::gemm_kernels
