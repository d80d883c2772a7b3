// attentionForward / attentionBackward: re-validate what lib/ validated, fill the plain params
// struct, and queue the backend's launcher on the device's stream.
#include <cmath>
#include <limits>

#include "common/attention_params.h"
#include "cpu/flash_cpu.h"
#include "napi/addon.h"
#include "napi/dispatch.h"
#include "runtime/format.h"
#ifdef FA_WITH_CUDA
#include "cuda/flash/flash_bwd.h"
#include "cuda/flash/flash_bwd_fp32.h"
#include "cuda/flash/flash_fwd.h"
#include "cuda/flash/flash_fwd_fp32.h"
#include "cuda/naive_attention.h"
#endif

namespace fa::napi {

namespace {

// Which implementation runs. The numbers are part of the JS contract (lib/native.ts).
enum class Kernel : int32_t {
  kAuto = 0,   // the fastest available on the device
  kFlash = 1,  // FlashAttention-2 (CPU: csrc/cpu; CUDA: csrc/cuda/flash)
  kNaive = 2,  // CUDA only: fp32 reference that materialises S (csrc/cuda/naive_attention.cu)
};

// How the CUDA FA2 backward computes dq. The numbers are part of the JS contract (lib/native.ts).
enum class BwdAlgorithm : int32_t {
  kAuto = 0,          // the single kernel, for now (bench/RESULTS.md, session 3: two kernels measured 0.97x its time)
  kSingleKernel = 1,  // dK, dV and dQ in one kernel, dQ through atomic (or ordered) adds
  kTwoKernel = 2,     // a dK/dV kernel, then a dQ kernel (Hopper, head dims 32 / 64 / 128)
};

constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
constexpr int64_t kMaxHeadDim = 256;
constexpr int64_t kHeadDimMultiple = 8;

struct Dims {
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
};

Dims dims_arg(const Napi::Value& v) {
  if (!v.IsArray() || v.As<Napi::Array>().Length() != 6) {
    throw type_error(
        "Expected dims to be an Array of 6 [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim] but received " +
        describe(v));
  }
  auto a = v.As<Napi::Array>();
  Dims d{};
  d.batch = int_arg(a.Get(0u), "batch", 1, kMaxDim);
  d.seqlen_q = int_arg(a.Get(1u), "seqlenQ", 1, kMaxDim);
  d.seqlen_k = int_arg(a.Get(2u), "seqlenK", 1, kMaxDim);
  d.heads_q = int_arg(a.Get(3u), "headsQ", 1, kMaxDim);
  d.heads_kv = int_arg(a.Get(4u), "headsKV", 1, kMaxDim);
  d.head_dim = int_arg(a.Get(5u), "headDim", kHeadDimMultiple, kMaxHeadDim);
  if (d.head_dim % kHeadDimMultiple != 0) {
    throw range_error("Expected headDim to be a multiple of 8 in [8, 256] but received " + std::to_string(d.head_dim));
  }
  if (d.heads_q % d.heads_kv != 0) {
    throw range_error("Expected headsQ to be a multiple of headsKV (" + std::to_string(d.heads_kv) + ") but received " +
                      std::to_string(d.heads_q));
  }
  return d;
}

void expect_buffer(const BufferPtr& b, const char* arg, Device device, DType dtype, int64_t numel) {
  if (b->device() != device) {
    throw type_error(std::string("Expected ") + arg + " to be on device '" + device_name(device) + "' but received '" +
                     device_name(b->device()) + "'");
  }
  if (b->dtype() != dtype) {
    throw type_error(std::string("Expected ") + arg + " to have dtype " + dtype_name(dtype) + " but received " +
                     dtype_name(b->dtype()));
  }
  if (b->numel() != static_cast<size_t>(numel)) {
    throw range_error(std::string("Expected ") + arg + " to hold " + std::to_string(numel) + " elements but it holds " +
                      std::to_string(b->numel()));
  }
}

float scale_arg(const Napi::Value& v) {
  double s = number_arg(v, "softmaxScale");
  // The kernels use softmaxScale * log2(e) in float32: it must be a positive finite float32 too.
  const float scale_log2 = static_cast<float>(s) * kLog2e;
  if (!std::isfinite(s) || s <= 0.0 || static_cast<float>(s) <= 0.0f || !std::isfinite(scale_log2)) {
    throw range_error("Expected softmaxScale to be a finite number > 0 and < 2.3e38 but received " +
                      v.ToString().Utf8Value());
  }
  return static_cast<float>(s);
}

Kernel kernel_arg(const Napi::Value& v) {
  return static_cast<Kernel>(int_arg(v, "kernel", 0, 2));
}

// The Fp32Precision code (common/attention_params.h; lib/native.ts FLOAT32_PRECISION_CODE).
BwdAlgorithm algorithm_arg(const Napi::Value& v) {
  return static_cast<BwdAlgorithm>(int_arg(v, "algorithm", static_cast<int64_t>(BwdAlgorithm::kAuto),
                                           static_cast<int64_t>(BwdAlgorithm::kTwoKernel)));
}

Fp32Precision fp32_precision_arg(const Napi::Value& v) {
  return static_cast<Fp32Precision>(int_arg(v, "float32Precision", static_cast<int64_t>(Fp32Precision::kTf32),
                                            static_cast<int64_t>(Fp32Precision::kHighest)));
}

void fill_fwd_params(AttentionFwdParams& p, const Dims& d, DType dtype, float scale, bool causal) {
  p.batch = d.batch;
  p.seqlen_q = d.seqlen_q;
  p.seqlen_k = d.seqlen_k;
  p.heads_q = d.heads_q;
  p.heads_kv = d.heads_kv;
  p.head_dim = d.head_dim;
  set_contiguous_strides(d.seqlen_q, d.heads_q, d.head_dim, &p.q_batch_stride, &p.q_row_stride, &p.q_head_stride);
  set_contiguous_strides(d.seqlen_k, d.heads_kv, d.head_dim, &p.k_batch_stride, &p.k_row_stride, &p.k_head_stride);
  set_contiguous_strides(d.seqlen_k, d.heads_kv, d.head_dim, &p.v_batch_stride, &p.v_row_stride, &p.v_head_stride);
  set_contiguous_strides(d.seqlen_q, d.heads_q, d.head_dim, &p.o_batch_stride, &p.o_row_stride, &p.o_head_stride);
  p.dtype = dtype;
  p.softmax_scale = scale;
  p.scale_log2 = scale * kLog2e;
  p.causal = causal;
}

// Picks the implementation for the call, or throws why the requested one cannot run there.
// `flash_ok`: whether a FlashAttention-2 kernel exists for this device and problem.
Kernel resolve_kernel(Kernel k, Device device, bool flash_ok, const char* what) {
  if (device == Device::kCpu) {
    if (k == Kernel::kNaive) {
      throw range_error(
          "Expected kernel to be 'auto' or 'flash' on device 'cpu' but received 'naive' (the naive kernel runs on "
          "CUDA; on the CPU the float64 reference is referenceAttention)");
    }
    return Kernel::kFlash;
  }
  if (k == Kernel::kFlash && !flash_ok) {
    throw range_error(std::string("Expected kernel to be 'auto' or 'naive' for this call but received 'flash': ") +
                      what);
  }
  // On CUDA 'auto' takes FlashAttention-2 wherever it has a kernel for the call, and the naive
  // reference otherwise (float32 and deterministic backwards, GPUs without enough shared memory).
  if (k == Kernel::kAuto) return flash_ok ? Kernel::kFlash : Kernel::kNaive;
  return k;
}

const char* kernel_name(Kernel k) {
  return k == Kernel::kNaive ? "naive" : "flash";
}

// attentionForward(q, k, v, dims, causal, softmaxScale, kernel, float32Precision): [out, lse, kernel]
Napi::Value AttentionForward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  BufferPtr q = NativeBuffer::From(info[0], "q");
  BufferPtr k = NativeBuffer::From(info[1], "k");
  BufferPtr v = NativeBuffer::From(info[2], "v");
  const Dims d = dims_arg(info[3]);
  const bool causal = bool_arg(info[4], "causal");
  const float scale = scale_arg(info[5]);
  const Device device = q->device();
  const DType dtype = q->dtype();
  expect_float(dtype, "q");
  const int64_t q_numel = checked_numel({d.batch, d.seqlen_q, d.heads_q, d.head_dim}, "q");
  const int64_t kv_numel = checked_numel({d.batch, d.seqlen_k, d.heads_kv, d.head_dim}, "k");
  const int64_t lse_numel = checked_numel({d.batch, d.heads_q, d.seqlen_q}, "lse");
  expect_buffer(q, "q", device, dtype, q_numel);
  expect_buffer(k, "k", device, dtype, kv_numel);
  expect_buffer(v, "v", device, dtype, kv_numel);
  const Kernel requested = kernel_arg(info[6]);
  const Fp32Precision fp32_precision = fp32_precision_arg(info[7]);

