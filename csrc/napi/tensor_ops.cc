// Tensor memory: creation from host data, asynchronous reads back, accounting, device queries.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/copy_params.h"
#include "common/half.h"
#include "cpu/copy_cpu.h"
#include "napi/addon.h"
#include "napi/copy_ops.h"
#include "napi/dispatch.h"
#include "napi/view_args.h"
#include "runtime/build_info.h"

#ifdef FA_WITH_CUDA
#include "cuda/copy.h"
#include "cuda/fault_injection.h"
#endif

namespace fa::napi {

namespace {

// Converts `n` float32 values into `dst` of dtype `t` (round to nearest even for the half types).
void convert_from_f32(const float* src, void* dst, size_t n, DType t) {
  switch (t) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * 4);
      break;
    case DType::kFloat16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      break;
    }
    case DType::kBFloat16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      break;
    }
    case DType::kInt32:  // CreateFromFloat32 refuses int32 before converting
      break;
  }
}

void convert_to_f32(const void* src, float* dst, size_t n, DType t) {
  switch (t) {
    case DType::kFloat32:
      std::memcpy(dst, src, n * 4);
      break;
    case DType::kFloat16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      break;
    }
    case DType::kBFloat16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      break;
    }
    case DType::kInt32: {  // exact for |x| <= 2^24, rounded to nearest beyond
      const auto* s = static_cast<const int32_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      break;
    }
  }
}

// The typed array that holds a dtype's raw elements (createFromBits, readBits).
napi_typedarray_type bits_array_type(DType t) {
  return t == DType::kFloat32 ? napi_float32_array : t == DType::kInt32 ? napi_int32_array : napi_uint16_array;
}
const char* bits_array_name(DType t) {
  return t == DType::kFloat32 ? "a Float32Array" : t == DType::kInt32 ? "an Int32Array" : "a Uint16Array";
}

// Allocates a buffer on `device` and fills it from host bytes that are already in the buffer's dtype.
BufferPtr upload(Runtime& rt, Device device, DType dtype, const void* host, size_t bytes) {
  BufferPtr buf = rt.allocate(device, dtype, bytes, /*is_output=*/false);
  if (device == Device::kCpu) {
    std::memcpy(buf->data(), host, bytes);  // a new buffer: no queued work can touch it yet
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().upload(buf->data(), host, bytes);
#endif
  }
  return buf;
}

std::string device_unavailable(Runtime& rt, Device device) {
  if (device != Device::kCuda) return {};
  std::string why;
  if (rt.cuda_available(&why)) return {};
  return "Expected device 'cuda' to be available but it is not: " + why;
}

void require_device(Runtime& rt, Device device) {
  std::string why = device_unavailable(rt, device);
  if (!why.empty()) throw Error(why);
}

// createFromFloat32(device, dtype, data: Float32Array): NativeBuffer
Napi::Value CreateFromFloat32(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  Device device = device_arg(info[0], "device");
  DType dtype = dtype_arg(info[1], "dtype");
  if (!dtype_is_float(dtype)) {
    throw type_error(std::string("Expected dtype to be float32, float16 or bfloat16 for data from a Float32Array but "
                                 "received ") + dtype_name(dtype));
  }
  if (!info[2].IsTypedArray() || info[2].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array) {
    throw type_error("Expected data to be a Float32Array but received " + describe(info[2]));
  }
  require_device(rt, device);
  auto arr = info[2].As<Napi::Float32Array>();
  const size_t n = arr.ElementLength();
  if (n == 0) throw range_error("Expected data to have at least 1 element but received 0");
  if (dtype == DType::kFloat32) return NativeBuffer::Wrap(env, upload(rt, device, dtype, arr.Data(), n * 4));
  std::vector<uint16_t> bits(n);
  convert_from_f32(arr.Data(), bits.data(), n, dtype);
  return NativeBuffer::Wrap(env, upload(rt, device, dtype, bits.data(), n * 2));
}

// createFromBits(device, dtype, data: Uint16Array (half types) | Float32Array (float32)): NativeBuffer
Napi::Value CreateFromBits(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  Device device = device_arg(info[0], "device");
  DType dtype = dtype_arg(info[1], "dtype");
  const napi_typedarray_type want = bits_array_type(dtype);
  if (!info[2].IsTypedArray() || info[2].As<Napi::TypedArray>().TypedArrayType() != want) {
    throw type_error(std::string("Expected data to be ") + bits_array_name(dtype) + " for dtype " +
                     dtype_name(dtype) + " but received " + describe(info[2]));
  }
  require_device(rt, device);
  auto arr = info[2].As<Napi::TypedArray>();
  const size_t bytes = arr.ByteLength();
  if (bytes == 0) throw range_error("Expected data to have at least 1 element but received 0");
  const auto* src = static_cast<const uint8_t*>(arr.ArrayBuffer().Data()) + arr.ByteOffset();
  return NativeBuffer::Wrap(env, upload(rt, device, dtype, src, bytes));
}

