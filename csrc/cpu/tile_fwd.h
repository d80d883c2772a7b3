// Forward work item of the CPU backend (FlashAttention-2 Algorithm 1) for one instruction set.
// Included by flash_fwd_cpu.cc once per instruction set, after tile_kernels.h (no include guard:
// see tile_kernels.h for the inclusion contract).
//
// One item = (batch b, query head h, query tile of plan.block_q rows). Everything is computed
// transposed, S^T = K_j Q_i^T and O^T += V_j^T P^T, so that every per-query-row statistic (max m,
// sum l, rescale alpha) is a vector along the query rows (no horizontal reductions), and K_j and V_j
// are both GEMM A operands (read by broadcasts), so fp32 K and V are read in place, never copied.
//
// Numerics: S is the unscaled Q K^T (exact when the products are, e.g. integer inputs), the row max m
// is taken on it, and P = exp2((S - m) * scale_log2): the subtraction is exact near the max (Sterbenz)
// and the exponent is rounded once, after the cancellation; the max element gets exactly 2^0 at any
// magnitude. (An fma(S, scale_log2, -m * scale_log2) left m * scale_log2's rounding error in every
// exponent: beyond scores of ~2e9 that error passed exp2's range and rows came out 0 or NaN,
// test/numerics.test.ts bug C. Folding the scale into Q instead rounded every product and lost ~1e-3
// in P at scores ~1e4.)

