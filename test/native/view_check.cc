// views_overlap and view_nested (csrc/common/view_layout.h) against brute force: random nested views
// of one storage, in pairs of the same layout (the same-layout path) and of different layouts (the
// run walk), each answer compared with the intersection of the two views' element sets.
//   g++ -std=c++17 -O2 -Icsrc test/native/view_check.cc -o view_check && ./view_check [--seed N]
// Prints one summary line; exit status 1 on the first disagreement (printed).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>

#include "common/view_layout.h"
#include "host_check_args.h"

namespace {

using fa::ViewLayout;

// A random nested view: a random order of dims, each stride above the span of the smaller ones by a
// random gap (0: packed). Sizes 1-4, ranks 1-5, offsets 0-40.
ViewLayout random_nested(std::mt19937_64& rng) {
  ViewLayout v;
  v.rank = 1 + static_cast<int>(rng() % 5);
  int order[fa::kMaxViewRank];
  for (int d = 0; d < v.rank; ++d) order[d] = d;
  for (int d = v.rank - 1; d > 0; --d) std::swap(order[d], order[rng() % (d + 1)]);
  int64_t span = 0;
  for (int k = 0; k < v.rank; ++k) {  // order[0] has the smallest stride
    const int d = order[k];
    v.sizes[d] = 1 + static_cast<int64_t>(rng() % 4);
    v.strides[d] = span + 1 + static_cast<int64_t>(rng() % 3 == 0 ? rng() % 5 : 0);
    span += (v.sizes[d] - 1) * v.strides[d];
  }
  v.offset = static_cast<int64_t>(rng() % 41);
  return v;
}

std::set<int64_t> elements(const ViewLayout& v) {
  std::set<int64_t> out;
  int64_t idx[fa::kMaxViewRank] = {};
  for (;;) {
    int64_t x = v.offset;
    for (int d = 0; d < v.rank; ++d) x += idx[d] * v.strides[d];
    out.insert(x);
    int d = v.rank - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < v.sizes[d]) break;
      idx[d] = 0;
    }
    if (d < 0) return out;
  }
}

int64_t count_elements(const ViewLayout& v) {
  int64_t n = 1;
  for (int d = 0; d < v.rank; ++d) n *= v.sizes[d];
  return n;
}

std::string describe(const ViewLayout& v) {
  std::string s = "{sizes [";
  for (int d = 0; d < v.rank; ++d) s += (d ? ", " : "") + std::to_string(v.sizes[d]);
  s += "], strides [";
  for (int d = 0; d < v.rank; ++d) s += (d ? ", " : "") + std::to_string(v.strides[d]);
  return s + "], offset " + std::to_string(v.offset) + "}";
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = host_check_seed(argc, argv);
  std::mt19937_64 rng(seed);
  int64_t pairs = 0, same_layout = 0, overlapping = 0;
  for (int t = 0; t < 200000; ++t) {
    const ViewLayout a = random_nested(rng);
    ViewLayout b = t % 2 == 0 ? a : random_nested(rng);
    if (t % 2 == 0) b.offset = static_cast<int64_t>(rng() % 41);
    const std::set<int64_t> ea = elements(a), eb = elements(b);
    if (!fa::view_nested(a) || static_cast<int64_t>(ea.size()) != count_elements(a)) {
      std::printf("view_check: FAIL: %s is nested and has distinct elements, view_nested says %d\n",
                  describe(a).c_str(), fa::view_nested(a));
      return 1;
    }
    bool expected = false;
    for (int64_t x : eb) expected = expected || ea.count(x) != 0;
    const bool got = fa::views_overlap(a, b), got_swapped = fa::views_overlap(b, a);
    if (got != expected || got_swapped != expected) {
      std::printf("view_check: FAIL (seed %llu): a %s, b %s: overlap %d, views_overlap(a, b) %d, (b, a) %d\n",
                  static_cast<unsigned long long>(seed), describe(a).c_str(), describe(b).c_str(), expected, got,
                  got_swapped);
      return 1;
    }
    ++pairs;
    same_layout += t % 2 == 0;
    overlapping += expected;
  }
  std::printf("view_check: OK: %lld pairs (%lld of one layout), %lld overlapping, seed %llu\n",
              static_cast<long long>(pairs), static_cast<long long>(same_layout), static_cast<long long>(overlapping),
              static_cast<unsigned long long>(seed));
  return 0;
}