// createZeros(device, dtype, numel): NativeBuffer of numel zero elements. numel is re-checked here: a
// positive integer that JS numbers hold exactly (below 2^53), so bytes = numel * 4 cannot overflow.
Napi::Value CreateZeros(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  Device device = device_arg(info[0], "device");
  DType dtype = dtype_arg(info[1], "dtype");
  constexpr int64_t kMaxSafeInteger = (int64_t{1} << 53) - 1;
  const int64_t numel = int_arg(info[2], "numel", 1, kMaxSafeInteger);
  require_device(rt, device);
  const size_t bytes = static_cast<size_t>(numel) * dtype_size(dtype);
  BufferPtr buf = rt.allocate(device, dtype, bytes, /*is_output=*/false);
  if (device == Device::kCpu) {
    std::memset(buf->data(), 0, bytes);  // a new buffer: no queued work can touch it yet
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().memset(buf->data(), 0, bytes);
#endif
  }
  return NativeBuffer::Wrap(env, buf);
}

// injectCudaFault(kind: 'illegal-address'): enqueues a store to an unmapped address on the CUDA stream
// (cuda/fault_injection.h). The error surfaces at the next synchronisation and the context is lost.
Napi::Value InjectCudaFault(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsString() || info[0].As<Napi::String>().Utf8Value() != "illegal-address") {
    throw type_error("Expected kind to be 'illegal-address' but received " + describe(info[0]));
  }
  Runtime& rt = runtime(env);
  require_device(rt, Device::kCuda);
#ifdef FA_WITH_CUDA
  rt.cuda().ensure_usable();
  const cudaError_t err = cuda::inject_illegal_address(rt.cuda().stream());
  if (err != cudaSuccess) throw Error(std::string("injectCudaFault: the launch failed: ") + cudaGetErrorString(err));
#endif
  return env.Undefined();
}

// Reads a buffer back to the host off the JS thread, as float32 values or as raw bits.
class ReadWorker : public PromiseWorker {
 public:
  // Reads elements [offset, offset + count) of buf (the caller checked the range).
  // With `target` (readInto), the values land in a staging copy first and reach the caller's array
  // on the JS thread only once the read succeeded: a failed read leaves the array untouched.
  ReadWorker(Napi::Env env, Runtime& rt, BufferPtr buf, bool as_float32, size_t offset, size_t count,
             Napi::TypedArray target = Napi::TypedArray())
      : PromiseWorker(env, "flash-attn-node:read"),
        rt_(rt),
        buf_(std::move(buf)),
        as_f32_(as_float32),
        offset_(offset),
        count_(count),
        deferred_(Napi::Promise::Deferred::New(env)) {
    const size_t n = count_;
    const bool f32_out = as_f32_ || buf_->dtype() == DType::kFloat32;
    if (!target.IsEmpty()) {
      into_ = true;
      target_bytes_ = target.ByteLength();
      staging_.resize(n * (f32_out ? 4 : dtype_size(buf_->dtype())));
      dst_ = staging_.data();
      result_ = Napi::Persistent(static_cast<Napi::Object>(target));
    } else {
      Napi::TypedArray out;
      if (f32_out) {
        out = Napi::Float32Array::New(env, n);
      } else if (buf_->dtype() == DType::kInt32) {
        out = Napi::Int32Array::New(env, n);
      } else {
        out = Napi::Uint16Array::New(env, n);
      }
      dst_ = static_cast<uint8_t*>(out.ArrayBuffer().Data()) + out.ByteOffset();
      result_ = Napi::Persistent(static_cast<Napi::Object>(out));
    }
    fence_ = rt_.fence(buf_->device());  // everything queued so far, in call order
  }

  Napi::Promise Promise() { return deferred_.Promise(); }

