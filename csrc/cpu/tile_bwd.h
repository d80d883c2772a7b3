// Backward work items of the CPU backend (FlashAttention-2 Algorithm 2) for one instruction set.
// Included by flash_bwd_cpu.cc once per instruction set, after tile_kernels.h (no include guard:
// see tile_kernels.h for the inclusion contract).
//
// One schedule: a single pass over the K/V tiles with dQ accumulated across them (flash_bwd_cpu.cc
// plans it and runs the three kinds of items below, one parallel pass each).
//  - bwd_delta_item, item = (batch, query head, Q tile): D = rowsum(dO ∘ O).
//  - bwd_chunk_item, item = (batch, kv head, chunk): a chunk is a contiguous range of K/V tiles whose
//    dK and dV the item owns outright. For every query head sharing the kv head, and every block of
//    kBwdQBlockTiles Q tiles, it sweeps its K/V tiles over the block, each from the first Q tile
//    that sees it: S = Q K^T, dP = dO V^T, then dV += P^T dO, dK += dS^T Q, dQ += dS K (5 tile
//    GEMMs per (Q tile, K/V tile) pair). dQ of a block is complete after the sweep: stored when
//    there is one chunk per (batch, kv head), else left in the chunk's fp32 partial.
//  - bwd_dq_reduce_item, item = (batch, query head, Q tile), only with several chunks: dq = the sum
//    of the partials in chunk order.
// Every tile GEMM computes each element as one fma chain in a fixed order (tile_kernels.h). dK_j and
// dV_j are chains over (query head of the group, Q tile) in that order, dQ_i over the chunk's K/V
// tiles in order and then over the chunks in order, whatever the Q blocking and whichever thread
// runs an item: results depend on the shape (through the chunk count) but not on the thread count.

// Lanes outside [first, end) of P (keys past the end, entries the mask hides) are exactly 0, so no
// Inf * 0 downstream.
inline Vec keep_lanes(VecI lane_pos, int64_t first, int64_t end, Vec v) {
  const VecI lo = VecI{} + static_cast<int32_t>(first), hi = VecI{} + static_cast<int32_t>(end);
  return lane_pos >= lo && lane_pos < hi ? v : Vec{};
}

// D = rowsum(dO ∘ O) for one (batch, query head, query tile), into plan.delta.
void bwd_delta_item(const BwdPlan& plan, int64_t item) {
  const AttentionBwdParams& p = *plan.p;
  const int d = plan.head_dim;
  const int64_t qt = item % plan.q_tiles;
  const int64_t bh = item / plan.q_tiles;
  const int64_t b = bh / p.heads_q;
  const int64_t h = bh % p.heads_q;
  const int64_t i0 = qt * kBwdBlockQ;
  const int rows = static_cast<int>(std::min<int64_t>(kBwdBlockQ, p.seqlen_q - i0));
  alignas(64) float o_row[kMaxHeadDim];
  alignas(64) float do_row[kMaxHeadDim];
  for (int r = 0; r < rows; ++r) {
    const int64_t o_off = b * p.o_batch_stride + (i0 + r) * p.o_row_stride + h * p.o_head_stride;
    const int64_t do_off = b * p.do_batch_stride + (i0 + r) * p.do_row_stride + h * p.do_head_stride;
    convert_row(p.out, p.dtype, o_off, d, 1.0f, o_row);
    convert_row(p.dout, p.dtype, do_off, d, 1.0f, do_row);
    plan.delta[(b * p.heads_q + h) * p.seqlen_q + i0 + r] = dot_row(o_row, do_row, d);
  }
}

// Loads K/V tile j (keys [j0, j0 + keys) of kv head hk): K_j^T and V_j^T (for S and dP in the
// S = Q K^T orientation) and K_j row-major (for dQ).
void bwd_load_kv(const BwdPlan& plan, int64_t b, int64_t hk, int64_t j0, int keys, float* ws) {
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
  load_rows(p.k, p.dtype, k_off, p.k_row_stride, keys, d, keys_pad, 1.0f, ws + plan.off_kc, d);
}

// LSE (+inf on padding rows, so P = 0 there) and D of query rows [i0, i0 + rows) into lse and dl
// (pad_to_tile(rows) entries each).
void bwd_load_row_stats(const BwdPlan& plan, int64_t b, int64_t hq, int64_t i0, int rows, float* lse, float* dl) {
  const AttentionBwdParams& p = *plan.p;
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
  load_rows(p.dout, p.dtype, b * p.do_batch_stride + i0 * p.do_row_stride + hq * p.do_head_stride, p.do_row_stride,
            rows, d, rows_pad, 1.0f, doc, d);
}

