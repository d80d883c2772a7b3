// A small fork-join thread pool for the CPU backend: one job at a time, dynamic scheduling of
// indices over the workers, the calling thread participating as worker 0.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fa::cpu {

class ThreadPool {
 public:
  // threads <= 0 means std::thread::hardware_concurrency() (at least 1). Starts threads - 1 helper
  // threads; may throw std::system_error if the OS refuses to start one.
  explicit ThreadPool(int threads);
  // Wakes and joins every helper. Must not be called while parallel_for runs.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Number of workers, the calling thread included.
  int size() const { return size_; }

  // Runs fn(index, worker) for every index in [0, n) and returns when all are done. `worker` is in
  // [0, size()) and unique among the calls running at the same moment (index per-worker scratch
  // with it). Indices are handed out dynamically, in increasing order. If fn throws, no new index
  // is started, the running ones finish, and the first exception is rethrown here. Calls from
  // several threads are serialised (one job at a time); fn must not call parallel_for on the same
  // pool (it would deadlock).
  void parallel_for(int64_t n, const std::function<void(int64_t index, int worker)>& fn);

 private:
  void helper_main(int worker);
  void drain(int worker);  // runs indices of the current job until none is left

  int size_ = 1;
  std::vector<std::thread> helpers_;

  std::mutex caller_mu_;  // held by the thread inside parallel_for
  std::mutex mu_;
  std::condition_variable start_cv_;  // helpers wait here for a new job or for shutdown
  std::condition_variable done_cv_;   // the caller waits here for the helpers to finish a job
  uint64_t job_id_ = 0;               // guarded by mu_; bumped once per job
  bool stopping_ = false;             // guarded by mu_
  int helpers_busy_ = 0;              // guarded by mu_; helpers not yet done with the current job
  std::exception_ptr error_;          // guarded by mu_; first exception of the current job

  // The current job; written under mu_ before job_id_ is bumped, read-only while it runs.
  const std::function<void(int64_t, int)>* fn_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<bool> failed_{false};
};

}  // namespace fa::cpu
