// Module entry point, per-environment data, the NativeBuffer class and the shared argument helpers.
#include "napi/addon.h"

#include <cmath>

#include "cpu/cpu_isa.h"
#include "runtime/build_info.h"
#include "cpu/thread_pool.h"

namespace fa::napi {

AddonData& data(Napi::Env env) {
  return *env.GetInstanceData<AddonData>();
}
Runtime& runtime(Napi::Env env) {
  return *data(env).runtime;
}

void rethrow_as_js(Napi::Env env, const std::exception& e) {
  if (const auto* fe = dynamic_cast<const Error*>(&e)) {
    switch (fe->kind()) {
      case Error::Kind::kType:
        throw Napi::TypeError::New(env, fe->what());
      case Error::Kind::kRange:
        throw Napi::RangeError::New(env, fe->what());
      case Error::Kind::kGeneric:
        break;
    }
    throw Napi::Error::New(env, fe->what());
  }
  if (dynamic_cast<const std::bad_alloc*>(&e)) throw Napi::Error::New(env, "out of host memory");
  throw Napi::Error::New(env, e.what());
}

// ---- argument helpers ----

std::string describe(const Napi::Value& v) {
  switch (v.Type()) {
    case napi_undefined:
      return "undefined";
    case napi_null:
      return "null";
    case napi_boolean:
      return std::string(v.As<Napi::Boolean>().Value() ? "true" : "false") + " of type boolean";
    case napi_number:  // JS's own formatting: 0.5, NaN, 1e-50
      return v.ToString().Utf8Value() + " of type number";
    case napi_string:
      return "\"" + v.As<Napi::String>().Utf8Value() + "\" of type string";
    case napi_object:
      if (v.IsArray()) return "an Array of length " + std::to_string(v.As<Napi::Array>().Length());
      if (v.IsTypedArray()) {
        static const char* const kNames[] = {"an Int8Array",    "a Uint8Array",    "a Uint8ClampedArray",
                                             "an Int16Array",   "a Uint16Array",   "an Int32Array",
                                             "a Uint32Array",   "a Float32Array",  "a Float64Array",
                                             "a BigInt64Array", "a BigUint64Array"};
        const auto t = static_cast<size_t>(v.As<Napi::TypedArray>().TypedArrayType());
        return t < sizeof(kNames) / sizeof(kNames[0]) ? kNames[t] : "a typed array";
      }
      return "an object";
    case napi_function:
      return "a function";
    default:
      return "a value of another type";
  }
}

int64_t int_arg(const Napi::Value& v, const char* arg, int64_t min, int64_t max) {
  if (!v.IsNumber()) throw type_error(std::string("Expected ") + arg + " to be an integer but received " + describe(v));
  double d = v.As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d) || d != std::floor(d) || d < static_cast<double>(min) || d > static_cast<double>(max)) {
    throw range_error(std::string("Expected ") + arg + " to be an integer in [" + std::to_string(min) + ", " +
                      std::to_string(max) + "] but received " + describe(v));
  }
  return static_cast<int64_t>(d);
}

double number_arg(const Napi::Value& v, const char* arg) {
  if (!v.IsNumber()) throw type_error(std::string("Expected ") + arg + " to be a number but received " + describe(v));
  return v.As<Napi::Number>().DoubleValue();
}

bool bool_arg(const Napi::Value& v, const char* arg) {
  if (!v.IsBoolean()) throw type_error(std::string("Expected ") + arg + " to be a boolean but received " + describe(v));
  return v.As<Napi::Boolean>().Value();
}

Device device_arg(const Napi::Value& v, const char* arg) {
  int64_t d = int_arg(v, arg, 0, kNumDevices - 1);
  return static_cast<Device>(d);
}

DType dtype_arg(const Napi::Value& v, const char* arg) {
  int64_t d = int_arg(v, arg, 0, 3);
  DType t = DType::kFloat32;
  dtype_from_int(static_cast<int32_t>(d), &t);
  return t;
}

// ---- NativeBuffer ----

Napi::Function NativeBuffer::Define(Napi::Env env) {
  return DefineClass(env, "NativeBuffer",
                     {
                         InstanceMethod<&NativeBuffer::Release>("release"),
                         InstanceMethod<&NativeBuffer::Share>("share"),
                         InstanceAccessor<&NativeBuffer::GetBytes>("bytes"),
                         InstanceAccessor<&NativeBuffer::GetDevice>("device"),
                         InstanceAccessor<&NativeBuffer::GetDtype>("dtype"),
                         InstanceAccessor<&NativeBuffer::GetReleased>("released"),
                     });
}

NativeBuffer::NativeBuffer(const Napi::CallbackInfo& info) : Napi::ObjectWrap<NativeBuffer>(info) {
  // Only Wrap() creates these: it passes the buffer through an External it tagged. Any other
  // argument (another addon's External, a timer handle) is refused, not read as a BufferPtr.
  if (info.Length() != 1 || !info[0].IsExternal() ||
      !info[0].As<Napi::External<BufferPtr>>().CheckTypeTag(&kBufferHandleTag)) {
    throw Napi::TypeError::New(info.Env(), "NativeBuffer cannot be constructed from JS; use the Tensor factories");
  }
  buf_ = *info[0].As<Napi::External<BufferPtr>>().Data();
  info.This().As<Napi::Object>().TypeTag(&kBufferObjectTag);
}

