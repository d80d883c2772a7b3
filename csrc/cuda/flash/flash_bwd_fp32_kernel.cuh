// FlashAttention-2 backward for float32 inputs, sm_80+ mma.sync path on TF32 tensor cores (m16n8k8,
// fp32 accumulation); Fp32Precision::kHighest runs each product as 3xTF32 for fp32-level accuracy.
// FA2's Algorithm 2 in one kernel, dQ through fp32 atomic adds: the structure of the fp16 / bf16 kernel
// (flash_bwd_kernel.cuh) with the operand handling of the float32 forward (flash_fwd_fp32_kernel.cuh).
//
// Grid: one thread block per (K/V tile of kBlockN keys, KV head, batch), flattened into blockIdx.x with
// the key tile fastest. K_j and V_j stay in shared memory for the whole loop, which runs over every query
// head of the KV head's group (GQA: dK and dV sum over the group in registers) and, per head, over the
// query tiles that can see K_j (causal: from the first row whose diagonal reaches the tile). Q_i, dO_i,
// lse_i and D_i stream through shared memory with cp.async (Traits::kStages buffers). Per query tile
// (warp w owns keys [16 (w % kKeyTiles), +16)):
//   S^T  = K_j Q_i^T                 (16 keys, kBlockM) per warp: A = K (ldmatrix), B = Q (ldmatrix)
//   dP^T = V_j dO_i^T                (16 keys, kBlockM): A = V, B = dO
//   P^T  = 2^(S^T scale log2e - lse_i log2e)   no online softmax
//   dS^T = P^T o (dP^T - D_i)
//   hidden pairs (mask.cuh: keys >= seqlen_k, query rows >= seqlen_q, causal keys past the row's
//   diagonal): P^T = dS^T = 0 by a select (0 * NaN would leak otherwise), on tiles that hold one only
//   dV  += P^T dO_i                  P^T's accumulator as the A operand, B = dO (scalar loads)
//   dK  += dS^T Q_i                  dS^T likewise, B = Q (scalar loads)
//   dS^T -> shared memory [key][query]; dQ_i += dS K_j: warps split dQ_i's rows and columns, A = dS
//   (scalar loads of dS^T), B = K (scalar loads); the fp32 pieces go to the accumulator by atomic adds.
// Epilogue: dK * softmax_scale and dV (rows >= seqlen_k and columns >= head_dim not stored).
// Query rows past seqlen_q load as zeros and see no key (their P^T and dS^T are selected to 0: a key
// holding -inf would score 0 * (-inf) = NaN there); the accumulator has rows up to the next multiple of
// kBlockM, so its atomics need no bounds checks.
//
// NaN / ±Inf at hidden pairs (bug B2, bwd_nonfinite.cuh): the three products multiply the zero P^T /
// dS^T of a hidden pair by their other operand, and 0 * Inf = 0 * NaN = NaN. Causal kernels, on query
// tiles that cross the diagonal only (hidden pairs elsewhere hold zero-filled rows), run rare paths:
//   Q, dO: the loop-top barrier is a vote (__syncthreads_or) on whether a row of a crossing tile has a
//     non-finite lse or D (bwd_row_suspect: a NaN / ±Inf in its q or dO makes one so). If one has:
//     P^T -> sdS, barrier, every thread zeroes the NaN / ±Inf of its chunks of this stage's Q and dO
//     (tile_nonfinite), barrier, the dV / dK products as always, then each thread adds P_ij dO_i[d] (dO
//     from global memory) to its dV elements for the flagged rows i that see key j, barrier (P^T is read
//     before dS^T overwrites it). 2 + 1 barriers, only on such tiles. A row that sees no key (lse =
//     +inf) is flagged too: its tile takes the rare path on clean data (exact, only slower).
//   K: once per K/V tile (causal blocks with a crossing tile), a scan of sK and a vote (one barrier; the
//     result in a padding word of sdS). If K holds NaN / ±Inf, the dQ product of a crossing tile sets
//     them to 0 in its B registers (sK itself feeds S^T of every query tile) and adds dS_ij K_j[d] back
//     for the visible pairs (dS from sdS, K from sK): dq_product_nonfinite_k.
// The common path's arithmetic is unchanged (the same instructions on the same operands), and on the
// rare paths every output element without a term from a non-finite value at a visible pair is
// bit-identical to a run with a finite value there. Non-causal kernels compile to the same code as
// without any of this.
//
// Operands (mma_tf32.cuh). ldmatrix .b16 moves 8 rows of 4 floats, lane l getting row l / 4, float l % 4:
// that is the A fragment of a row-major, k-contiguous tile (K, V: rows = keys, k = head dim) and the B
// fragment of an n-major, k-contiguous tile (Q, dO: n = queries), as in the forward. The three products
// whose k index is the row index of their shared-memory tile (dV, dK: k = queries; dQ: k = keys) take
// their operands with scalar loads and use the forward's P V permutation of k inside one mma: k column
// t is row 2t of the 8 and column t + 4 is row 2t + 1 (the order of the 8 products of one mma is free
// as long as A and B agree). Then an S^T accumulator n8 tile is that mma's A operand as it stands,
// a = {c0, c2, c1, c3}, and each B element pair is (row 2t, column g), (row 2t + 1, column g).
// Every operand is converted at its use: kTf32 rounds it to TF32 (cvt.rna), kHighest splits it into
// big + small and runs three mma (Tf32Operand, mma_fp32_operands).
//
// Head dims below the specialisation (Traits::kHeadDim) are zero-padded: cp.async fills columns >=
// head_dim with zeros, which add exact zeros to S^T and dP^T and give zero dK, dV and dQ columns (never
// stored). As in the fp16 / bf16 kernel they are computed, not skipped: a per-k-step skip (as the fp32
// forward does) made every k-step its own basic block in SASS, each ldmatrix waiting for its mma.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/attention_params.h"
#include "cuda/flash/bwd_nonfinite.cuh"
#include "cuda/flash/dq_accum.cuh"
#include "cuda/flash/flash_bwd_fp32_traits.h"
#include "cuda/flash/mask.cuh"
#include "cuda/flash/mma_tf32.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/flash/tile_load.cuh"
#include "cuda/flash/tile_scheduler.cuh"

