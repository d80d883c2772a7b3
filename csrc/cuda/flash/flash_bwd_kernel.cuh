// FlashAttention-2 backward, sm_80+ mma.sync path (fp16 / bf16, fp32 accumulation): FA2's Algorithm 2
// in one kernel, dQ through fp32 atomic adds.
//
// Grid: one thread block per (K/V tile of kBlockN keys, KV head, batch), flattened into blockIdx.x with
// the key tile fastest; for causal masking the first key tiles (which every later query sees, the
// heaviest) come first. K_j and V_j stay in shared memory for the whole loop. The loop runs over every
// query head of the KV head's group (GQA: dK and dV sum over the group in registers, no expanded
// buffers) and, per head, over the query tiles that can see K_j (causal: from the first row whose
// diagonal reaches the tile). Q_i, dO_i, lse_i and D_i stream through shared memory, double buffered
// with cp.async. Per query tile (warp w owns keys [16 (w % kKeyTiles), +16)):
//   S^T  = K_j Q_i^T                 (16 keys, kBlockM) per warp: mma, A = K (ldmatrix), B = Q
//   dP^T = V_j dO_i^T                (16 keys, kBlockM): A = V, B = dO
//   P^T  = 2^(S^T scale log2e - lse_i log2e)   no online softmax
//   dS^T = P^T o (dP^T - D_i)
//   hidden pairs (mask.cuh: keys >= seqlen_k, query rows >= seqlen_q, causal keys past the row's
//   diagonal): P^T = dS^T = 0 by a select (0 * NaN would leak otherwise), on tiles that hold one only
//   dV  += P^T dO_i                  P^T re-packed in registers as the A operand, B = dO (ldmatrix.trans)
//   dK  += dS^T Q_i                  dS^T likewise, B = Q (ldmatrix.trans)
//   dS^T -> shared memory; dQ_i += dS K_j: warps split dQ_i's rows and columns, A = dS (ldmatrix.trans
//   of dS^T), B = K (ldmatrix.trans); the fp32 pieces go to the accumulator by atomic adds (v2 on sm_90).
// Epilogue: dK * softmax_scale and dV rounded to Elem (rows >= seqlen_k and columns >= head_dim skipped).
//
// NaN / ±Inf at hidden pairs (bug B2, bwd_nonfinite.cuh), causal kernels only: the products still
// multiply the zeros of hidden pairs by dO, Q and K (0 * NaN = 0 * Inf = NaN). Only query tiles that
// cross the diagonal hold hidden pairs with real data; on those, a rare path (block-uniform) runs when
//   - a row of the tile has a non-finite lse or D (bwd_row_suspect; the loop-top barrier votes): the
//     dV / dK product runs a copy that sets the NaN / ±Inf words of its dO and Q B fragments to 0 and
//     keeps one bit per P^T element (> 0 or not); after the dQ atomics, add_nonfinite_do_terms records
//     the class (+Inf, -Inf, NaN) of dO's visible terms per dV accumulator, and the epilogue adds the
//     classes to dV. Q's terms need no add-back (bwd_nonfinite.cuh);
//   - K_j holds NaN / ±Inf (the block votes once per K/V tile, each thread scanning the chunks it
//     copied): the dQ product runs a copy that sets K's NaN / ±Inf words in its B fragments to 0 (sK
//     stays whole for the next tiles' S^T), and add_nonfinite_k_terms adds K's visible terms to dQ.
// The rare path is exact whether or not the data holds NaN / ±Inf (finite words are left as they are,
// the add-backs look for the non-finite values themselves); the common path computes what it computed
// before. The rare path keeps its state in the row padding of the shared-memory tiles (never written
// by the loads, never read by ldmatrix) and computes its addresses where it runs: the larger head dims
// are at the 255-register limit, and state or addresses kept in registers spilled in the loop.
//
// Query rows past seqlen_q load as zeros and see no key (their P^T and dS^T are selected to 0: a key
// holding -inf would score 0 * (-inf) = NaN there); the accumulator has rows up to the next multiple of
// kBlockM, so its atomics need no bounds checks.
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/attention_params.h"
#include "cuda/flash/bwd_nonfinite.cuh"
#include "cuda/flash/dq_accum.cuh"
#include "cuda/flash/flash_bwd_traits.h"
#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/mask.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/flash/tile_load.cuh"
#include "cuda/flash/tile_scheduler.cuh"

