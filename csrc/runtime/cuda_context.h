// The CUDA device layer: one device (ordinal 0), a compute stream that all work is queued on, a copy
// stream for reads back to the host, and the device's stream-ordered memory pool (cudaMallocAsync).
// Every CUDA call is checked; failures become fa::Error with CUDA's own message. Compiled only when
// the build has CUDA (FA_WITH_CUDA); the rest of the addon talks to it through runtime.h.
#pragma once
#ifdef FA_WITH_CUDA
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <string>

namespace fa {

struct CudaDeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;
  size_t shared_memory_per_block_optin = 0;
  int l2_cache_bytes = 0;
  int driver_version = 0;  // e.g. 13000 for 13.0
  int runtime_version = 0;
};

// Number of CUDA devices, without creating a context. On failure returns 0 and sets *why
// (no driver, driver too old, no device...).
int cuda_device_count(std::string* why);
// "13.0" for 13000 (the encoding of cudaDriverGetVersion / cudaRuntimeGetVersion).
std::string cuda_version_string(int version);

class CudaContext {
 public:
  // Creates the streams on device 0 and configures its memory pool. Throws fa::Error.
  CudaContext();
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  const CudaDeviceInfo& info() const { return info_; }
  cudaStream_t stream() const { return stream_; }

  // Stream-ordered allocation from the pool. Throws fa::Error that says how much was asked for and
  // how much is free when the device is out of memory.
  void* allocate(size_t bytes);
  // Stream-ordered free; errors are ignored (it runs from destructors, possibly at exit).
  void release(void* ptr) noexcept;
  // Fills bytes with a pattern (0xff makes NaN in every dtype), stream-ordered.
  void memset(void* ptr, int value, size_t bytes);
  // Copies host -> device on the compute stream (host memory may be reused when this returns).
  void upload(void* dst, const void* src, size_t bytes);

  // Marks the current end of the compute stream: reads wait for this.
  cudaEvent_t record_fence();
  // On a worker thread: waits for `fence`, copies device -> host on the copy stream, destroys the
  // fence. Returns an empty string, or the CUDA error message.
  std::string read_after(cudaEvent_t fence, void* host_dst, const void* src, size_t bytes) noexcept;
  // On a worker thread: waits for everything queued so far (fence from record_fence()).
  std::string wait(cudaEvent_t fence) noexcept;

  // A timing event recorded now on the compute stream (for device-side timing of queued work).
  cudaEvent_t record_timing_event();
  // On a worker thread: waits for `stop`, sets *ms to the time between the two events on the GPU,
  // and destroys both. Returns an empty string, or the CUDA error message.
  std::string elapsed_ms(cudaEvent_t start, cudaEvent_t stop, float* ms) noexcept;

  // Throws fa::Error for a failed call, naming `what`. A sticky error (the context is lost) is
  // remembered and every later call fails fast with it.
  void check(cudaError_t err, const char* what);
  // Throws if an earlier sticky error lost the context.
  void ensure_usable();
  // The message ensure_usable() throws once the context is lost; empty while it is usable.
  std::string lost_message();
  // Pool statistics: bytes currently handed out, and the high-water mark since the last reset.
  size_t pool_used_bytes();
  size_t pool_peak_bytes();
  void reset_pool_peak();
  // On a worker thread, after a fence: returns the pool's cached, unused memory to the driver (so
  // another process, e.g. PyTorch beside a benchmark, can use it). Returns "" or CUDA's message.
  std::string trim_pool() noexcept;
  // Free and total device memory (cudaMemGetInfo).
  void mem_info(size_t* free_bytes, size_t* total_bytes);

 private:
  std::string error_message(cudaError_t err, const char* what) const;

  CudaDeviceInfo info_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t copy_stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  std::mutex lost_mu_;
  std::string lost_;  // non-empty once a sticky error lost the context
};

}  // namespace fa
#endif  // FA_WITH_CUDA