namespace fa::cuda::flash {

// N 32-bit registers (ldmatrix results, fp32 bit patterns) as the operand of the precision mode.
template <Fp32Precision kPrecision, int N>
__device__ __forceinline__ Tf32Operand<N> tf32_operand_from_bits(const uint32_t (&bits)[N]) {
  float x[N];
#pragma unroll
  for (int i = 0; i < N; ++i) x[i] = __uint_as_float(bits[i]);
  return to_tf32<kPrecision>(x);
}

// B operand (k = 8 rows in the permuted order, n = 8 columns) from a row-major shared-memory tile:
// b0 = rows[0] (row 2t, column g), b1 = rows[pitch] (row 2t + 1, column g); `rows` points at that
// thread's (row 2t, column g) of the n8 tile.
template <Fp32Precision kPrecision, int kPitch>
__device__ __forceinline__ Tf32Operand<2> permuted_b_operand(const float* rows) {
  const float b[2] = {rows[0], rows[kPitch]};
  return to_tf32<kPrecision>(b);
}

// A P or dS value as the dV / dK / dQ product multiplied it, for the terms that bug B2's rare path adds
// back (bwd_nonfinite.cuh): kTf32 multiplies tf32(x) (cvt.rna), so a term is tf32(x) * y, exactly the
// term the product would have formed from the non-finite y (an x that rounds to 0 gives NaN there too).
// kHighest multiplies big + small, which stands for the fp32 x (the products were made 3xTF32 to give
// fp32 results); with a non-finite y the split itself would give NaN (y - tf32(y) = Inf - Inf), so
// there is no "as the tensor core saw it" to match, and the term is the fp32 one, x * y.
template <Fp32Precision kPrecision>
__device__ __forceinline__ float mma_operand_value(float x) {
  if constexpr (kPrecision == Fp32Precision::kTf32) return tf32_as_float(tf32_round(x));
  else return x;
}

// threadIdx.x read anew for bug B2's rare paths (asm volatile: not merged with the kernel's read), so
// that the warp and lane indices they derive from it keep no extra registers live through the loop.
// With the kernel's own indices (ptxas, CUDA 13.0) the causal kernels took 3-6 more registers (d32 to
// d128) or spilled 12-24 more bytes (d256).
__device__ __forceinline__ int fresh_thread_index() {
  int x;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(x));
  return x;
}

