// Host-side checks the FA2 launchers share before they accept a call: 16-byte alignment of the
// tensors (the cp.async / TMA granule) and strides in whole granules (the device's attributes:
// cuda/device_props.h). Plain C++ (CUDA runtime API only).
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

}  // namespace fa::cuda::flash