  BufferPtr out = rt.allocate(device, dtype, q_numel * dtype_size(dtype), true);
  BufferPtr lse = rt.allocate(device, DType::kFloat32, lse_numel * sizeof(float), true);
  AttentionFwdParams p;
  fill_fwd_params(p, d, dtype, scale, causal);
  p.q = q->data();
  p.k = k->data();
  p.v = v->data();
  p.out = out->data();
  p.lse = static_cast<float*>(lse->data());
  p.fp32_precision = fp32_precision;  // read by the CUDA float32 FA2 forward only
  bool flash_ok = device == Device::kCpu;
  const char* flash_unsupported =
      "the CUDA FlashAttention-2 forward needs a GPU of compute capability 8.0 (sm_80) or newer";
#ifdef FA_WITH_CUDA
  if (device == Device::kCuda && dtype == DType::kFloat32) {
    const char* reason = cuda::flash_fwd_fp32_unsupported_reason(p);
    flash_ok = reason == nullptr;
    if (reason != nullptr) flash_unsupported = reason;
  } else if (device == Device::kCuda) {
    flash_ok = cuda::flash_fwd_supported(p);
  }
#endif
  [[maybe_unused]] const Kernel kernel = resolve_kernel(requested, device, flash_ok, flash_unsupported);

  if (device == Device::kCpu) {
    cpu::ThreadPool* pool = &rt.pool();
    submit_cpu(rt, {q, k, v}, {out, lse}, [p, pool] { cpu::flash_fwd(p, *pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    if (kernel == Kernel::kFlash && dtype == DType::kFloat32) {
      check_launch(rt, cuda::flash_fwd_fp32(p, rt.cuda().stream()), "FlashAttention-2 forward (float32)", 0);
    } else if (kernel == Kernel::kFlash) {
      check_launch(rt, cuda::flash_fwd(p, rt.cuda().stream()), "FlashAttention-2 forward", 0);
    } else {
      check_launch(rt, cuda::naive_attention_fwd(p, rt.cuda().stream()), "naive attention forward",
                   cuda::naive_attention_fwd_workspace_bytes(p));
    }
#endif
  }
  Napi::Array result = Napi::Array::New(env, 3);
  result.Set(0u, NativeBuffer::Wrap(env, out));
  result.Set(1u, NativeBuffer::Wrap(env, lse));
  result.Set(2u, Napi::String::New(env, kernel_name(kernel)));
  return result;
}

// attentionBackward(dout, q, k, v, out, lse, dims, causal, softmaxScale, kernel, deterministic, algorithm,
// float32Precision): [dq, dk, dv, kernel, algorithm] (the last two resolved: 'flash' | 'naive',
// 'single-kernel' | 'two-kernel')
Napi::Value AttentionBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  BufferPtr dout = NativeBuffer::From(info[0], "dout");
  BufferPtr q = NativeBuffer::From(info[1], "q");
  BufferPtr k = NativeBuffer::From(info[2], "k");
  BufferPtr v = NativeBuffer::From(info[3], "v");
  BufferPtr out = NativeBuffer::From(info[4], "out");
  BufferPtr lse = NativeBuffer::From(info[5], "lse");
  const Dims d = dims_arg(info[6]);
  const bool causal = bool_arg(info[7], "causal");
  const float scale = scale_arg(info[8]);
  const Kernel requested = kernel_arg(info[9]);
  const bool deterministic = bool_arg(info[10], "deterministic");
  const BwdAlgorithm algorithm = algorithm_arg(info[11]);
  const Fp32Precision fp32_precision = fp32_precision_arg(info[12]);
  const Device device = q->device();
  const DType dtype = q->dtype();
  expect_float(dtype, "q");
  const int64_t q_numel = checked_numel({d.batch, d.seqlen_q, d.heads_q, d.head_dim}, "q");
  const int64_t kv_numel = checked_numel({d.batch, d.seqlen_k, d.heads_kv, d.head_dim}, "k");
  const int64_t lse_numel = checked_numel({d.batch, d.heads_q, d.seqlen_q}, "lse");
  expect_buffer(q, "q", device, dtype, q_numel);
  expect_buffer(k, "k", device, dtype, kv_numel);
  expect_buffer(v, "v", device, dtype, kv_numel);
  expect_buffer(out, "out", device, dtype, q_numel);
  expect_buffer(dout, "dout", device, dtype, q_numel);
  expect_buffer(lse, "lse", device, DType::kFloat32, lse_numel);
  AttentionBwdParams p;
  fill_fwd_params(p, d, dtype, scale, causal);
  p.q = q->data();
  p.k = k->data();
  p.v = v->data();
  p.out = out->data();
  p.dout = dout->data();
  p.lse_in = static_cast<const float*>(lse->data());
  p.deterministic = deterministic;
  p.two_kernel = algorithm == BwdAlgorithm::kTwoKernel;
  p.fp32_precision = fp32_precision;
  bool flash_ok = device == Device::kCpu;
  const char* flash_unsupported =
      "the CUDA FlashAttention-2 backward needs a GPU of compute capability 8.0 (sm_80) or newer";
#ifdef FA_WITH_CUDA
  if (device == Device::kCuda) {
    // The gradients are allocated below by the pool (256-byte aligned, contiguous): the checks' other
    // inputs decide.
    if (algorithm == BwdAlgorithm::kAuto && dtype != DType::kFloat32) {
      // 'auto' takes the two-kernel backward wherever it exists (Hopper, head dims 32 / 64 / 128 after
      // padding): on an H200 it took 0.97x the single kernel's time over the bf16 FA2 grid (0.93-1.03x per
      // cell, bench/RESULTS.md session 3), needs no fp32 dq accumulator and is deterministic.
      p.two_kernel = true;
      if (cuda::flash_bwd_unsupported_reason(p) != nullptr) p.two_kernel = false;
    }
    const char* reason = dtype != DType::kFloat32 ? cuda::flash_bwd_unsupported_reason(p)
                         : p.two_kernel ? "the two-kernel backward takes float16 and bfloat16 inputs (float32 has "
                                          "the single-kernel one)"
                                        : cuda::flash_bwd_fp32_unsupported_reason(p);
    flash_ok = reason == nullptr;
    if (reason != nullptr) flash_unsupported = reason;
  }
#endif
  const Kernel kernel = resolve_kernel(requested, device, flash_ok, flash_unsupported);
  if (algorithm == BwdAlgorithm::kTwoKernel && (device == Device::kCpu || kernel != Kernel::kFlash)) {
    const std::string why = device == Device::kCpu ? "the CPU backend has one backward algorithm"
                            : flash_ok             ? "kernel 'naive' has one backward algorithm"
                                                   : flash_unsupported;
    throw range_error("Expected algorithm to be 'auto' or 'single-kernel' for this call but received 'two-kernel': " +
                      why);
  }

  BufferPtr dq = rt.allocate(device, dtype, q_numel * dtype_size(dtype), true);
  BufferPtr dk = rt.allocate(device, dtype, kv_numel * dtype_size(dtype), true);
  BufferPtr dv = rt.allocate(device, dtype, kv_numel * dtype_size(dtype), true);
  p.dq = dq->data();
  p.dk = dk->data();
  p.dv = dv->data();

  if (device == Device::kCpu) {
    cpu::ThreadPool* pool = &rt.pool();
    submit_cpu(rt, {dout, q, k, v, out, lse}, {dq, dk, dv}, [p, pool] { cpu::flash_bwd(p, *pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    if (kernel == Kernel::kFlash && dtype == DType::kFloat32) {
      check_launch(rt, cuda::flash_bwd_fp32(p, rt.cuda().stream()), "FlashAttention-2 backward (float32)",
                   cuda::flash_bwd_fp32_workspace_bytes(p));
    } else if (kernel == Kernel::kFlash) {
      check_launch(rt, cuda::flash_bwd(p, rt.cuda().stream()), "FlashAttention-2 backward",
                   cuda::flash_bwd_workspace_bytes(p));
    } else {
      check_launch(rt, cuda::naive_attention_bwd(p, rt.cuda().stream()), "naive attention backward",
                   cuda::naive_attention_bwd_workspace_bytes(p));
    }
#endif
  }
  Napi::Array result = Napi::Array::New(env, 5);
  result.Set(0u, NativeBuffer::Wrap(env, dq));
  result.Set(1u, NativeBuffer::Wrap(env, dk));
  result.Set(2u, NativeBuffer::Wrap(env, dv));
  result.Set(3u, Napi::String::New(env, kernel_name(kernel)));
  const bool two_kernel = kernel == Kernel::kFlash && device == Device::kCuda && p.two_kernel;
  result.Set(4u, Napi::String::New(env, two_kernel ? "two-kernel" : "single-kernel"));
  return result;
}

}  // namespace

void InitAttentionOps(Napi::Env env, Napi::Object exports) {
  exports.Set("attentionForward", Napi::Function::New<guarded<AttentionForward>>(env, "attentionForward"));
  exports.Set("attentionBackward", Napi::Function::New<guarded<AttentionBackward>>(env, "attentionBackward"));
}

}  // namespace fa::napi
