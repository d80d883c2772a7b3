// Queuing the copy-and-cast engine (csrc/common/copy_params.h) on a device's stream, for the bindings
// that stage strided data (tensor_ops.cc; attention_ops.cc makes contiguous copies of views that a
// kernel cannot read in place).
#pragma once
#include "common/copy_params.h"
#include "common/view_layout.h"
#include "runtime/runtime.h"

namespace fa::napi {

// Fills the params of dst view = src view (same sizes; pointers at each view's first element).
CopyParams make_copy_params(const Buffer& dst, const ViewLayout& dv, const Buffer& src, const ViewLayout& sv);

// Queues p on `device`'s stream: the CPU executor (src's error, if any, passes to dst) or the CUDA
// stream (launch checked). `src` and `dst` are kept alive by the queued work.
void enqueue_copy(Runtime& rt, Device device, const CopyParams& p, const BufferPtr& src, const BufferPtr& dst);

}  // namespace fa::napi
