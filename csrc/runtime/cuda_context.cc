#include "runtime/cuda_context.h"

#include <cstdint>
#include <sstream>

#include "runtime/error.h"
#include "runtime/format.h"

namespace fa {

namespace {

// Errors after which the CUDA context cannot be used again (CUDA's "sticky" errors).
bool is_sticky(cudaError_t err) {
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
      return true;
    default:
      return false;
  }
}

}  // namespace

std::string cuda_version_string(int v) {
  return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

int cuda_device_count(std::string* why) {
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it; the CPU backend stays usable
    if (!why) return 0;
    int driver = 0, runtime = 0;
    cudaDriverGetVersion(&driver);  // 0 when no driver library could be loaded
    cudaRuntimeGetVersion(&runtime);
    if (err == cudaErrorInsufficientDriver && driver == 0) {
      *why = "no NVIDIA driver was found (libcuda.so.1 could not be loaded)";
    } else if (err == cudaErrorInsufficientDriver) {
      *why = "the NVIDIA driver supports CUDA " + cuda_version_string(driver) + " but this addon was built with CUDA " +
             cuda_version_string(runtime) + ": update the driver";
    } else if (err == cudaErrorNoDevice) {
      *why = "no CUDA device is visible (check CUDA_VISIBLE_DEVICES)";
    } else {
      *why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    }
    return 0;
  }
  if (n == 0 && why) *why = "no CUDA device is visible";
  return n;
}

std::string CudaContext::error_message(cudaError_t err, const char* what) const {
  return std::string("CUDA error in ") + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

void CudaContext::check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  std::string msg = error_message(err, what);
  if (is_sticky(err)) {
    std::lock_guard<std::mutex> lock(lost_mu_);
    if (lost_.empty()) lost_ = msg;
    throw Error(msg + "; the CUDA context is lost: restart the process to use the GPU again");
  }
  cudaGetLastError();  // clear a non-sticky error so it is not reported again by a later call
  throw Error(msg);
}

std::string CudaContext::lost_message() {
  std::lock_guard<std::mutex> lock(lost_mu_);
  if (lost_.empty()) return std::string();
  return "the CUDA context was lost by an earlier error (" + lost_ + "); restart the process to use the GPU again";
}

void CudaContext::ensure_usable() {
  const std::string lost = lost_message();
  if (!lost.empty()) throw Error(lost);
}

CudaContext::CudaContext() {
  check(cudaSetDevice(0), "cudaSetDevice(0)");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  info_.ordinal = 0;
  info_.name = prop.name;
  info_.cc_major = prop.major;
  info_.cc_minor = prop.minor;
  info_.multiprocessors = prop.multiProcessorCount;
  info_.total_memory = prop.totalGlobalMem;
  info_.shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  info_.l2_cache_bytes = prop.l2CacheSize;
  check(cudaDriverGetVersion(&info_.driver_version), "cudaDriverGetVersion");
  check(cudaRuntimeGetVersion(&info_.runtime_version), "cudaRuntimeGetVersion");
  int pools = 0;
  check(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, 0), "cudaDeviceGetAttribute");
  if (!pools) throw Error("CUDA device 0 (" + info_.name + ") does not support stream-ordered memory pools");
  // Non-blocking: no implicit synchronisation with the legacy default stream (other libraries).
  check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  check(cudaDeviceGetDefaultMemPool(&pool_, 0), "cudaDeviceGetDefaultMemPool");
  // Keep freed memory in the pool instead of returning it to the driver at every synchronisation:
  // a training step then reuses the same blocks without cudaMalloc/cudaFree.
  uint64_t threshold = UINT64_MAX;
  check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold), "cudaMemPoolSetAttribute");
}

CudaContext::~CudaContext() {
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  cudaGetLastError();
}

void* CudaContext::allocate(size_t bytes) {
  ensure_usable();
  void* ptr = nullptr;
  cudaError_t err = cudaMallocAsync(&ptr, bytes == 0 ? 1 : bytes, stream_);
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw Error("CUDA out of memory: tried to allocate " + format_bytes(bytes) + " (" + std::to_string(bytes) +
                " bytes) on " + info_.name + " with " + format_bytes(free_bytes) + " free of " +
                format_bytes(total_bytes) + " (" + format_bytes(pool_used_bytes()) + " in use by this process's pool)");
  }
  check(err, "cudaMallocAsync");
  return ptr;
}

