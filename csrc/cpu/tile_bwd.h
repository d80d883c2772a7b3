// Backward work items of the CPU backend (FlashAttention-2 Algorithm 2) for one instruction set.
// Included by flash_bwd_cpu.cc once per instruction set, after tile_kernels.h (no include guard:
// see tile_kernels.h for the inclusion contract).
//
// Two schedules, chosen per call by flash_bwd_cpu.cc, that give bit-identical results:
//  - fused (enough (batch, kv head) items for the threads): one item owns a kv head, loops the
//    query heads sharing it, and per K/V tile streams the Q tiles, accumulating dK, dV and dQ
//    (Algorithm 2 as written; dQ in a per-worker fp32 [seqlen_q, d] accumulator).
//  - split (few kv heads, more threads): a dK/dV pass over (batch, kv head, K/V tile) items and a
//    dQ pass over (batch, query head, Q tile) items that recomputes S and dP (7 tile GEMMs instead
//    of 5, but every thread busy and no dQ partial sums to reduce).
// Every tile GEMM computes each element as one fma chain in a fixed order (tile_kernels.h), and both
// schedules visit the (Q tile, K/V tile) pairs and tile shapes identically, so dQ, dK and dV do not
// depend on the schedule or on the thread count.

// Masked lanes of P (keys past the end, causal-invisible entries) are exactly 0, so no Inf * 0.
inline Vec keep_lanes(VecI lane_pos, int64_t first, int64_t end, Vec v) {
  return (lane_pos >= VecI{} + static_cast<int32_t>(first)) & (lane_pos < VecI{} + static_cast<int32_t>(end))
             ? v
             : Vec{};
}

// D = rowsum(dO ∘ O) for one (batch, query head, query tile), into plan.delta.
void bwd_delta_item(const BwdPlan& plan, int64_t item, float* ws) {
  const AttentionBwdParams& p = *plan.p;
  const int d = plan.head_dim;
  const int64_t qt = item % plan.q_tiles;
  const int64_t bh = item / plan.q_tiles;
  const int64_t b = bh / p.heads_q;
  const int64_t h = bh % p.heads_q;
  const int64_t i0 = qt * kBwdBlockQ;
  const int rows = static_cast<int>(std::min<int64_t>(kBwdBlockQ, p.seqlen_q - i0));
  float* o_row = ws + plan.off_qc;    // [d]
  float* do_row = ws + plan.off_doc;  // [d]
  for (int r = 0; r < rows; ++r) {
    const int64_t off = b * p.o_batch_stride + (i0 + r) * p.o_row_stride + h * p.o_head_stride;
    convert_row(p.out, p.dtype, off, d, 1.0f, o_row);
    convert_row(p.dout, p.dtype, off, d, 1.0f, do_row);
    plan.delta[(b * p.heads_q + h) * p.seqlen_q + i0 + r] = dot_row(o_row, do_row, d);
  }
}

// Loads K/V tile j (keys [j0, j0 + keys) of kv head hk): K_j^T and V_j^T (for S and dP in the
// S = Q K^T orientation), and K_j row-major (for dQ) when with_k_rows.
void bwd_load_kv(const BwdPlan& plan, int64_t b, int64_t hk, int64_t j0, int keys, bool with_k_rows, float* ws) {
  const AttentionBwdParams& p = *plan.p;
  const int d = plan.head_dim;
  const int keys_pad = pad_to_tile(keys);
  const int64_t k_off = b * p.k_batch_stride + j0 * p.k_row_stride + hk * p.k_head_stride;
  const int64_t v_off = b * p.v_batch_stride + j0 * p.v_row_stride + hk * p.v_head_stride;
  float* row = ws + plan.off_row;
  load_rows_transposed(p.k, p.dtype, k_off, p.k_row_stride, keys, d, keys_pad, 1.0f, ws + plan.off_kt, kBwdBlockK,
                       row);
  load_rows_transposed(p.v, p.dtype, v_off, p.v_row_stride, keys, d, keys_pad, 1.0f, ws + plan.off_vt, kBwdBlockK,
                       row);
  if (with_k_rows) load_rows(p.k, p.dtype, k_off, p.k_row_stride, keys, d, keys_pad, 1.0f, ws + plan.off_kc, d);
}

