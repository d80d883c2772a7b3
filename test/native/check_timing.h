// Timing of one launch function for the standalone GPU checks (test/native/*_check.cu): kWarmupCalls
// untimed calls, then
//   median_ms: the median of kTimedCalls calls, each started on an idle stream between its own pair of
//              CUDA events (so the host's per-call work is counted), and min_ms their minimum;
//   queued_ms: the median over kQueuedRounds rounds of the mean of kTimedCalls calls queued back to
//              back between one pair of events (host work overlaps the GPU's, as in the bench and in
//              PyTorch's usual timing); the median of rounds keeps one disturbed round out of it.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "check_cuda.h"

struct LaunchTimes {
  double median_ms, min_ms, queued_ms;
};

inline constexpr int kWarmupCalls = 3;
inline constexpr int kTimedCalls = 20;
inline constexpr int kQueuedRounds = 5;

// launch() enqueues one call on the stream and returns its cudaError_t.
template <typename Launch>
LaunchTimes time_launches(Launch&& launch, cudaStream_t stream) {
  for (int w = 0; w < kWarmupCalls; ++w) CHECK_CUDA(launch());
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  std::vector<float> ms(kTimedCalls);
  for (int it = 0; it < kTimedCalls; ++it) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    CHECK_CUDA(launch());
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&ms[it], start, stop));
  }
  std::sort(ms.begin(), ms.end());
  std::vector<float> rounds(kQueuedRounds);
  for (float& round : rounds) {
    CHECK_CUDA(cudaEventRecord(start, stream));
    for (int it = 0; it < kTimedCalls; ++it) CHECK_CUDA(launch());
    CHECK_CUDA(cudaEventRecord(stop, stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    CHECK_CUDA(cudaEventElapsedTime(&round, start, stop));
  }
  std::sort(rounds.begin(), rounds.end());
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return {ms[kTimedCalls / 2], ms[0], rounds[kQueuedRounds / 2] / kTimedCalls};
}

// TFLOP/s of `flops` in `ms` milliseconds.
inline double tflops_per_s(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }
