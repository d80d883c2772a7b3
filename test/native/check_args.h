// The command line and the opening line shared by the standalone GPU checks (test/native/*_check.cu):
//     <program> [seed] [--no-bench] [--bench-only]
// A seed reruns a previous run's inputs (a fresh one is drawn otherwise); --no-bench skips the timing;
// --bench-only skips the checks (programs that support it say so to check_setup; the others refuse it).
// Prints the device and the seed with the command that reruns it.
#pragma once
#include <cuda_runtime.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "check_cuda.h"

struct CheckSetup {
  uint64_t seed;
  bool run_bench;
  bool run_checks;
  cudaDeviceProp prop;  // of the current device
};

inline CheckSetup check_setup(int argc, char** argv, const char* program, bool bench_only_supported = false) {
  // Line-buffered stdout: a run cut off by a time limit keeps every line it printed (fully buffered
  // output to a file was lost whole once).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  CheckSetup s{std::random_device{}(), true, true, {}};
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--no-bench") == 0) {
      s.run_bench = false;
    } else if (std::strcmp(argv[a], "--bench-only") == 0 && bench_only_supported) {
      s.run_checks = false;
    } else if (argv[a][0] >= '0' && argv[a][0] <= '9') {
      s.seed = std::strtoull(argv[a], nullptr, 10);
    } else {
      std::fprintf(stderr, "%s: unknown argument \"%s\"; usage: %s [seed] [--no-bench]%s\n", program, argv[a], program,
                   bench_only_supported ? " [--bench-only]" : "");
      std::exit(2);
    }
  }
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaGetDeviceProperties(&s.prop, dev));
  std::printf("device %d: %s (sm_%d%d), seed %" PRIu64 " (rerun with: %s %" PRIu64 ")\n", dev, s.prop.name,
              s.prop.major, s.prop.minor, s.seed, program, s.seed);
  return s;
}

// Whether the comma-separated list in environment variable `var` (unset: everything) holds `name`
// (the checks' FLASH_*_CHECK_* filters).
inline bool listed(const char* var, const std::string& name) {
  const char* const wanted = std::getenv(var);
  if (wanted == nullptr) return true;
  const std::string list = std::string(",") + wanted + ",";
  return list.find("," + name + ",") != std::string::npos;
}