// LSE (+inf on padding rows, so P = 0 there) and D of query rows [i0, i0 + rows).
void bwd_load_row_stats(const BwdPlan& plan, int64_t b, int64_t hq, int64_t i0, int rows, float* ws) {
  const AttentionBwdParams& p = *plan.p;
  float* lse = ws + plan.off_lse;
  float* dl = ws + plan.off_delta;
  const int64_t base = (b * p.heads_q + hq) * p.seqlen_q + i0;
  for (int r = 0; r < rows; ++r) {
    lse[r] = p.lse_in[base + r];
    dl[r] = plan.delta[base + r];
  }
  for (int r = rows; r < pad_to_tile(rows); ++r) {
    lse[r] = std::numeric_limits<float>::infinity();
    dl[r] = 0.0f;
  }
}

// P = exp2(S * scale_log2 - LSE * log2 e), evaluated as exp2((S * softmax_scale - LSE) * log2 e):
// the fma rounds once after the cancellation, and LSE is used as stored (rounding LSE * log2 e, an
// O(|LSE|) number, would add its ulp to every P of the row).
inline Vec recompute_p(Vec s, Vec softmax_scale, Vec lse) {
  return exp2v(vfma(s, softmax_scale, -lse) * vsplat<Vec>(kLog2e));
}

// Q_i and dO_i of query head hq as [rows_pad][d] fp32 into qc and doc.
void bwd_load_q_tile(const BwdPlan& plan, int64_t b, int64_t hq, int64_t i0, int rows, float* qc, float* doc) {
  const AttentionBwdParams& p = *plan.p;
  const int d = plan.head_dim;
  const int rows_pad = pad_to_tile(rows);
  load_rows(p.q, p.dtype, b * p.q_batch_stride + i0 * p.q_row_stride + hq * p.q_head_stride, p.q_row_stride, rows, d,
            rows_pad, 1.0f, qc, d);
  load_rows(p.dout, p.dtype, b * p.o_batch_stride + i0 * p.o_row_stride + hq * p.o_head_stride, p.o_row_stride, rows,
            d, rows_pad, 1.0f, doc, d);
}

// One (Q tile i, K/V tile j) step in the S = Q K^T orientation. The K/V tile was loaded by
// bwd_load_kv; qc, doc: Q_i and dO_i, [rows_pad][d]. dk, dv: [keys_pad][d] accumulators of tile j;
// dq: [rows_pad][d] accumulator of tile i.
template <bool kWithDq>
void bwd_pair(const BwdPlan& plan, int64_t b, int64_t hq, int64_t i0, int64_t j0, int keys, const float* qc,
              const float* doc, float* ws, float* dk, float* dv, float* dq) {
  const AttentionBwdParams& p = *plan.p;
  const int d = plan.head_dim;
  constexpr int kBk = kBwdBlockK;
  const int rows = static_cast<int>(std::min<int64_t>(kBwdBlockQ, p.seqlen_q - i0));
  const int rows_pad = pad_to_tile(rows);
  const int keys_pad = pad_to_tile(keys);

  float* s = ws + plan.off_s;      // [kBwdBlockQ][kBk] S, then P
  float* dp = ws + plan.off_dp;    // [kBwdBlockQ][kBk] dP, then dS
  const float* lse = ws + plan.off_lse;
  const float* dl = ws + plan.off_delta;

  bwd_load_row_stats(plan, b, hq, i0, rows, ws);

  gemm<ALayout::kRowMajor, false>(rows_pad, keys_pad, d, qc, d, ws + plan.off_kt, kBk, s, kBk);
  gemm<ALayout::kRowMajor, false>(rows_pad, keys_pad, d, doc, d, ws + plan.off_vt, kBk, dp, kBk);

  // P (recompute_p), dS = P ∘ (dP - D). Row r sees keys c < visible.
  const int64_t diag = p.seqlen_k - p.seqlen_q;
  const Vec scale = vsplat<Vec>(p.softmax_scale);
  const VecI lanes = lane_index();
  for (int r = 0; r < rows_pad; ++r) {
    const int64_t visible =
        p.causal ? std::min<int64_t>(keys, std::max<int64_t>(0, i0 + r + diag - j0 + 1)) : keys;
    const Vec lse_r = vsplat<Vec>(lse[r]);
    const Vec dr = vsplat<Vec>(dl[r]);
    float* srow = s + r * kBk;
    float* dprow = dp + r * kBk;
    for (int c = 0; c < keys_pad; c += kLanes) {
      const Vec pv = keep_lanes(lanes + c, 0, visible, recompute_p(vload<Vec>(srow + c), scale, lse_r));
      vstore<Vec>(srow + c, pv);
      vstore<Vec>(dprow + c, pv * (vload<Vec>(dprow + c) - dr));
    }
  }

  // dV_j += P^T dO_i; dK_j += dS^T Q_i (softmax_scale applied at the store); dQ_i += dS K_j.
  gemm<ALayout::kColMajor, true>(keys_pad, d, rows_pad, s, kBk, doc, d, dv, d);
  gemm<ALayout::kColMajor, true>(keys_pad, d, rows_pad, dp, kBk, qc, d, dk, d);
  if constexpr (kWithDq) gemm<ALayout::kRowMajor, true>(rows_pad, d, keys_pad, dp, kBk, ws + plan.off_kc, d, dq, d);
}