// One (Q tile i, K/V tile j) step in the S = Q K^T orientation. The K/V tile was loaded by
// bwd_load_kv; qc, doc: Q_i and dO_i, [rows_pad][d]; lse, dl: their row stats (bwd_load_row_stats).
// dk, dv: [keys_pad][d] accumulators of tile j; dq: [rows_pad][d] accumulator of tile i. slope: the
// ALiBi slope of the tile's batch and query head (0: none).
void bwd_pair(const BwdPlan& plan, int64_t i0, int64_t j0, int keys, float slope, const float* qc,
              const float* doc, const float* lse, const float* dl, float* ws, float* dk, float* dv, float* dq) {
  const AttentionBwdParams& p = *plan.p;
  const int d = plan.head_dim;
  constexpr int kBk = kBwdBlockK;
  const int rows = static_cast<int>(std::min<int64_t>(kBwdBlockQ, p.seqlen_q - i0));
  const int rows_pad = pad_to_tile(rows);
  const int keys_pad = pad_to_tile(keys);

  float* s = ws + plan.off_s;      // [kBwdBlockQ][kBk] S, then P
  float* dp = ws + plan.off_dp;    // [kBwdBlockQ][kBk] dP, then dS

  gemm<ALayout::kRowMajor, false>(rows_pad, keys_pad, d, qc, d, ws + plan.off_kt, kBk, s, kBk);
  gemm<ALayout::kRowMajor, false>(rows_pad, keys_pad, d, doc, d, ws + plan.off_vt, kBk, dp, kBk);

  // P (recompute_p), dS = P ∘ (dP - D). Row r sees tile keys [first, end) (VisibleKeys; none for the
  // padding rows r >= rows, whose zero q times an infinite k would otherwise make a NaN score). P and
  // dS are exactly 0 where a row does not see a key, whatever dP and D hold (D is NaN on a row with a
  // NaN output).
  const VisibleKeys vis(p);
  const Vec scale = vsplat<Vec>(p.softmax_scale);
  const VecI lanes = lane_index();
  const auto first_key = [&](int r) -> int64_t {
    return r >= rows ? 0 : std::clamp<int64_t>(vis.lo(i0 + r) - j0, 0, keys);
  };
  const auto end_key = [&](int r) -> int64_t {
    return r >= rows ? 0 : std::clamp<int64_t>(vis.hi(i0 + r) - j0, first_key(r), keys);
  };
  // Softcap (softcap_scores): P from the scaled, capped scores, and dS through the tanh, times
  // 1 - t^2 (softmax_scale is applied at the stores, as without it).
  const bool capped = p.softcap > 0.0f;
  const Vec p_scale = capped ? vsplat<Vec>(1.0f) : scale;
  alignas(64) float dtanh[kBk];  // the row's 1 - t^2 (lanes past its visible keys are dropped below)
  bool masked = false;  // some real row does not see some real key of the tile
  for (int r = 0; r < rows_pad; ++r) {
    const int64_t first = first_key(r), end = end_key(r);
    masked = masked || (r < rows && (first > 0 || end < keys));
    const Vec lse_r = vsplat<Vec>(lse[r]);
    const Vec dr = vsplat<Vec>(dl[r]);
    float* srow = s + r * kBk;
    float* dprow = dp + r * kBk;
    if (capped) softcap_scores(srow, keys_pad, p.softmax_scale, p.softcap, dtanh);
    // ALiBi (it moves P, not the chain rule): in the capped row's units, else in Q K^T's.
    if (slope != 0.0f)
      alibi_scores(srow, keys_pad, capped ? slope : slope / p.softmax_scale, i0 + r + p.seqlen_k - p.seqlen_q - j0, -1);
    for (int c = 0; c < keys_pad; c += kLanes) {
      const Vec pv = keep_lanes(lanes + c, first, end, recompute_p(vload<Vec>(srow + c), p_scale, lse_r));
      vstore<Vec>(srow + c, pv);
      Vec ds = pv * (vload<Vec>(dprow + c) - dr);
      if (capped) ds *= vload<Vec>(dtanh + c);
      vstore<Vec>(dprow + c, keep_lanes(lanes + c, first, end, ds));
    }
  }

  // dV_j += P^T dO_i; dK_j += dS^T Q_i (softmax_scale applied at the store); dQ_i += dS K_j. On a tile
  // where the mask hides keys from rows, a NaN / Inf in dO, Q or K would meet the mask's zeros:
  // those products leave the hidden (row, key) terms out (gemm_masked, tile_kernels.h).
  const float* kc = ws + plan.off_kc;
  const auto sees = [&](int r, int c) { return first_key(r) <= c && c < end_key(r); };
  if (masked && any_nonfinite(doc, rows, d, d)) {
    gemm_masked<ALayout::kColMajor>(keys_pad, d, rows_pad, s, kBk, doc, d, dv, d,
                                    [&](int c, int, int r) { return sees(r, c); });
  } else {
    gemm<ALayout::kColMajor, true>(keys_pad, d, rows_pad, s, kBk, doc, d, dv, d);
  }
  if (masked && any_nonfinite(qc, rows, d, d)) {
    gemm_masked<ALayout::kColMajor>(keys_pad, d, rows_pad, dp, kBk, qc, d, dk, d,
                                    [&](int c, int, int r) { return sees(r, c); });
  } else {
    gemm<ALayout::kColMajor, true>(keys_pad, d, rows_pad, dp, kBk, qc, d, dk, d);
  }
  if (masked && any_nonfinite(kc, keys, d, d)) {
    gemm_masked<ALayout::kRowMajor>(rows_pad, d, keys_pad, dp, kBk, kc, d, dq, d,
                                    [&](int r, int, int c) { return sees(r, c); });
  } else {
    gemm<ALayout::kRowMajor, true>(rows_pad, d, keys_pad, dp, kBk, kc, d, dq, d);
  }
}

// Rows [0, rows) of an fp32 [rows][d] accumulator, times scale, into a strided output tensor.
void bwd_store_rows(const BwdPlan& plan, const float* acc, int64_t rows, float scale, void* dst, int64_t offset,
                    int64_t row_stride) {
  const AttentionBwdParams& p = *plan.p;
  for (int64_t r = 0; r < rows; ++r)
    store_row(acc + static_cast<int64_t>(r) * plan.head_dim, plan.head_dim, scale, p.dtype, dst,
              offset + r * row_stride);
}

// Item = (batch, kv head, chunk c) of the single pass; see the top of this file.
void bwd_chunk_item(const BwdPlan& plan, int64_t item, float* ws) {
  const AttentionBwdParams& p = *plan.p;
  const int d = plan.head_dim;
  constexpr int kBq = kBwdBlockQ;
  constexpr int kBk = kBwdBlockK;
  const int64_t c = item % plan.chunks;
  const int64_t bk = item / plan.chunks;
  const int64_t b = bk / p.heads_kv;
  const int64_t hk = bk % p.heads_kv;
  const int64_t kt_begin = plan.chunk_begin[c];
  const int64_t kt_end = plan.chunk_begin[c + 1];
  const int64_t key0 = kt_begin * kBk;  // first key of the chunk

  float* dk_acc = ws + plan.off_dk;  // [max_chunk_tiles * kBk][d], key key0 + r at row r
  float* dv_acc = ws + plan.off_dv;  // [max_chunk_tiles * kBk][d]
  // Q and dO of one Q block, converted once per (query head, Q block) rather than per pair: copying
  // strided source rows per (Q tile, K/V tile) pair cost 15% of the backward.
  float* q_blk = ws + plan.off_q;    // [kBwdQBlockTiles * kBq][d]
  float* do_blk = ws + plan.off_do;  // [kBwdQBlockTiles * kBq][d]
  float* dq_blk = ws + plan.off_dq;  // [kBwdQBlockTiles * kBq][d] dQ of the block (one chunk)
  float* lse_blk = ws + plan.off_lse;  // [kBwdQBlockTiles * kBq]
  float* dl_blk = ws + plan.off_delta;  // [kBwdQBlockTiles * kBq]
  const size_t kv_floats = static_cast<size_t>(kt_end - kt_begin) * kBk * d;
  std::memset(dk_acc, 0, sizeof(float) * kv_floats);
  std::memset(dv_acc, 0, sizeof(float) * kv_floats);

  // With one chunk dQ is stored from here, so every Q tile is visited (tiles that see no key store
  // zeros); a partial holds only the Q tiles from the first one that sees the chunk.
  const int64_t qt_begin = plan.chunks == 1 ? 0 : plan.chunk_first_qt[c];
  for (int64_t g = 0; g < plan.group; ++g) {
    const int64_t hq = hk * plan.group + g;
    for (int64_t qb0 = qt_begin; qb0 < plan.q_tiles; qb0 += kBwdQBlockTiles) {
      const int64_t qb1 = std::min<int64_t>(plan.q_tiles, qb0 + kBwdQBlockTiles);
      const int64_t blk_i0 = qb0 * kBq;
      const int blk_rows = static_cast<int>(std::min<int64_t>(qb1 * kBq, p.seqlen_q) - blk_i0);
      for (int64_t qt = qb0; qt < qb1; ++qt) {
        const int64_t i0 = qt * kBq;
        const int rows = static_cast<int>(std::min<int64_t>(kBq, p.seqlen_q - i0));
        bwd_load_q_tile(plan, b, hq, i0, rows, q_blk + (i0 - blk_i0) * d, do_blk + (i0 - blk_i0) * d);
      }
      bwd_load_row_stats(plan, b, hq, blk_i0, blk_rows, lse_blk, dl_blk);
      // dQ of the block: final with one chunk, else accumulated in place in this chunk's partial.
      float* dq_acc = plan.chunks == 1 ? dq_blk : plan.dq_partial_rows(c, b, hq, blk_i0);
      std::memset(dq_acc, 0, sizeof(float) * static_cast<size_t>(qb1 - qb0) * kBq * d);
      for (int64_t kt = kt_begin; kt < kt_end; ++kt) {
        const int64_t j0 = kt * kBk;
        const int keys = static_cast<int>(std::min<int64_t>(kBk, p.seqlen_k - j0));
        const int64_t first = std::max(qb0, bwd_first_q_tile(plan, j0));
        const int64_t end = std::min(qb1, bwd_end_q_tile(plan, j0, keys));
        if (first >= end) continue;
        bwd_load_kv(plan, b, hk, j0, keys, ws);
        for (int64_t qt = first; qt < end; ++qt) {
          const int64_t r0 = qt * kBq - blk_i0;  // first row of Q tile qt in the block
          bwd_pair(plan, qt * kBq, j0, keys, p.alibi_slope(b, hq), q_blk + r0 * d, do_blk + r0 * d, lse_blk + r0,
                   dl_blk + r0, ws, dk_acc + (j0 - key0) * d, dv_acc + (j0 - key0) * d, dq_acc + r0 * d);
        }
      }
      if (plan.chunks == 1)
        bwd_store_rows(plan, dq_blk, blk_rows, p.softmax_scale, p.dq,
                       b * p.dq_batch_stride + blk_i0 * p.dq_row_stride + hq * p.dq_head_stride, p.dq_row_stride);
    }
  }
  const int64_t keys = std::min<int64_t>(kt_end * kBk, p.seqlen_k) - key0;
  bwd_store_rows(plan, dk_acc, keys, p.softmax_scale, p.dk,
                 b * p.dk_batch_stride + key0 * p.dk_row_stride + hk * p.dk_head_stride, p.dk_row_stride);
  bwd_store_rows(plan, dv_acc, keys, 1.0f, p.dv,
                 b * p.dv_batch_stride + key0 * p.dv_row_stride + hk * p.dv_head_stride, p.dv_row_stride);
}