// Bug B2's dV add-back (bwd_nonfinite.cuh) for one thread: dv[dt][2h + e] is key n0 + key_row0 + g + 8h,
// column kv_col0 + 8dt + 2t + e (the kernel's dK / dV layout). For every flagged row i of the tile
// (bwd_row_suspect on its lse and D; a row with NaN / ±Inf in dO always is) that sees the key, a NaN /
// ±Inf dO_i[d] adds P_ij dO_i[d]: dO from global memory (the original; the shared tile holds zeros
// there), P from sPt (P^T [key][query] in sdS, stored for this) as the product multiplied it. A runtime
// loop over the rows: P from the registers of S^T would need unrolled, compile-time register indices
// (quad shuffles per row and register) for every row.
template <typename Traits, Fp32Precision kPrecision, typename Mask>
__device__ __forceinline__ void add_nonfinite_do_dv(float (&dv)[Traits::kKvTiles][4], const float* sPt,
                                                    const float* lse2, const float* dvec, const float* dout,
                                                    int64_t row_stride, int m0, int n0, const Mask& mask,
                                                    int head_dim) {
  const int tid = fresh_thread_index();
  const int warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
  const int key_row0 = warp % Traits::kKeyTiles * Traits::kMmaM;
  const int kv_col0 = warp / Traits::kKeyTiles * Traits::kDPart;
#pragma unroll 1
  for (int qi = 0; qi < Traits::kBlockM; ++qi) {
    const int row = m0 + qi;
    if (!bwd_row_suspect(row, mask.seqlen_q, lse2[qi], dvec[qi])) continue;
    const float* orow = dout + static_cast<int64_t>(row) * row_stride + kv_col0 + 2 * t;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = key_row0 + g + 8 * h;
      if (mask.hidden(row, n0 + key)) continue;
      const float pij = mma_operand_value<kPrecision>(sPt[key * Traits::kDsPitch + qi]);
#pragma unroll
      for (int dt = 0; dt < Traits::kKvTiles; ++dt) {
        if (kv_col0 + Traits::kMmaN * dt >= head_dim) continue;  // no dO there (head_dim: whole n8 tiles)
        const float2 x = *reinterpret_cast<const float2*>(orow + Traits::kMmaN * dt);
        if (!isfinite(x.x)) dv[dt][2 * h] += pij * x.x;
        if (!isfinite(x.y)) dv[dt][2 * h + 1] += pij * x.y;
      }
    }
  }
}

// Bug B2's dQ product with K's NaN / ±Inf entering as 0 (in the B registers: sK stays as it is), then
// their terms dS_ij K_j[d] added back for the visible pairs: the kernel's dQ product otherwise (its
// fragment layouts; dq[dt][e] is row m0 + dq_row0 + g + 8 (e / 2), column dq_col0 + 8 dt + 2t + e % 2).
// dS from sdS as the product read it; K from sK (never written during the loop: the original values,
// and zeros past seqlen_k and head_dim, which add nothing). Row g + 8h sees the tile's keys below
// key_end[h] (AttentionMask::hidden as a bound: none past seqlen_q, none past seqlen_k or the row's diagonal).
template <typename Traits, Fp32Precision kPrecision, typename Mask>
__device__ __forceinline__ void dq_product_nonfinite_k(float (&dq)[Traits::kDqTiles][4], const float* sdS,
                                                       const float* sK, int m0, int n0, const Mask& mask) {
  constexpr int kPitch = Traits::kSmemPitch, kDsPitch = Traits::kDsPitch, kMmaK = Traits::kMmaK, kMmaN = Traits::kMmaN;
  constexpr int kBlockN = Traits::kBlockN;
  const int tid = fresh_thread_index();
  const int warp = tid / 32, g = tid % 32 / 4, t = tid % 4;
  const int dq_row0 = warp % Traits::kDqRowTiles * Traits::kMmaM;
  const int dq_col0 = warp / Traits::kDqRowTiles * Traits::kDqCols;
#pragma unroll 1
  for (int kk = 0; kk < Traits::kDqKSteps; ++kk) {
    const float* ds_rows = sdS + (kk * kMmaK + 2 * t) * kDsPitch + dq_row0 + g;
    const float af[4] = {ds_rows[0], ds_rows[8], ds_rows[kDsPitch], ds_rows[kDsPitch + 8]};
    const Tf32Operand<4> a = to_tf32<kPrecision>(af);
    const float* k_rows = sK + (kk * kMmaK + 2 * t) * kPitch + dq_col0 + g;
#pragma unroll
    for (int dt = 0; dt < Traits::kDqTiles; ++dt) {
      float b[2] = {k_rows[dt * kMmaN], k_rows[kPitch + dt * kMmaN]};
#pragma unroll
      for (int e = 0; e < 2; ++e) b[e] = isfinite(b[e]) ? b[e] : 0.0f;
      mma_fp32_operands<kPrecision>(dq[dt], a, to_tf32<kPrecision>(b));
    }
  }
  int key_end[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = m0 + dq_row0 + g + 8 * h;
    key_end[h] = row < mask.seqlen_q ? mask.key_end(row) - n0 : 0;
  }
  const int keys = min(kBlockN, max(key_end[0], key_end[1]));  // row g + 8 may lie past seqlen_q
#pragma unroll 1
  for (int key = 0; key < keys; ++key) {
    const float* k_row = sK + key * kPitch + dq_col0 + 2 * t;
    const float* ds_col = sdS + key * kDsPitch + dq_row0 + g;
#pragma unroll
    for (int dt = 0; dt < Traits::kDqTiles; ++dt) {
      const float2 x2 = *reinterpret_cast<const float2*>(k_row + kMmaN * dt);
      const float x[2] = {x2.x, x2.y};
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (isfinite(x[e])) continue;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (key < key_end[h]) dq[dt][2 * h + e] += mma_operand_value<kPrecision>(ds_col[8 * h]) * x[e];
      }
    }
  }
}

