// CPU FlashAttention-2 forward (Algorithm 1): work items (batch, query head, query tile) spread over
// the thread pool; each streams the K/V tiles of its kv head (read in place when fp32, converted into
// per-worker scratch otherwise) through an online softmax. The tile code (tile_fwd.h) is compiled
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

// Everything a forward work item needs, derived once per call.
struct FwdPlan {
  const AttentionFwdParams* p = nullptr;
  int head_dim = 0;
  int64_t group = 1;    // query heads per kv head
  int block_q = 0;      // query rows per item: kFwdBlockQ or kFwdBlockQSmall
  int64_t q_tiles = 0;  // per (batch, head)
  int64_t items = 0;    // batch * heads_q * q_tiles
  // Per-worker scratch layout, in floats from the worker's base (shapes in tile_fwd.h).
  size_t off_qt = 0, off_k = 0, off_v = 0, off_s = 0, off_o = 0, off_m = 0, off_off = 0, off_l = 0,
         off_alpha = 0, off_row = 0;
  size_t per_worker = 0;
};

FwdPlan make_fwd_plan(const AttentionFwdParams& p, int threads) {
  FwdPlan plan;
  plan.p = &p;
  plan.head_dim = static_cast<int>(p.head_dim);
  plan.group = p.heads_q / p.heads_kv;
  const int64_t large_items = p.batch * p.heads_q * ((p.seqlen_q + kFwdBlockQ - 1) / kFwdBlockQ);
  plan.block_q = large_items >= static_cast<int64_t>(kFwdMinItemsPerThread) * threads ? kFwdBlockQ : kFwdBlockQSmall;
  plan.q_tiles = (p.seqlen_q + plan.block_q - 1) / plan.block_q;
  plan.items = p.batch * p.heads_q * plan.q_tiles;
  const size_t d = static_cast<size_t>(p.head_dim);
  ScratchLayout ws;  // sized for the taller Q tile, kFwdBlockQ
  plan.off_qt = ws.take(d * kFwdBlockQ);
  plan.off_k = ws.take(kFwdBlockK * d);
  plan.off_v = ws.take(kFwdBlockK * d);
  plan.off_s = ws.take(static_cast<size_t>(kFwdBlockK) * kFwdBlockQ);
  plan.off_o = ws.take(d * kFwdBlockQ);
  plan.off_m = ws.take(kFwdBlockQ);
  plan.off_off = ws.take(kFwdBlockQ);
  plan.off_l = ws.take(kFwdBlockQ);
  plan.off_alpha = ws.take(kFwdBlockQ);
  plan.off_row = ws.take(d);
  plan.per_worker = ws.size();
  return plan;
}

}  // namespace

#define FA_TILE_BODY "cpu/tile_fwd.h"
#include "cpu/tile_variants.h"

void flash_fwd(const AttentionFwdParams& p, ThreadPool& pool, Isa isa) {
  const FwdPlan plan = make_fwd_plan(p, pool.size());
  FloatBuffer scratch(checked_mul(plan.per_worker, static_cast<size_t>(pool.size())));
  void (*item_fn)(const FwdPlan&, int64_t, float*) = isa_generic::fwd_item;
#if FA_CPU_X86
  switch (supported_isa(isa)) {
    case Isa::kAvx512: item_fn = isa_avx512::fwd_item; break;
    case Isa::kAvx2: item_fn = isa_avx2::fwd_item; break;
    case Isa::kGeneric: break;
  }
#else
  (void)isa;  // only the generic variant is compiled
#endif
  float* base = scratch.data();
  pool.parallel_for(plan.items, [&](int64_t item, int worker) {
    item_fn(plan, item, base + static_cast<size_t>(worker) * plan.per_worker);
  });
}

}  // namespace fa::cpu
