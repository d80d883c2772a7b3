// The sm_80+ GEMM kernel (mma.sync): C = epilogue(A·B) for every layout of gemm_params.h.
//
// Grid: one thread block per (tile of kBlockM x kBlockN of C, K split), flattened into blockIdx.x
// with the N tile fastest (consecutive blocks share their A rows in L2; B, the weights, is small).
// Warps: kWarpsM x kWarpsN, each owning a (kBlockM / kWarpsM) x (kBlockN / kWarpsN) piece of the
// tile as m16n8 accumulator tiles in registers.
// Shared memory: kStages stages of an A tile and a B tile, each stored in its global orientation
// (A k-major: [kBlockM][kBlockK], m-major: [kBlockK][kBlockM]; B k-major: [kBlockN][kBlockK],
// n-major: [kBlockK][kBlockN]) with rows padded by 16 bytes (32 for fp32 MN-major tiles) so the
// fragment reads of 8 rows hit different banks. Loads: cp.async of 16 bytes (partial at the K / M /
// N edges, zero-filled past them) when the pointers and leading dimensions allow it (kVec), else
// element by element through registers; the pipeline keeps kStages - 1 tiles in flight.
// fp16 / bf16: mma m16n8k16, fragments by ldmatrix (k-major tiles) or ldmatrix.trans (MN-major).
// fp32: mma m16n8k8 on TF32 (one mma, or 3xTF32 for Fp32Precision::kHighest), fragments read as
// 32-bit words (ldmatrix cannot transpose 32-bit elements).
// Epilogue: staged through shared memory and finished 8 columns per thread (gemm_common.cuh), or
// raw fp32 sums into the split's workspace slice when K is split.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/gemm_params.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/flash/mma_tf32.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/gemm/gemm_common.cuh"
#include "cuda/gemm/gemm_sm80_traits.h"

namespace fa::cuda::gemm_kernels {

using flash::cp_async_commit;
using flash::cp_async_wait;
using flash::ldmatrix_x4;
using flash::ldmatrix_x4_trans;
using flash::smem_u32;

// Copies the tile rows [outer0, outer0 + kRows) x columns [inner0, inner0 + kCols) of a matrix whose
// element (o, i) is base[o * ld + i] into shared memory of pitch kPitch; elements with o >= outer_lim
// or i >= inner_lim arrive as zeros.
template <typename Elem, int kRows, int kCols, int kPitch, int kThreads, bool kVec>
__device__ __forceinline__ void load_tile(Elem* smem, const Elem* base, int64_t ld, int64_t outer0, int64_t outer_lim,
                                          int64_t inner0, int64_t inner_lim) {
  constexpr int kChunk = 16 / static_cast<int>(sizeof(Elem));
  constexpr int kChunksPerRow = kCols / kChunk;
  constexpr int kIters = kRows * kChunksPerRow / kThreads;
  static_assert(kRows * kChunksPerRow % kThreads == 0, "tile chunks must split evenly over the threads");
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = static_cast<int>(threadIdx.x) + it * kThreads;
    const int r = c / kChunksPerRow;
    const int col = (c % kChunksPerRow) * kChunk;
    const int64_t o = outer0 + r, i = inner0 + col;
    Elem* dst = smem + r * kPitch + col;
    if constexpr (kVec) {
      int64_t left = o < outer_lim ? inner_lim - i : 0;
      left = left < 0 ? 0 : (left > kChunk ? kChunk : left);
      const Elem* src = left > 0 ? base + o * ld + i : base;
      cp_async_16_partial(smem_u32(dst), src, static_cast<int>(left) * static_cast<int>(sizeof(Elem)));
    } else {
#pragma unroll
      for (int e = 0; e < kChunk; ++e)
        dst[e] = (o < outer_lim && i + e < inner_lim) ? base[o * ld + i + e] : from_float<Elem>(0.0f);
    }
  }
}