Napi::Object NativeBuffer::Wrap(Napi::Env env, BufferPtr buf) {
  BufferPtr holder = std::move(buf);
  auto ext = Napi::External<BufferPtr>::New(env, &holder);
  ext.TypeTag(&kBufferHandleTag);
  return data(env).buffer_ctor.New({ext});
}

BufferPtr NativeBuffer::From(const Napi::Value& value, const char* arg) {
  Napi::Env env = value.Env();
  if (!value.IsObject() || !value.As<Napi::Object>().InstanceOf(data(env).buffer_ctor.Value())) {
    throw type_error(std::string("Expected ") + arg + " to be a native buffer but received " + describe(value));
  }
  // InstanceOf only asks the prototype chain: Object.create(NativeBuffer.prototype) passes it.
  if (!value.As<Napi::Object>().CheckTypeTag(&kBufferObjectTag)) {
    throw type_error(std::string("Expected ") + arg +
                     " to be a native buffer made by the addon but received an object with its prototype only");
  }
  NativeBuffer* nb = NativeBuffer::Unwrap(value.As<Napi::Object>());
  if (!nb->buf_) throw type_error(std::string("Expected ") + arg + " to be a live tensor but it was disposed");
  return nb->buf_;
}

Napi::Value NativeBuffer::Release(const Napi::CallbackInfo& info) {
  buf_.reset();
  return info.Env().Undefined();
}

// A second handle on the same buffer (an autograd context keeps its inputs this way, so the caller
// may dispose its own tensors before the backward).
Napi::Value NativeBuffer::Share(const Napi::CallbackInfo& info) {
  if (!buf_) throw Napi::TypeError::New(info.Env(), "Expected a live tensor but it was disposed");
  return Wrap(info.Env(), buf_);
}

Napi::Value NativeBuffer::GetBytes(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), buf_ ? static_cast<double>(buf_->bytes()) : 0.0);
}

Napi::Value NativeBuffer::GetDevice(const Napi::CallbackInfo& info) {
  return buf_ ? Napi::Number::New(info.Env(), static_cast<int>(buf_->device())) : info.Env().Undefined();
}

Napi::Value NativeBuffer::GetDtype(const Napi::CallbackInfo& info) {
  return buf_ ? Napi::Number::New(info.Env(), static_cast<int>(buf_->dtype())) : info.Env().Undefined();
}

Napi::Value NativeBuffer::GetReleased(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), !buf_);
}

void throw_too_many_args(Napi::Env env, size_t max_args, size_t got) {
  throw Napi::TypeError::New(env, "Expected at most " + std::to_string(max_args) + " argument" +
                                      (max_args == 1 ? "" : "s") + " but received " + std::to_string(got));
}

// isNativeBuffer(value): whether value is a NativeBuffer the addon made (its type tag), for lib/'s
// Tensor constructor, which must not adopt an imitation (its finalizer would call into it).
Napi::Value IsNativeBuffer(const Napi::CallbackInfo& info) {
  const Napi::Value v = info[0];
  return Napi::Boolean::New(info.Env(), v.IsObject() && v.As<Napi::Object>().CheckTypeTag(&kBufferObjectTag));
}

// ---- build and CPU description ----

// Why this build has no CUDA (runtime/build_info.h): "disabled" (FA_CUDA=0), "nvcc-not-found",
// "cudart-not-found" (nvcc without libcudart_static.a), or "unknown" (a build that did not go through
// build-config.js). Null in a CUDA build.
Napi::Value CpuOnlyReason(Napi::Env env) {
#ifdef FA_WITH_CUDA
  return env.Null();
#else
  return Napi::String::New(env, kCpuOnlyReason);
#endif
}

// ---- module ----

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  auto* d = new AddonData();
  d->runtime = std::make_unique<Runtime>();
  env.SetInstanceData<AddonData>(d);  // deleted (runtime drained) when the environment shuts down
  Napi::Function ctor = NativeBuffer::Define(env);
  d->buffer_ctor = Napi::Persistent(ctor);
  exports.Set("NativeBuffer", ctor);
  exports.Set("isNativeBuffer", Napi::Function::New<guarded<IsNativeBuffer, 1>>(env, "isNativeBuffer"));
  exports.Set("cudaCompiled", Napi::Boolean::New(env, Runtime::cuda_compiled()));
  exports.Set("cpuOnlyReason", CpuOnlyReason(env));
  exports.Set("cpuThreads", Napi::Number::New(env, d->runtime->pool().size()));
  // The instruction-set variant the CPU attention and matmul kernels run: they take
  // cpu::detected_isa() (cpu/cpu_isa.h), the best one this CPU and OS support.
  exports.Set("cpuSimd", Napi::String::New(env, cpu::isa_name(cpu::detected_isa())));
  InitTensorOps(env, exports);
  InitAttentionOps(env, exports);
  InitTimingOps(env, exports);
  InitTrainOps(env, exports);
  InitNnOps(env, exports);
  return exports;
}

}  // namespace fa::napi

// Context-aware (NAPI_MODULE_INIT): each environment, the main thread's and each worker's, gets its
// own AddonData.
static Napi::Object InitModule(Napi::Env env, Napi::Object exports) {
  return fa::napi::Init(env, exports);
}
NODE_API_MODULE(flash_attn_node, InitModule)