namespace fa::cuda::flash {

// The rare path of bug B2 in the causal kernels (the kernel's header comment). Its state lives in the
// 16-byte padding at the end of the rows of sV, the stages and sdS, which nothing else reads or writes.

// This thread's place in the warps' split of the work (as in the kernel), from threadIdx.x read by a
// volatile asm: the rare path computes its addresses where it runs (LLVM hoisted them out of the loop
// otherwise, into registers live through the common path, and ptxas spilled there).
template <typename Traits>
struct RareThread {
  int tid, lane, g, t, warp, key_row0, kv_col0, dq_row0, dq_col0;
  __device__ __forceinline__ RareThread() {
    asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(tid));
    lane = tid % 32;
    g = lane / 4;
    t = lane % 4;
    warp = tid / 32;
    key_row0 = (warp % Traits::kKeyTiles) * 16;
    kv_col0 = (warp / Traits::kKeyTiles) * Traits::kDPart;
    dq_row0 = (warp % Traits::kDqRowTiles) * 16;
    dq_col0 = (warp / Traits::kDqRowTiles) * Traits::kDqCols;
  }
};

// x, through a volatile asm, for the same reason: what the rare path derives from it is computed there.
__device__ __forceinline__ int rare_copy(int x) {
  int r;
  asm volatile("mov.b32 %0, %1;\n" : "=r"(r) : "r"(x));
  return r;
}

// Whether K_j holds NaN / ±Inf: the block's vote, kept by each thread in its own word of sV's row padding
// (written after the vote, read by the same thread: no barrier).
template <typename Traits>
__device__ __forceinline__ uint32_t* k_nonfinite_flag(typename Traits::Elem* sV) {
  static_assert(Traits::kBlockN * 4 >= Traits::kNThreads, "a word of sV's row padding per thread");
  const RareThread<Traits> th;
  return reinterpret_cast<uint32_t*>(sV + th.tid / 4 * Traits::kSmemPitch + Traits::kHeadDim) + th.tid % 4;
}

// P's class for the dO terms: whether P^T, as the dV product's A operand holds it (rounded to Elem), is
// > 0 (rather than 0 or NaN). That is all dV needs of P there: for dO_i[d] NaN / ±Inf, P_ij dO_i[d] is
// dO_i[d]'s own class where P_ij > 0 and NaN where P_ij is 0 or NaN. One bit per (key, query) in sdS's
// row padding (the dS^T store and the dQ product use columns < kBlockM only): key row key_t, 16-bit
// word 4 (warp / kKeyTiles) + t, bit 2 j + e for query 8 j + 2 t + e (P^T's n8 tile j). Each warp keeps
// its own bits (the warps of a key tile hold the same P^T), so only its lanes read them.
template <typename Traits>
__device__ __forceinline__ uint16_t* p_class_bits(typename Traits::Elem* sdS, int key_t, int warp, int t) {
  static_assert(2 * Traits::kSTiles <= 16 && Traits::kDSplit <= 2 &&
                    (Traits::kDsPitch - Traits::kBlockM) * sizeof(typename Traits::Elem) >=
                        Traits::kDSplit * 4 * sizeof(uint16_t),
                "a key's 4 x 16 query bits per warp of its key tile must fit its row's padding");
  const int word = 4 * (warp / Traits::kKeyTiles) + t;
  return reinterpret_cast<uint16_t*>(sdS + key_t * Traits::kDsPitch + Traits::kBlockM) + word;
}

// Bits 2 (2 ks) + e and 2 (2 ks + 1) + e of both keys' class words, from k-step ks's A operand a (P^T
// re-packed by p_to_a_operand: a[h] = key g + 8 h, queries 16 ks + 2 t + e; a[2 + h]: queries + 8). An
// Elem is > 0 when its bits lie in [1, +Inf] (P is never negative; NaN lies above +Inf).
template <typename Elem>
__device__ __forceinline__ void add_p_class_bits(uint32_t (&bits)[2], const uint32_t (&a)[4], int ks) {
  constexpr uint32_t kInf = NonFiniteBits<Elem>::kExp;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const uint32_t x = (a[2 * half + h] >> (16 * e)) & 0xFFFFu;
        bits[h] |= (x - 1u < kInf ? 1u : 0u) << (2 * (2 * ks + half) + e);
      }
}