// First query tile with a row that sees key j0 (causal), or q_tiles if none does.
int64_t bwd_first_q_tile(const BwdPlan& plan, int64_t j0) {
  const AttentionBwdParams& p = *plan.p;
  if (!p.causal) return 0;
  const int64_t first_row = std::max<int64_t>(0, j0 - (p.seqlen_k - p.seqlen_q));
  return first_row >= p.seqlen_q ? plan.q_tiles : first_row / kBwdBlockQ;
}

// Rows [0, rows) of an fp32 [rows][d] accumulator, times scale, into a strided output tensor.
void bwd_store_rows(const BwdPlan& plan, const float* acc, int64_t rows, float scale, void* dst, int64_t offset,
                    int64_t row_stride) {
  const AttentionBwdParams& p = *plan.p;
  for (int64_t r = 0; r < rows; ++r)
    store_row(acc + static_cast<int64_t>(r) * plan.head_dim, plan.head_dim, scale, p.dtype, dst,
              offset + r * row_stride);
}

// Fused schedule: item = (batch, kv head). Uses the per-worker whole-sequence accumulators.
void bwd_fused_item(const BwdPlan& plan, int64_t item, float* ws) {
  const AttentionBwdParams& p = *plan.p;
  const int d = plan.head_dim;
  const int64_t b = item / p.heads_kv;
  const int64_t hk = item % p.heads_kv;
  float* dk_all = ws + plan.off_dk_all;  // [k_tiles * kBwdBlockK][d]
  float* dv_all = ws + plan.off_dv_all;  // [k_tiles * kBwdBlockK][d]
  float* dq_all = ws + plan.off_dq_all;  // [q_tiles * kBwdBlockQ][d]
  // Q and dO of the current query head, converted once (not per K/V tile): contiguous rows stream
  // well, where copying strided source rows per (Q tile, K/V tile) pair cost 15% of the backward.
  float* q_all = ws + plan.off_q_all;    // [q_tiles * kBwdBlockQ][d]
  float* do_all = ws + plan.off_do_all;  // [q_tiles * kBwdBlockQ][d]
  const size_t kv_floats = static_cast<size_t>(plan.k_tiles) * kBwdBlockK * d;
  std::memset(dk_all, 0, sizeof(float) * kv_floats);
  std::memset(dv_all, 0, sizeof(float) * kv_floats);

  for (int64_t g = 0; g < plan.group; ++g) {
    const int64_t hq = hk * plan.group + g;
    std::memset(dq_all, 0, sizeof(float) * static_cast<size_t>(plan.q_tiles) * kBwdBlockQ * d);
    for (int64_t qt = 0; qt < plan.q_tiles; ++qt) {
      const int64_t i0 = qt * kBwdBlockQ;
      const int rows = static_cast<int>(std::min<int64_t>(kBwdBlockQ, p.seqlen_q - i0));
      bwd_load_q_tile(plan, b, hq, i0, rows, q_all + i0 * d, do_all + i0 * d);
    }
    for (int64_t kt = 0; kt < plan.k_tiles; ++kt) {
      const int64_t j0 = kt * kBwdBlockK;
      const int keys = static_cast<int>(std::min<int64_t>(kBwdBlockK, p.seqlen_k - j0));
      const int64_t first = bwd_first_q_tile(plan, j0);
      if (first >= plan.q_tiles) continue;
      bwd_load_kv(plan, b, hk, j0, keys, true, ws);
      for (int64_t qt = first; qt < plan.q_tiles; ++qt) {
        const int64_t i0 = qt * kBwdBlockQ;
        bwd_pair<true>(plan, b, hq, i0, j0, keys, q_all + i0 * d, do_all + i0 * d, ws, dk_all + j0 * d,
                       dv_all + j0 * d, dq_all + i0 * d);
      }
    }
    bwd_store_rows(plan, dq_all, p.seqlen_q, p.softmax_scale, p.dq,
                   b * p.q_batch_stride + hq * p.q_head_stride, p.q_row_stride);
  }
  bwd_store_rows(plan, dk_all, p.seqlen_k, p.softmax_scale, p.dk, b * p.k_batch_stride + hk * p.k_head_stride,
                 p.k_row_stride);
  bwd_store_rows(plan, dv_all, p.seqlen_k, 1.0f, p.dv, b * p.v_batch_stride + hk * p.v_head_stride, p.v_row_stride);
}

