// CPU FlashAttention-2 backward (Algorithm 2), always a single pass over the K/V tiles with dQ
// accumulated across them (tile_bwd.h has the loops):
//  1. D = rowsum(dO ∘ O), items (batch, query head, Q tile).
//  2. Items (batch, kv head, chunk): each runs the pass over one contiguous chunk of K/V tiles,
//     owning their dK and dV and accumulating dQ over them. When there are few (batch, kv head)
//     pairs, the K/V tiles of each are split into several chunks so that there is work for more
//     threads; the chunk count is a function of the shape alone (never of the thread count).
//  3. With more than one chunk, each chunk's dQ is an fp32 partial, and the partials are summed in
//     chunk order (0, 1, 2, ...) into dq, items (batch, query head, Q tile).
// Results are therefore bit-identical across runs and thread counts. The tile code is compiled here
// once per instruction set and picked at run time.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

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

// Chunking. With fewer than kBwdMinKvItems (batch, kv head) pairs, the K/V tiles of each pair are
// split into ceil(kBwdMinKvItems / pairs) chunks, at most kBwdMaxChunks and at most one per
// kBwdMinChunkTiles K/V tiles, so that about kBwdMinKvItems items can keep that many threads busy.
// Each chunk beyond the first re-converts Q and dO and writes, then reads back, an fp32 dQ partial.
// Bwd CPU seconds (one thread) at 1 / 2 / 4 / 8 chunks: B1 H1 D64 S2048 0.019 / 0.020 / 0.021 /
// 0.022, S4096 0.077 / 0.078 / 0.079 / 0.082 (16 chunks of 4 tiles: 0.088, hence the floor of 8
// tiles); B1 H8 S2048 D64 0.170 / 0.176 / 0.183 / -. B1 H1 S32768 D64 bwd seconds on a 16-core
// Xeon: 0.95-1.23 at 8 chunks (8 threads busy), 0.66-0.67 at 16 (the old split schedule, 7 GEMMs
// per pair: 0.75); on 2 cores 2.49 vs 2.51 s, peak RSS 136 vs 198 MiB (partials: 8 MiB per chunk).
constexpr int64_t kBwdMinKvItems = 16;
constexpr int64_t kBwdMaxChunks = 16;
constexpr int64_t kBwdMinChunkTiles = 8;
// The dQ partials (chunks * batch * heads_q * seqlen_q * head_dim fp32) stay under this, by
// lowering the chunk count (down to 1 chunk, which needs none); so does the scratch of the items
// running at once, by running fewer of them at once (neither changes the results).
constexpr size_t kBwdWorkspaceLimitBytes = size_t{1} << 30;

struct BwdPlan {
  const AttentionBwdParams* p = nullptr;
  int head_dim = 0;
  int64_t group = 1;    // query heads per kv head
  int64_t q_tiles = 0;  // per (batch, head)
  int64_t k_tiles = 0;
  int64_t chunks = 1;                   // K/V chunks per (batch, kv head)
  std::vector<int64_t> chunk_begin;     // [chunks + 1] first K/V tile of each chunk, then k_tiles
  std::vector<int64_t> chunk_first_qt;  // [chunks] first Q tile that sees a key of the chunk (or q_tiles)
  int64_t items = 0;                    // batch * heads_kv * chunks
  float* delta = nullptr;               // [batch, heads_q, seqlen_q] D = rowsum(dO ∘ O)
  float* dq_partial = nullptr;          // [chunks][batch][heads_q][q_tiles * kBwdBlockQ][d], chunks > 1
  // Per-slot scratch layout, in floats from the slot's base (shapes in tile_bwd.h).
  size_t off_q = 0, off_do = 0, off_dq = 0, off_lse = 0, off_delta = 0, off_kc = 0, off_kt = 0, off_vt = 0,
         off_s = 0, off_dp = 0, off_row = 0, off_dk = 0, off_dv = 0;
  size_t per_slot = 0;

  // Row i of chunk c's partial dQ for (batch b, query head hq).
  float* dq_partial_rows(int64_t c, int64_t b, int64_t hq, int64_t i) const {
    const int64_t head = (c * p->batch + b) * p->heads_q + hq;
    return dq_partial + (static_cast<size_t>(head) * static_cast<size_t>(q_tiles * kBwdBlockQ) +
                         static_cast<size_t>(i)) * static_cast<size_t>(head_dim);
  }
};

