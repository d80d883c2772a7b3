// The per-addon-instance runtime: device memory with accounting, the CPU executor and thread pool,
// and the CUDA context. Each Node environment (main thread or worker) that loads the addon gets its
// own Runtime; there is no process-wide mutable state.
//
// Ownership: a Buffer owns one allocation. JS tensors hold a Buffer through a shared_ptr, and so does
// every queued operation that reads or writes it, so disposing a tensor while work on it is queued is
// safe: the memory goes back when the last user is done (on CUDA, stream-ordered, right away).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "runtime/cpu_executor.h"
#include "runtime/cuda_context.h"

namespace fa {

namespace cpu {
class ThreadPool;
}

enum class Device : int32_t { kCpu = codes::kDeviceCpu, kCuda = codes::kDeviceCuda };  // csrc/enums.json
inline constexpr int kNumDevices = 2;
inline const char* device_name(Device d) {
  return d == Device::kCpu ? "cpu" : "cuda";
}

struct MemoryCounters {
  std::atomic<int64_t> buffers{0};
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> peak_bytes{0};
};

// Allocation and accounting, shared by the runtime and every buffer (it outlives both).
class MemoryManager {
 public:
  // Throws fa::Error on failure (out of memory says what was asked for and what is free).
  void* allocate(Device device, size_t bytes);
  void release(Device device, void* ptr, size_t bytes) noexcept;
  MemoryCounters& counters(Device device) { return counters_[static_cast<int>(device)]; }
  // When set, every buffer allocated for an operation's output is filled with 0xff bytes (NaN in
  // float32, float16 and bfloat16) first, so tests can tell that a kernel wrote every element.
  std::atomic<bool> poison{false};
#ifdef FA_WITH_CUDA
  // Set once, when the runtime first initialises CUDA; buffers keep the context alive.
  void attach_cuda(std::shared_ptr<CudaContext> ctx);
  CudaContext* cuda() const {
    return cuda_.get();
  }
#endif

 private:
  MemoryCounters counters_[kNumDevices];
#ifdef FA_WITH_CUDA
  std::shared_ptr<CudaContext> cuda_;
#endif
};

class Buffer {
 public:
  Buffer(std::shared_ptr<MemoryManager> mm, Device device, DType dtype, size_t bytes);
  // Memory that another library owns (Tensor.fromDevicePointer): not allocated, counted or freed here.
  Buffer(std::shared_ptr<MemoryManager> mm, Device device, DType dtype, size_t bytes, void* external);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  size_t numel() const { return bytes_ / dtype_size(dtype_); }
  Device device() const { return device_; }
  DType dtype() const { return dtype_; }
  bool external() const { return external_; }

  // CPU backend: a queued task that failed to produce this buffer records why; reads report it.
  void set_error(const std::string& msg);
  std::string error() const;

 private:
  std::shared_ptr<MemoryManager> mm_;
  Device device_;
  DType dtype_;
  size_t bytes_;
  void* ptr_ = nullptr;
  bool external_ = false;
  mutable std::mutex error_mu_;
  std::string error_;
};
using BufferPtr = std::shared_ptr<Buffer>;

// Where a read must wait: everything queued on the buffer's device before the read was asked for.
struct Fence {
  Device device = Device::kCpu;
  uint64_t cpu_seq = 0;
#ifdef FA_WITH_CUDA
  cudaEvent_t event = nullptr;
#endif
};

class Runtime {
 public:
  Runtime();
  ~Runtime();  // drains the CPU executor; buffers still alive keep the memory manager alive

  // Allocates a buffer for an operation's output (poisoned when MemoryManager::poison is set).
  BufferPtr allocate(Device device, DType dtype, size_t bytes, bool is_output);
  // A buffer over `bytes` at `ptr` that another library owns (never freed or counted here).
  BufferPtr wrap_external(Device device, DType dtype, size_t bytes, void* ptr);
  MemoryManager& memory() { return *mm_; }
  CpuExecutor& executor() { return executor_; }
  cpu::ThreadPool& pool() { return *pool_; }

  // Whether CUDA is compiled in, has a device, and initialised; *why says why not. Initialises the
  // context on first use (creating it costs ~100 ms and some device memory, so only when needed).
  bool cuda_available(std::string* why);
  static bool cuda_compiled();
#ifdef FA_WITH_CUDA
  CudaContext& cuda();  // throws fa::Error when unavailable
#endif

  // Records the point reads on `device` wait for (on the JS thread, at the time of the call).
  Fence fence(Device device);
  // Waits for a fence (on a worker thread). Returns an error message or "".
  std::string wait(const Fence& f);

 private:
  std::shared_ptr<MemoryManager> mm_;
  std::unique_ptr<cpu::ThreadPool> pool_;
  CpuExecutor executor_;
  std::mutex cuda_mu_;
  bool cuda_tried_ = false;
  std::string cuda_why_;
};

}  // namespace fa
