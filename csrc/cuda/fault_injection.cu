// Deliberate CUDA faults behind fault_injection.h.
#include "cuda/fault_injection.h"

#include <cuda_runtime.h>

#include <cstdint>

namespace fa::cuda {
namespace {

// The lowest page is never mapped: a store there is an illegal address on every GPU.
constexpr uintptr_t kUnmappedAddress = 0x10;

__global__ void illegal_store_kernel(int value) { *reinterpret_cast<volatile int*>(kUnmappedAddress) = value; }

}  // namespace

cudaError_t inject_illegal_address(cudaStream_t stream) {
  illegal_store_kernel<<<1, 1, 0, stream>>>(1);
  return cudaGetLastError();
}

}  // namespace fa::cuda