// Split schedule, pass 1: item = (batch, kv head, K/V tile) -> dK_j, dV_j.
void bwd_dkdv_item(const BwdPlan& plan, int64_t item, float* ws) {
  const AttentionBwdParams& p = *plan.p;
  const int d = plan.head_dim;
  const int64_t kt = item % plan.k_tiles;
  const int64_t bk = item / plan.k_tiles;
  const int64_t b = bk / p.heads_kv;
  const int64_t hk = bk % p.heads_kv;
  const int64_t j0 = kt * kBwdBlockK;
  const int keys = static_cast<int>(std::min<int64_t>(kBwdBlockK, p.seqlen_k - j0));
  float* dk = ws + plan.off_dk;  // [kBwdBlockK][d]
  float* dv = ws + plan.off_dv;  // [kBwdBlockK][d]
  std::memset(dk, 0, sizeof(float) * kBwdBlockK * d);
  std::memset(dv, 0, sizeof(float) * kBwdBlockK * d);
  const int64_t first = bwd_first_q_tile(plan, j0);
  if (first < plan.q_tiles) {
    bwd_load_kv(plan, b, hk, j0, keys, false, ws);
    float* qc = ws + plan.off_qc;    // [kBwdBlockQ][d] Q_i
    float* doc = ws + plan.off_doc;  // [kBwdBlockQ][d] dO_i
    for (int64_t g = 0; g < plan.group; ++g)
      for (int64_t qt = first; qt < plan.q_tiles; ++qt) {
        const int64_t hq = hk * plan.group + g;
        const int64_t i0 = qt * kBwdBlockQ;
        bwd_load_q_tile(plan, b, hq, i0, static_cast<int>(std::min<int64_t>(kBwdBlockQ, p.seqlen_q - i0)), qc, doc);
        bwd_pair<false>(plan, b, hq, i0, j0, keys, qc, doc, ws, dk, dv, nullptr);
      }
  }
  bwd_store_rows(plan, dk, keys, p.softmax_scale, p.dk,
                 b * p.k_batch_stride + j0 * p.k_row_stride + hk * p.k_head_stride, p.k_row_stride);
  bwd_store_rows(plan, dv, keys, 1.0f, p.dv, b * p.v_batch_stride + j0 * p.v_row_stride + hk * p.v_head_stride,
                 p.v_row_stride);
}

