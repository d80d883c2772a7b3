// Bindings of the nn ops (lib/ops/norm.ts, rope.ts, activation.ts, elementwise.ts): re-validate
// what lib/ validated (every size against the storage it reaches), fill the params struct of
// csrc/common/op_params.h, and queue the backend on the device's stream.
//
// Tensor arguments are [NativeBuffer, offset] pairs (dispatch.h); sizes come as separate integers
// and are checked against each buffer's extent. The first tensor argument decides the device and
// the activation dtype; every other activation must match it.
#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "common/op_params.h"
#include "cpu/ops/ops_cpu.h"
#include "napi/addon.h"
#include "napi/dispatch.h"
#ifdef FA_WITH_CUDA
#include "cuda/ops/ops_cuda.h"
#endif

namespace fa::napi {

namespace {

constexpr int64_t kMaxSafeInteger = 9007199254740991;  // 2^53 - 1: the largest size JS can pass exactly
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxPosition = std::numeric_limits<int32_t>::max();
constexpr int64_t kExtentLimit = int64_t{1} << 60;

// An optional tensor argument: null or undefined gives an empty TensorArg (buf == nullptr).
TensorArg optional_tensor_arg(const Napi::Value& v, const char* arg) {
  if (v.IsNull() || v.IsUndefined()) return TensorArg{};
  return tensor_arg(v, arg);
}

int64_t size_arg(const Napi::Value& v, const char* arg) {
  return int_arg(v, arg, 1, kMaxSafeInteger);
}

// A float32 scalar: finite as a double and after rounding to float32; `min_exclusive`/`min` bound it.
float float_arg(const Napi::Value& v, const char* arg, const char* what, double min, bool min_exclusive) {
  const double d = number_arg(v, arg);
  const float f = static_cast<float>(d);
  const bool below = min_exclusive ? !(d > min && static_cast<double>(f) > min) : !(d >= min);
  if (!std::isfinite(d) || !std::isfinite(f) || below) {
    throw range_error(std::string("Expected ") + arg + " to be " + what + " but received " + v.ToString().Utf8Value());
  }
  return f;
}

float alpha_arg(const Napi::Value& v) {
  const double d = number_arg(v, "alpha");
  const float f = static_cast<float>(d);
  if (!std::isfinite(d) || !std::isfinite(f)) {
    throw range_error("Expected alpha to be a finite float32 number but received " + v.ToString().Utf8Value());
  }
  return f;
}

// Whether [a.offset, a.offset + na) and [b.offset, b.offset + nb) share elements of one buffer.
bool overlaps(const TensorArg& a, int64_t na, const TensorArg& b, int64_t nb) {
  if (a.buf.get() != b.buf.get()) return false;
  return a.offset < b.offset + nb && b.offset < a.offset + na;
}

// ---- norms -------------------------------------------------------------------------------------------

[[maybe_unused]] const char* norm_name(bool layer_norm, bool backward) {
  if (layer_norm) return backward ? "LayerNorm backward" : "LayerNorm forward";
  return backward ? "RMSNorm backward" : "RMSNorm forward";
}

// normForward(x, weight, bias | null, rows, cols, eps, layerNorm): [out, mean | null, rstd]
Napi::Value NormForward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg x = tensor_arg(info[0], "x");
  const TensorArg weight = tensor_arg(info[1], "weight");
  const TensorArg bias = optional_tensor_arg(info[2], "bias");
  const int64_t rows = size_arg(info[3], "rows");
  const int64_t cols = size_arg(info[4], "cols");
  const float eps = float_arg(info[5], "eps", "a finite number >= 0", 0.0, false);
  const bool layer_norm = bool_arg(info[6], "layerNorm");
  const Device device = x.device();
  const DType dtype = x.dtype();
  expect_float(dtype, "x");
  const int64_t numel = checked_numel({rows, cols}, "x");
  expect_extent(x, "x", device, numel);
  expect_tensor(weight, "weight", device, dtype, cols);
  if (bias.buf != nullptr) {
    if (!layer_norm) throw type_error("Expected bias to be null for RMSNorm (layerNorm false) but received a tensor");
    expect_tensor(bias, "bias", device, dtype, cols);
  }