// First query tile with a row that sees a key from j0 on (the causal mask and the window's right side),
// or q_tiles if none does.
int64_t bwd_first_q_tile(const BwdPlan& plan, int64_t j0) {
  const AttentionBwdParams& p = *plan.p;
  const int64_t first_row = VisibleKeys(p).first_reaching(j0, p.seqlen_q);
  return first_row >= p.seqlen_q ? plan.q_tiles : first_row / kBwdBlockQ;
}

// One past the last query tile with a row that sees a key before j0 + keys (the window's left side).
int64_t bwd_end_q_tile(const BwdPlan& plan, int64_t j0, int64_t keys) {
  const AttentionBwdParams& p = *plan.p;
  const int64_t end_row = VisibleKeys(p).first_after(j0 + keys - 1, p.seqlen_q);
  return (end_row + kBwdBlockQ - 1) / kBwdBlockQ;
}

// Splits the K/V tiles into plan.chunks contiguous, non-empty chunks of about equal work (the Q
// tiles each K/V tile pairs with): equal tile counts when not masked, longer chunks towards the end
// of K when causal.
void split_chunks(BwdPlan& plan) {
  std::vector<int64_t> work(plan.k_tiles + 1, 0);  // work[kt]: work of tiles [0, kt)
  for (int64_t kt = 0; kt < plan.k_tiles; ++kt) {
    const int64_t j0 = kt * kBwdBlockK;
    const int64_t keys = std::min<int64_t>(kBwdBlockK, plan.p->seqlen_k - j0);
    work[kt + 1] = work[kt] + std::max<int64_t>(0, bwd_end_q_tile(plan, j0, keys) - bwd_first_q_tile(plan, j0));
  }
  plan.chunk_begin.assign(plan.chunks + 1, plan.k_tiles);
  plan.chunk_begin[0] = 0;
  for (int64_t c = 1; c < plan.chunks; ++c) {
    const int64_t target = work.back() * c / plan.chunks;
    const int64_t kt = std::lower_bound(work.begin(), work.end(), target) - work.begin();
    plan.chunk_begin[c] = std::clamp(kt, plan.chunk_begin[c - 1] + 1, plan.k_tiles - (plan.chunks - c));
  }
  plan.chunk_first_qt.resize(plan.chunks);
  for (int64_t c = 0; c < plan.chunks; ++c)
    plan.chunk_first_qt[c] = bwd_first_q_tile(plan, plan.chunk_begin[c] * kBwdBlockK);
}

BwdPlan make_bwd_plan(const AttentionBwdParams& p) {
  BwdPlan plan;
  plan.p = &p;
  plan.head_dim = static_cast<int>(p.head_dim);
  plan.group = p.heads_q / p.heads_kv;
  plan.q_tiles = (p.seqlen_q + kBwdBlockQ - 1) / kBwdBlockQ;
  plan.k_tiles = (p.seqlen_k + kBwdBlockK - 1) / kBwdBlockK;
  const size_t d = static_cast<size_t>(p.head_dim);

  const int64_t kv_pairs = p.batch * p.heads_kv;
  if (kv_pairs < kBwdMinKvItems) {
    plan.chunks = std::min({kBwdMaxChunks, std::max<int64_t>(1, plan.k_tiles / kBwdMinChunkTiles),
                            (kBwdMinKvItems + kv_pairs - 1) / kv_pairs});
    const size_t partial_bytes_per_chunk = checked_mul(
        checked_mul(static_cast<size_t>(p.batch * p.heads_q), static_cast<size_t>(plan.q_tiles) * kBwdBlockQ),
        d * sizeof(float));
    plan.chunks = std::max<int64_t>(
        1, std::min<int64_t>(plan.chunks, static_cast<int64_t>(kBwdWorkspaceLimitBytes / partial_bytes_per_chunk)));
  }
  split_chunks(plan);
  plan.items = kv_pairs * plan.chunks;
  int64_t max_chunk_tiles = 0;
  for (int64_t c = 0; c < plan.chunks; ++c)
    max_chunk_tiles = std::max(max_chunk_tiles, plan.chunk_begin[c + 1] - plan.chunk_begin[c]);

  ScratchLayout ws;
  const size_t blk_rows = static_cast<size_t>(kBwdQBlockTiles) * kBwdBlockQ;
  plan.off_q = ws.take(blk_rows * d);
  plan.off_do = ws.take(blk_rows * d);
  if (plan.chunks == 1) plan.off_dq = ws.take(blk_rows * d);  // else dQ accumulates in the partials
  plan.off_lse = ws.take(blk_rows);
  plan.off_delta = ws.take(blk_rows);
  plan.off_kc = ws.take(kBwdBlockK * d);
  plan.off_kt = ws.take(d * kBwdBlockK);
  plan.off_vt = ws.take(d * kBwdBlockK);
  plan.off_s = ws.take(static_cast<size_t>(kBwdBlockQ) * kBwdBlockK);
  plan.off_dp = ws.take(static_cast<size_t>(kBwdBlockQ) * kBwdBlockK);
  plan.off_row = ws.take(d);
  const size_t chunk_rows = static_cast<size_t>(max_chunk_tiles) * kBwdBlockK;
  plan.off_dk = ws.take(checked_mul(chunk_rows, d));
  plan.off_dv = ws.take(checked_mul(chunk_rows, d));
  plan.per_slot = ws.size();
  return plan;
}

}  // namespace

