// The query-tile scheduler: work item -> (query tile, head, batch, KV head) for every grid of query
// tiles, built on the host per launch and decoded on the device. Plain C++ as well
// (test/native/scheduler_check.cc checks the decode against the plain divisions with g++, run by
// test/tile-scheduler.test.ts).
#pragma once
#include <algorithm>
#include <cstdint>

#include "common/attention_params.h"
#include "cuda/flash/fast_divmod.h"

namespace fa::cuda::flash {

// Grids of query tiles (the forward kernels, the two-kernel backward's dQ kernel): one work item per
// (query tile of kBlockM rows, query head, batch), query tiles fastest so that the items of a head
// run side by side and share its K/V in L2; causal, heaviest first (below).
struct QueryTileWork {
  int m_block, m0;    // the query tile and its first row
  int head, head_kv;  // the query head and the KV head it reads (GQA / MQA)
  int64_t batch;
};
// Causal grids of query tiles, heaviest first: a causal query tile sees the keys up to the diagonal,
// so the tiles of a head differ in work, and blocks start in blockIdx order. Head by head, the
// heaviest tiles of the last heads start last and run alone at the end. Instead the heads are cut into
// L2 sections, as many heads as have K and V within kCausalSectionKiB and at most
// kCausalSectionMaxHeads, and within a section the items go tile-major, the heaviest (last) query
// tile of every head first: the blocks' last items are short, and the blocks at work at one time read
// the K/V of a few heads. H100, bf16, FA2 grid, the two-block d64 forward (the shipped causal kernel
// below 2k keys), TFLOP/s at 512 / 1k / 2k / 4k / 8k / 16k, two runs of two rounds each, in turn with
// the head-by-head build (2026-11-27): 206-207 / 282-284 / 326-349 / 371-378 / 386-404 / 359-416
// against 207-208 / 277-279 / 334-343 / 356-363 / 381-385 / 391-397; the two-kernel backward (its dQ
// kernel) 0.97-1.03x the head-by-head build's time at d64-192 causal, 0.97-0.99x at d256 from 1k.
inline constexpr uint32_t kAllHeadsKiB = ~0u;
inline constexpr uint32_t kCausalSectionKiB = 32u << 10;
inline constexpr uint32_t kCausalSectionMaxHeads = 32;
// Item -> query tile, the divisions of a launch's sizes done as FastDivmods built on the host
// (make_query_tile_scheduler) and passed to the kernel. Longest first (causal): heaviest first within
// sections (above; the warp-specialized forward hands the items out from a global counter in order,
// the other grids take blockIdx.x). H100, bf16, causal d128 warp-specialized forward, TFLOP/s at 512 /
// 1k / 2k / 4k / 8k / 16k keys (2026-11-27, items from the counter): sections of 32 MiB and at most 32
// heads 268 / 364 / 437 / 494 / 517 / 542; 32 MiB alone 240 / 360 / 421 / 487 / 516 / 547 (at 512 that
// is 128 heads, whose K/V the first items all read); one head 270 / 354 / 404 / 447 / 506 / 526; all
// heads 205 / 266 / 324 / 451 / 493 / 524. Otherwise query tiles fastest, each head's heaviest causal
// tile first.
struct QueryTileScheduler {
  uint32_t items;     // query tiles x heads x batch, < 2^31
  uint32_t m_blocks;  // query tiles of a head
  FastDivmod tiles;   // m_blocks
  FastDivmod heads;   // bh = batch x heads + head
  FastDivmod group;   // query heads per KV head
  // Longest first: sections of section.divisor heads (batch x heads flattened), the last one
  // last_section.divisor; section_items = section x m_blocks items each.
  FastDivmod section_items, section, last_section;
  uint32_t full_section_items;  // the items of the sections before the last

  // kBlockM: the rows of a query tile, as the scheduler was built with. Host-callable for
  // test/native/scheduler_check.cc.
  template <int kBlockM, bool kLongestFirst>
  FA_HOST_DEVICE QueryTileWork work(uint32_t item) const {
    QueryTileWork w;
    uint32_t bh, tile;
    if constexpr (kLongestFirst) {
      uint32_t sec, r;
      section_items.divmod(item, sec, r);
      // Every section but the last holds section.divisor heads.
      const FastDivmod& in = item < full_section_items ? section : last_section;
      uint32_t rank, h;
      in.divmod(r, rank, h);
      tile = rank;
      bh = sec * section.divisor + h;
    } else {
      tiles.divmod(item, bh, tile);
    }
    w.m_block = static_cast<int>(m_blocks - 1 - tile);
    w.m0 = w.m_block * kBlockM;
    uint32_t batch, head;
    heads.divmod(bh, batch, head);
    w.head = static_cast<int>(head);
    w.batch = batch;
    w.head_kv = static_cast<int>(group.div(head));
    return w;
  }
};
// The scheduler of a launch whose query tiles have kBlockM rows, with sections of at most section_kib
// KiB of K / V and section_max_heads heads (the longest-first order). False, and *s untouched, when
// the sizes give no item or 2^31 items or more (the grids and FastDivmod count in 31 bits), or KV
// heads that do not divide the query heads: the launchers then return cudaErrorInvalidConfiguration.
template <int kBlockM>
bool make_query_tile_scheduler(QueryTileScheduler* s, const AttentionFwdParams& p,
                               uint32_t section_kib = kCausalSectionKiB,
                               uint32_t section_max_heads = kCausalSectionMaxHeads) {
  const int64_t m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM, bhs = p.batch * p.heads_q;
  if (m_blocks < 1 || bhs < 1 || p.heads_kv < 1 || p.heads_q % p.heads_kv != 0 || m_blocks > INT32_MAX ||
      bhs > INT32_MAX || m_blocks * bhs > INT32_MAX)
    return false;
  const int64_t items = m_blocks * bhs;
  const int64_t group = p.heads_q / p.heads_kv;
  s->items = static_cast<uint32_t>(items);
  s->m_blocks = static_cast<uint32_t>(m_blocks);
  s->tiles = FastDivmod(static_cast<uint32_t>(m_blocks));
  s->heads = FastDivmod(static_cast<uint32_t>(p.heads_q));
  s->group = FastDivmod(static_cast<uint32_t>(group));
  // K and V of one query head, in KiB (the heads of a GQA group share theirs).
  const int64_t kv_kib = ((p.seqlen_k + 255) / 256 * p.head_dim + group - 1) / group;
  const int64_t section = std::min<int64_t>(std::min<int64_t>(bhs, section_max_heads),
                                            std::max<int64_t>(1, section_kib / std::max<int64_t>(1, kv_kib)));
  const int64_t sections = (bhs + section - 1) / section;
  s->section_items = FastDivmod(static_cast<uint32_t>(section * m_blocks));
  s->section = FastDivmod(static_cast<uint32_t>(section));
  s->last_section = FastDivmod(static_cast<uint32_t>(bhs - (sections - 1) * section));
  s->full_section_items = static_cast<uint32_t>((sections - 1) * section * m_blocks);
  return true;
}

}  // namespace fa::cuda::flash
