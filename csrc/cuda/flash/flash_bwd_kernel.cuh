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
//   hidden pairs (bwd_mask.cuh: keys >= seqlen_k, query rows >= seqlen_q, causal keys past the row's
//   diagonal): P^T = dS^T = 0 by a select (0 * NaN would leak otherwise), on tiles that hold one only
//   dV  += P^T dO_i                  P^T re-packed in registers as the A operand, B = dO (ldmatrix.trans)
//   dK  += dS^T Q_i                  dS^T likewise, B = Q (ldmatrix.trans)
//   dS^T -> shared memory; dQ_i += dS K_j: warps split dQ_i's rows and columns, A = dS (ldmatrix.trans
//   of dS^T), B = K (ldmatrix.trans); the fp32 pieces go to the accumulator by atomic adds (v2 on sm_90).
// Epilogue: dK * softmax_scale and dV rounded to Elem (rows >= seqlen_k and columns >= head_dim skipped).
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
#include "cuda/flash/bwd_mask.cuh"
#include "cuda/flash/dq_accum.cuh"
#include "cuda/flash/flash_bwd_traits.h"
#include "cuda/flash/fragment_softmax.cuh"
#include "cuda/flash/ptx.cuh"
#include "cuda/flash/tile_load.cuh"

namespace fa::cuda::flash {

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
  const int first_tile = static_cast<int>(blockIdx.x % tile_stride);
  // 32-bit division (the launcher keeps the grid below 2^31 blocks): a 64-bit one is a slow call.
  const uint32_t bh = blockIdx.x / tile_stride;
  const int head_kv = static_cast<int>(bh % static_cast<uint32_t>(p.heads_kv));
  const int64_t batch = bh / static_cast<uint32_t>(p.heads_kv);
  const int group = static_cast<int>(p.heads_q / p.heads_kv);
  const int diag = seqlen_k - seqlen_q;  // causal: row i sees keys j <= i + diag
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
    const int m_begin = kIsCausal ? min(m_blocks, max(0, n0 - diag) / kBlockM) : 0;
    const int m_count = m_blocks - m_begin;
    const int iters = m_count * group;  // (query head of the group, query tile) pairs, head-major

