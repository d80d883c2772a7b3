#include "runtime/cpu_executor.h"

namespace fa {

CpuExecutor::CpuExecutor() : thread_([this] { loop(); }) {}

CpuExecutor::~CpuExecutor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  // Tasks hold buffers, never the runtime that owns this executor, so this never runs on thread_.
  thread_.join();
}

uint64_t CpuExecutor::submit(std::function<void()> task) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    seq = ++submitted_;
  }
  work_cv_.notify_one();
  return seq;
}

uint64_t CpuExecutor::last_submitted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return submitted_;
}

void CpuExecutor::wait(uint64_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return completed_ >= seq; });
}

void CpuExecutor::loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
    task = nullptr;  // release captured buffers before reporting completion
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++completed_;
    }
    done_cv_.notify_all();
  }
}

}  // namespace fa
