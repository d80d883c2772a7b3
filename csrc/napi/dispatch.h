// What every operation's binding shares between validation and the backend call: tensor arguments
// (a buffer and an element offset into it, re-checked against the buffer's own size), and queuing a
// launcher on the device's stream (the CPU executor, or the CUDA stream with its launch checked).
#pragma once
#include <napi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "napi/addon.h"

namespace fa::cpu {
class ThreadPool;
}

namespace fa::napi {

// A tensor argument as the binding receives it from lib/: the JS array [NativeBuffer, offset], or a
// bare NativeBuffer (offset 0). `offset` is in elements of the buffer's dtype.
struct TensorArg {
  BufferPtr buf;
  int64_t offset = 0;
  // The first element of the view.
  void* data() const { return static_cast<char*>(buf->data()) + offset * static_cast<int64_t>(dtype_size(buf->dtype())); }
  Device device() const { return buf->device(); }
  DType dtype() const { return buf->dtype(); }
};

// Parses a tensor argument named `arg` (a TypeError for anything else; a RangeError for an offset
// outside the buffer).
TensorArg tensor_arg(const Napi::Value& v, const char* arg);

// Checks that `t` lives on `device` with dtype `dtype` and that elements [offset, offset + extent)
// lie inside its buffer: `extent` is the contiguous element count, or for a strided view 1 + the
// largest reachable element index (sum of (size - 1) * stride). Throws a TypeError / RangeError that
// names `arg`.
void expect_tensor(const TensorArg& t, const char* arg, Device device, DType dtype, int64_t extent);
// The same without the dtype check (for ops that take any floating dtype; see expect_float).
void expect_extent(const TensorArg& t, const char* arg, Device device, int64_t extent);
// Throws a TypeError unless `dtype` is float32, float16 or bfloat16.
void expect_float(DType dtype, const char* arg);

// Element count of a tensor with these dims, refusing anything whose byte size would not fit in 62 bits.
int64_t checked_numel(std::initializer_list<int64_t> dims, const char* what);

// Runs `fn` on the CPU executor; if an input failed upstream or `fn` throws, the outputs carry the
// error and reads of them reject with it. Ops that update a tensor in place list it in both.
void submit_cpu(Runtime& rt, std::vector<BufferPtr> inputs, std::vector<BufferPtr> outputs, std::function<void()> fn);

// submit_cpu for a backend function that fans out over the runtime's thread pool.
void submit_cpu_pooled(Runtime& rt, std::vector<BufferPtr> inputs, std::vector<BufferPtr> outputs,
                       std::function<void(cpu::ThreadPool&)> fn);

#ifdef FA_WITH_CUDA
// A stream-ordered CUDA workspace of at least `bytes` (null for 0): freed when the last holder lets
// go, after the work queued before that point.
BufferPtr cuda_workspace(Runtime& rt, size_t bytes);
// Turns a launcher's status into a JS error: out of memory names `what` and its workspace's size.
void check_launch(Runtime& rt, cudaError_t err, const char* what, size_t workspace_bytes);
#endif

}  // namespace fa::napi