    float dk[kKvTiles][4], dv[kKvTiles][4];
#pragma unroll
    for (int j = 0; j < kKvTiles; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[j][e] = dv[j][e] = 0.0f;

    // Loads iteration it's Q, dO tiles (cp.async, not committed) and its lse (base 2) and D rows.
    const auto load_iter = [&](int it, int stage) {
      const int head = head_kv * group + it / m_count;
      const int m0 = (m_begin + it % m_count) * kBlockM;
      const Elem* q = static_cast<const Elem*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride;
      const Elem* dout = static_cast<const Elem*>(p.dout) + batch * p.o_batch_stride + head * p.o_head_stride;
      load_tile_async<Traits, kBlockM>(sQ + stage * Traits::kQTileElems, q, p.q_row_stride, m0, seqlen_q, head_dim);
      load_tile_async<Traits, kBlockM>(sdO + stage * Traits::kQTileElems, dout, p.o_row_stride, m0, seqlen_q, head_dim);
      if (threadIdx.x < kBlockM) {
        const int row = m0 + static_cast<int>(threadIdx.x);
        const int64_t stat = (batch * p.heads_q + head) * p.seqlen_q + row;
        // Rows past seqlen_q have no lse or D to read: placeholders, as they see no key (P, dS selected to 0).
        sLse2[stage * kBlockM + threadIdx.x] = row < seqlen_q ? p.lse_in[stat] * kLog2e : INFINITY;
        sD[stage * kBlockM + threadIdx.x] = row < seqlen_q ? ws.d[stat] : 0.0f;
      }
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
      __syncthreads();  // tile it has landed everywhere; iteration it - 1 is done with the other stage and sdS
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
            lo[h] = kIsCausal ? key - diag - m0 - 2 * t : INT_MIN;
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
      if (bwd_tile_needs_mask<kBlockM, kBlockN, kIsCausal>(m0, n0, seqlen_q, seqlen_k, diag))
        p_and_ds(std::true_type{});
      else
        p_and_ds(std::false_type{});

      // dV += P^T dO and dK += dS^T Q over this warp's columns; k-steps over the tile's queries.
#pragma unroll
      for (int ks = 0; ks < Traits::kQKSteps; ++ks) {
        uint32_t pa[4], dsa[4];
        p_to_a_operand<Elem>(st, ks, pa);
        p_to_a_operand<Elem>(dpt, ks, dsa);
#pragma unroll
        for (int dp = 0; dp < kKvTiles / 2; ++dp) {
          // Transposed matrices: (queries 0-7, d 0-7), (queries 8-15, d 0-7), (queries 0-7, d 8-15),
          // (queries 8-15, d 8-15) = b0, b1 of column tile 2dp and b0, b1 of column tile 2dp + 1.
          const int b_off = (ks * 16 + (mi % 2) * 8 + lane % 8) * kPitch + kv_col0 + dp * 16 + (mi / 2) * 8;
          uint32_t of[4], qf[4];
          ldmatrix_x4_trans(of, smem_u32(sdOs + b_off));
          ldmatrix_x4_trans(qf, smem_u32(sQs + b_off));
          const uint32_t o0[2] = {of[0], of[1]}, o1[2] = {of[2], of[3]};
          const uint32_t q0[2] = {qf[0], qf[1]}, q1[2] = {qf[2], qf[3]};
          mma_m16n8k16<Elem>(dv[2 * dp], pa, o0);
          mma_m16n8k16<Elem>(dv[2 * dp + 1], pa, o1);
          mma_m16n8k16<Elem>(dk[2 * dp], dsa, q0);
          mma_m16n8k16<Elem>(dk[2 * dp + 1], dsa, q1);
        }
      }

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

      // dQ_i += dS K_j for this warp's (16 rows, kDqCols columns); k-steps over the tile's keys.
      float dq[kDqTiles][4];
#pragma unroll
      for (int j = 0; j < kDqTiles; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq[j][e] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < Traits::kDqKSteps; ++ks) {
        // A = dS (queries x keys) from dS^T [key][query], transposed: matrices (keys 0-7, queries 0-7),
        // (keys 0-7, queries 8-15), (keys 8-15, queries 0-7), (keys 8-15, queries 8-15) = a0..a3.
        uint32_t a[4];
        ldmatrix_x4_trans(a, smem_u32(sdS + (ks * 16 + (mi / 2) * 8 + lane % 8) * kDsPitch + dq_row0 + (mi % 2) * 8));
#pragma unroll
        for (int dp = 0; dp < kDqTiles / 2; ++dp) {
          uint32_t kf[4];
          ldmatrix_x4_trans(kf, smem_u32(sK + (ks * 16 + (mi % 2) * 8 + lane % 8) * kPitch + dq_col0 + dp * 16 + (mi / 2) * 8));
          const uint32_t b0[2] = {kf[0], kf[1]}, b1[2] = {kf[2], kf[3]};
          mma_m16n8k16<Elem>(dq[2 * dp], a, b0);
          mma_m16n8k16<Elem>(dq[2 * dp + 1], a, b1);
        }
      }
      float* acc = dq_accum + ((batch * p.heads_q + head) * ws.dq_rows + m0 + dq_row0 + g) * Traits::kHeadDim +
                   dq_col0 + 2 * t;
#pragma unroll
      for (int j = 0; j < kDqTiles; ++j) {
        atomic_add_f32x2(acc + 8 * j, dq[j][0], dq[j][1]);
        atomic_add_f32x2(acc + 8 * Traits::kHeadDim + 8 * j, dq[j][2], dq[j][3]);
      }
    }

    // Epilogue: dK * scale and dV for this warp's keys and columns (zeros when no query saw the tile).
    const int64_t kv_off = batch * p.k_batch_stride + head_kv * p.k_head_stride;
    const int64_t v_off = batch * p.v_batch_stride + head_kv * p.v_head_stride;
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
        *reinterpret_cast<uint32_t*>(dk_out + static_cast<int64_t>(key) * p.k_row_stride + col) =
            pack2<Elem>(dk[j][2 * h] * p.softmax_scale, dk[j][2 * h + 1] * p.softmax_scale);
        *reinterpret_cast<uint32_t*>(dv_out + static_cast<int64_t>(key) * p.v_row_stride + col) =
            pack2<Elem>(dv[j][2 * h], dv[j][2 * h + 1]);
      }
    }
    __syncthreads();  // the next tile's loads overwrite sK, sV, the stages and sdS
  }
}

}  // namespace fa::cuda::flash