// The dO terms' classes, per dV accumulator of this thread: the terms P_ij dO_i[d] of visible pairs
// where dO_i[d] is NaN / ±Inf are non-finite, so all that dV needs of them is the class of their sum:
// bit 0 for a +Inf, bit 1 for a -Inf (both: NaN); dv[jt][i] at bits 2 k, 2 k + 1 of the thread's
// 128-bit slot, k = 4 jt + i. The slot is the padding of row tid of the stages (sQ's rows, then sdO's):
// the thread's own, so it needs no barrier; it lasts for the K/V tile (set to 0 before the loop, added
// to dV by add_nonfinite_do_classes in the epilogue).
template <typename Traits>
__device__ __forceinline__ uint32_t* do_class_slot(typename Traits::Elem* sQ, int tid) {
  static_assert(2 * Traits::kStages * Traits::kBlockM >= Traits::kNThreads,
                "a row of the stages per thread (its padding holds the thread's slot)");
  static_assert(Traits::kSmemPitch - Traits::kHeadDim == Traits::kChunk && Traits::kKvTiles * 4 * 2 <= 128,
                "a thread's dV classes must fit the 16 bytes of its row's padding");
  return reinterpret_cast<uint32_t*>(sQ + tid * Traits::kSmemPitch + Traits::kHeadDim);
}

// Records in the slot the classes of the terms P_ij dO_i[d] of this thread's dV accumulators (key n0 +
// key_row0 + g + 8 h, column kv_col0 + 8 jt + 2 t + e) for the visible pairs of the tile's flagged rows i
// (bwd_row_suspect from iteration it's lse2 and D, 32 rows per ballot) where dO_i[d] is NaN / ±Inf: dO_i[d]'s
// own where P_ij > 0, NaN where P_ij is 0 or NaN (p_class_bits). dO is read from global memory. The slot
// is updated in place, column tile by column tile: a loop unrolled over this thread's columns, or adding
// the terms to dv, spilled registers in the common path. Runs after the barrier that follows the dS^T
// store, so the warp's class bits are visible to all its lanes.
template <typename Traits, typename Mask>
__device__ __forceinline__ void add_nonfinite_do_terms(typename Traits::Elem* sQ, typename Traits::Elem* sdS,
                                                       const typename Traits::Elem* dout, int64_t row_stride,
                                                       const float* sLse2, const float* sD, int it, int m0, int n0,
                                                       const Mask& mask, int head_dim) {
  using Elem = typename Traits::Elem;
  static_assert(Traits::kBlockM % 32 == 0, "the tile's rows are flagged 32 at a time (one ballot)");
  const RareThread<Traits> th;
  // Iteration it's lse2 and D (the stage's pointers, shared with the common path, stayed live to here).
  const int stage = rare_copy(it) % Traits::kStages;
  const float* lse2 = sLse2 + stage * Traits::kBlockM;
  const float* dvec = sD + stage * Traits::kBlockM;
  uint32_t* const cls = do_class_slot<Traits>(sQ, th.tid);
  const int key_t0 = th.key_row0 + th.g, col0 = th.kv_col0 + 2 * th.t;
#pragma unroll 1
  for (int r0 = 0; r0 < Traits::kBlockM; r0 += 32) {
    const int rl = r0 + th.lane;
    uint32_t rows = __ballot_sync(0xffffffffu, bwd_row_suspect(m0 + rl, mask.seqlen_q, lse2[rl], dvec[rl]));
    while (rows != 0u) {
      const int r = r0 + __ffs(rows) - 1;
      rows &= rows - 1u;
      const int row = m0 + r;
      bool visible[2], positive[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        visible[h] = !mask.hidden(row, n0 + key_t0 + 8 * h);
        positive[h] = (*p_class_bits<Traits>(sdS, key_t0 + 8 * h, th.warp, r % 8 / 2) >> (2 * (r / 8) + r % 2)) & 1u;
      }
      const Elem* orow = dout + static_cast<int64_t>(row) * row_stride;
#pragma unroll 1
      for (int jt = 0; jt < Traits::kKvTiles && col0 + 8 * jt < head_dim; ++jt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const float x = to_float(orow[col0 + 8 * jt + e]);
          if (isfinite(x)) continue;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int k = 4 * jt + 2 * h + e;
            const uint32_t code = !positive[h] || isnan(x) ? 3u : x > 0.0f ? 1u : 2u;
            if (visible[h]) cls[k / 16] |= code << (2 * (k % 16));
          }
        }
      }
    }
  }
}

