// Tensor arguments and queuing on the device's stream (dispatch.h).
#include "napi/dispatch.h"

#include "cpu/thread_pool.h"
#include "runtime/format.h"

namespace fa::napi {

TensorArg tensor_arg(const Napi::Value& v, const char* arg) {
  TensorArg t;
  if (v.IsArray()) {
    auto a = v.As<Napi::Array>();
    if (a.Length() != 2) {
      throw type_error(std::string("Expected ") + arg + " to be a tensor ([buffer, offset]) but received " +
                       describe(v));
    }
    t.buf = NativeBuffer::From(a.Get(0u), arg);
    const int64_t numel = static_cast<int64_t>(t.buf->numel());
    t.offset = int_arg(a.Get(1u), (std::string(arg) + " offset").c_str(), 0, numel - 1);
    return t;
  }
  t.buf = NativeBuffer::From(v, arg);
  return t;
}

void expect_extent(const TensorArg& t, const char* arg, Device device, int64_t extent) {
  if (t.device() != device) {
    throw type_error(std::string("Expected ") + arg + " to be on device '" + device_name(device) + "' but received '" +
                     device_name(t.device()) + "'");
  }
  const int64_t numel = static_cast<int64_t>(t.buf->numel());
  if (extent < 1 || extent > numel - t.offset) {
    throw range_error(std::string("Expected ") + arg + " to reach " + std::to_string(extent) +
                      " elements from offset " + std::to_string(t.offset) + " inside its storage of " +
                      std::to_string(numel) + " elements but it does not");
  }
}

void expect_tensor(const TensorArg& t, const char* arg, Device device, DType dtype, int64_t extent) {
  if (t.dtype() != dtype) {
    throw type_error(std::string("Expected ") + arg + " to have dtype " + dtype_name(dtype) + " but received " +
                     dtype_name(t.dtype()));
  }
  expect_extent(t, arg, device, extent);
}

void expect_float(DType dtype, const char* arg) {
  if (!dtype_is_float(dtype)) {
    throw type_error(std::string("Expected ") + arg + " to have dtype float32, float16 or bfloat16 but received " +
                     dtype_name(dtype));
  }
}

int64_t checked_numel(std::initializer_list<int64_t> dims, const char* what) {
  constexpr int64_t kLimit = int64_t{1} << 60;
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d != 0 && n > kLimit / d) {
      std::string shape;
      for (int64_t x : dims) shape += (shape.empty() ? "" : ", ") + std::to_string(x);
      throw range_error(std::string("Expected ") + what + " to have fewer than 2^60 elements but received [" + shape +
                        "]");
    }
    n *= d;
  }
  return n;
}

void submit_cpu(Runtime& rt, std::vector<BufferPtr> inputs, std::vector<BufferPtr> outputs, std::function<void()> fn) {
  rt.executor().submit([inputs = std::move(inputs), outputs = std::move(outputs), fn = std::move(fn)] {
    std::string err;
    for (const auto& in : inputs) {
      err = in->error();
      if (!err.empty()) break;
    }
    if (err.empty()) {
      try {
        fn();
      } catch (const std::bad_alloc&) {
        err = "out of host memory for a CPU workspace";
      } catch (const std::exception& e) {
        err = e.what();
      }
    }
    if (!err.empty()) {
      for (const auto& out : outputs) out->set_error(err);
    }
  });
}

void submit_cpu_pooled(Runtime& rt, std::vector<BufferPtr> inputs, std::vector<BufferPtr> outputs,
                       std::function<void(cpu::ThreadPool&)> fn) {
  cpu::ThreadPool* pool = &rt.pool();
  submit_cpu(rt, std::move(inputs), std::move(outputs), [fn = std::move(fn), pool] { fn(*pool); });
}

#ifdef FA_WITH_CUDA
BufferPtr cuda_workspace(Runtime& rt, size_t bytes) {
  if (bytes == 0) return nullptr;
  return rt.allocate(Device::kCuda, DType::kFloat32, (bytes + sizeof(float) - 1) / sizeof(float) * sizeof(float),
                     false);
}

void check_launch(Runtime& rt, cudaError_t err, const char* what, size_t workspace_bytes) {
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw Error(std::string("CUDA out of memory in ") + what + ": its workspace needs " + format_bytes(workspace_bytes) +
                " (" + std::to_string(workspace_bytes) + " bytes) and the device has " + format_bytes(free_bytes) +
                " free of " + format_bytes(total_bytes));
  }
  rt.cuda().check(err, what);
}
#endif

}  // namespace fa::napi
