// CPU FlashAttention-2 backward (Algorithm 2): a parallel pre-pass for D = rowsum(dO ∘ O), then
// either the fused schedule (items = (batch, kv head)) or the split schedule (a dK/dV pass and a dQ
// pass) when there are too few kv heads for the threads; see tile_bwd.h. The tile code is compiled
// here once per instruction set and picked at run time.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "common/attention_params.h"
#include "common/half.h"
#include "cpu/cpu_buffer.h"
#include "cpu/cpu_isa.h"
#include "cpu/flash_cpu.h"
#include "cpu/thread_pool.h"
#include "cpu/tile_config.h"

namespace fa::cpu {
namespace {

// The split schedule runs 7 tile GEMMs per (Q tile, K/V tile) pair instead of the fused 5.
constexpr double kSplitWorkRatio = 7.0 / 5.0;
// The fused schedule keeps (2 seqlen_k + 3 seqlen_q) * head_dim fp32 per worker; above this total the
// split schedule (O(tile) per worker, same results) is used instead.
constexpr size_t kFusedWorkspaceLimitBytes = size_t{1} << 30;

struct BwdPlan {
  const AttentionBwdParams* p = nullptr;
  int head_dim = 0;
  int64_t group = 1;    // query heads per kv head
  int64_t q_tiles = 0;  // per (batch, head)
  int64_t k_tiles = 0;
  bool split = false;
  float* delta = nullptr;  // [batch, heads_q, seqlen_q] D = rowsum(dO ∘ O)
  // Per-worker scratch layout, in floats from the worker's base (shapes in tile_bwd.h).
  size_t off_qc = 0, off_doc = 0, off_lse = 0, off_delta = 0, off_kc = 0, off_kt = 0, off_vt = 0, off_s = 0,
         off_dp = 0, off_row = 0, off_dk = 0, off_dv = 0, off_dq = 0;
  size_t off_dk_all = 0, off_dv_all = 0, off_dq_all = 0, off_q_all = 0, off_do_all = 0;  // fused schedule only
  size_t per_worker = 0;
};

BwdPlan make_bwd_plan(const AttentionBwdParams& p, int threads) {
  BwdPlan plan;
  plan.p = &p;
  plan.head_dim = static_cast<int>(p.head_dim);
  plan.group = p.heads_q / p.heads_kv;
  plan.q_tiles = (p.seqlen_q + kBwdBlockQ - 1) / kBwdBlockQ;
  plan.k_tiles = (p.seqlen_k + kBwdBlockK - 1) / kBwdBlockK;

  // Fused: batch * heads_kv equal items in ceil(items / threads) waves. Split: the same work times
  // kSplitWorkRatio, spread evenly over all threads.
  const double kv_items = static_cast<double>(p.batch * p.heads_kv);
  const double fused_time = std::ceil(kv_items / threads);
  const double split_time = kSplitWorkRatio * kv_items / threads;
  const size_t fused_bytes = checked_mul(
      checked_mul(static_cast<size_t>(2 * plan.k_tiles * kBwdBlockK + 3 * plan.q_tiles * kBwdBlockQ),
                  static_cast<size_t>(p.head_dim) * sizeof(float)),
      static_cast<size_t>(threads));
  plan.split = split_time < fused_time || fused_bytes > kFusedWorkspaceLimitBytes;

  const size_t d = static_cast<size_t>(p.head_dim);
  ScratchLayout ws;
  plan.off_qc = ws.take(kBwdBlockQ * d);   // Q_i, or Q_i^T in the dQ pass
  plan.off_doc = ws.take(kBwdBlockQ * d);  // dO_i, or dO_i^T in the dQ pass
  plan.off_lse = ws.take(kBwdBlockQ);
  plan.off_delta = ws.take(kBwdBlockQ);
  plan.off_kc = ws.take(kBwdBlockK * d);
  plan.off_kt = ws.take(d * kBwdBlockK);
  plan.off_vt = ws.take(d * kBwdBlockK);  // V_j^T, or V_j in the dQ pass
  plan.off_s = ws.take(static_cast<size_t>(kBwdBlockQ) * kBwdBlockK);
  plan.off_dp = ws.take(static_cast<size_t>(kBwdBlockQ) * kBwdBlockK);
  plan.off_row = ws.take(d);
  if (plan.split) {
    plan.off_dk = ws.take(kBwdBlockK * d);
    plan.off_dv = ws.take(kBwdBlockK * d);
    plan.off_dq = ws.take(kBwdBlockQ * d);
  } else {  // whole-sequence fp32 buffers: O(seqlen * d) per worker
    const size_t kv_rows = static_cast<size_t>(plan.k_tiles) * kBwdBlockK;
    const size_t q_rows = static_cast<size_t>(plan.q_tiles) * kBwdBlockQ;
    plan.off_dk_all = ws.take(checked_mul(kv_rows, d));
    plan.off_dv_all = ws.take(checked_mul(kv_rows, d));
    plan.off_dq_all = ws.take(checked_mul(q_rows, d));
    plan.off_q_all = ws.take(checked_mul(q_rows, d));
    plan.off_do_all = ws.take(checked_mul(q_rows, d));
  }
  plan.per_worker = ws.size();
  return plan;
}

}  // namespace

namespace isa_generic {
namespace {
#define FA_TILE_LANES 4
#define FA_TILE_LEVEL 0
#include "cpu/tile_kernels.h"
#include "cpu/tile_bwd.h"
#undef FA_TILE_LANES
#undef FA_TILE_LEVEL
}  // namespace
}  // namespace isa_generic

#if FA_CPU_X86
FA_CPU_TARGET_AVX2_BEGIN
namespace isa_avx2 {
namespace {
#define FA_TILE_LANES 8
#define FA_TILE_LEVEL 1
#include "cpu/tile_kernels.h"
#include "cpu/tile_bwd.h"
#undef FA_TILE_LANES
#undef FA_TILE_LEVEL
}  // namespace
}  // namespace isa_avx2
FA_CPU_TARGET_END

FA_CPU_TARGET_AVX512_BEGIN
namespace isa_avx512 {
namespace {
#define FA_TILE_LANES 16
#define FA_TILE_LEVEL 2
#include "cpu/tile_kernels.h"
#include "cpu/tile_bwd.h"
#undef FA_TILE_LANES
#undef FA_TILE_LEVEL
}  // namespace
}  // namespace isa_avx512
FA_CPU_TARGET_END
#endif

namespace {

using ItemFn = void (*)(const BwdPlan&, int64_t, float*);

struct BwdKernels {
  ItemFn delta, fused, dkdv, dq;
};

BwdKernels select_kernels() {
#if FA_CPU_X86
  switch (active_isa()) {
    case Isa::kAvx512:
      return {isa_avx512::bwd_delta_item, isa_avx512::bwd_fused_item, isa_avx512::bwd_dkdv_item,
              isa_avx512::bwd_dq_item};
    case Isa::kAvx2:
      return {isa_avx2::bwd_delta_item, isa_avx2::bwd_fused_item, isa_avx2::bwd_dkdv_item, isa_avx2::bwd_dq_item};
    case Isa::kGeneric: break;
  }
#endif
  return {isa_generic::bwd_delta_item, isa_generic::bwd_fused_item, isa_generic::bwd_dkdv_item,
          isa_generic::bwd_dq_item};
}

}  // namespace

void flash_bwd(const AttentionBwdParams& p, ThreadPool& pool) {
  BwdPlan plan = make_bwd_plan(p, pool.size());
  FloatBuffer delta(checked_mul(static_cast<size_t>(p.batch * p.heads_q), static_cast<size_t>(p.seqlen_q)));
  FloatBuffer scratch(checked_mul(plan.per_worker, static_cast<size_t>(pool.size())));
  plan.delta = delta.data();
  const BwdKernels k = select_kernels();
  float* base = scratch.data();
  auto run = [&](ItemFn fn, int64_t items) {
    pool.parallel_for(items, [&](int64_t item, int worker) {
      fn(plan, item, base + static_cast<size_t>(worker) * plan.per_worker);
    });
  };
  run(k.delta, p.batch * p.heads_q * plan.q_tiles);
  if (plan.split) {
    run(k.dkdv, p.batch * p.heads_kv * plan.k_tiles);
    run(k.dq, p.batch * p.heads_q * plan.q_tiles);
  } else {
    run(k.fused, p.batch * p.heads_kv);
  }
}

}  // namespace fa::cpu