// Split schedule, pass 2: item = (batch, query head, Q tile) -> dQ_i. Computed in the transposed
// orientation S^T = K_j Q_i^T so that only Q_i and dO_i are transposed (once per item); each S, P,
// dP, dS element is the same fp32 value the fused schedule computes.
void bwd_dq_item(const BwdPlan& plan, int64_t item, float* ws) {
  const AttentionBwdParams& p = *plan.p;
  const int d = plan.head_dim;
  constexpr int kBq = kBwdBlockQ;
  const int64_t qt = plan.q_tiles - 1 - item % plan.q_tiles;  // heaviest causal tiles first
  const int64_t bh = item / plan.q_tiles;
  const int64_t b = bh / p.heads_q;
  const int64_t hq = bh % p.heads_q;
  const int64_t hk = hq / plan.group;
  const int64_t i0 = qt * kBq;
  const int rows = static_cast<int>(std::min<int64_t>(kBq, p.seqlen_q - i0));
  const int rows_pad = pad_to_tile(rows);

  float* qt_s = ws + plan.off_qc;    // [d][kBq] Q_i^T
  float* dot_s = ws + plan.off_doc;  // [d][kBq] dO_i^T
  float* kc = ws + plan.off_kc;      // [kBwdBlockK][d] K_j
  float* vc = ws + plan.off_vt;      // [kBwdBlockK][d] V_j (unless read in place: fp32, an A operand)
  float* st = ws + plan.off_s;       // [kBwdBlockK][kBq] S^T, then P^T
  float* dpt = ws + plan.off_dp;     // [kBwdBlockK][kBq] dP^T, then dS^T
  float* dq = ws + plan.off_dq;      // [kBq][d]
  float* row = ws + plan.off_row;
  const float* lse = ws + plan.off_lse;
  const float* dl = ws + plan.off_delta;

  load_rows_transposed(p.q, p.dtype, b * p.q_batch_stride + i0 * p.q_row_stride + hq * p.q_head_stride,
                       p.q_row_stride, rows, d, rows_pad, 1.0f, qt_s, kBq, row);
  load_rows_transposed(p.dout, p.dtype, b * p.o_batch_stride + i0 * p.o_row_stride + hq * p.o_head_stride,
                       p.o_row_stride, rows, d, rows_pad, 1.0f, dot_s, kBq, row);
  bwd_load_row_stats(plan, b, hq, i0, rows, ws);
  std::memset(dq, 0, sizeof(float) * static_cast<size_t>(rows_pad) * d);

  const int64_t diag = p.seqlen_k - p.seqlen_q;
  const int64_t key_end = p.causal ? std::min<int64_t>(p.seqlen_k, i0 + rows + diag) : p.seqlen_k;
  const Vec scale = vsplat<Vec>(p.softmax_scale);
  const VecI lanes = lane_index();
  for (int64_t j0 = 0; j0 < key_end; j0 += kBwdBlockK) {
    // Whole K/V tiles (not cut at key_end): the same tile shapes as the fused schedule.
    const int keys = static_cast<int>(std::min<int64_t>(kBwdBlockK, p.seqlen_k - j0));
    const int keys_pad = pad_to_tile(keys);
    load_rows(p.k, p.dtype, b * p.k_batch_stride + j0 * p.k_row_stride + hk * p.k_head_stride, p.k_row_stride, keys,
              d, keys_pad, 1.0f, kc, d);
    const TileRef vj = tile_rows(p.v, p.dtype, b * p.v_batch_stride + j0 * p.v_row_stride + hk * p.v_head_stride,
                                 p.v_row_stride, keys, d, keys_pad, vc);
    gemm<ALayout::kRowMajor, false>(keys_pad, rows_pad, d, kc, d, qt_s, kBq, st, kBq);
    gemm<ALayout::kRowMajor, false>(keys_pad, rows_pad, d, vj.data, vj.ld, dot_s, kBq, dpt, kBq);
    for (int c = 0; c < keys_pad; ++c) {
      // Key j0 + c is visible to query rows r >= first (causal) and to none if past the end.
      const int64_t first = p.causal ? j0 + c - diag - i0 : 0;
      const int64_t end = c < keys ? rows_pad : 0;
      float* srow = st + c * kBq;
      float* dprow = dpt + c * kBq;
      for (int r = 0; r < rows_pad; r += kLanes) {
        const int64_t first_kept = std::min<int64_t>(std::max<int64_t>(first, 0), rows_pad);
        const Vec pv =
            keep_lanes(lanes + r, first_kept, end, recompute_p(vload<Vec>(srow + r), scale, vload<Vec>(lse + r)));
        vstore<Vec>(dprow + r, pv * (vload<Vec>(dprow + r) - vload<Vec>(dl + r)));
      }
    }
    // dQ_i += dS K_j, with dS read from dS^T.
    gemm<ALayout::kColMajor, true>(rows_pad, d, keys_pad, dpt, kBq, kc, d, dq, d);
  }
  bwd_store_rows(plan, dq, rows, p.softmax_scale, p.dq,
                 b * p.q_batch_stride + i0 * p.q_row_stride + hq * p.q_head_stride, p.q_row_stride);
}