// The epilogue's half: dv += the class its slot recorded (+Inf, -Inf or NaN), only where it recorded
// one (adding 0 would turn a -0 into +0). The terms being non-finite, their order against the products'
// finite sums does not matter (bwd_nonfinite.cuh), nor adding them once per class rather than per term.
template <typename Traits>
__device__ __forceinline__ void add_nonfinite_do_classes(float (&dv)[Traits::kKvTiles][4], typename Traits::Elem* sQ) {
  const uint4 c = *reinterpret_cast<const uint4*>(do_class_slot<Traits>(sQ, static_cast<int>(threadIdx.x)));
  if ((c.x | c.y | c.z | c.w) == 0u) return;
  const uint32_t cls[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
  for (int jt = 0; jt < Traits::kKvTiles; ++jt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = 4 * jt + i;
      const uint32_t code = (cls[k / 16] >> (2 * (k % 16))) & 3u;
      if (code != 0u) dv[jt][i] += code == 1u ? INFINITY : code == 2u ? -INFINITY : NAN;
    }
}

// K's terms, after the dQ product ran with K's NaN / ±Inf zeroed in its B fragments: adds dS_ij K_j[d] to
// this thread's dQ accumulators (row m0 + dq_row0 + g + 8 h, column dq_col0 + 8 jt + 2 t + e in
// dq[jt][2 h + e]) for the visible pairs, for every key j of the tile whose K row holds NaN / ±Inf in this
// warp's columns (32 keys per ballot). K comes from sK (unmodified, the same data as K in global memory),
// dS from sdS [key][query] as the product's A operand read it (Elem); both after the barrier that
// follows the dS^T store.
template <typename Traits, typename Mask>
__device__ __forceinline__ void add_nonfinite_k_terms(float (&dq)[Traits::kDqTiles][4],
                                                      const typename Traits::Elem* sK,
                                                      const typename Traits::Elem* sdS, int n0, int m0,
                                                      const Mask& mask) {
  using Elem = typename Traits::Elem;
  constexpr int kPitch = Traits::kSmemPitch, kDsPitch = Traits::kDsPitch;
  static_assert(Traits::kBlockN % 32 == 0, "the tile's keys are flagged 32 at a time (one ballot)");
  const RareThread<Traits> th;
#pragma unroll 1
  for (int k0 = 0; k0 < Traits::kBlockN; k0 += 32) {
    const Elem* scan = sK + (k0 + th.lane) * kPitch + th.dq_col0;
    bool bad = false;
#pragma unroll
    for (int c = 0; c < Traits::kDqCols; c += Traits::kChunk)
      bad |= chunk_nonfinite<Elem>(*reinterpret_cast<const uint4*>(scan + c));
    uint32_t keys = __ballot_sync(0xffffffffu, bad);
    while (keys != 0u) {
      const int kk = k0 + __ffs(keys) - 1;  // in the tile; keys >= seqlen_k load as zeros, never here
      keys &= keys - 1u;
      const Elem* krow = sK + kk * kPitch + th.dq_col0 + 2 * th.t;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int rt = th.dq_row0 + th.g + 8 * h;
        if (mask.hidden(m0 + rt, n0 + kk)) continue;
        const float ds = to_float(sdS[kk * kDsPitch + rt]);
#pragma unroll
        for (int jt = 0; jt < Traits::kDqTiles; ++jt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = to_float(krow[8 * jt + e]);
            if (!isfinite(x)) dq[jt][2 * h + e] += ds * x;
          }
      }
    }
  }
}