  void Execute() override {
    const size_t n = count_;
    const size_t elem = dtype_size(buf_->dtype());
    const size_t bytes = n * elem;
    const void* src = static_cast<const uint8_t*>(buf_->data()) + offset_ * elem;
    const bool convert = as_f32_ && buf_->dtype() != DType::kFloat32;
    if (buf_->device() == Device::kCpu) {
      std::string err = rt_.wait(fence_);
      if (err.empty()) err = buf_->error();
      if (!err.empty()) return SetError(err);
      if (convert) {
        convert_to_f32(src, reinterpret_cast<float*>(dst_), n, buf_->dtype());
      } else {
        std::memcpy(dst_, src, bytes);
      }
      return;
    }
#ifdef FA_WITH_CUDA
    CudaContext* cuda = rt_.memory().cuda();
    if (!convert) {
      std::string err = cuda->read_after(fence_.event, dst_, src, bytes);
      if (!err.empty()) SetError(err);
      return;
    }
    std::vector<uint8_t> staging(bytes);
    std::string err = cuda->read_after(fence_.event, staging.data(), src, bytes);
    if (!err.empty()) return SetError(err);
    convert_to_f32(staging.data(), reinterpret_cast<float*>(dst_), n, buf_->dtype());
#endif
  }

  void OnOK() override {
    if (!into_) {
      deferred_.Resolve(result_.Value());
      return;
    }
    auto target = result_.Value().As<Napi::TypedArray>();
    if (target.ByteLength() != target_bytes_ || staging_.size() != target_bytes_) {  // detached meanwhile
      deferred_.Reject(Napi::Error::New(Env(), "readInto: the target array was detached or resized before the "
                                               "read finished; nothing was written").Value());
      return;
    }
    std::memcpy(static_cast<uint8_t*>(target.ArrayBuffer().Data()) + target.ByteOffset(), staging_.data(),
                staging_.size());
    deferred_.Resolve(Env().Undefined());
  }
  void OnError(const Napi::Error& e) override {
    deferred_.Reject(e.Value());
  }

 private:
  bool into_ = false;
  size_t target_bytes_ = 0;
  std::vector<uint8_t> staging_;
  Runtime& rt_;
  BufferPtr buf_;  // kept alive until the read is done, even if the tensor is disposed meanwhile
  bool as_f32_;
  size_t offset_, count_;  // elements
  Napi::Promise::Deferred deferred_;
  Napi::ObjectReference result_;
  uint8_t* dst_ = nullptr;
  Fence fence_;
};

