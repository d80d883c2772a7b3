// The CPU backend's "stream": one thread that runs submitted tasks in submission order, so CPU work
// is queued and ordered exactly like work on a CUDA stream. Each task may use the ThreadPool for
// parallelism. Reads wait for a sequence number off the JS thread.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace fa {

class CpuExecutor {
 public:
  CpuExecutor();
  ~CpuExecutor();  // runs what is queued, then joins
  CpuExecutor(const CpuExecutor&) = delete;
  CpuExecutor& operator=(const CpuExecutor&) = delete;

  // Queues `task`; returns its sequence number (1, 2, ...). Tasks must not throw (wrap them).
  uint64_t submit(std::function<void()> task);
  // The sequence number of the last submitted task (0 when none).
  uint64_t last_submitted() const;
  // Blocks until every task up to and including `seq` has finished.
  void wait(uint64_t seq);

 private:
  void loop();

  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace fa