void fwd_item(const FwdPlan& plan, int64_t item, float* ws) {
  const AttentionFwdParams& p = *plan.p;
  const int d = plan.head_dim;
  const int bq = plan.block_q;
  constexpr int kBk = kFwdBlockK;

  // Heaviest causal tiles (the last ones) first, so the dynamic schedule ends with short items.
  const int64_t qt = plan.q_tiles - 1 - item % plan.q_tiles;
  const int64_t bh = item / plan.q_tiles;
  const int64_t b = bh / p.heads_q;
  const int64_t h = bh % p.heads_q;
  const int64_t hk = h / plan.group;
  const int64_t i0 = qt * bq;
  const int rows = static_cast<int>(std::min<int64_t>(bq, p.seqlen_q - i0));
  const int rows_pad = pad_to_tile(rows);

  float* qt_s = ws + plan.off_qt;    // [d][bq]    Q_i^T
  float* kc = ws + plan.off_k;       // [kBk][d]   K_j (unless read in place, fp32)
  float* vc = ws + plan.off_v;       // [kBk][d]   V_j (unless read in place, fp32)
  float* st = ws + plan.off_s;       // [kBk][bq]  S^T, then P^T
  float* ot = ws + plan.off_o;       // [d][bq]    O^T, unscaled output accumulator
  float* m = ws + plan.off_m;        // [bq]       running row max of S (unscaled)
  float* off = ws + plan.off_off;    // [bq]       m * scale_log2, for the lse
  float* l = ws + plan.off_l;        // [bq]       running row sum of exp2
  float* alpha = ws + plan.off_alpha;  // [bq]     rescale factor of this step
  float* row = ws + plan.off_row;    // [d]        conversion scratch

  load_rows_transposed(p.q, p.dtype, b * p.q_batch_stride + i0 * p.q_row_stride + h * p.q_head_stride,
                       p.q_row_stride, rows, d, rows_pad, 1.0f, qt_s, bq, row);
  for (int r = 0; r < rows_pad; ++r) {
    m[r] = -std::numeric_limits<float>::infinity();
    off[r] = 0.0f;
    l[r] = 0.0f;
  }
  for (int e = 0; e < d; ++e) std::memset(ot + e * bq, 0, sizeof(float) * rows_pad);

  // Row i sees keys [vis.lo(i), vis.hi(i)) (the causal mask and the sliding window, bottom-right
  // aligned; both bounds grow with i). The tiles run over the keys some row of the tile sees; only
  // tiles where some row does not see some key get the mask.
  const VisibleKeys vis(p);
  const int64_t last = i0 + rows - 1;
  const int64_t key_begin = vis.lo(i0);
  const int64_t key_end = std::max(key_begin, vis.hi(last));
  const int64_t k_base = b * p.k_batch_stride + hk * p.k_head_stride;
  const int64_t v_base = b * p.v_batch_stride + hk * p.v_head_stride;
  const Vec neg_inf = vsplat<Vec>(-std::numeric_limits<float>::infinity());
  // With a softcap the tile holds the scaled, capped scores (softcap_scores), so the exponent takes
  // log2(e) alone: P = exp2((s - m) log2 e), m the running max of the capped scores.
  const bool capped = p.softcap > 0.0f;
  const Vec scale = vsplat<Vec>(capped ? kLog2e : p.scale_log2);
  const float slope = p.alibi_slope(b, h);
  const float slope_units = capped ? slope : slope / p.softmax_scale;
  const int64_t diag = p.seqlen_k - p.seqlen_q;

  for (int64_t j0 = key_begin; j0 < key_end; j0 += kBk) {
    const int keys = static_cast<int>(std::min<int64_t>(kBk, key_end - j0));
    const int keys_pad = pad_to_tile(keys);
    const TileRef kj = tile_rows(p.k, p.dtype, k_base + j0 * p.k_row_stride, p.k_row_stride, keys, d, keys_pad, kc);
    const TileRef vj = tile_rows(p.v, p.dtype, v_base + j0 * p.v_row_stride, p.v_row_stride, keys, d, keys_pad, vc);

    gemm<ALayout::kRowMajor, false>(keys_pad, rows_pad, d, kj.data, kj.ld, qt_s, bq, st, bq);
    if (capped)
      for (int jj = 0; jj < keys; ++jj) softcap_scores(st + jj * bq, rows_pad, p.softmax_scale, p.softcap, nullptr);
    // ALiBi on the tile's scores: in the capped tile's units (scaled), else in Q K^T's (slope / scale).
    if (slope != 0.0f)
      for (int jj = 0; jj < keys; ++jj) alibi_scores(st + jj * bq, rows_pad, slope_units, i0 + diag - j0 - jj, 1);

    // Row i0 + r (padding rows too, so that they stay finite) sees tile keys [lo - j0, hi - j0).
    const bool masked = j0 < vis.lo(i0 + rows_pad - 1) || j0 + keys > vis.hi(i0);
    if (masked) {
      for (int r = 0; r < rows_pad; ++r) {
        const int64_t first = std::clamp<int64_t>(vis.lo(i0 + r) - j0, 0, keys);
        const int64_t end = std::clamp<int64_t>(vis.hi(i0 + r) - j0, first, keys);
        for (int64_t jj = 0; jj < first; ++jj) st[jj * bq + r] = -std::numeric_limits<float>::infinity();
        for (int64_t jj = end; jj < keys; ++jj) st[jj * bq + r] = -std::numeric_limits<float>::infinity();
      }
    }

    // Online softmax over this tile, kLanes query rows at a time. Key rows >= keys (past the end of
    // the sequence or of the causal range) are left out of the max and get P = 0.
    for (int r = 0; r < rows_pad; r += kLanes) {
      const Vec m_old = vload<Vec>(m + r);
      Vec m_new = m_old;
      for (int jj = 0; jj < keys; ++jj) m_new = vmax(m_new, vload<Vec>(st + jj * bq + r));
      // A row with no visible key so far has m_new = -inf: it subtracts 0 instead, so that
      // -inf - (-inf) = NaN never happens (its P are exp2(-inf) = 0).
      const Vec base = m_new == neg_inf ? Vec{} : m_new;
      const Vec off_new = base * scale;
      // Rescales the earlier tiles' P, l and O from the old max to the new one: exactly 1 when the
      // max did not move, 0 when there were no earlier keys.
      const Vec a = m_old == neg_inf ? Vec{} : exp2v((m_old - base) * scale);
      Vec sum{};
      for (int jj = 0; jj < keys; ++jj) {
        const Vec pv = exp2v((vload<Vec>(st + jj * bq + r) - base) * scale);
        vstore<Vec>(st + jj * bq + r, pv);
        sum += pv;
      }
      for (int jj = keys; jj < keys_pad; ++jj) vstore<Vec>(st + jj * bq + r, Vec{});
      vstore<Vec>(m + r, m_new);
      vstore<Vec>(off + r, off_new);
      vstore<Vec>(l + r, vload<Vec>(l + r) * a + sum);
      vstore<Vec>(alpha + r, a);
    }
    for (int e = 0; e < d; ++e) {
      float* orow = ot + e * bq;
      for (int r = 0; r < rows_pad; r += kLanes) vstore<Vec>(orow + r, vload<Vec>(orow + r) * vload<Vec>(alpha + r));
    }
    // O^T += V^T P^T, with V^T read from V. A NaN / Inf in V on a masked tile: the hidden (key, row)
    // terms are left out (gemm_masked), so it reaches only the rows that see the key.
    if (masked && any_nonfinite(vj.data, keys, d, vj.ld)) {
      gemm_masked<ALayout::kColMajor>(d, rows_pad, keys_pad, vj.data, vj.ld, st, bq, ot, bq,
                                      [&](int, int r, int jj) { return vis.sees(i0 + r, j0 + jj); });
    } else {
      gemm<ALayout::kColMajor, true>(d, rows_pad, keys_pad, vj.data, vj.ld, st, bq, ot, bq);
    }
  }

  // FA2 tweak 1: divide by l only once, at the end. LSE in natural units: off * ln 2 + ln l, one
  // rounding after the (exact) product. A row that sees no key (causal with seqlen_q > seqlen_k, or a
  // window past the keys) gets out 0
  // and lse +inf. A row that sees keys has l >= 1 (its max scores 2^0) unless its scores are not finite:
  // l = NaN (a NaN score) gives NaN out and lse through the same formulas, and l = 0 (every score -inf,
  // from an infinite input) is softmax's 0 / 0: NaN, as standard attention gives (not an empty row).
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  for (int r = 0; r < rows; ++r) {
    const int64_t i = i0 + r;
    const bool sees_keys = vis.any(i);
    const float inv_l = !sees_keys ? 0.0f : l[r] == 0.0f ? kNaN : 1.0f / l[r];
    for (int e = 0; e < d; ++e) row[e] = ot[e * bq + r];
    store_row(row, d, inv_l, p.dtype, p.out, b * p.o_batch_stride + i * p.o_row_stride + h * p.o_head_stride);
    p.lse[(b * p.heads_q + h) * p.seqlen_q + i] = !sees_keys      ? std::numeric_limits<float>::infinity()
                                                  : l[r] == 0.0f ? kNaN
                                                                 : std::fma(off[r], kLn2, std::log(l[r]));
  }
}