#define FA_TILE_BODY "cpu/tile_bwd.h"
#include "cpu/tile_variants.h"

namespace {

struct BwdKernels {
  void (*delta)(const BwdPlan&, int64_t);
  void (*chunk)(const BwdPlan&, int64_t, float*);
  void (*dq_reduce)(const BwdPlan&, int64_t);
};

BwdKernels select_kernels(Isa isa) {
#if FA_CPU_X86
  switch (supported_isa(isa)) {
    case Isa::kAvx512:
      return {isa_avx512::bwd_delta_item, isa_avx512::bwd_chunk_item, isa_avx512::bwd_dq_reduce_item};
    case Isa::kAvx2: return {isa_avx2::bwd_delta_item, isa_avx2::bwd_chunk_item, isa_avx2::bwd_dq_reduce_item};
    case Isa::kGeneric: break;
  }
#else
  (void)isa;  // only the generic variant is compiled
#endif
  return {isa_generic::bwd_delta_item, isa_generic::bwd_chunk_item, isa_generic::bwd_dq_reduce_item};
}

}  // namespace

void flash_bwd(const AttentionBwdParams& p, ThreadPool& pool, Isa isa) {
  BwdPlan plan = make_bwd_plan(p);
  // Items running at once, each on its own scratch slot: min(threads, items), fewer when their
  // scratch would exceed kBwdWorkspaceLimitBytes.
  const int64_t threads = pool.size();
  const int64_t fit = static_cast<int64_t>(
      std::max<size_t>(1, kBwdWorkspaceLimitBytes / checked_mul(plan.per_slot, sizeof(float))));
  const int64_t running = std::min({plan.items, threads, fit});
  FloatBuffer delta(checked_mul(static_cast<size_t>(p.batch * p.heads_q), static_cast<size_t>(p.seqlen_q)));
  FloatBuffer scratch(checked_mul(plan.per_slot, static_cast<size_t>(running)));
  const size_t partial_floats =
      plan.chunks == 1 ? 0
                       : checked_mul(checked_mul(static_cast<size_t>(plan.chunks * p.batch * p.heads_q),
                                                 static_cast<size_t>(plan.q_tiles) * kBwdBlockQ),
                                     static_cast<size_t>(p.head_dim));
  FloatBuffer dq_partial(partial_floats);
  plan.delta = delta.data();
  plan.dq_partial = dq_partial.data();
  const BwdKernels k = select_kernels(isa);
  const int64_t q_tile_items = p.batch * p.heads_q * plan.q_tiles;
  pool.parallel_for(q_tile_items, [&](int64_t item, int) { k.delta(plan, item); });
  float* base = scratch.data();
  if (running == threads) {  // a slot per worker, items handed out dynamically
    pool.parallel_for(plan.items, [&](int64_t item, int worker) {
      k.chunk(plan, item, base + static_cast<size_t>(worker) * plan.per_slot);
    });
  } else {  // `running` lanes, each with a slot: lane l runs items l, l + running, ...
    pool.parallel_for(running, [&](int64_t lane, int) {
      for (int64_t item = lane; item < plan.items; item += running)
        k.chunk(plan, item, base + static_cast<size_t>(lane) * plan.per_slot);
    });
  }
  if (plan.chunks > 1) pool.parallel_for(q_tile_items, [&](int64_t item, int) { k.dq_reduce(plan, item); });
}

}  // namespace fa::cpu
