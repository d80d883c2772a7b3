// The command line of the host-only checks that Jest builds with the host compiler and runs
// (test/native/view_check.cc, divmod_check.cc, scheduler_check.cc): [--seed N], seed 1 by default, so
// that a run is repeatable and the Jest test can try several.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>

inline uint64_t host_check_seed(int argc, char** argv) {
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--seed") == 0) seed = std::strtoull(argv[i + 1], nullptr, 10);
  return seed;
}
