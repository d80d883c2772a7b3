// Host-side checks the FA2 launchers share before they accept a call: 16-byte alignment of the
// tensors (the cp.async / TMA granule), strides in whole granules, and attributes of the current
// device. Plain C++ (CUDA runtime API only).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>

namespace fa::cuda::flash {

inline constexpr uintptr_t kCopyAlignBytes = 16;

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kCopyAlignBytes == 0; }

// True when every stride is a multiple of `elems`.
inline bool strides_multiple_of(std::initializer_list<int64_t> strides, int64_t elems) {
  for (int64_t s : strides)
    if (s % elems != 0) return false;
  return true;
}

// An attribute of the current device, or 0 when it cannot be queried.
inline int device_attribute(cudaDeviceAttr attr) {
  int dev = 0, value = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (cudaDeviceGetAttribute(&value, attr, dev) != cudaSuccess) return 0;
  return value;
}

inline int device_major() { return device_attribute(cudaDevAttrComputeCapabilityMajor); }

}  // namespace fa::cuda::flash