template <typename Traits, bool kIsCausal>
__global__ void __launch_bounds__(Traits::kNThreads) flash_bwd_kernel(const AttentionBwdParams p,
                                                                      const FlashBwdWorkspace ws) {
  using Elem = typename Traits::Elem;
  constexpr int kBlockM = Traits::kBlockM, kBlockN = Traits::kBlockN, kPitch = Traits::kSmemPitch;
  constexpr int kDsPitch = Traits::kDsPitch, kSTiles = Traits::kSTiles, kKSteps = Traits::kKSteps;
  constexpr int kKvTiles = Traits::kKvTiles, kDqTiles = Traits::kDqTiles;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  Elem* sK = reinterpret_cast<Elem*>(smem_raw);
  Elem* sV = sK + Traits::kKvTileElems;
  Elem* sQ = sV + Traits::kKvTileElems;                   // [kStages][kBlockM][kPitch]
  Elem* sdO = sQ + Traits::kStages * Traits::kQTileElems;  // [kStages][kBlockM][kPitch]
  Elem* sdS = sdO + Traits::kStages * Traits::kQTileElems;  // [kBlockN][kDsPitch]
  float* sLse2 = reinterpret_cast<float*>(smem_raw + Traits::kElemBytes);  // [kStages][kBlockM]
  float* sD = sLse2 + Traits::kStages * kBlockM;                          // [kStages][kBlockM]

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

  const Elem* k = static_cast<const Elem*>(p.k) + batch * p.k_batch_stride + head_kv * p.k_head_stride;
  const Elem* v = static_cast<const Elem*>(p.v) + batch * p.v_batch_stride + head_kv * p.v_head_stride;

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment row group and thread-in-group
  const int mi = lane / 8;               // which 8x8 matrix of an ldmatrix x4 this lane addresses
  const int key_tile = warp % Traits::kKeyTiles;
  const int kv_col0 = (warp / Traits::kKeyTiles) * Traits::kDPart;  // this warp's dK / dV columns
  const int key_row0 = key_tile * 16;                               // this warp's keys, in the tile
  const int dq_row0 = (warp % Traits::kDqRowTiles) * 16;            // this warp's dQ rows, in the tile
  const int dq_col0 = (warp / Traits::kDqRowTiles) * Traits::kDqCols;

  for (int n_block = first_tile; n_block < n_blocks; n_block += static_cast<int>(tile_stride)) {
    const int n0 = n_block * kBlockN;
    // Query tiles that see some key of this tile: causal starts at the first row whose diagonal reaches n0.
    const int m_blocks = (seqlen_q + kBlockM - 1) / kBlockM;
    const int m_begin = mask.template first_query_tile<kBlockM>(n0, m_blocks);
    const int m_count = m_blocks - m_begin;
    const int iters = m_count * group;  // (query head of the group, query tile) pairs, head-major

    float dk[kKvTiles][4], dv[kKvTiles][4];
#pragma unroll
    for (int j = 0; j < kKvTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;
    if constexpr (kIsCausal)  // this thread's dO term classes (the rare path's) start empty
      *reinterpret_cast<uint4*>(do_class_slot<Traits>(sQ, static_cast<int>(threadIdx.x))) = make_uint4(0u, 0u, 0u, 0u);

    // Loads iteration it's Q, dO tiles (cp.async, not committed) and its lse (base 2) and D rows.
    const auto load_iter = [&](int it, int stage) {
      load_bwd_query_step<Traits, kBlockM>(p, ws.d, sQ, sdO, sLse2, sD, stage, head_kv * group + it / m_count,
                                           (m_begin + it % m_count) * kBlockM, batch, seqlen_q, head_dim);
    };

    if (iters > 0) {
      load_tile_async<Traits, kBlockN>(sK, k, p.k_row_stride, n0, seqlen_k, head_dim);
      load_tile_async<Traits, kBlockN>(sV, v, p.v_row_stride, n0, seqlen_k, head_dim);
      load_iter(0, 0);
      cp_async_commit();
    }

    for (int it = 0; it < iters; ++it) {
      const int stage = it % Traits::kStages;
      const int head = head_kv * group + it / m_count;
      const int m0 = (m_begin + it % m_count) * kBlockM;
      cp_async_wait<0>();
      // Rare-path votes (causal; bug B2, header comment), on tiles that cross the diagonal. The first
      // iteration crosses if any does (it has the smallest m0): there each thread scans the K chunks it
      // copied itself (visible to it after its wait) and the block votes once per K/V tile. The barrier
      // every iteration needs votes on the tile's rows flagged by lse or D (each row's thread wrote the
      // stage's lse2 and D itself).
      const bool crosses = mask.template crosses<kBlockM, kBlockN>(m0, n0);
      bool rows_nonfinite = false;
      if constexpr (kIsCausal) {
        if (it == 0)
          *k_nonfinite_flag<Traits>(sV) = __syncthreads_or(
              crosses && tile_nonfinite<Elem, kBlockN, Traits::kHeadDim, kPitch, Traits::kNThreads, false>(sK));
        const int tid = static_cast<int>(threadIdx.x);
        // tile it has landed everywhere; iteration it - 1 is done with the other stage and sdS
        rows_nonfinite = __syncthreads_or(crosses && tid < kBlockM &&
                                          bwd_row_suspect(m0 + tid, seqlen_q, sLse2[stage * kBlockM + tid],
                                                          sD[stage * kBlockM + tid]));
      } else {
        __syncthreads();  // tile it has landed everywhere; iteration it - 1 is done with the other stage and sdS
      }
      if (it + 1 < iters) {
        load_iter(it + 1, (it + 1) % Traits::kStages);
        cp_async_commit();
      }
      const Elem* sQs = sQ + stage * Traits::kQTileElems;
      const Elem* sdOs = sdO + stage * Traits::kQTileElems;
      const float* lse2 = sLse2 + stage * kBlockM;
      const float* dvec = sD + stage * kBlockM;

      // S^T = K Q^T and dP^T = V dO^T: (16 keys, kBlockM queries) per warp.
      float st[kSTiles][4], dpt[kSTiles][4];
#pragma unroll
      for (int j = 0; j < kSTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = dpt[j][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        // A: this warp's 16 keys x 16 head-dim columns (ldmatrix x4: row lane % 16, column (lane / 16) 8).
        uint32_t ka[4], va[4];
        const int a_off = (key_row0 + lane % 16) * kPitch + ks * 16 + (lane / 16) * 8;
        ldmatrix_x4(ka, smem_u32(sK + a_off));
        ldmatrix_x4(va, smem_u32(sV + a_off));
#pragma unroll
        for (int np = 0; np < kSTiles / 2; ++np) {
          // B: matrices (queries 0-7, d 0-7), (queries 0-7, d 8-15), (queries 8-15, d 0-7), (8-15, 8-15)
          // = b0, b1 of n-tile 2np and b0, b1 of n-tile 2np + 1.
          const int b_off = (np * 16 + (mi / 2) * 8 + lane % 8) * kPitch + ks * 16 + (mi % 2) * 8;
          uint32_t qf[4], of[4];
          ldmatrix_x4(qf, smem_u32(sQs + b_off));
          ldmatrix_x4(of, smem_u32(sdOs + b_off));
          const uint32_t q0[2] = {qf[0], qf[1]}, q1[2] = {qf[2], qf[3]};
          const uint32_t o0[2] = {of[0], of[1]}, o1[2] = {of[2], of[3]};
          mma_m16n8k16<Elem>(st[2 * np], ka, q0);
          mma_m16n8k16<Elem>(st[2 * np + 1], ka, q1);
          mma_m16n8k16<Elem>(dpt[2 * np], va, o0);
          mma_m16n8k16<Elem>(dpt[2 * np + 1], va, o1);
        }
      }

      // P^T and dS^T in place. Element (j, e): key n0 + key_row0 + g + 8 (e / 2), query m0 + 8 j + 2 t + e % 2.
      // x = S^T scale_log2 is rounded before lse2 is subtracted (__fmul_rn: ptxas would contract a plain
      // multiply and subtract into one fma and change P's bits). On a tile that holds a hidden pair
      // (`masked`, a std::bool_constant: the other tiles compile without the test), a hidden element
      // gets 2^-inf = +0 and dP - D = 0 by selects (bwd_mask.cuh): P^T = dS^T = 0 whatever S, lse, dP and
      // D hold. (Selecting these inputs rather than the outputs, and comparing offsets against per-key
      // bounds: the form that ptxas compiled without new spills inside the loop, d256 and the sm_90a
      // builds being at the 255-register limit.)
      const auto p_and_ds = [&](auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
        // The queries that see key h (n0 + key_row0 + g + 8 h): offsets [lo[h], hi[h]) from m0 + 2 t, so
        // that element (j, e) compares its constant offset 8 j + e % 2. INT_MIN: no bound (non-causal
        // lo) or no query (hi of a key >= seqlen_k).
        int lo[2] = {0, 0}, hi[2] = {0, 0};
        if constexpr (kMasked) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int key = n0 + key_row0 + g + 8 * h;
            lo[h] = kIsCausal ? mask.first_row(key) - m0 - 2 * t : INT_MIN;
            hi[h] = key < seqlen_k ? seqlen_q - m0 - 2 * t : INT_MIN;
          }
        }
#pragma unroll
        for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int qcol = 8 * j + 2 * t + e % 2;
            const int c = 8 * j + e % 2;
            const bool hidden = kMasked & ((c < lo[e / 2]) | (c >= hi[e / 2]));
            float arg = __fmul_rn(st[j][e], p.scale_log2) - lse2[qcol];
            if (hidden) arg = -INFINITY;
            const float pe = exp2_approx(arg);
            st[j][e] = pe;
            float dd = dpt[j][e] - dvec[qcol];
            if (hidden) dd = 0.0f;
            dpt[j][e] = pe * dd;
          }
        }
      };
      if (mask.template bwd_tile_needs_mask<kBlockM, kBlockN>(m0, n0))
        p_and_ds(std::true_type{});
      else
        p_and_ds(std::false_type{});

      // dV += P^T dO and dK += dS^T Q over this warp's columns; k-steps over the tile's queries. With
      // `zero_qdo` (a std::bool_constant; rare path: a flagged row on a crossing tile) the NaN / ±Inf of Q
      // and dO become 0 in the B fragments (the stage keeps them), and P's class bits go to sdS's padding
      // for add_nonfinite_do_terms.
      const auto dv_dk_product = [&](auto zero_qdo) {
        constexpr bool kZero = decltype(zero_qdo)::value;
        uint32_t bits[2] = {0u, 0u};
#pragma unroll
        for (int ks = 0; ks < Traits::kQKSteps; ++ks) {
          uint32_t pa[4], dsa[4];
          p_to_a_operand<Elem>(st, ks, pa);
          p_to_a_operand<Elem>(dpt, ks, dsa);
          if constexpr (kZero) add_p_class_bits<Elem>(bits, pa, ks);
#pragma unroll
          for (int dp = 0; dp < kKvTiles / 2; ++dp) {
            // Transposed matrices: (queries 0-7, d 0-7), (queries 8-15, d 0-7), (queries 0-7, d 8-15),
            // (queries 8-15, d 8-15) = b0, b1 of column tile 2dp and b0, b1 of column tile 2dp + 1
            // (2 queries per word).
            const int b_off = (ks * 16 + (mi % 2) * 8 + lane % 8) * kPitch + kv_col0 + dp * 16 + (mi / 2) * 8;
            uint32_t of[4], qf[4];
            ldmatrix_x4_trans(of, smem_u32(sdOs + b_off));
            ldmatrix_x4_trans(qf, smem_u32(sQs + b_off));
            if constexpr (kZero) {
#pragma unroll
              for (int w = 0; w < 4; ++w) {
                of[w] = word_zero_nonfinite<Elem>(of[w]);
                qf[w] = word_zero_nonfinite<Elem>(qf[w]);
              }
            }
            const uint32_t o0[2] = {of[0], of[1]}, o1[2] = {of[2], of[3]};
            const uint32_t q0[2] = {qf[0], qf[1]}, q1[2] = {qf[2], qf[3]};
            mma_m16n8k16<Elem>(dv[2 * dp], pa, o0);
            mma_m16n8k16<Elem>(dv[2 * dp + 1], pa, o1);
            mma_m16n8k16<Elem>(dk[2 * dp], dsa, q0);
            mma_m16n8k16<Elem>(dk[2 * dp + 1], dsa, q1);
          }
        }
        if constexpr (kZero) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            *p_class_bits<Traits>(sdS, key_row0 + g + 8 * h, warp, t) = static_cast<uint16_t>(bits[h]);
        }
      };
      if (rows_nonfinite)
        dv_dk_product(std::true_type{});
      else
        dv_dk_product(std::false_type{});

      // dS^T to shared memory [key][query] (the first warp of each key tile; the others hold copies).
      if (warp < Traits::kKeyTiles) {
#pragma unroll
        for (int j = 0; j < kSTiles; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            *reinterpret_cast<uint32_t*>(sdS + (key_row0 + g + 8 * h) * kDsPitch + 8 * j + 2 * t) =
                pack2<Elem>(dpt[j][2 * h], dpt[j][2 * h + 1]);
      }
      __syncthreads();

      // dQ_i += dS K_j for this warp's (16 rows, kDqCols columns); k-steps over the tile's keys. With
      // `zero_k` (a std::bool_constant; rare path: K_j holds NaN / ±Inf and the tile crosses the
      // diagonal) K's NaN / ±Inf become 0 in the B fragments, sK staying whole for the next tiles' S^T;
      // add_nonfinite_k_terms then adds their visible terms.
      float dq[kDqTiles][4];
#pragma unroll
      for (int j = 0; j < kDqTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[j][e] = 0.0f;
      const auto dq_product = [&](auto zero_k) {
#pragma unroll
        for (int ks = 0; ks < Traits::kDqKSteps; ++ks) {
          // A = dS (queries x keys) from dS^T [key][query], transposed: matrices (keys 0-7, queries 0-7),
          // (keys 0-7, queries 8-15), (keys 8-15, queries 0-7), (keys 8-15, queries 8-15) = a0..a3.
          uint32_t a[4];
          ldmatrix_x4_trans(a, smem_u32(sdS + (ks * 16 + (mi / 2) * 8 + lane % 8) * kDsPitch + dq_row0 + (mi % 2) * 8));
#pragma unroll
          for (int dp = 0; dp < kDqTiles / 2; ++dp) {
            // B = K (keys x d), transposed: matrices (keys 0-7, d 0-7), (keys 8-15, d 0-7), (keys 0-7,
            // d 8-15), (keys 8-15, d 8-15) = b0, b1 of column tiles 2dp and 2dp + 1 (2 keys per word).
            uint32_t kf[4];
            ldmatrix_x4_trans(
                kf, smem_u32(sK + (ks * 16 + (mi % 2) * 8 + lane % 8) * kPitch + dq_col0 + dp * 16 + (mi / 2) * 8));
            if constexpr (decltype(zero_k)::value) {
#pragma unroll
              for (int w = 0; w < 4; ++w) kf[w] = word_zero_nonfinite<Elem>(kf[w]);
            }
            const uint32_t b0[2] = {kf[0], kf[1]}, b1[2] = {kf[2], kf[3]};
            mma_m16n8k16<Elem>(dq[2 * dp], a, b0);
            mma_m16n8k16<Elem>(dq[2 * dp + 1], a, b1);
          }
        }
      };
      if (kIsCausal && crosses && *k_nonfinite_flag<Traits>(sV) != 0u) {
        dq_product(std::true_type{});
        add_nonfinite_k_terms<Traits>(dq, sK, sdS, n0, m0, mask);
      } else {
        dq_product(std::false_type{});
      }
      float* acc = dq_accum + ((batch * p.heads_q + head) * ws.dq_rows + m0 + dq_row0 + g) * Traits::kHeadDim +
                   dq_col0 + 2 * t;
#pragma unroll
      for (int j = 0; j < kDqTiles; ++j) {
        atomic_add_f32x2(acc + 8 * j, dq[j][0], dq[j][1]);
        atomic_add_f32x2(acc + 8 * Traits::kHeadDim + 8 * j, dq[j][2], dq[j][3]);
      }
      if (rows_nonfinite) {  // dO's visible terms, here where only dK and dV stay live
        const Elem* dout = static_cast<const Elem*>(p.dout) + batch * p.do_batch_stride + head * p.do_head_stride;
        add_nonfinite_do_terms<Traits>(sQ, sdS, dout, p.do_row_stride, sLse2, sD, it, m0, n0, mask, head_dim);
      }
    }

    // Epilogue: dK * scale and dV for this warp's keys and columns (zeros when no query saw the tile).
    if constexpr (kIsCausal) add_nonfinite_do_classes<Traits>(dv, sQ);
    const int64_t kv_off = batch * p.dk_batch_stride + head_kv * p.dk_head_stride;
    const int64_t v_off = batch * p.dv_batch_stride + head_kv * p.dv_head_stride;
    Elem* dk_out = static_cast<Elem*>(p.dk) + kv_off;
    Elem* dv_out = static_cast<Elem*>(p.dv) + v_off;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = n0 + key_row0 + g + 8 * h;
      if (key >= seqlen_k) continue;
#pragma unroll
      for (int j = 0; j < kKvTiles; ++j) {
        const int col = kv_col0 + 8 * j + 2 * t;
        if (col >= head_dim) continue;
        *reinterpret_cast<uint32_t*>(dk_out + static_cast<int64_t>(key) * p.dk_row_stride + col) =
            pack2<Elem>(dk[j][2 * h] * p.softmax_scale, dk[j][2 * h + 1] * p.softmax_scale);
        *reinterpret_cast<uint32_t*>(dv_out + static_cast<int64_t>(key) * p.dv_row_stride + col) =
            pack2<Elem>(dv[j][2 * h], dv[j][2 * h + 1]);
      }
    }
    __syncthreads();  // the next tile's loads overwrite sK, sV, the stages and sdS
  }
}

}  // namespace fa::cuda::flash
