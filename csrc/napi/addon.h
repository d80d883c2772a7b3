// The Node-API surface. JS values are converted into plain structs on the JS thread, re-validated
// here (C++ never trusts a length or a shape from JS), and the work is queued on the device's
// stream; results come back through Promises resolved off the event loop's critical path.
#pragma once
#include <napi.h>

#include <memory>
#include <string>

#include "runtime/error.h"
#include "runtime/runtime.h"

namespace fa::napi {

// Type tags (napi_type_tag_object) of every object and External the addon hands to JS, checked
// wherever one comes back: the raw binding is reachable from user code, and an External or an
// object of another kind (a timer handle passed as a buffer handle, an object made with
// NativeBuffer.prototype) must be refused with a TypeError, never dereferenced as the wrong type.
inline constexpr napi_type_tag kBufferHandleTag = {0x6a1c2f0e9b3d4a57ULL, 0x8e21c4b7d05f9a13ULL};  // External<BufferPtr>
inline constexpr napi_type_tag kBufferObjectTag = {0x3f84d2a96c1e7b05ULL, 0xb7590e3ad2c84f61ULL};  // NativeBuffer
inline constexpr napi_type_tag kTimerTag = {0xc02e5b917a4df368ULL, 0x51d9f7260e8ba4c3ULL};         // External<Timer>

// A JS handle on one Buffer. JS `Tensor` objects (lib/tensor.ts) hold one each; `release()` drops
// the handle's reference (the buffer is freed when queued work on it is done).
class NativeBuffer : public Napi::ObjectWrap<NativeBuffer> {
 public:
  static Napi::Function Define(Napi::Env env);
  explicit NativeBuffer(const Napi::CallbackInfo& info);
  // Wraps `buf` in a new JS object (the constructor is not callable from JS with arguments).
  static Napi::Object Wrap(Napi::Env env, BufferPtr buf);
  // Unwraps `value`, throwing a TypeError naming `arg` if it is not a live NativeBuffer.
  static BufferPtr From(const Napi::Value& value, const char* arg);

 private:
  Napi::Value Release(const Napi::CallbackInfo& info);
  Napi::Value Share(const Napi::CallbackInfo& info);
  Napi::Value GetBytes(const Napi::CallbackInfo& info);
  Napi::Value GetDevice(const Napi::CallbackInfo& info);
  Napi::Value GetDtype(const Napi::CallbackInfo& info);
  Napi::Value GetReleased(const Napi::CallbackInfo& info);

  BufferPtr buf_;
};

// Per-environment state (main thread and each worker get their own).
struct AddonData {
  std::unique_ptr<Runtime> runtime;
  Napi::FunctionReference buffer_ctor;
};

AddonData& data(Napi::Env env);
Runtime& runtime(Napi::Env env);

// The base of the addon's AsyncWorkers, which settle promises. When a worker thread exits (or is
// terminated) with one of its promises pending, the work completes after its environment stopped
// running JavaScript: settling the promise fails, node-addon-api throws a Napi::Error out of the
// completion callback, and the process aborted ("terminate called after throwing ..."). Here that
// completion drops the result and releases the worker instead (test/load.test.ts, bug D).
class PromiseWorker : public Napi::AsyncWorker {
 protected:
  using Napi::AsyncWorker::AsyncWorker;
  void OnWorkComplete(Napi::Env env, napi_status status) override {
    try {
      Napi::AsyncWorker::OnWorkComplete(env, status);
    } catch (const Napi::Error&) {
      Destroy();  // the base threw before its own Destroy(): nothing can be settled any more
    }
  }
};

// Maps a C++ exception to the matching JS error and throws it.
[[noreturn]] void rethrow_as_js(Napi::Env env, const std::exception& e);

// A TypeError for a call with more than `max_args` arguments (extra arguments are refused, not
// ignored: a binding called with the wrong signature must not run with part of it).
[[noreturn]] void throw_too_many_args(Napi::Env env, size_t max_args, size_t got);

// Every exported function is registered through guarded<>: it refuses more than kMaxArgs arguments
// (the signature in lib/native.ts), and C++ exceptions become JS errors.
template <Napi::Value (*Fn)(const Napi::CallbackInfo&), size_t kMaxArgs>
Napi::Value guarded(const Napi::CallbackInfo& info) {
  if (info.Length() > kMaxArgs) throw_too_many_args(info.Env(), kMaxArgs, info.Length());
  try {
    return Fn(info);
  } catch (const Napi::Error&) {
    throw;
  } catch (const std::exception& e) {
    rethrow_as_js(info.Env(), e);
  }
}

// "0.5 of type number", "\"x\" of type string", "an Array of length 3", "null": for error messages.
std::string describe(const Napi::Value& v);

// Argument helpers: each throws a TypeError/RangeError that names the argument.
Device device_arg(const Napi::Value& v, const char* arg);
DType dtype_arg(const Napi::Value& v, const char* arg);
int64_t int_arg(const Napi::Value& v, const char* arg, int64_t min, int64_t max);
double number_arg(const Napi::Value& v, const char* arg);
bool bool_arg(const Napi::Value& v, const char* arg);

// Exports of each source file.
void InitTensorOps(Napi::Env env, Napi::Object exports);
void InitAttentionOps(Napi::Env env, Napi::Object exports);
void InitTimingOps(Napi::Env env, Napi::Object exports);
void InitTrainOps(Napi::Env env, Napi::Object exports);  // embedding, linear, cross-entropy, AdamW, reductions
void InitNnOps(Napi::Env env, Napi::Object exports);     // norms, RoPE, activations, residual add

}  // namespace fa::napi
