// The command line and the opening line shared by the standalone GPU checks (test/native/*_check.cu):
//     <program> [seed] [--no-bench]
// A seed reruns a previous run's inputs (a fresh one is drawn otherwise); --no-bench skips the timing.
// Prints the device and the seed with the command that reruns it.
#pragma once
#include <cuda_runtime.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "check_cuda.h"

struct CheckSetup {
  uint64_t seed;
  bool run_bench;
  cudaDeviceProp prop;  // of the current device
};

inline CheckSetup check_setup(int argc, char** argv, const char* program) {
  CheckSetup s{std::random_device{}(), true, {}};
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--no-bench") == 0)
      s.run_bench = false;
    else
      s.seed = std::strtoull(argv[a], nullptr, 10);
  }
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaGetDeviceProperties(&s.prop, dev));
  std::printf("device %d: %s (sm_%d%d), seed %" PRIu64 " (rerun with: %s %" PRIu64 ")\n", dev, s.prop.name,
              s.prop.major, s.prop.minor, s.seed, program, s.seed);
  return s;
}