// dQ of one (batch, query head, Q tile) from the chunks' partials: their sum in chunk order (chunks
// whose first visible Q tile comes later contribute nothing: first_qt grows with the chunk), times
// softmax_scale, rounded to the dtype. Zero when no chunk is visible to the tile.
void bwd_dq_reduce_item(const BwdPlan& plan, int64_t item) {
  const AttentionBwdParams& p = *plan.p;
  const int d = plan.head_dim;
  const int64_t qt = item % plan.q_tiles;
  const int64_t bh = item / plan.q_tiles;
  const int64_t b = bh / p.heads_q;
  const int64_t hq = bh % p.heads_q;
  const int64_t i0 = qt * kBwdBlockQ;
  const int rows = static_cast<int>(std::min<int64_t>(kBwdBlockQ, p.seqlen_q - i0));
  int64_t visible_chunks = 0;
  while (visible_chunks < plan.chunks && plan.chunk_first_qt[visible_chunks] <= qt)
    ++visible_chunks;
  alignas(64) float sum[kMaxHeadDim];
  for (int r = 0; r < rows; ++r) {
    std::fill(sum, sum + d, 0.0f);
    for (int64_t c = 0; c < visible_chunks; ++c) {
      const float* part = plan.dq_partial_rows(c, b, hq, i0 + r);
      for (int e = 0; e < d; ++e) sum[e] += part[e];
    }
    store_row(sum, d, p.softmax_scale, p.dtype, p.dq,
              b * p.dq_batch_stride + (i0 + r) * p.dq_row_stride + hq * p.dq_head_stride);
  }
}
