// Division by a divisor fixed for a launch: a multiply-high and a shift, the multiplier found on the
// host. Exact for dividends in [0, 2^31) and divisors in [1, 2^31): with k the least integer such
// that 2^k >= d and m = ceil(2^(31 + k) / d) (< 2^32), n m / 2^(31 + k) = n / d + e with
// 0 <= e < n / 2^(31 + k) < 2^-k <= 1 / d, so its floor is n's quotient. The integer division it
// replaces is a dependent chain of some 25 instructions through the MUFU and conversion pipes.
// Plain C++ as well (test/native/divmod_check.cc checks it against the division with g++, run by
// test/tile-scheduler.test.ts).
#pragma once
#include <cstdint>

// Functions of the headers that host C++ compiles too (fast_divmod.h, query_tile_scheduler.h).
#ifndef FA_HOST_DEVICE
#if defined(__CUDACC__)
#define FA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FA_HOST_DEVICE inline
#endif
#endif

namespace fa::cuda::flash {

struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 0;  // 0: divisor 1
  uint32_t shift = 0;       // k - 1

  FastDivmod() = default;
  // d >= 1 (the builders never pass 0).
  explicit FastDivmod(uint32_t d) : divisor(d) {
    if (d <= 1) return;
    uint32_t k = 0;
    while ((uint64_t{1} << k) < d) ++k;
    multiplier = static_cast<uint32_t>(((uint64_t{1} << (31 + k)) + d - 1) / d);
    shift = k - 1;
  }
  FA_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(n, multiplier);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * multiplier) >> 32);
#endif
    return multiplier == 0 ? n : hi >> shift;
  }
  // n = q divisor + r, 0 <= r < divisor.
  FA_HOST_DEVICE void divmod(uint32_t n, uint32_t& q, uint32_t& r) const {
    q = div(n);
    r = n - q * divisor;
  }
};

}  // namespace fa::cuda::flash

