// QueryTileScheduler (csrc/cuda/flash/query_tile_scheduler.h), the work-item decode of every CUDA grid
// of query tiles, against the plain integer divisions it replaces, on the host: for every item of
// random launches (batch, query and KV heads, lengths, head dim, tile rows 64 / 128 / 192, sections
// by default and down to one head or over all heads) the query tile, head, batch and KV head must
// equal the divisions', every (tile, head, batch) must come up exactly once, and longest first the
// items of a section must go heaviest tile first. Launches of 2^31 items or more must be refused.
//   g++ -std=c++17 -O2 -Icsrc test/native/scheduler_check.cc -o scheduler_check && ./scheduler_check [--seed N]
// Prints one summary line; exit status 1 on the first disagreement (printed).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "cuda/flash/query_tile_scheduler.h"
#include "host_check_args.h"

namespace {

using fa::cuda::flash::QueryTileScheduler;
using fa::cuda::flash::QueryTileWork;

// The decode with the divisions written out (the schedulers' definition): sections of `section`
// heads (batch x heads flattened), tile-major within a section, the last query tile first.
QueryTileWork divided(const fa::AttentionFwdParams& p, int block_m, bool longest_first, uint32_t section_kib,
                      uint32_t section_max_heads, uint64_t item) {
  const uint64_t m_blocks = (p.seqlen_q + block_m - 1) / block_m, heads = p.heads_q;
  const uint64_t group = heads / p.heads_kv, bhs = heads * p.batch;
  uint64_t bh, tile;
  if (longest_first) {
    const uint64_t kv_kib = ((p.seqlen_k + 255) / 256 * p.head_dim + group - 1) / group;
    const uint64_t by_kib = std::max<uint64_t>(1, section_kib / std::max<uint64_t>(1, kv_kib));
    const uint64_t section = std::min<uint64_t>(std::min<uint64_t>(bhs, section_max_heads), by_kib);
    const uint64_t sec = item / (section * m_blocks), r = item - sec * section * m_blocks;
    const uint64_t sec_heads = std::min(section, bhs - sec * section);
    tile = r / sec_heads;
    bh = sec * section + r % sec_heads;
  } else {
    tile = item % m_blocks;
    bh = item / m_blocks;
  }
  QueryTileWork w;
  w.m_block = static_cast<int>(m_blocks - 1 - tile);
  w.m0 = w.m_block * block_m;
  w.head = static_cast<int>(bh % heads);
  w.batch = static_cast<int64_t>(bh / heads);
  w.head_kv = static_cast<int>(static_cast<uint64_t>(w.head) / group);
  return w;
}

uint64_t items_checked = 0;

template <int kBlockM, bool kLongestFirst>
bool check_launch(const fa::AttentionFwdParams& p, uint32_t kib, uint32_t max_heads) {
  QueryTileScheduler s;
  if (!fa::cuda::flash::make_query_tile_scheduler<kBlockM>(&s, p, kib, max_heads)) {
    std::printf("scheduler_check: FAIL: a launch of B%lld H%lld/%lld Sq%lld refused\n", static_cast<long long>(p.batch),
                static_cast<long long>(p.heads_q), static_cast<long long>(p.heads_kv), static_cast<long long>(p.seqlen_q));
    return false;
  }
  const int64_t m_blocks = (p.seqlen_q + kBlockM - 1) / kBlockM;
  if (static_cast<int64_t>(s.items) != m_blocks * p.heads_q * p.batch) {
    std::printf("scheduler_check: FAIL: %u items, expected %lld\n", s.items, static_cast<long long>(m_blocks * p.heads_q * p.batch));
    return false;
  }
  std::vector<char> seen(s.items, 0);
  int prev_m_block = 0;
  for (uint32_t item = 0; item < s.items; ++item, ++items_checked) {
    const QueryTileWork w = s.work<kBlockM, kLongestFirst>(item);
    const QueryTileWork e = divided(p, kBlockM, kLongestFirst, kib, max_heads, item);
    const bool same = w.m_block == e.m_block && w.m0 == e.m0 && w.head == e.head && w.batch == e.batch &&
                      w.head_kv == e.head_kv;
    const int64_t flat = (w.batch * p.heads_q + w.head) * m_blocks + w.m_block;
    const bool in_range = w.m_block >= 0 && w.m_block < m_blocks && w.head >= 0 && w.head < p.heads_q && w.batch >= 0 &&
                          w.batch < p.batch;
    if (!same || !in_range || seen[flat]) {
      std::printf("scheduler_check: FAIL: B%lld H%lld/%lld Sq%lld Sk%lld D%lld rows %d %s sections %u KiB / %u heads, "
                  "item %u: tile %d head %d batch %lld kv %d, expected tile %d head %d batch %lld kv %d%s\n",
                  static_cast<long long>(p.batch), static_cast<long long>(p.heads_q), static_cast<long long>(p.heads_kv),
                  static_cast<long long>(p.seqlen_q), static_cast<long long>(p.seqlen_k), static_cast<long long>(p.head_dim),
                  kBlockM, kLongestFirst ? "longest first" : "in order", kib, max_heads, item, w.m_block, w.head,
                  static_cast<long long>(w.batch), w.head_kv, e.m_block, e.head, static_cast<long long>(e.batch), e.head_kv,
                  in_range && seen[flat] ? " (a second time)" : "");
      return false;
    }
    seen[flat] = 1;
    // Longest first: within a section the query tiles never get heavier (a section starts again at
    // the last tile).
    if (kLongestFirst && item > 0 && w.m_block > prev_m_block && w.m_block != m_blocks - 1) {
      std::printf("scheduler_check: FAIL: item %u goes to tile %d after tile %d\n", item, w.m_block, prev_m_block);
      return false;
    }
    prev_m_block = w.m_block;
  }
  return true;
}

template <int kBlockM>
bool check_both(const fa::AttentionFwdParams& p, uint32_t kib, uint32_t max_heads) {
  return check_launch<kBlockM, true>(p, kib, max_heads) && check_launch<kBlockM, false>(p, kib, max_heads);
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = host_check_seed(argc, argv);
  std::mt19937_64 rng(seed);
  const uint32_t kAll = fa::cuda::flash::kAllHeadsKiB;
  const uint32_t section_choices[][2] = {{fa::cuda::flash::kCausalSectionKiB, fa::cuda::flash::kCausalSectionMaxHeads},
                                         {1, 1},
                                         {kAll, kAll},
                                         {256, 7}};
  int launches = 0;
  for (int t = 0; t < 3000; ++t) {
    fa::AttentionFwdParams p;
    const int64_t group = 1 + static_cast<int64_t>(rng() % 8);
    p.heads_kv = 1 + static_cast<int64_t>(rng() % 6);
    p.heads_q = p.heads_kv * group;
    p.batch = 1 + static_cast<int64_t>(rng() % 5);
    p.seqlen_q = 1 + static_cast<int64_t>(rng() % (t % 4 == 0 ? 9000 : 700));
    p.seqlen_k = 1 + static_cast<int64_t>(rng() % 20000);
    p.head_dim = 8 * (1 + static_cast<int64_t>(rng() % 32));
    const auto& sc = section_choices[t % 4];
    ++launches;
    bool ok;
    switch (t % 3) {
      case 0:
        ok = check_both<64>(p, sc[0], sc[1]);
        break;
      case 1:
        ok = check_both<128>(p, sc[0], sc[1]);
        break;
      default:
        ok = check_both<192>(p, sc[0], sc[1]);
        break;
    }
    if (!ok) return 1;
  }
  // Refused: no item, 2^31 items, a KV head count that does not divide the query heads.
  fa::AttentionFwdParams big;
  big.batch = 1 << 16;
  big.heads_q = big.heads_kv = 1 << 9;
  big.seqlen_q = 64 * 64;
  big.seqlen_k = 64;
  big.head_dim = 64;
  fa::AttentionFwdParams odd = big;
  odd.batch = 1;
  odd.heads_q = 6;
  odd.heads_kv = 4;
  fa::AttentionFwdParams none = odd;
  none.heads_q = none.heads_kv = 2;
  none.seqlen_q = 0;
  QueryTileScheduler s;
  s.items = 12345;
  if (fa::cuda::flash::make_query_tile_scheduler<64>(&s, big) || fa::cuda::flash::make_query_tile_scheduler<64>(&s, odd) ||
      fa::cuda::flash::make_query_tile_scheduler<64>(&s, none) || s.items != 12345) {
    std::printf("scheduler_check: FAIL: a launch of 2^31 items, 6 query heads over 4 KV heads or no query was not refused, "
                "or the refusal wrote the scheduler\n");
    return 1;
  }
  std::printf("scheduler_check: OK: %d launches, %llu items (seed %llu)\n", launches,
              static_cast<unsigned long long>(items_checked), static_cast<unsigned long long>(seed));
  return 0;
}
