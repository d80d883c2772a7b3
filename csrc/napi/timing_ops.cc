// Device-side timing of queued work, for the benchmark: timerStart(device) marks the current end
// of the device's stream; timerStop(timer) marks it again and resolves with the milliseconds
// between the two marks. On CUDA the marks are timing events on the compute stream (GPU time of
// the work queued in between); on the CPU backend the first mark is the host clock at the call and
// the second is when the executor finished the queued work.
#include <chrono>

#include "napi/addon.h"

namespace fa::napi {

namespace {

struct Timer {
  Device device = Device::kCpu;
  std::chrono::steady_clock::time_point t0;
  bool stopped = false;
#ifdef FA_WITH_CUDA
  cudaEvent_t start = nullptr;  // owned until timerStop hands it to the worker
#endif
};

void finalize_timer(Napi::Env, Timer* t) {
#ifdef FA_WITH_CUDA
  if (!t->stopped && t->start) cudaEventDestroy(t->start);
#endif
  delete t;
}

// timerStart(device): an opaque timer handle.
Napi::Value TimerStart(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  auto* t = new Timer();
  t->device = device_arg(info[0], "device");
  try {
    if (t->device == Device::kCuda) {
#ifdef FA_WITH_CUDA
      t->start = rt.cuda().record_timing_event();
#else
      throw Error("Expected device 'cuda' to be available but this build has no CUDA support");
#endif
    }
  } catch (...) {
    delete t;
    throw;
  }
  t->t0 = std::chrono::steady_clock::now();
  auto handle = Napi::External<Timer>::New(env, t, finalize_timer);
  handle.TypeTag(&kTimerTag);
  return handle;
}

class TimerWorker : public PromiseWorker {
 public:
  TimerWorker(Napi::Env env, Runtime& rt, Timer* t)
      : PromiseWorker(env, "flash-attn-node:timer"),
        rt_(rt),
        t0_(t->t0),
        deferred_(Napi::Promise::Deferred::New(env)) {
#ifdef FA_WITH_CUDA
    if (t->device == Device::kCuda) {
      stop_ = rt_.cuda().record_timing_event();
      start_ = t->start;
      t->start = nullptr;
    }
#endif
    if (t->device == Device::kCpu) fence_ = rt_.fence(Device::kCpu);
    t->stopped = true;
  }
  Napi::Promise Promise() {
    return deferred_.Promise();
  }
  void Execute() override {
#ifdef FA_WITH_CUDA
    if (stop_) {
      float ms = 0.0f;
      std::string err = rt_.memory().cuda()->elapsed_ms(start_, stop_, &ms);
      if (!err.empty()) return SetError(err);
      ms_ = ms;
      return;
    }
#endif
    std::string err = rt_.wait(fence_);
    if (!err.empty()) return SetError(err);
    ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
  }
  void OnOK() override {
    deferred_.Resolve(Napi::Number::New(Env(), ms_));
  }
  void OnError(const Napi::Error& e) override {
    deferred_.Reject(e.Value());
  }

 private:
  Runtime& rt_;
  std::chrono::steady_clock::time_point t0_;
  Napi::Promise::Deferred deferred_;
  Fence fence_;
  double ms_ = 0.0;
#ifdef FA_WITH_CUDA
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
#endif
};

// timerStop(timer): Promise<number> (milliseconds). A timer stops once.
Napi::Value TimerStop(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsExternal() || !info[0].As<Napi::External<Timer>>().CheckTypeTag(&kTimerTag))
    throw type_error("Expected timer to be a handle from timerStart but received " + describe(info[0]));
  Timer* t = info[0].As<Napi::External<Timer>>().Data();
  if (t->stopped) throw Error("Expected timer to be running but it was already stopped");
  auto* w = new TimerWorker(env, runtime(env), t);
  Napi::Promise p = w->Promise();
  w->Queue();
  return p;
}

}  // namespace

void InitTimingOps(Napi::Env env, Napi::Object exports) {
  exports.Set("timerStart", Napi::Function::New<guarded<TimerStart, 1>>(env, "timerStart"));
  exports.Set("timerStop", Napi::Function::New<guarded<TimerStop, 1>>(env, "timerStop"));
}

}  // namespace fa::napi
