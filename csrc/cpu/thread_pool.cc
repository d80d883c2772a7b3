// ThreadPool: helpers sleep on a condition variable between jobs; within a job every worker pulls
// indices from one atomic counter, so uneven items (causal tiles) balance themselves.
#include "cpu/thread_pool.h"

namespace fa::cpu {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  size_ = threads > 0 ? threads : 1;
  helpers_.reserve(static_cast<size_t>(size_ - 1));
  try {
    for (int w = 1; w < size_; ++w) helpers_.emplace_back(&ThreadPool::helper_main, this, w);
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    start_cv_.notify_all();
    for (std::thread& t : helpers_) t.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : helpers_) t.join();
}

void ThreadPool::drain(int worker) {
  while (!failed_.load(std::memory_order_relaxed)) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= n_) return;
    try {
      (*fn_)(i, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
}

void ThreadPool::helper_main(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stopping_ || job_id_ != seen; });
      if (stopping_) return;
      seen = job_id_;
    }
    drain(worker);
    std::lock_guard<std::mutex> lock(mu_);
    if (--helpers_busy_ == 0) done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  std::lock_guard<std::mutex> caller(caller_mu_);
  if (n == 1 || helpers_.empty()) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);  // an exception leaves at once: the first one wins
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    helpers_busy_ = static_cast<int>(helpers_.size());
    ++job_id_;
  }
  start_cv_.notify_all();
  drain(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return helpers_busy_ == 0; });
    fn_ = nullptr;
    error = error_;
    error_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace fa::cpu
