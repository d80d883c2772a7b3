// Deliberate CUDA faults, for the tests of the sticky-error path (debug.injectCudaFault in
// lib/tensor.ts). Plain C++ header.
#pragma once
#include <cuda_runtime_api.h>

namespace fa::cuda {

// Enqueues on `stream` one thread that stores to an address no allocation can hold, so that the
// stream's next synchronisation reports cudaErrorIllegalAddress and the context is lost for good (a
// sticky error: every later CUDA call of the process fails with it). Returns the launch error.
cudaError_t inject_illegal_address(cudaStream_t stream);

}  // namespace fa::cuda
