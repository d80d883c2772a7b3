// CUDA backend of the strided copy-and-cast engine (csrc/common/copy_params.h). Enqueued on `stream`;
// returns the launch error. The params must meet copy_params.h's invariants (the binding checked them).
#pragma once
#include <cuda_runtime_api.h>

#include "common/copy_params.h"

namespace fa::cuda {

// dst view = convert(src view). Same dtype and both sides dense: one cudaMemcpyAsync; dense with a
// cast: a vectorised kernel (4 elements per thread, only where both pointers are aligned for the
// vector width); anything else: the strided kernel. `p` need not be coalesced.
cudaError_t copy(const CopyParams& p, cudaStream_t stream);
// dst view = convert(p.value).
cudaError_t fill_strided(const CopyParams& p, cudaStream_t stream);

}  // namespace fa::cuda