template <typename Traits, bool kIsCausal, Fp32Precision kPrecision>
__global__ void __launch_bounds__(Traits::kNThreads, Traits::kMinBlocksPerSm)
    flash_bwd_fp32_kernel(const AttentionBwdParams p, const FlashBwdWorkspace ws) {
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kPitch = Traits::kSmemPitch;
  constexpr int kDsPitch = Traits::kDsPitch, kSTiles = Traits::kSTiles, kKSteps = Traits::kKSteps;
  constexpr int kKvTiles = Traits::kKvTiles, kDqTiles = Traits::kDqTiles;
  constexpr int kMmaK = Traits::kMmaK, kMmaN = Traits::kMmaN;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  float* sK = reinterpret_cast<float*>(smem_raw);         // [kBlockN][kPitch]
  float* sV = sK + Traits::kKvTileElems;                  // [kBlockN][kPitch]
  float* sQ = sV + Traits::kKvTileElems;                  // [kStages][kBlockM][kPitch]
  float* sdO = sQ + Traits::kStages * Traits::kQTileElems;  // [kStages][kBlockM][kPitch]
  float* sdS = sdO + Traits::kStages * Traits::kQTileElems;  // dS^T [kBlockN][kDsPitch]
  float* sLse2 = sdS + Traits::kDsElems;                  // [kStages][kBlockM]
  float* sD = sLse2 + Traits::kStages * kBlockM;          // [kStages][kBlockM]
  // Bug B2's K flag (below) in the padding of dS^T's row 0: the products read columns < kBlockM only.
  static_assert(Traits::kDsPitch >= kBlockM + 1, "dS^T rows must have a padding column");
  int* const sKNonfinite = reinterpret_cast<int*>(sdS + kBlockM);

  const int seqlen_q = static_cast<int>(p.seqlen_q), seqlen_k = static_cast<int>(p.seqlen_k);
  const int head_dim = static_cast<int>(p.head_dim);
  const int n_blocks = (seqlen_k + kBlockN - 1) / kBlockN;
  // Atomic mode: one K/V tile per block. Deterministic mode: block `split` of ws.splits takes the tiles
  // split, split + splits, ... in turn, so its dQ adds go to its own accumulator slice, in a fixed order.
  const uint32_t tile_stride = p.deterministic ? static_cast<uint32_t>(ws.splits) : static_cast<uint32_t>(n_blocks);
  const KeyTileWork tile = key_tile_work(p, tile_stride);  // tile_scheduler.cuh
  const int first_tile = tile.first_tile, head_kv = tile.head_kv;
  const int64_t batch = tile.batch;
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const AttentionMask<kIsCausal> mask(seqlen_q, seqlen_k);  // mask.cuh
  float* const dq_accum = ws.dq_accum + (p.deterministic ? first_tile * ws.split_stride : 0);

  const float* k = static_cast<const float*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride;
  const float* v = static_cast<const float*>(p.v) + batch * p.v_batch_stride + head_kv * p.v_head_stride;

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment row group and thread-in-group
  const int mi = lane / 8;               // which 8x4-float matrix of an ldmatrix x4 this lane addresses
  const int key_tile = warp % Traits::kKeyTiles;
  const int kv_col0 = (warp / Traits::kKeyTiles) * Traits::kDPart;  // this warp's dK / dV columns
  const int key_row0 = key_tile * Traits::kMmaM;                    // this warp's keys, in the tile
  const int dq_row0 = (warp % Traits::kDqRowTiles) * Traits::kMmaM;  // this warp's dQ rows, in the tile
  const int dq_col0 = (warp / Traits::kDqRowTiles) * Traits::kDqCols;

  for (int n_block = first_tile; n_block < n_blocks; n_block += static_cast<int>(tile_stride)) {
    const int n0 = n_block * kBlockN;
    // Query tiles that see some key of this tile: causal starts at the first row whose diagonal reaches n0.
    const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
    const int m_begin = mask.template first_query_tile<kBlockM>(n0, m_blocks);
    const int m_count = m_blocks - m_begin;
    const int iters = m_count * group;  // (query head of the group, query tile) pairs, head-major

    // dK and dV (16 keys, kDPart columns) per warp as kKvTiles n8 accumulators each.
    float dk[kKvTiles][4], dv[kKvTiles][4];
#pragma unroll
    for (int j = 0; j < kKvTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;

    // Loads iteration it's Q, dO tiles (cp.async, not committed) and its lse (base 2) and D rows.
    const auto load_iter = [&](int it, int stage) {
      load_bwd_query_step<Traits, kBlockM>(p, ws.d, sQ, sdO, sLse2, sD, stage, head_kv * group + it / m_count,
                                           (m_begin + it % m_count) * kBlockM, batch, seqlen_q, head_dim);
    };

    // Bug B2, K (bwd_nonfinite.cuh): whether the K tile holds NaN / ±Inf, found once per K/V tile by a
    // scan and a vote, for the dQ products of the query tiles that cross the diagonal (block-uniform).
    // Only causal blocks that have such a tile scan: the first query tile has the smallest m0, so when it
    // does not cross, none does. The vote's result goes to sKNonfinite, read on crossing tiles only
    // (the loop-top barrier of iteration 0 orders the store before them): kept in a register through
    // the loop, it was spilled and reloaded in every iteration of the d192 'highest' kernel (sm_90a).
    if (iters > 0) {
      load_tile_async<Traits, kBlockN>(sK, k, p.k_row_stride, n0, seqlen_k, head_dim);
      load_tile_async<Traits, kBlockN>(sV, v, p.v_row_stride, n0, seqlen_k, head_dim);
      load_iter(0, 0);
      cp_async_commit();
      if constexpr (kIsCausal) {
        if (mask.template crosses<kBlockM, kBlockN>(m_begin * kBlockM, n0)) {
          // Each thread scans the K chunks that it copied itself (tile_nonfinite deals them as
          // load_tile_async does), visible to it after its own wait: the vote is the only barrier.
          cp_async_wait<0>();
          const bool k_nonfinite =
              __syncthreads_or(tile_nonfinite<float, kBlockN, Traits::kHeadDim, kPitch, Traits::kNThreads, false>(sK));
          if (threadIdx.x == 0) *sKNonfinite = k_nonfinite;
        }
      }
    }

    for (int it = 0; it < iters; ++it) {
      const int stage = it % Traits::kStages;
      const int head = head_kv * group + it / m_count;
      const int m0 = (m_begin + it % m_count) * kBlockM;
      // The query tile holds hidden pairs with real data (bug B2's rare paths run on such tiles only).
      const bool crosses_diag = mask.template crosses<kBlockM, kBlockN>(m0, n0);
      cp_async_wait<0>();
      // Barrier: tile it has landed everywhere; iteration it - 1 is done with the other stage and sdS.
      // Causal: it also votes whether a row of a crossing tile may hold NaN / ±Inf in q or dO (its lse or
      // D is not finite, bwd_row_suspect). Thread r < kBlockM reads the lse and D of row r that it stored
      // itself in load_iter(it) (the latest load_iter call before this point with either stage count), so
      // it needs no barrier for them and the flag is this iteration's. One unconditional barrier for both
      // kinds of tile, no barrier in a branch of the common path (bench/NOTES.md suspects one of costing
      // the causal sm90 forward a few %).
      bool q_do_suspect = false;
      if constexpr (kIsCausal) {
        const int r = static_cast<int>(threadIdx.x);
        q_do_suspect =
            __syncthreads_or(crosses_diag && r < kBlockM &&
                             bwd_row_suspect(m0 + r, seqlen_q, sLse2[stage * kBlockM + r], sD[stage * kBlockM + r]));
      } else {
        __syncthreads();
      }
      if (Traits::kStages == 2 && it + 1 < iters) {
        load_iter(it + 1, (it + 1) % Traits::kStages);
        cp_async_commit();
      }
      float* const sQs = sQ + stage * Traits::kQTileElems;
      float* const sdOs = sdO + stage * Traits::kQTileElems;
      const float* lse2 = sLse2 + stage * kBlockM;
      const float* dvec = sD + stage * kBlockM;

      // S^T = K Q^T and dP^T = V dO^T: (16 keys, kBlockM queries) per warp as kSTiles n8 accumulators.
      float st[kSTiles][4], dpt[kSTiles][4];
#pragma unroll
      for (int j = 0; j < kSTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.0f;
      // Unrolled by 2 only (the k-steps index no register array): fully unrolled, ptxas hoists the ldmatrix
      // of every k-step and the d64 kernel took 255 registers and spilled (now 199-251, 0 spills).
#pragma unroll 2
      for (int ks = 0; ks < kKSteps; ++ks) {
        // A: this warp's 16 keys x 8 head-dim columns. Matrices (keys 0-7, d 0-3) = a0, (keys 8-15, d 0-3)
        // = a1, (keys 0-7, d 4-7) = a2, (keys 8-15, d 4-7) = a3; lanes 8i..8i+7 address matrix i's rows.
        uint32_t kf[4], vf[4];
        const int a_off = (key_row0 + (mi % 2) * 8 + lane % 8) * kPitch + ks * kMmaK + (mi / 2) * 4;
        ldmatrix_x4(kf, smem_u32(sK + a_off));
        ldmatrix_x4(vf, smem_u32(sV + a_off));
        const Tf32Operand<4> ka = tf32_operand_from_bits<kPrecision>(kf);
        const Tf32Operand<4> va = tf32_operand_from_bits<kPrecision>(vf);
#pragma unroll
        for (int np = 0; np < kSTiles / 2; ++np) {
          // B: matrices (queries 0-7, d 0-3), (queries 0-7, d 4-7), (queries 8-15, d 0-3), (8-15, d 4-7)
          // = b0, b1 of n-tile 2np and b0, b1 of n-tile 2np + 1.
          const int b_off = (np * 16 + (mi / 2) * 8 + lane % 8) * kPitch + ks * kMmaK + (mi % 2) * 4;
          uint32_t qf[4], of[4];
          ldmatrix_x4(qf, smem_u32(sQs + b_off));
          ldmatrix_x4(of, smem_u32(sdOs + b_off));
          const uint32_t q0[2] = {qf[0], qf[1]}, q1[2] = {qf[2], qf[3]};
          const uint32_t o0[2] = {of[0], of[1]}, o1[2] = {of[2], of[3]};
          mma_fp32_operands<kPrecision>(st[2 * np], ka, tf32_operand_from_bits<kPrecision>(q0));
          mma_fp32_operands<kPrecision>(st[2 * np + 1], ka, tf32_operand_from_bits<kPrecision>(q1));
          mma_fp32_operands<kPrecision>(dpt[2 * np], va, tf32_operand_from_bits<kPrecision>(o0));
          mma_fp32_operands<kPrecision>(dpt[2 * np + 1], va, tf32_operand_from_bits<kPrecision>(o1));
        }
      }

      // P^T and dS^T in place. Element (j, e): key n0 + key_row0 + g + 8 (e / 2), query m0 + 8 j + 2 t + e % 2.
      // x = S^T scale_log2 is rounded before lse2 is subtracted (__fmul_rn: ptxas would contract a plain
      // multiply and subtract into one fma and change P's bits). On a tile that holds a hidden pair
      // (`masked`, a std::bool_constant: the other tiles compile without the test), a hidden element
      // gets P^T = dS^T = 0 by selects (mask.cuh), whatever S, lse, dP and D hold.
      const auto p_and_ds = [&](auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
#pragma unroll
        for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int qcol = kMmaN * j + 2 * t + e % 2;
            const float pe = exp2_approx(__fmul_rn(st[j][e], p.scale_log2) - lse2[qcol]);
            const float ds = pe * (dpt[j][e] - dvec[qcol]);
            const bool hidden =
                kMasked & mask.hidden(m0 + qcol, n0 + key_row0 + g + 8 * (e / 2));
            st[j][e] = hidden ? 0.0f : pe;
            dpt[j][e] = hidden ? 0.0f : ds;
          }
        }
      };
      if (mask.template bwd_tile_needs_mask<kBlockM, kBlockN>(m0, n0))
        p_and_ds(std::true_type{});
      else
        p_and_ds(std::false_type{});

      // x^T (this warp's 16 keys x kBlockM queries, in S^T's accumulator layout) to sdS [key][query] in
      // fp32, by the first warp of each key tile (the others hold copies): dS^T for the dQ product, and
      // P^T on the rare path below.
      const auto store_keys_by_queries = [&](const float(&x)[kSTiles][4]) {
        if (warp < Traits::kKeyTiles) {
#pragma unroll
          for (int j = 0; j < kSTiles; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              *reinterpret_cast<float2*>(sdS + (key_row0 + g + 8 * h) * kDsPitch + kMmaN * j + 2 * t) =
                  make_float2(x[j][2 * h], x[j][2 * h + 1]);
        }
      };

      // Bug B2, Q and dO (bwd_nonfinite.cuh), on a crossing tile where a row is flagged (the vote above,
      // block-uniform): their NaN / ±Inf are set to 0 in shared memory for the dV and dK products (S^T and
      // dP^T above read the originals; nothing reads this stage's Q and dO after the products), and P^T
      // goes to sdS (free until dS^T is stored) for the dO add-back after the products. Q needs none.
      if constexpr (kIsCausal) {
        if (q_do_suspect) {
          store_keys_by_queries(st);
          __syncthreads();  // P^T is complete; every warp is done reading Q and dO for S^T and dP^T
          tile_nonfinite<float, kBlockM, Traits::kHeadDim, kPitch, Traits::kNThreads, true>(sQs);
          tile_nonfinite<float, kBlockM, Traits::kHeadDim, kPitch, Traits::kNThreads, true>(sdOs);
          __syncthreads();  // the zeros are in place for every warp's products
        }
      }

      // dV += P^T dO and dK += dS^T Q over this warp's columns. k-step kk = the tile's queries 8 kk ..
      // 8 kk + 7 = S^T's n8 tile kk, in the permuted order: A = {c0, c2, c1, c3} of that tile, B = dO / Q
      // rows 8 kk + 2t and 8 kk + 2t + 1 at column g of each n8 column tile.
      if constexpr (kPrecision == Fp32Precision::kTf32) {
#pragma unroll
        for (int kk = 0; kk < kSTiles; ++kk) {
          const float pf[4] = {st[kk][0], st[kk][2], st[kk][1], st[kk][3]};
          const float sf[4] = {dpt[kk][0], dpt[kk][2], dpt[kk][1], dpt[kk][3]};
          const Tf32Operand<4> pa = to_tf32<kPrecision>(pf);
          const Tf32Operand<4> dsa = to_tf32<kPrecision>(sf);
          const int b_off = (kk * kMmaK + 2 * t) * kPitch + kv_col0 + g;
#pragma unroll
          for (int dt = 0; dt < kKvTiles; ++dt) {
            mma_fp32_operands<kPrecision>(dv[dt], pa, permuted_b_operand<kPrecision, kPitch>(sdOs + b_off + dt * kMmaN));
            mma_fp32_operands<kPrecision>(dk[dt], dsa, permuted_b_operand<kPrecision, kPitch>(sQs + b_off + dt * kMmaN));
          }
        }
      } else {
        // 3xTF32: the tensor cores' fp32 accumulation truncates (it does not round to nearest), so
        // accumulating dK / dV over every query of the sequence in the mma accumulator biases them by up
        // to ~(queries) x 2^-23 relative: measured 1.7e-4 on dv at 1025 causal rows, GQA 4:1 (40x the
        // naive fp32 backward's error; rows that see few keys put P ~ 1 terms into it early). Each query
        // tile's kBlockM rows go into a fresh accumulator instead, added to dK / dV with a rounding FADD.
        // Column tile outer, query k-step inner: one 4-register accumulator pair at a time (the P^T / dS^T
        // operands are re-split per column tile: ALU work, no registers).
#pragma unroll
        for (int dt = 0; dt < kKvTiles; ++dt) {
          float tv[4] = {0.0f, 0.0f, 0.0f, 0.0f}, tk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
          for (int kk = 0; kk < kSTiles; ++kk) {
            const float pf[4] = {st[kk][0], st[kk][2], st[kk][1], st[kk][3]};
            const float sf[4] = {dpt[kk][0], dpt[kk][2], dpt[kk][1], dpt[kk][3]};
            const int b_off = (kk * kMmaK + 2 * t) * kPitch + kv_col0 + g + dt * kMmaN;
            mma_fp32_operands<kPrecision>(tv, to_tf32<kPrecision>(pf), permuted_b_operand<kPrecision, kPitch>(sdOs + b_off));
            mma_fp32_operands<kPrecision>(tk, to_tf32<kPrecision>(sf), permuted_b_operand<kPrecision, kPitch>(sQs + b_off));
          }
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            dv[dt][e] += tv[e];
            dk[dt][e] += tk[e];
          }
        }
      }

      // Bug B2, dO: the terms P_ij dO_i[d] of the zeroed dO elements, added back to dV for the visible
      // pairs (add_nonfinite_do_dv; dO from global memory). After the products rather than before them:
      // st is dead here, and ptxas spilled less in the d256 kernels.
      if constexpr (kIsCausal) {
        if (q_do_suspect) {
          const float* dout = static_cast<const float*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride;
          add_nonfinite_do_dv<Traits, kPrecision>(dv, sdS, lse2, dvec, dout, p.do_row_stride, m0, n0, mask, head_dim);
          __syncthreads();  // P^T is read before dS^T lands
        }
      }
      store_keys_by_queries(dpt);
      __syncthreads();  // dS^T is complete; every warp is done with this stage's Q, dO, lse and D
      if (Traits::kStages == 1 && it + 1 < iters) {
        load_iter(it + 1, 0);  // lands during the dQ product, which reads only sK and sdS
        cp_async_commit();
      }

      // dQ_i += dS K_j for this warp's (16 rows, kDqCols columns). k-step kk = the tile's keys 8 kk ..
      // 8 kk + 7 in the permuted order: A = dS rows g, g + 8 at keys 8 kk + 2t, 8 kk + 2t + 1 (dS^T rows
      // 8 kk + 2t and 8 kk + 2t + 1, columns dq_row0 + g and + 8), B = K rows 8 kk + 2t, 8 kk + 2t + 1.
      float dq[kDqTiles][4];
#pragma unroll
      for (int j = 0; j < kDqTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[j][e] = 0.0f;
      // Bug B2, K (bwd_nonfinite.cuh), on a crossing tile when the K tile holds NaN / ±Inf (the flag is read
      // on crossing tiles only): the product with those as 0, and their terms added back for the visible
      // pairs (dq_product_nonfinite_k). The same mma in the same order otherwise, so every dq element
      // without such a term is bit-identical to the common loop's.
      if (kIsCausal && crosses_diag && *sKNonfinite) {
        dq_product_nonfinite_k<Traits, kPrecision>(dq, sdS, sK, m0, n0, mask);
      } else {
        // Unrolled by 2, as the k-steps of S^T.
#pragma unroll 2
        for (int kk = 0; kk < Traits::kDqKSteps; ++kk) {
          const float* ds_rows = sdS + (kk * kMmaK + 2 * t) * kDsPitch + dq_row0 + g;
          // a0 = (row g, key 2t), a1 = (row g + 8, key 2t), a2 = (row g, key 2t + 1), a3 = (row g + 8, key 2t + 1).
          const float af[4] = {ds_rows[0], ds_rows[8], ds_rows[kDsPitch], ds_rows[kDsPitch + 8]};
          const Tf32Operand<4> a = to_tf32<kPrecision>(af);
          const float* k_rows = sK + (kk * kMmaK + 2 * t) * kPitch + dq_col0 + g;
#pragma unroll
          for (int dt = 0; dt < kDqTiles; ++dt)
            mma_fp32_operands<kPrecision>(dq[dt], a, permuted_b_operand<kPrecision, kPitch>(k_rows + dt * kMmaN));
        }
      }
      // Element (dt, e): query row m0 + dq_row0 + g + 8 (e / 2), column dq_col0 + 8 dt + 2t + e % 2.
      float* acc = dq_accum + ((batch * p.heads_q + head) * ws.dq_rows + m0 + dq_row0 + g) * Traits::kHeadDim +
                   dq_col0 + 2 * t;
#pragma unroll
      for (int dt = 0; dt < kDqTiles; ++dt) {
        atomic_add_f32x2(acc + kMmaN * dt, dq[dt][0], dq[dt][1]);
        atomic_add_f32x2(acc + 8 * Traits::kHeadDim + kMmaN * dt, dq[dt][2], dq[dt][3]);
      }
    }

    // Epilogue: dK * scale and dV for this warp's keys and columns (zeros when no query saw the tile).
    float* dk_out = static_cast<float*>(p.dk) + batch * p.dk_batch_stride + head_kv * p.dk_head_stride;
    float* dv_out = static_cast<float*>(p.dv) + batch * p.dv_batch_stride + head_kv * p.dv_head_stride;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = n0 + key_row0 + g + 8 * h;
      if (key >= seqlen_k) continue;
#pragma unroll
      for (int dt = 0; dt < kKvTiles; ++dt) {
        const int col = kv_col0 + kMmaN * dt + 2 * t;
        if (col >= head_dim) continue;
        *reinterpret_cast<float2*>(dk_out + static_cast<int64_t>(key) * p.dk_row_stride + col) =
            make_float2(dk[dt][2 * h] * p.softmax_scale, dk[dt][2 * h + 1] * p.softmax_scale);
        *reinterpret_cast<float2*>(dv_out + static_cast<int64_t>(key) * p.dv_row_stride + col) =
            make_float2(dv[dt][2 * h], dv[dt][2 * h + 1]);
      }
    }
    __syncthreads();  // the next tile's loads overwrite sK, sV, the stages and sdS
  }
}

}  // namespace fa::cuda::flash
