// Device fill for tests: writes one value, converted to a storage dtype, into a buffer (e.g. NaN to
// poison outputs before a kernel runs, so unwritten elements are detectable).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/dtype.h"

namespace fa::cuda {

// Sets `count` elements of dtype `t` at `ptr` to `value` (rounded to nearest even for the 16-bit types;
// NaN stays NaN). Enqueued on `stream`; count == 0 enqueues nothing. Returns the launch error.
cudaError_t fill(void* ptr, DType t, size_t count, float value, cudaStream_t stream);

}  // namespace fa::cuda