void CudaContext::release(void* ptr) noexcept {
  if (!ptr) return;
  if (cudaFreeAsync(ptr, stream_) != cudaSuccess) cudaGetLastError();
}

void CudaContext::memset(void* ptr, int value, size_t bytes) {
  check(cudaMemsetAsync(ptr, value, bytes, stream_), "cudaMemsetAsync");
}

void CudaContext::upload(void* dst, const void* src, size_t bytes) {
  ensure_usable();
  // Pageable source: CUDA stages it before returning, so the caller may free `src` right away.
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync (host to device)");
}

cudaEvent_t CudaContext::record_fence() {
  ensure_usable();
  cudaEvent_t ev = nullptr;
  check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  cudaError_t err = cudaEventRecord(ev, stream_);
  if (err != cudaSuccess) {
    cudaEventDestroy(ev);
    check(err, "cudaEventRecord");
  }
  return ev;
}

std::string CudaContext::wait(cudaEvent_t fence) noexcept {
  cudaError_t err = cudaEventSynchronize(fence);
  cudaEventDestroy(fence);
  if (err == cudaSuccess) return {};
  std::string msg = error_message(err, "a queued operation");
  if (is_sticky(err)) {
    std::lock_guard<std::mutex> lock(lost_mu_);
    if (lost_.empty()) lost_ = msg;
    return msg + "; the CUDA context is lost: restart the process to use the GPU again";
  }
  return msg;
}

cudaEvent_t CudaContext::record_timing_event() {
  ensure_usable();
  cudaEvent_t ev = nullptr;
  check(cudaEventCreate(&ev), "cudaEventCreate");
  cudaError_t err = cudaEventRecord(ev, stream_);
  if (err != cudaSuccess) {
    cudaEventDestroy(ev);
    check(err, "cudaEventRecord");
  }
  return ev;
}

std::string CudaContext::elapsed_ms(cudaEvent_t start, cudaEvent_t stop, float* ms) noexcept {
  cudaError_t err = cudaEventSynchronize(stop);
  if (err == cudaSuccess) err = cudaEventElapsedTime(ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (err == cudaSuccess) return {};
  std::string msg = error_message(err, "a timed operation");
  if (is_sticky(err)) {
    std::lock_guard<std::mutex> lock(lost_mu_);
    if (lost_.empty()) lost_ = msg;
  }
  return msg;
}

std::string CudaContext::read_after(cudaEvent_t fence, void* host_dst, const void* src, size_t bytes) noexcept {
  cudaSetDevice(info_.ordinal);  // the current device is per thread
  cudaError_t err = cudaStreamWaitEvent(copy_stream_, fence, 0);
  if (err == cudaSuccess) err = cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, copy_stream_);
  if (err == cudaSuccess) err = cudaStreamSynchronize(copy_stream_);
  std::string queued = wait(fence);  // reports an error of the work that produced the data first
  if (!queued.empty()) return queued;
  if (err == cudaSuccess) return {};
  return error_message(err, "cudaMemcpyAsync (device to host)");
}

size_t CudaContext::pool_used_bytes() {
  uint64_t v = 0;
  if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &v) != cudaSuccess) cudaGetLastError();
  return static_cast<size_t>(v);
}

size_t CudaContext::pool_peak_bytes() {
  uint64_t v = 0;
  if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &v) != cudaSuccess) cudaGetLastError();
  return static_cast<size_t>(v);
}

std::string CudaContext::trim_pool() noexcept {
  cudaError_t err = cudaMemPoolTrimTo(pool_, 0);
  return err == cudaSuccess ? std::string() : error_message(err, "cudaMemPoolTrimTo");
}

void CudaContext::reset_pool_peak() {
  uint64_t zero = 0;
  check(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero), "cudaMemPoolSetAttribute");
}

void CudaContext::mem_info(size_t* free_bytes, size_t* total_bytes) {
  check(cudaMemGetInfo(free_bytes, total_bytes), "cudaMemGetInfo");
}

}  // namespace fa
