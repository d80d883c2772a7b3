// The properties of a CUDA device that the planners and launch checks read (GEMM, FlashAttention-2
// forward and backward, float32 and 16-bit), queried once per device and kept for the process: a
// device's attributes do not change while it runs, and every call used to query them again. Host
// only (CUDA runtime API).
#pragma once
#include <cuda_runtime_api.h>

#include <mutex>

namespace fa::cuda {

struct DeviceProps {
  bool valid = false;   // false: no device could be queried (no driver, no GPU); every field 0
  int major = 0, minor = 0;
  int sms = 0;          // multiprocessors
  int smem_optin = 0;   // bytes of shared memory one block may opt in to
};

// The current device's (cudaGetDevice's) properties. A device that cannot be queried gives an
// invalid DeviceProps and is asked again on the next call.
inline DeviceProps current_device_props() {
  constexpr int kMaxDevices = 64;
  static DeviceProps cache[kMaxDevices];
  static std::mutex mutex;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return {};
  std::lock_guard<std::mutex> lock(mutex);
  if (dev < kMaxDevices && cache[dev].valid) return cache[dev];
  DeviceProps p;
  if (cudaDeviceGetAttribute(&p.major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&p.minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&p.sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&p.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return {};
  p.valid = true;
  if (dev < kMaxDevices) cache[dev] = p;
  return p;
}

}  // namespace fa::cuda
