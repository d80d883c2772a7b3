#include "runtime/runtime.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "cpu/thread_pool.h"
#include "runtime/error.h"
#include "runtime/build_info.h"
#include "runtime/format.h"

namespace fa {

namespace {
// CPU buffers are aligned for 512-bit vector loads.
constexpr size_t kCpuAlignment = 64;

// The host's available and total physical memory, for an out-of-memory message ("" if unknown).
std::string host_memory_note() {
  const long page = sysconf(_SC_PAGESIZE), avail = sysconf(_SC_AVPHYS_PAGES), total = sysconf(_SC_PHYS_PAGES);
  if (page <= 0 || avail < 0 || total <= 0) return "";
  return " with " + format_bytes(static_cast<size_t>(avail) * static_cast<size_t>(page)) + " available of " +
         format_bytes(static_cast<size_t>(total) * static_cast<size_t>(page));
}
}  // namespace

// ---- MemoryManager ----

void* MemoryManager::allocate(Device device, size_t bytes) {
  void* ptr = nullptr;
  if (device == Device::kCpu) {
    const size_t rounded = (bytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    ptr = std::aligned_alloc(kCpuAlignment, rounded == 0 ? kCpuAlignment : rounded);
    if (!ptr) {
      throw Error("out of host memory: tried to allocate " + format_bytes(bytes) + " (" + std::to_string(bytes) +
                  " bytes) for a cpu tensor" + host_memory_note());
    }
  } else {
#ifdef FA_WITH_CUDA
    if (!cuda_) throw Error("CUDA is not initialised");
    ptr = cuda_->allocate(bytes);
#else
    throw Error("this build of flash-attn-node has no CUDA support");
#endif
  }
  MemoryCounters& c = counters(device);
  c.buffers.fetch_add(1);
  const int64_t now = c.bytes.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  int64_t peak = c.peak_bytes.load();
  while (now > peak && !c.peak_bytes.compare_exchange_weak(peak, now)) {
  }
  return ptr;
}

void MemoryManager::release(Device device, void* ptr, size_t bytes) noexcept {
  if (!ptr) return;
  if (device == Device::kCpu) {
    std::free(ptr);
  } else {
#ifdef FA_WITH_CUDA
    if (cuda_) cuda_->release(ptr);
#endif
  }
  MemoryCounters& c = counters(device);
  c.buffers.fetch_sub(1);
  c.bytes.fetch_sub(static_cast<int64_t>(bytes));
}

#ifdef FA_WITH_CUDA
void MemoryManager::attach_cuda(std::shared_ptr<CudaContext> ctx) {
  cuda_ = std::move(ctx);
}
#endif

// ---- Buffer ----

Buffer::Buffer(std::shared_ptr<MemoryManager> mm, Device device, DType dtype, size_t bytes)
    : mm_(std::move(mm)), device_(device), dtype_(dtype), bytes_(bytes) {
  ptr_ = mm_->allocate(device, bytes);
}

Buffer::Buffer(std::shared_ptr<MemoryManager> mm, Device device, DType dtype, size_t bytes, void* external)
    : mm_(std::move(mm)), device_(device), dtype_(dtype), bytes_(bytes), ptr_(external), external_(true) {}

Buffer::~Buffer() {
  if (!external_) mm_->release(device_, ptr_, bytes_);
}

void Buffer::set_error(const std::string& msg) {
  std::lock_guard<std::mutex> lock(error_mu_);
  if (error_.empty()) error_ = msg;
}

std::string Buffer::error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return error_;
}

// ---- Runtime ----

Runtime::Runtime() : mm_(std::make_shared<MemoryManager>()), pool_(std::make_unique<cpu::ThreadPool>(0)) {}

Runtime::~Runtime() {
  // Finish queued CPU work first: its tasks use the pool, which is destroyed next.
  executor_.wait(executor_.last_submitted());
}

bool Runtime::cuda_compiled() {
#ifdef FA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

bool Runtime::cuda_available(std::string* why) {
#ifdef FA_WITH_CUDA
  std::lock_guard<std::mutex> lock(cuda_mu_);
  if (!cuda_tried_) {
    cuda_tried_ = true;
    std::string reason;
    if (cuda_device_count(&reason) == 0) {
      cuda_why_ = reason;
    } else {
      try {
        mm_->attach_cuda(std::make_shared<CudaContext>());
      } catch (const std::exception& e) {
        cuda_why_ = e.what();
      }
    }
  }
  if (mm_->cuda()) return true;
  if (why) *why = cuda_why_;
  return false;
#else
  if (why) *why = kCpuOnlyMessage;
  return false;
#endif
}

#ifdef FA_WITH_CUDA
CudaContext& Runtime::cuda() {
  std::string why;
  if (!cuda_available(&why)) throw Error("CUDA is not available: " + why);
  return *mm_->cuda();
}
#endif

BufferPtr Runtime::allocate(Device device, DType dtype, size_t bytes, bool is_output) {
#ifdef FA_WITH_CUDA
  if (device == Device::kCuda) cuda();  // initialises lazily, or throws why not
#endif
  auto buf = std::make_shared<Buffer>(mm_, device, dtype, bytes);
  if (is_output && mm_->poison.load()) {
    if (device == Device::kCpu) {
      std::memset(buf->data(), 0xff, bytes);
    } else {
#ifdef FA_WITH_CUDA
      mm_->cuda()->memset(buf->data(), 0xff, bytes);
#endif
    }
  }
  return buf;
}

BufferPtr Runtime::wrap_external(Device device, DType dtype, size_t bytes, void* ptr) {
  return std::make_shared<Buffer>(mm_, device, dtype, bytes, ptr);
}

Fence Runtime::fence(Device device) {
  Fence f;
  f.device = device;
  if (device == Device::kCpu) {
    f.cpu_seq = executor_.last_submitted();
  } else {
#ifdef FA_WITH_CUDA
    f.event = cuda().record_fence();
#endif
  }
  return f;
}

std::string Runtime::wait(const Fence& f) {
  if (f.device == Device::kCpu) {
    executor_.wait(f.cpu_seq);
    return {};
  }
#ifdef FA_WITH_CUDA
  return mm_->cuda()->wait(f.event);
#else
  return "this build has no CUDA support";
#endif
}

}  // namespace fa