// readFloat32(buf, offset?, count?): Promise<Float32Array>; readBits(buf, offset?, count?): Promise<Uint16Array |
// Float32Array>. Elements [offset, offset + count) of the flat buffer; the whole buffer when both are
// undefined. The range is re-checked against the buffer's own size.
Napi::Value Read(const Napi::CallbackInfo& info, bool as_float32) {
  Napi::Env env = info.Env();
  BufferPtr buf = NativeBuffer::From(info[0], "tensor");
  const int64_t numel = static_cast<int64_t>(buf->numel());
  int64_t offset = 0, count = numel;
  if (!info[1].IsUndefined() || !info[2].IsUndefined()) {
    offset = int_arg(info[1], "offset", 0, numel - 1);
    count = int_arg(info[2], "count", 1, numel - offset);
  }
  auto* w = new ReadWorker(env, runtime(env), std::move(buf), as_float32, static_cast<size_t>(offset),
                           static_cast<size_t>(count));
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

Napi::Value ReadFloat32(const Napi::CallbackInfo& info) {
  return Read(info, true);
}
Napi::Value ReadBits(const Napi::CallbackInfo& info) {
  return Read(info, false);
}

// Resolves once everything queued on `device` so far has finished (or rejects with its error).
// With `trim`, also returns the CUDA pool's cached memory to the driver once the work is done.
class SyncWorker : public PromiseWorker {
 public:
  SyncWorker(Napi::Env env, Runtime& rt, Device device, bool trim)
      : PromiseWorker(env, "flash-attn-node:synchronize"),
        rt_(rt),
        trim_(trim),
        deferred_(Napi::Promise::Deferred::New(env)) {
    fence_ = rt_.fence(device);
  }
  Napi::Promise Promise() { return deferred_.Promise(); }
  void Execute() override {
    std::string err = rt_.wait(fence_);
#ifdef FA_WITH_CUDA
    if (err.empty() && trim_ && fence_.device == Device::kCuda) err = rt_.memory().cuda()->trim_pool();
#endif
    if (!err.empty()) SetError(err);
  }
  void OnOK() override {
    deferred_.Resolve(Env().Undefined());
  }
  void OnError(const Napi::Error& e) override {
    deferred_.Reject(e.Value());
  }

 private:
  Runtime& rt_;
  bool trim_;
  Napi::Promise::Deferred deferred_;
  Fence fence_;
};

// synchronize(device, trimCache?): Promise<void>
Napi::Value Synchronize(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  Device device = device_arg(info[0], "device");
  const bool trim = info.Length() > 1 && !info[1].IsUndefined() && bool_arg(info[1], "trimCache");
  require_device(rt, device);
  auto* w = new SyncWorker(env, rt, device, trim);
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

Napi::Object counters_object(Napi::Env env, MemoryCounters& c) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("buffers", Napi::Number::New(env, static_cast<double>(c.buffers.load())));
  o.Set("bytes", Napi::Number::New(env, static_cast<double>(c.bytes.load())));
  o.Set("peakBytes", Napi::Number::New(env, static_cast<double>(c.peak_bytes.load())));
  return o;
}

// memory(): { cpu: {buffers, bytes, peakBytes}, cuda: {..., poolUsedBytes?, poolPeakBytes?} }
Napi::Value Memory(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  Napi::Object o = Napi::Object::New(env);
  o.Set("cpu", counters_object(env, rt.memory().counters(Device::kCpu)));
  Napi::Object cuda = counters_object(env, rt.memory().counters(Device::kCuda));
#ifdef FA_WITH_CUDA
  if (CudaContext* ctx = rt.memory().cuda()) {
    cuda.Set("poolUsedBytes", Napi::Number::New(env, static_cast<double>(ctx->pool_used_bytes())));
    cuda.Set("poolPeakBytes", Napi::Number::New(env, static_cast<double>(ctx->pool_peak_bytes())));
  }
#endif
  o.Set("cuda", cuda);
  return o;
}

// resetPeakMemory(device): restarts the high-water marks (accounting and, on CUDA, the pool's).
Napi::Value ResetPeakMemory(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  Device device = device_arg(info[0], "device");
  MemoryCounters& c = rt.memory().counters(device);
  c.peak_bytes.store(c.bytes.load());
#ifdef FA_WITH_CUDA
  if (device == Device::kCuda && rt.memory().cuda()) rt.memory().cuda()->reset_pool_peak();
#endif
  return env.Undefined();
}

Napi::Value SetPoison(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  runtime(env).memory().poison.store(bool_arg(info[0], "enabled"));
  return env.Undefined();
}

// cudaStatus(): { available, reason, contextLost, device? } -- synchronous, initialises CUDA on first
// call. Never throws for CUDA's sake: a context lost to a sticky error reports available false, the
// lost context's message as the reason, and contextLost true (no device query: it would fail too).
Napi::Value CudaStatus(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  Napi::Object o = Napi::Object::New(env);
  std::string why;
  bool ok = rt.cuda_available(&why);
  bool lost = false;
#ifdef FA_WITH_CUDA
  if (ok) {
    why = rt.cuda().lost_message();
    lost = !why.empty();
    ok = !lost;
  }
#endif
  o.Set("available", Napi::Boolean::New(env, ok));
  o.Set("reason", ok ? Napi::Value(env.Null()) : Napi::String::New(env, why));
  o.Set("contextLost", Napi::Boolean::New(env, lost));
#ifdef FA_WITH_CUDA
  if (ok) {
    const CudaDeviceInfo& d = rt.cuda().info();
    Napi::Object dev = Napi::Object::New(env);
    dev.Set("ordinal", d.ordinal);
    dev.Set("name", d.name);
    dev.Set("computeCapability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor));
    dev.Set("multiprocessors", d.multiprocessors);
    dev.Set("totalMemoryBytes", static_cast<double>(d.total_memory));
    dev.Set("sharedMemoryPerBlockBytes", static_cast<double>(d.shared_memory_per_block_optin));
    dev.Set("l2CacheBytes", d.l2_cache_bytes);
    dev.Set("driverVersion", cuda_version_string(d.driver_version));
    dev.Set("runtimeVersion", cuda_version_string(d.runtime_version));
    size_t free_bytes = 0, total_bytes = 0;
    rt.cuda().mem_info(&free_bytes, &total_bytes);
    dev.Set("freeMemoryBytes", static_cast<double>(free_bytes));
    o.Set("device", dev);
  }
#endif
  return o;
}

// cudaDeviceCount(): { count, reason } -- synchronous and cheap (no context), for test gating.
Napi::Value CudaDeviceCount(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object o = Napi::Object::New(env);
#ifdef FA_WITH_CUDA
  std::string why;
  int n = cuda_device_count(&why);
  o.Set("count", n);
  o.Set("reason", n > 0 ? Napi::Value(env.Null()) : Napi::String::New(env, why));
#else
  o.Set("count", 0);
  o.Set("reason", kCpuOnlyMessage);
#endif
  return o;
}

// createEmpty(device, dtype, numel): NativeBuffer of numel uninitialised elements (filled with NaN /
// 0xff bytes while output poisoning is on, like an operation's output).
Napi::Value CreateEmpty(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  Device device = device_arg(info[0], "device");
  DType dtype = dtype_arg(info[1], "dtype");
  const int64_t numel = int_arg(info[2], "numel", 1, kMaxSafeInteger);
  require_device(rt, device);
  return NativeBuffer::Wrap(env, rt.allocate(device, dtype, static_cast<size_t>(numel) * dtype_size(dtype), true));
}

// Throws unless values of `src` may be converted to `dst` (float -> int32 is refused).
void expect_convertible(DType src, DType dst) {
  if (dst == DType::kInt32 && src != DType::kInt32) {
    throw type_error(std::string("Expected src to have dtype int32 to be copied into an int32 tensor but received ") +
                     dtype_name(src) + " (float to int32 conversion is not supported)");
  }
}

// copyStrided(dst, src, sizes, dstStrides?, srcStrides?): dst view = src view converted to dst's dtype,
// queued on their (common) device. Refuses a dst whose elements are not distinct, and src and dst
// sharing elements (unless they are the same view and dtype: nothing to do).
Napi::Value CopyStrided(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  TensorArg dst = tensor_arg(info[0], "dst");
  TensorArg src = tensor_arg(info[1], "src");
  ViewLayout dv, sv;
  sizes_arg(info[2], "sizes", &dv);
  sv.rank = dv.rank;
  std::copy(dv.sizes, dv.sizes + dv.rank, sv.sizes);
  strides_arg(info[3], "dstStrides", &dv);
  strides_arg(info[4], "srcStrides", &sv);
  if (src.device() != dst.device()) {
    throw type_error(std::string("Expected src to be on device '") + device_name(dst.device()) +
                     "' (like dst) but received '" + device_name(src.device()) + "'");
  }
  expect_convertible(src.dtype(), dst.dtype());
  expect_view(dst, "dst", &dv);
  sv.offset = src.offset;
  const int64_t src_extent = view_extent(sv);
  if (src_extent < 0) throw range_error("Expected src to reach fewer than 2^62 elements");
  expect_extent(src, "src", src.device(), src_extent);
  if (src.buf.get() == dst.buf.get()) {
    bool same = dv.offset == sv.offset;
    for (int d = 0; d < dv.rank && same; ++d) same = dv.strides[d] == sv.strides[d] || dv.sizes[d] == 1;
    if (same) return env.Undefined();  // one buffer has one dtype: the copy would change nothing
    if (!view_nested(sv) || views_overlap(dv, sv)) {
      throw range_error("Expected src and dst not to share elements but they do (copy through a clone() first)");
    }
  }
  require_device(rt, dst.device());
  CopyParams p = make_copy_params(*dst.buf, dv, *src.buf, sv);
  enqueue_copy(rt, dst.device(), p, src.buf, dst.buf);
  return env.Undefined();
}

// fillStrided(dst, sizes, strides?, value): every element of the dst view = value converted to dst's
// dtype (an integer in int32's range for int32; any number, NaN and +-Infinity included, otherwise).
Napi::Value FillStrided(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  TensorArg dst = tensor_arg(info[0], "dst");
  ViewLayout dv;
  sizes_arg(info[1], "sizes", &dv);
  strides_arg(info[2], "strides", &dv);
  const double value = number_arg(info[3], "value");
  if (dst.dtype() == DType::kInt32 &&
      !(std::isfinite(value) && value == std::floor(value) && value >= -2147483648.0 && value <= 2147483647.0)) {
    throw range_error("Expected value to be an integer in [-2147483648, 2147483647] for an int32 tensor but received " +
                      describe(info[3]));
  }
  expect_view(dst, "dst", &dv);
  require_device(rt, dst.device());
  CopyParams p;
  p.rank = dv.rank;
  for (int d = 0; d < dv.rank; ++d) {
    p.sizes[d] = dv.sizes[d];
    p.dst_strides[d] = dv.strides[d];
  }
  p.numel = numel_of(dv);
  p.src_dtype = p.dst_dtype = dst.dtype();
  p.dst = dst.data();
  p.value = value;
  BufferPtr out = dst.buf;
  if (dst.device() == Device::kCpu) {
    cpu::ThreadPool* pool = &rt.pool();
    submit_cpu(rt, {out}, {out}, [p, pool] { cpu::fill(p, *pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    check_launch(rt, cuda::fill_strided(p, rt.cuda().stream()), "fill", 0);
#endif
  }
  return env.Undefined();
}

// transfer(src, count, device): a new contiguous buffer on `device` holding elements [offset, offset +
// count) of src (same dtype). Ordering: after the work queued on both devices so far.
//  - cpu -> cuda: the JS thread waits for the CPU executor's queued work (as a tensor creation from
//    host data does), then the upload is queued on the CUDA stream;
//  - cuda -> cpu: a task on the CPU executor waits for the CUDA work queued so far, then copies down:
//    the call returns at once, and CPU work queued after it waits for the copy;
//  - same device: a copy on that device's stream.
Napi::Value Transfer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  TensorArg src = tensor_arg(info[0], "src");
  const int64_t numel = static_cast<int64_t>(src.buf->numel());
  const int64_t count = int_arg(info[1], "count", 1, numel - src.offset);
  const Device to = device_arg(info[2], "device");
  require_device(rt, src.device());
  require_device(rt, to);
  const DType dtype = src.dtype();
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  if (to == src.device()) {
    BufferPtr out = rt.allocate(to, dtype, bytes, false);
    ViewLayout v;
    v.rank = 1;
    v.sizes[0] = count;
    v.strides[0] = 1;
    CopyParams p = make_copy_params(*out, v, *src.buf, v);
    p.src = src.data();
    enqueue_copy(rt, to, p, src.buf, out);
    return NativeBuffer::Wrap(env, out);
  }
#ifdef FA_WITH_CUDA
  if (to == Device::kCuda) {
    std::string err = rt.wait(rt.fence(Device::kCpu));
    if (err.empty()) err = src.buf->error();
    if (!err.empty()) throw Error("to('cuda'): the work that produced the tensor failed: " + err);
    BufferPtr out = rt.allocate(to, dtype, bytes, false);
    rt.cuda().upload(out->data(), src.data(), bytes);
    return NativeBuffer::Wrap(env, out);
  }
  BufferPtr out = rt.allocate(Device::kCpu, dtype, bytes, false);
  Fence fence = rt.fence(Device::kCuda);
  CudaContext* cuda = rt.memory().cuda();
  BufferPtr in = src.buf;
  const void* from = src.data();
  rt.executor().submit([cuda, fence, in, out, from, bytes] {
    std::string err = cuda->read_after(fence.event, out->data(), from, bytes);
    if (!err.empty()) out->set_error(err);
  });
  return NativeBuffer::Wrap(env, out);
#else
  throw Error("this build of flash-attn-node has no CUDA support");
#endif
}

// readInto(buf, offset, count, target): Promise<void>. Elements [offset, offset + count) of buf into
// `target`: a Float32Array (values, any floating dtype), a Uint16Array (raw bits, float16 / bfloat16)
// or an Int32Array (int32), of exactly `count` elements. The target is written only once the read
// succeeded.
Napi::Value ReadInto(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  BufferPtr buf = NativeBuffer::From(info[0], "tensor");
  const int64_t numel = static_cast<int64_t>(buf->numel());
  const int64_t offset = int_arg(info[1], "offset", 0, numel - 1);
  const int64_t count = int_arg(info[2], "count", 1, numel - offset);
  const DType t = buf->dtype();
  const char* want = t == DType::kInt32 ? "an Int32Array"
                     : t == DType::kFloat32 ? "a Float32Array"
                                            : "a Float32Array (values) or a Uint16Array (raw bits)";
  bool ok = info[3].IsTypedArray();
  bool as_f32 = false;
  if (ok) {
    const napi_typedarray_type at = info[3].As<Napi::TypedArray>().TypedArrayType();
    if (t == DType::kInt32) {
      ok = at == napi_int32_array;
    } else if (at == napi_float32_array) {
      as_f32 = true;
    } else {
      ok = at == napi_uint16_array && t != DType::kFloat32;
    }
  }
  if (!ok) {
    throw type_error(std::string("Expected target to be ") + want + " for dtype " + dtype_name(t) + " but received " +
                     describe(info[3]));
  }
  auto target = info[3].As<Napi::TypedArray>();
  if (static_cast<int64_t>(target.ElementLength()) != count) {
    throw range_error("Expected target to have " + std::to_string(count) + " elements but it has " +
                      std::to_string(target.ElementLength()));
  }
  auto* w = new ReadWorker(env, runtime(env), std::move(buf), as_f32, static_cast<size_t>(offset),
                           static_cast<size_t>(count), target);
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

// exportPointer(buf): { ptr: bigint, stream: bigint }: the address of the buffer's first byte and the
// stream that orders work on it (the CUDA compute stream's handle; 0n on the CPU, whose queued work
// is waited for with synchronize()). lib/interop.ts documents the ownership and ordering rules.
Napi::Value ExportPointer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  BufferPtr buf = NativeBuffer::From(info[0], "tensor");
  uint64_t stream = 0;
#ifdef FA_WITH_CUDA
  if (buf->device() == Device::kCuda) stream = reinterpret_cast<uint64_t>(runtime(env).cuda().stream());
#endif
  Napi::Object o = Napi::Object::New(env);
  o.Set("ptr", Napi::BigInt::New(env, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(buf->data()))));
  o.Set("stream", Napi::BigInt::New(env, stream));
  return o;
}

uint64_t bigint_arg(const Napi::Value& v, const char* arg) {
  if (!v.IsBigInt()) throw type_error(std::string("Expected ") + arg + " to be a bigint but received " + describe(v));
  bool lossless = false;
  const uint64_t x = v.As<Napi::BigInt>().Uint64Value(&lossless);
  if (!lossless) {
    throw range_error(std::string("Expected ") + arg + " to be a bigint in [0, 2^64) but received " +
                      v.ToString().Utf8Value());
  }
  return x;
}

// importPointer(device, dtype, ptr: bigint, numel, stream: bigint): a NativeBuffer over numel elements
// at ptr that another library owns (not freed, not counted by memory()). On CUDA, a non-zero stream
// is the producer's: the compute stream waits for the work queued on it so far before later work.
Napi::Value ImportPointer(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const Device device = device_arg(info[0], "device");
  const DType dtype = dtype_arg(info[1], "dtype");
  const uint64_t ptr = bigint_arg(info[2], "ptr");
  const int64_t numel = int_arg(info[3], "numel", 1, kMaxSafeInteger);
  const uint64_t stream = bigint_arg(info[4], "stream");
  const size_t elem = dtype_size(dtype);
  if (ptr == 0 || ptr % elem != 0) {
    throw range_error(std::string("Expected ptr to be a non-null address aligned to ") + std::to_string(elem) +
                      " bytes (the size of a " + dtype_name(dtype) + " element) but received " +
                      info[2].ToString().Utf8Value());
  }
  if (static_cast<uint64_t>(numel) > (UINT64_MAX - ptr) / elem) {
    throw range_error("Expected ptr + numel elements to stay below 2^64 but they do not");
  }
  require_device(rt, device);
  if (device == Device::kCpu) {
    if (stream != 0) {
      throw range_error("Expected stream to be 0n for a cpu pointer (order host memory by finishing the producer's "
                        "writes before the import) but received " + info[4].ToString().Utf8Value());
    }
    return NativeBuffer::Wrap(env, rt.wrap_external(device, dtype, static_cast<size_t>(numel) * elem,
                                                    reinterpret_cast<void*>(static_cast<uintptr_t>(ptr))));
  }
#ifdef FA_WITH_CUDA
  CudaContext& cuda = rt.cuda();
  cuda.ensure_usable();
  cudaPointerAttributes attr{};
  const cudaError_t aerr = cudaPointerGetAttributes(&attr, reinterpret_cast<const void*>(static_cast<uintptr_t>(ptr)));
  if (aerr != cudaSuccess) cudaGetLastError();
  if (aerr != cudaSuccess || (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged) ||
      attr.device != cuda.info().ordinal) {
    throw range_error("Expected ptr to be device (or managed) memory of CUDA device " +
                      std::to_string(cuda.info().ordinal) + " but it is not");
  }
  if (stream != 0) {
    cudaEvent_t ev = nullptr;
    cuda.check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cudaError_t err = cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(stream)));
    if (err == cudaSuccess) err = cudaStreamWaitEvent(cuda.stream(), ev, 0);
    cudaEventDestroy(ev);
    if (err != cudaSuccess) {
      cudaGetLastError();
      throw range_error(std::string("Expected stream to be a CUDA stream of device ") +
                        std::to_string(cuda.info().ordinal) + " but ordering against it failed: " +
                        cudaGetErrorString(err));
    }
  }
  return NativeBuffer::Wrap(env, rt.wrap_external(device, dtype, static_cast<size_t>(numel) * elem,
                                                  reinterpret_cast<void*>(static_cast<uintptr_t>(ptr))));
#else
  throw Error("this build of flash-attn-node has no CUDA support");
#endif
}

}  // namespace