  BufferPtr out = rt.allocate(device, dtype, numel * dtype_size(dtype), true);
  BufferPtr mean = layer_norm ? rt.allocate(device, DType::kFloat32, rows * sizeof(float), true) : nullptr;
  BufferPtr rstd = rt.allocate(device, DType::kFloat32, rows * sizeof(float), true);
  NormParams p;
  p.rows = rows;
  p.cols = cols;
  p.dtype = dtype;
  p.eps = eps;
  p.layer_norm = layer_norm;
  p.x = x.data();
  p.weight = weight.data();
  p.bias = bias.buf != nullptr ? bias.data() : nullptr;
  p.out = out->data();
  p.mean = mean ? static_cast<float*>(mean->data()) : nullptr;
  p.rstd = static_cast<float*>(rstd->data());
  if (device == Device::kCpu) {
    std::vector<BufferPtr> inputs{x.buf, weight.buf};
    if (bias.buf) inputs.push_back(bias.buf);
    std::vector<BufferPtr> outputs{out, rstd};
    if (mean) outputs.push_back(mean);
    submit_cpu_pooled(rt, std::move(inputs), std::move(outputs),
        [p](cpu::ThreadPool& pool) { cpu::norm_fwd(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    check_launch(rt, cuda::norm_fwd(p, rt.cuda().stream()), norm_name(layer_norm, false), 0);
#endif
  }
  Napi::Array result = Napi::Array::New(env, 3);
  result.Set(0u, NativeBuffer::Wrap(env, out));
  result.Set(1u, mean ? Napi::Value(NativeBuffer::Wrap(env, mean)) : env.Null());
  result.Set(2u, NativeBuffer::Wrap(env, rstd));
  return result;
}

// normBackward(dout, x, weight, mean | null, rstd, dweight | null, dbias | null, rows, cols, layerNorm): dx
// dweight and dbias (float32 [cols]) are accumulated into in place.
Napi::Value NormBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg dout = tensor_arg(info[0], "dout");
  const TensorArg x = tensor_arg(info[1], "x");
  const TensorArg weight = tensor_arg(info[2], "weight");
  const TensorArg mean = optional_tensor_arg(info[3], "mean");
  const TensorArg rstd = tensor_arg(info[4], "rstd");
  const TensorArg dweight = optional_tensor_arg(info[5], "dweight");
  const TensorArg dbias = optional_tensor_arg(info[6], "dbias");
  const int64_t rows = size_arg(info[7], "rows");
  const int64_t cols = size_arg(info[8], "cols");
  const bool layer_norm = bool_arg(info[9], "layerNorm");
  const Device device = x.device();
  const DType dtype = x.dtype();
  expect_float(dtype, "x");
  const int64_t numel = checked_numel({rows, cols}, "x");
  expect_extent(x, "x", device, numel);
  expect_tensor(dout, "dout", device, dtype, numel);
  expect_tensor(weight, "weight", device, dtype, cols);
  if (layer_norm) {
    if (mean.buf == nullptr) throw type_error("Expected mean to be a tensor for LayerNorm (layerNorm true) but received null");
    expect_tensor(mean, "mean", device, DType::kFloat32, rows);
  } else if (mean.buf != nullptr) {
    throw type_error("Expected mean to be null for RMSNorm (layerNorm false) but received a tensor");
  }
  expect_tensor(rstd, "rstd", device, DType::kFloat32, rows);
  if (dweight.buf != nullptr) expect_tensor(dweight, "dweight", device, DType::kFloat32, cols);
  if (dbias.buf != nullptr) {
    if (!layer_norm) throw type_error("Expected dbias to be null for RMSNorm (layerNorm false) but received a tensor");
    expect_tensor(dbias, "dbias", device, DType::kFloat32, cols);
    if (dweight.buf != nullptr && overlaps(dweight, cols, dbias, cols)) {
      throw range_error("Expected dbias not to overlap dweight (both are accumulated into) but it does");
    }
  }

  BufferPtr dx = rt.allocate(device, dtype, numel * dtype_size(dtype), true);
  NormParams p;
  p.rows = rows;
  p.cols = cols;
  p.dtype = dtype;
  p.layer_norm = layer_norm;
  p.x = x.data();
  p.weight = weight.data();
  p.dout = dout.data();
  p.mean_in = mean.buf != nullptr ? static_cast<const float*>(mean.data()) : nullptr;
  p.rstd_in = static_cast<const float*>(rstd.data());
  p.dx = dx->data();
  p.dweight = dweight.buf != nullptr ? static_cast<float*>(dweight.data()) : nullptr;
  p.dbias = dbias.buf != nullptr ? static_cast<float*>(dbias.data()) : nullptr;
  if (device == Device::kCpu) {
    std::vector<BufferPtr> inputs{dout.buf, x.buf, weight.buf, rstd.buf};
    std::vector<BufferPtr> outputs{dx};
    if (mean.buf) inputs.push_back(mean.buf);
    for (const TensorArg* g : {&dweight, &dbias}) {
      if (g->buf == nullptr) continue;
      inputs.push_back(g->buf);  // accumulated into: read and written
      outputs.push_back(g->buf);
    }
    submit_cpu_pooled(rt, std::move(inputs), std::move(outputs),
        [p](cpu::ThreadPool& pool) { cpu::norm_bwd(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    // The parameter-gradient partial sums; freed stream-ordered after the kernels that use them.
    const size_t ws_bytes = cuda::norm_bwd_workspace_bytes(p);
    BufferPtr workspace = cuda_workspace(rt, ws_bytes);
    p.workspace = workspace ? workspace->data() : nullptr;
    check_launch(rt, cuda::norm_bwd(p, rt.cuda().stream()), norm_name(layer_norm, true), ws_bytes);
#endif
  }
  return NativeBuffer::Wrap(env, dx);
}

// ---- RoPE ----------------------------------------------------------------------------------------------

// rope(x, dims [batch, seqlen, heads, headDim], strides [batchStride, rowStride, headStride], base,
// positionOffset, inverse): undefined. x is rotated in place.
Napi::Value Rope(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg x = tensor_arg(info[0], "x");
  const Napi::Value dims_v = info[1];
  if (!dims_v.IsArray() || dims_v.As<Napi::Array>().Length() != 4) {
    throw type_error("Expected dims to be an Array of 4 [batch, seqlen, heads, headDim] but received " +
                     describe(dims_v));
  }
  const Napi::Value strides_v = info[2];
  if (!strides_v.IsArray() || strides_v.As<Napi::Array>().Length() != 3) {
    throw type_error("Expected strides to be an Array of 3 [batchStride, rowStride, headStride] but received " +
                     describe(strides_v));
  }
  auto dims = dims_v.As<Napi::Array>();
  auto strides = strides_v.As<Napi::Array>();
  RopeParams p;
  p.batch = int_arg(dims.Get(0u), "batch", 1, kMaxDim);
  p.seqlen = int_arg(dims.Get(1u), "seqlen", 1, kMaxDim);
  p.heads = int_arg(dims.Get(2u), "heads", 1, kMaxDim);
  p.head_dim = int_arg(dims.Get(3u), "headDim", 2, kMaxDim);
  if (p.head_dim % 2 != 0) {
    throw range_error("Expected headDim to be even but received " + std::to_string(p.head_dim));
  }
  p.batch_stride = int_arg(strides.Get(0u), "batchStride", 0, kMaxSafeInteger);
  p.row_stride = int_arg(strides.Get(1u), "rowStride", 0, kMaxSafeInteger);
  p.head_stride = int_arg(strides.Get(2u), "headStride", 0, kMaxSafeInteger);
  p.base = float_arg(info[3], "base", "a finite number > 1", 1.0, true);
  p.position_offset = int_arg(info[4], "positionOffset", 0, kMaxPosition);
  p.inverse = bool_arg(info[5], "inverse");
  const Device device = x.device();
  p.dtype = x.dtype();
  expect_float(p.dtype, "x");

  // The view's extent (1 + the largest element index it reaches), and no two of its [headDim]
  // vectors may share an element (the op rotates each once, in place): sorted by stride, each dim
  // of size > 1 must step over everything the dims inside it reach.
  struct Dim {
    int64_t size, stride;
    const char* name;
  };
  Dim ds[3] = {{p.batch, p.batch_stride, "batchStride"}, {p.seqlen, p.row_stride, "rowStride"},
               {p.heads, p.head_stride, "headStride"}};
  std::stable_sort(std::begin(ds), std::end(ds), [](const Dim& a, const Dim& b) { return a.stride < b.stride; });
  int64_t extent = p.head_dim;
  for (const Dim& d : ds) {
    if (d.size == 1) continue;
    if (d.stride < extent) {
      throw range_error(std::string("Expected x to be a view whose [headDim] vectors do not overlap (") + d.name + " >= " +
                        std::to_string(extent) + ") but received " + d.name + " " + std::to_string(d.stride));
    }
    if (d.stride > (kExtentLimit - extent) / (d.size - 1)) {
      throw range_error("Expected x's view to reach fewer than 2^60 elements but it reaches more");
    }
    extent += (d.size - 1) * d.stride;
  }
  expect_extent(x, "x", device, extent);
  p.x = x.data();

  if (device == Device::kCpu) {
    submit_cpu_pooled(rt, {x.buf}, {x.buf}, [p](cpu::ThreadPool& pool) { cpu::rope(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    check_launch(rt, cuda::rope(p, rt.cuda().stream()), "RoPE", 0);
#endif
  }
  return env.Undefined();
}

// ---- activations ---------------------------------------------------------------------------------

// gelu(x, numel): out
Napi::Value GeluForward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg x = tensor_arg(info[0], "x");
  const int64_t numel = size_arg(info[1], "numel");
  const Device device = x.device();
  const DType dtype = x.dtype();
  expect_float(dtype, "x");
  expect_extent(x, "x", device, numel);
  BufferPtr out = rt.allocate(device, dtype, numel * dtype_size(dtype), true);
  GeluParams p;
  p.numel = numel;
  p.dtype = dtype;
  p.x = x.data();
  p.out = out->data();
  if (device == Device::kCpu) {
    submit_cpu_pooled(rt, {x.buf}, {out}, [p](cpu::ThreadPool& pool) { cpu::gelu_fwd(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    check_launch(rt, cuda::gelu_fwd(p, rt.cuda().stream()), "GELU forward", 0);
#endif
  }
  return NativeBuffer::Wrap(env, out);
}

// geluBackward(dout, x, numel): dx
Napi::Value GeluBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg dout = tensor_arg(info[0], "dout");
  const TensorArg x = tensor_arg(info[1], "x");
  const int64_t numel = size_arg(info[2], "numel");
  const Device device = x.device();
  const DType dtype = x.dtype();
  expect_float(dtype, "x");
  expect_extent(x, "x", device, numel);
  expect_tensor(dout, "dout", device, dtype, numel);
  BufferPtr dx = rt.allocate(device, dtype, numel * dtype_size(dtype), true);
  GeluParams p;
  p.numel = numel;
  p.dtype = dtype;
  p.x = x.data();
  p.dout = dout.data();
  p.out = dx->data();
  if (device == Device::kCpu) {
    submit_cpu_pooled(rt, {dout.buf, x.buf}, {dx}, [p](cpu::ThreadPool& pool) { cpu::gelu_bwd(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    check_launch(rt, cuda::gelu_bwd(p, rt.cuda().stream()), "GELU backward", 0);
#endif
  }
  return NativeBuffer::Wrap(env, dx);
}

// swiglu(x, rows, cols): out [rows, cols] from x [rows, 2 * cols]
Napi::Value SwigluForward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg x = tensor_arg(info[0], "x");
  const int64_t rows = size_arg(info[1], "rows");
  const int64_t cols = size_arg(info[2], "cols");
  const Device device = x.device();
  const DType dtype = x.dtype();
  expect_float(dtype, "x");
  const int64_t x_numel = checked_numel({rows, cols, 2}, "x");
  const int64_t out_numel = rows * cols;
  expect_extent(x, "x", device, x_numel);
  BufferPtr out = rt.allocate(device, dtype, out_numel * dtype_size(dtype), true);
  SwigluParams p;
  p.rows = rows;
  p.cols = cols;
  p.dtype = dtype;
  p.x = x.data();
  p.out = out->data();
  if (device == Device::kCpu) {
    submit_cpu_pooled(rt, {x.buf}, {out}, [p](cpu::ThreadPool& pool) { cpu::swiglu_fwd(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    check_launch(rt, cuda::swiglu_fwd(p, rt.cuda().stream()), "SwiGLU forward", 0);
#endif
  }
  return NativeBuffer::Wrap(env, out);
}

// swigluBackward(dout, x, rows, cols): dx [rows, 2 * cols]
Napi::Value SwigluBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg dout = tensor_arg(info[0], "dout");
  const TensorArg x = tensor_arg(info[1], "x");
  const int64_t rows = size_arg(info[2], "rows");
  const int64_t cols = size_arg(info[3], "cols");
  const Device device = x.device();
  const DType dtype = x.dtype();
  expect_float(dtype, "x");
  const int64_t x_numel = checked_numel({rows, cols, 2}, "x");
  expect_extent(x, "x", device, x_numel);
  expect_tensor(dout, "dout", device, dtype, rows * cols);
  BufferPtr dx = rt.allocate(device, dtype, x_numel * dtype_size(dtype), true);
  SwigluParams p;
  p.rows = rows;
  p.cols = cols;
  p.dtype = dtype;
  p.x = x.data();
  p.dout = dout.data();
  p.out = dx->data();
  if (device == Device::kCpu) {
    submit_cpu_pooled(rt, {dout.buf, x.buf}, {dx}, [p](cpu::ThreadPool& pool) { cpu::swiglu_bwd(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    check_launch(rt, cuda::swiglu_bwd(p, rt.cuda().stream()), "SwiGLU backward", 0);
#endif
  }
  return NativeBuffer::Wrap(env, dx);
}

// ---- residual add ----------------------------------------------------------------------------------

// add(a, b, numel, alpha, inPlace): out = a + alpha * b (a new buffer), or undefined when inPlace
// (a += alpha * b).
Napi::Value Add(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg a = tensor_arg(info[0], "a");
  const TensorArg b = tensor_arg(info[1], "b");
  const int64_t numel = size_arg(info[2], "numel");
  const float alpha = alpha_arg(info[3]);
  const bool in_place = bool_arg(info[4], "inPlace");
  const Device device = a.device();
  const DType dtype = a.dtype();
  expect_float(dtype, "a");
  expect_extent(a, "a", device, numel);
  expect_tensor(b, "b", device, dtype, numel);
  // In place, b is read while a is written: the same view is fine (a += alpha * a), a shifted one
  // would read elements already updated.
  if (in_place && a.offset != b.offset && overlaps(a, numel, b, numel)) {
    throw range_error("Expected b not to overlap a (an in-place add writes a while it reads b) but it does");
  }
  BufferPtr out = in_place ? a.buf : rt.allocate(device, dtype, numel * dtype_size(dtype), true);
  AddParams p;
  p.numel = numel;
  p.dtype = dtype;
  p.alpha = alpha;
  p.a = a.data();
  p.b = b.data();
  p.out = in_place ? a.data() : out->data();
  if (device == Device::kCpu) {
    submit_cpu_pooled(rt, {a.buf, b.buf}, {out}, [p](cpu::ThreadPool& pool) { cpu::add(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    check_launch(rt, cuda::add(p, rt.cuda().stream()), "add", 0);
#endif
  }
  if (in_place) return env.Undefined();
  return NativeBuffer::Wrap(env, out);
}

}  // namespace

void InitNnOps(Napi::Env env, Napi::Object exports) {
  exports.Set("normForward", Napi::Function::New<guarded<NormForward, 7>>(env, "normForward"));
  exports.Set("normBackward", Napi::Function::New<guarded<NormBackward, 10>>(env, "normBackward"));
  exports.Set("rope", Napi::Function::New<guarded<Rope, 6>>(env, "rope"));
  exports.Set("geluForward", Napi::Function::New<guarded<GeluForward, 2>>(env, "geluForward"));
  exports.Set("geluBackward", Napi::Function::New<guarded<GeluBackward, 3>>(env, "geluBackward"));
  exports.Set("swigluForward", Napi::Function::New<guarded<SwigluForward, 3>>(env, "swigluForward"));
  exports.Set("swigluBackward", Napi::Function::New<guarded<SwigluBackward, 4>>(env, "swigluBackward"));
  exports.Set("add", Napi::Function::New<guarded<Add, 5>>(env, "add"));
}

}  // namespace fa::napi
