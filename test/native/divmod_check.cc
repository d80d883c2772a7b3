// FastDivmod (csrc/cuda/flash/fast_divmod.h, the query-tile schedulers' division by a launch's sizes)
// against the integer division, over the whole range it promises: divisors 1-4096 with every dividend
// below 2^16 and the dividends near the top of the range, every power of two and its neighbours below
// 2^31, and random divisors and dividends below 2^31 (and each divisor's multiples and their
// neighbours, where an error in the rounding of the multiplier would show first).
//   g++ -std=c++17 -O2 -Icsrc test/native/divmod_check.cc -o divmod_check && ./divmod_check [--seed N]
// Prints one summary line; exit status 1 on the first disagreement (printed).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>

#include "cuda/flash/fast_divmod.h"
#include "host_check_args.h"

namespace {

constexpr uint32_t kMaxDividend = 0x7fffffffu;  // the promise: dividends and divisors below 2^31

uint64_t checked = 0;

bool check(const fa::cuda::flash::FastDivmod& f, uint32_t n) {
  ++checked;
  uint32_t q, r;
  f.divmod(n, q, r);
  if (q == n / f.divisor && r == n % f.divisor) return true;
  std::printf("divmod_check: FAIL: %u / %u gave q %u r %u, expected q %u r %u (multiplier %u, shift %u)\n", n,
              f.divisor, q, r, n / f.divisor, n % f.divisor, f.multiplier, f.shift);
  return false;
}

// n and its neighbours within the range.
bool check_around(const fa::cuda::flash::FastDivmod& f, uint64_t n) {
  for (int64_t e = -2; e <= 2; ++e) {
    const int64_t m = static_cast<int64_t>(n) + e;
    if (m >= 0 && m <= kMaxDividend && !check(f, static_cast<uint32_t>(m))) return false;
  }
  return true;
}

bool check_divisor(uint32_t d, std::mt19937_64& rng, int random_dividends) {
  const fa::cuda::flash::FastDivmod f(d);
  // The multiples of d near the top of the range, the top itself, and random dividends with their
  // nearest multiples.
  const uint64_t top = kMaxDividend / d * d;
  if (!check_around(f, top) || !check_around(f, kMaxDividend) || !check_around(f, d) || !check(f, 0)) return false;
  for (int i = 0; i < random_dividends; ++i) {
    const uint32_t n = static_cast<uint32_t>(rng() % (uint64_t{kMaxDividend} + 1));
    if (!check(f, n) || !check_around(f, static_cast<uint64_t>(n) / d * d)) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = host_check_seed(argc, argv);
  std::mt19937_64 rng(seed);
  uint64_t divisors = 0;
  // Small divisors (head counts, query tiles, sections): every dividend below 2^16.
  for (uint32_t d = 1; d <= 4096; ++d, ++divisors) {
    const fa::cuda::flash::FastDivmod f(d);
    for (uint32_t n = 0; n < (1u << 16); ++n)
      if (!check(f, n)) return 1;
    if (!check_divisor(d, rng, 64)) return 1;
  }
  // Powers of two and their neighbours.
  for (int k = 1; k <= 31; ++k)
    for (int64_t e = -1; e <= 1; ++e) {
      const int64_t d = (int64_t{1} << k) + e;
      if (d < 1 || d > kMaxDividend) continue;
      ++divisors;
      if (!check_divisor(static_cast<uint32_t>(d), rng, 2048)) return 1;
    }
  // Random divisors across the range, uniform in their bit length.
  for (int i = 0; i < 20000; ++i, ++divisors) {
    const int bits = 1 + static_cast<int>(rng() % 31);
    const uint32_t d = static_cast<uint32_t>(std::max<uint64_t>(1, rng() % (uint64_t{1} << bits)));
    if (!check_divisor(d, rng, 64)) return 1;
  }
  std::printf("divmod_check: OK: %llu divisors, %llu divisions (seed %llu)\n", static_cast<unsigned long long>(divisors),
              static_cast<unsigned long long>(checked), static_cast<unsigned long long>(seed));
  return 0;
}