CopyParams make_copy_params(const Buffer& dst, const ViewLayout& dv, const Buffer& src, const ViewLayout& sv) {
  CopyParams p;
  p.rank = dv.rank;
  p.numel = 1;
  for (int d = 0; d < dv.rank; ++d) {
    p.sizes[d] = dv.sizes[d];
    p.dst_strides[d] = dv.strides[d];
    p.src_strides[d] = sv.strides[d];
    p.numel *= dv.sizes[d];
  }
  p.src_dtype = src.dtype();
  p.dst_dtype = dst.dtype();
  p.src = static_cast<const char*>(src.data()) + sv.offset * static_cast<int64_t>(dtype_size(src.dtype()));
  p.dst = static_cast<char*>(dst.data()) + dv.offset * static_cast<int64_t>(dtype_size(dst.dtype()));
  return p;
}

void enqueue_copy(Runtime& rt, Device device, const CopyParams& p, const BufferPtr& src, const BufferPtr& dst) {
  if (device == Device::kCpu) {
    cpu::ThreadPool* pool = &rt.pool();
    submit_cpu(rt, {src, dst}, {dst}, [p, pool] { cpu::copy(p, *pool); });
    return;
  }
#ifdef FA_WITH_CUDA
  rt.cuda().ensure_usable();
  check_launch(rt, cuda::copy(p, rt.cuda().stream()), "copy", 0);
#endif
}