template <typename Traits, bool kVec, Fp32Precision kPrecision>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    gemm_sm80_kernel(const GemmParams p, float* partial, int splits, int k_tiles_per_split) {
  using Elem = typename Traits::Elem;
  constexpr int kBM = Traits::kBlockM, kBN = Traits::kBlockN, kBK = Traits::kBlockK;
  constexpr int kStages = Traits::kStages, kThreads = Traits::kNThreads;
  constexpr int kMTiles = Traits::kMTiles, kNTiles = Traits::kNTiles;
  constexpr bool kAK = Traits::kAKMajor, kBKm = Traits::kBKMajor;

  extern __shared__ __align__(16) unsigned char smem_raw[];
  Elem* smem_a = reinterpret_cast<Elem*>(smem_raw);
  Elem* smem_b = smem_a + kStages * Traits::kAStageElems;

  // Block -> (split, m tile, n tile), N tile fastest.
  const int64_t n_tiles = ceil_div<int64_t>(p.n, kBN), m_tiles = ceil_div<int64_t>(p.m, kBM);
  const int64_t block = blockIdx.x;
  const int64_t tn = block % n_tiles, tm = (block / n_tiles) % m_tiles, split = block / (n_tiles * m_tiles);
  if (split >= splits) return;
  const int64_t i0 = tm * kBM, j0 = tn * kBN;
  const int64_t k_tiles = ceil_div<int64_t>(p.k, kBK);
  const int64_t kt_begin = split * k_tiles_per_split;
  const int64_t kt_end = kt_begin + k_tiles_per_split < k_tiles ? kt_begin + k_tiles_per_split : k_tiles;
  const int n_kt = static_cast<int>(kt_end > kt_begin ? kt_end - kt_begin : 0);

  const Elem* a = static_cast<const Elem*>(p.a);
  const Elem* b = static_cast<const Elem*>(p.b);
  auto load_stage = [&](int stage, int64_t kt) {
    const int64_t k0 = kt * kBK;
    Elem* sa = smem_a + stage * Traits::kAStageElems;
    Elem* sb = smem_b + stage * Traits::kBStageElems;
    if constexpr (kAK)
      load_tile<Elem, kBM, kBK, Traits::kAPitch, kThreads, kVec>(sa, a, p.lda, i0, p.m, k0, p.k);
    else
      load_tile<Elem, kBK, kBM, Traits::kAPitch, kThreads, kVec>(sa, a, p.lda, k0, p.k, i0, p.m);
    if constexpr (kBKm)
      load_tile<Elem, kBN, kBK, Traits::kBPitch, kThreads, kVec>(sb, b, p.ldb, j0, p.n, k0, p.k);
    else
      load_tile<Elem, kBK, kBN, Traits::kBPitch, kThreads, kVec>(sb, b, p.ldb, k0, p.k, j0, p.n);
  };

  const int warp = static_cast<int>(threadIdx.x) / kWarpSize, lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int wm0 = (warp / Traits::kWarpsN) * Traits::kWarpTileM;
  const int wn0 = (warp % Traits::kWarpsN) * Traits::kWarpTileN;

  // acc_small: 3xTF32's small-term products (mma_fp32_operands_apart), added to acc after the main
  // loop; unused, and compiled away, in every other mode.
  float acc[kMTiles][kNTiles][4], acc_small[kMTiles][kNTiles][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = acc_small[mt][nt][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_kt) load_stage(s, kt_begin + s);
    cp_async_commit();
  }

  for (int it = 0; it < n_kt; ++it) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    // Refill the stage consumed in the previous iteration (every warp is past it: the barrier).
    if (it + kStages - 1 < n_kt) load_stage((it + kStages - 1) % kStages, kt_begin + it + kStages - 1);
    cp_async_commit();

    const Elem* sa = smem_a + (it % kStages) * Traits::kAStageElems;
    const Elem* sb = smem_b + (it % kStages) * Traits::kBStageElems;
    if constexpr (!std::is_same_v<Elem, float>) {
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        const int k0 = ks * 16;
        uint32_t af[kMTiles][4];
        uint32_t bf[kNTiles][2];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          const int m0 = wm0 + mt * 16;
          const int mat = lane / 8;
          if constexpr (kAK) {  // [m][k]: matrices (m0, k0), (m0 + 8, k0), (m0, k0 + 8), (m0 + 8, k0 + 8)
            const int row = m0 + lane % 8 + (mat % 2) * 8, col = k0 + (mat / 2) * 8;
            ldmatrix_x4(af[mt], smem_u32(sa + row * Traits::kAPitch + col));
          } else {  // [k][m], transposed reads of the same four 8x8 blocks
            const int k = k0 + lane % 8 + (mat / 2) * 8, m = m0 + (mat % 2) * 8;
            ldmatrix_x4_trans(af[mt], smem_u32(sa + k * Traits::kAPitch + m));
          }
        }
#pragma unroll
        for (int np = 0; np < kNTiles / 2; ++np) {  // two n8 tiles per ldmatrix x4
          const int n0 = wn0 + np * 16;
          const int mat = lane / 8;
          uint32_t r[4];
          if constexpr (kBKm) {  // [n][k]: (n0, k0), (n0, k0 + 8), (n0 + 8, k0), (n0 + 8, k0 + 8)
            const int n = n0 + lane % 8 + (mat / 2) * 8, k = k0 + (mat % 2) * 8;
            ldmatrix_x4(r, smem_u32(sb + n * Traits::kBPitch + k));
          } else {  // [k][n], transposed
            const int k = k0 + lane % 8 + (mat % 2) * 8, n = n0 + (mat / 2) * 8;
            ldmatrix_x4_trans(r, smem_u32(sb + k * Traits::kBPitch + n));
          }
          bf[2 * np][0] = r[0];
          bf[2 * np][1] = r[1];
          bf[2 * np + 1][0] = r[2];
          bf[2 * np + 1][1] = r[3];
        }
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt) flash::mma_m16n8k16<Elem>(acc[mt][nt], af[mt], bf[nt]);
      }
    } else {
      const int g = lane / 4, t = lane % 4;
      auto a_at = [&](int m, int k) { return kAK ? sa[m * Traits::kAPitch + k] : sa[k * Traits::kAPitch + m]; };
      auto b_at = [&](int k, int n) { return kBKm ? sb[n * Traits::kBPitch + k] : sb[k * Traits::kBPitch + n]; };
#pragma unroll
      for (int ks = 0; ks < kBK / 8; ++ks) {
        const int k0 = ks * 8;
        flash::Tf32Operand<4> af[kMTiles];
        flash::Tf32Operand<2> bf[kNTiles];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          const int m0 = wm0 + mt * 16;
          const float v[4] = {a_at(m0 + g, k0 + t), a_at(m0 + g + 8, k0 + t), a_at(m0 + g, k0 + t + 4),
                              a_at(m0 + g + 8, k0 + t + 4)};
          af[mt] = flash::to_tf32<kPrecision>(v);
        }
#pragma unroll
        for (int nt = 0; nt < kNTiles; ++nt) {
          const int n0 = wn0 + nt * 8;
          const float v[2] = {b_at(k0 + t, n0 + g), b_at(k0 + t + 4, n0 + g)};
          bf[nt] = flash::to_tf32<kPrecision>(v);
        }
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
          for (int nt = 0; nt < kNTiles; ++nt)
            flash::mma_fp32_operands_apart<kPrecision>(acc[mt][nt], acc_small[mt][nt], af[mt], bf[nt]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // every warp is done with the stages: they hold the staged epilogue now
  if constexpr (std::is_same_v<Elem, float> && kPrecision == Fp32Precision::kHighest) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mt][nt][e] += acc_small[mt][nt][e];
  }

  const int g = lane / 4, t = lane % 4;
  float* stage = reinterpret_cast<float*>(smem_raw);
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      const int row = wm0 + mt * 16 + g, col = wn0 + nt * 8 + 2 * t;
      stage_pair<kBN>(stage, row, col, acc[mt][nt][0], acc[mt][nt][1]);
      stage_pair<kBN>(stage, row + 8, col, acc[mt][nt][2], acc[mt][nt][3]);
    }
  __syncthreads();
  float* slice = partial != nullptr ? partial + split * p.m * p.n : nullptr;
  finish_staged_tile<Elem, kBM, kBN, kThreads>(p, stage, i0, j0, slice, static_cast<int>(threadIdx.x));
}

}  // namespace fa::cuda::gemm_kernels