void InitTensorOps(Napi::Env env, Napi::Object exports) {
  exports.Set("createFromFloat32", Napi::Function::New<guarded<CreateFromFloat32, 3>>(env, "createFromFloat32"));
  exports.Set("createFromBits", Napi::Function::New<guarded<CreateFromBits, 3>>(env, "createFromBits"));
  exports.Set("createZeros", Napi::Function::New<guarded<CreateZeros, 3>>(env, "createZeros"));
  exports.Set("createEmpty", Napi::Function::New<guarded<CreateEmpty, 3>>(env, "createEmpty"));
  exports.Set("copyStrided", Napi::Function::New<guarded<CopyStrided, 5>>(env, "copyStrided"));
  exports.Set("fillStrided", Napi::Function::New<guarded<FillStrided, 4>>(env, "fillStrided"));
  exports.Set("transfer", Napi::Function::New<guarded<Transfer, 3>>(env, "transfer"));
  exports.Set("readInto", Napi::Function::New<guarded<ReadInto, 4>>(env, "readInto"));
  exports.Set("exportPointer", Napi::Function::New<guarded<ExportPointer, 1>>(env, "exportPointer"));
  exports.Set("importPointer", Napi::Function::New<guarded<ImportPointer, 5>>(env, "importPointer"));
  exports.Set("injectCudaFault", Napi::Function::New<guarded<InjectCudaFault, 1>>(env, "injectCudaFault"));
  exports.Set("readFloat32", Napi::Function::New<guarded<ReadFloat32, 3>>(env, "readFloat32"));
  exports.Set("readBits", Napi::Function::New<guarded<ReadBits, 3>>(env, "readBits"));
  exports.Set("synchronize", Napi::Function::New<guarded<Synchronize, 2>>(env, "synchronize"));
  exports.Set("memory", Napi::Function::New<guarded<Memory, 0>>(env, "memory"));
  exports.Set("resetPeakMemory", Napi::Function::New<guarded<ResetPeakMemory, 1>>(env, "resetPeakMemory"));
  exports.Set("setPoison", Napi::Function::New<guarded<SetPoison, 1>>(env, "setPoison"));
  exports.Set("cudaStatus", Napi::Function::New<guarded<CudaStatus, 0>>(env, "cudaStatus"));
  exports.Set("cudaDeviceCount", Napi::Function::New<guarded<CudaDeviceCount, 0>>(env, "cudaDeviceCount"));
}

}  // namespace fa::napi
