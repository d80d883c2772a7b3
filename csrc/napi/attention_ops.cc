// attentionForward / attentionBackward: read the one options object each takes into a snapshot,
// re-validate what lib/ validated, fill the plain params struct, and queue the backend's launcher on
// the device's stream.
#include <cmath>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/attention_params.h"
#include "cpu/flash_cpu.h"
#include "napi/addon.h"
#include "napi/copy_ops.h"
#include "napi/dispatch.h"
#include "napi/options_arg.h"
#include "napi/view_args.h"
#include "runtime/format.h"
#ifdef FA_WITH_CUDA
#include "cuda/flash/flash_plan.h"
#include "cuda/naive_attention.h"
#endif

namespace fa::napi {

namespace {

// Which implementation runs. The numbers are part of the JS contract (csrc/enums.json).
enum class Kernel : int32_t {
  kAuto = codes::kKernelAuto,    // the fastest available on the device
  kFlash = codes::kKernelFlash,  // FlashAttention-2 (CPU: csrc/cpu; CUDA: csrc/cuda/flash)
  kNaive = codes::kKernelNaive,  // CUDA only: fp32 reference that materialises S (csrc/cuda/naive_attention.cu)
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

// One [batch, seqlen, heads, head_dim] tensor argument: its storage and its view (last stride 1).
struct AttnTensor {
  TensorArg t;
  ViewLayout v;
  void* data() const { return t.data(); }
  int64_t batch_stride() const { return v.strides[0]; }
  int64_t row_stride() const { return v.strides[1]; }
  int64_t head_stride() const { return v.strides[2]; }
};

// The [batch, row, head] strides of `count` tensors (`names`), read once from `value`: undefined
// (contiguous; returns false) or a JS Array of 3 * count integers (returns true, fills `out`).
bool strides_array_arg(const Napi::Value& value, std::initializer_list<const char*> names, const char* arg,
                       int64_t* out) {
  if (value.IsUndefined()) return false;
  const uint32_t count = static_cast<uint32_t>(names.size());
  if (!value.IsArray() || value.As<Napi::Array>().Length() != 3 * count) {
    throw type_error(std::string("Expected ") + arg + " to be undefined or an Array of " + std::to_string(3 * count) +
                     " [batch, row, head] strides but received " + describe(value));
  }
  auto arr = value.As<Napi::Array>();
  uint32_t i = 0;
  for (const char* name : names) {
    const std::string what = std::string(name) + " strides";
    for (uint32_t d = 0; d < 3; ++d, ++i) out[i] = int_arg(arr.Get(i), what.c_str(), 0, kMaxSafeInteger);
  }
  return true;
}

// The view of tensor `t` named `arg` with sizes [b, s, h, d] and the [batch, row, head] strides at
// `strides` (nullptr: contiguous). Checks the dtype, the device, that the view stays inside its
// storage and that its elements are distinct.
AttnTensor attn_tensor(const TensorArg& t, const int64_t* strides, const char* arg, const int64_t (&sizes)[4],
                       Device device, DType dtype) {
  AttnTensor a;
  a.t = t;
  a.v.rank = 4;
  for (int d = 0; d < 4; ++d) a.v.sizes[d] = sizes[d];
  if (strides == nullptr) {
    set_contiguous_strides(sizes[1], sizes[2], sizes[3], &a.v.strides[0], &a.v.strides[1], &a.v.strides[2]);
  } else {
    for (int d = 0; d < 3; ++d) a.v.strides[d] = strides[d];
  }
  a.v.strides[3] = 1;
  if (a.t.device() != device) {
    throw type_error(std::string("Expected ") + arg + " to be on device '" + device_name(device) + "' but received '" +
                     device_name(a.t.device()) + "'");
  }
  if (a.t.dtype() != dtype) {
    throw type_error(std::string("Expected ") + arg + " to have dtype " + dtype_name(dtype) + " but received " +
                     dtype_name(a.t.dtype()));
  }
  expect_view(a.t, arg, &a.v);
  return a;
}

// lse: contiguous float32 [batch, heads_q, seqlen_q] from `offset` of its buffer, as a rank-1 view.
AttnTensor lse_tensor(const TensorArg& t, Device device, int64_t numel) {
  AttnTensor a;
  a.t = t;
  expect_tensor(a.t, "lse", device, DType::kFloat32, numel);
  a.v.rank = 1;
  a.v.sizes[0] = numel;
  a.v.strides[0] = 1;
  a.v.offset = a.t.offset;
  return a;
}

void set_strides(const AttnTensor& a, int64_t* batch, int64_t* row, int64_t* head) {
  *batch = a.batch_stride();
  *row = a.row_stride();
  *head = a.head_stride();
}

// Whether a staging copy would make `a` readable by the FlashAttention-2 kernels: not contiguous, or
// its first element not 16-byte aligned (the alignment of their vector and TMA loads).
bool needs_staging(const AttnTensor& a) {
  return !view_contiguous(a.v) || reinterpret_cast<uintptr_t>(a.data()) % 16 != 0;
}

// A contiguous buffer for `a`'s elements, on a's device; as an input (copy_in) its data is copied in
// now, on the stream, before the kernel that reads it.
AttnTensor stage(Runtime& rt, const AttnTensor& a, bool copy_in) {
  AttnTensor c;
  const int64_t numel = numel_of(a.v);
  c.t.buf = rt.allocate(a.t.device(), a.t.dtype(), static_cast<size_t>(numel) * dtype_size(a.t.dtype()), !copy_in);
  c.v = a.v;
  c.v.offset = 0;
  set_contiguous_strides(a.v.sizes[1], a.v.sizes[2], a.v.sizes[3], &c.v.strides[0], &c.v.strides[1], &c.v.strides[2]);
  if (copy_in) enqueue_copy(rt, a.t.device(), make_copy_params(*c.t.buf, c.v, *a.t.buf, a.v), a.t.buf, c.t.buf);
  return c;
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

// options.softcap: undefined (none) or a finite number >= 0 that float32 holds (0: none).
float softcap_arg(const Napi::Value& v) {
  if (v.IsUndefined()) return 0.0f;
  const double c = number_arg(v, "softcap");
  const float cf = static_cast<float>(c);
  if (!std::isfinite(c) || c < 0.0 || !std::isfinite(cf) || (c > 0.0 && cf <= 0.0f)) {
    throw range_error("Expected softcap to be a finite number >= 0 (0: none) that float32 holds but received " +
                      v.ToString().Utf8Value());
  }
  return cf;
}

// options.window: undefined (none) or [left, right], integers in [-1, 2^53 - 1] (-1: that side unbounded).
struct Window {
  int64_t left = -1, right = -1;
  bool bounded() const { return left >= 0 || right >= 0; }
};
Window window_arg(const Napi::Value& v) {
  Window w;
  if (v.IsUndefined()) return w;
  if (!v.IsArray() || v.As<Napi::Array>().Length() != 2) {
    throw type_error("Expected window to be an Array of 2 [left, right] but received " + describe(v));
  }
  auto a = v.As<Napi::Array>();
  constexpr int64_t kMaxWindow = (int64_t{1} << 53) - 1;
  w.left = int_arg(a.Get(0u), "window[0] (left)", -1, kMaxWindow);
  w.right = int_arg(a.Get(1u), "window[1] (right)", -1, kMaxWindow);
  return w;
}

// options.alibiSlopes: undefined (none) or a Float32Array or Array of finite numbers that float32 holds:
// headsQ of them (one per query head, for every batch) or batch * headsQ. Copied, so that the call keeps
// them whatever the caller does with its array while the CPU work is queued.
struct Alibi {
  std::shared_ptr<const std::vector<float>> slopes;  // null: none
  int64_t batch_stride = 0;                          // 0 (per head) or headsQ
};
Alibi alibi_arg(const Napi::Value& v, const Dims& d) {
  Alibi a;
  if (v.IsUndefined()) return a;
  const char* const what =
      "Expected alibiSlopes to be a Float32Array or an Array of headsQ or batch * headsQ finite numbers";
  uint32_t n = 0;
  if (v.IsTypedArray() && v.As<Napi::TypedArray>().TypedArrayType() == napi_float32_array) {
    n = static_cast<uint32_t>(v.As<Napi::Float32Array>().ElementLength());
  } else if (v.IsArray()) {
    n = v.As<Napi::Array>().Length();
  } else {
    throw type_error(std::string(what) + " but received " + describe(v));
  }
  if (static_cast<int64_t>(n) != d.heads_q && static_cast<int64_t>(n) != d.batch * d.heads_q) {
    throw range_error(std::string(what) + " (" + std::to_string(d.heads_q) + " or " +
                      std::to_string(d.batch * d.heads_q) + ") but received " + std::to_string(n) + " of them");
  }
  auto slopes = std::make_shared<std::vector<float>>(n);
  for (uint32_t i = 0; i < n; ++i) {
    double x;
    if (v.IsTypedArray()) {
      x = v.As<Napi::Float32Array>()[i];
    } else {
      const Napi::Value e = v.As<Napi::Array>().Get(i);
      if (!e.IsNumber()) throw type_error(std::string(what) + " but element " + std::to_string(i) + " is " + describe(e));
      x = e.As<Napi::Number>().DoubleValue();
    }
    const float f = static_cast<float>(x);
    if (!std::isfinite(x) || !std::isfinite(f)) {
      throw range_error(std::string(what) + " but element " + std::to_string(i) + " is " + std::to_string(x));
    }
    (*slopes)[i] = f;
  }
  a.slopes = std::move(slopes);
  a.batch_stride = static_cast<int64_t>(n) == d.heads_q ? 0 : d.heads_q;
  return a;
}

Kernel kernel_arg(const Napi::Value& v) {
  return static_cast<Kernel>(int_arg(v, "kernel", 0, 2));
}

BwdAlgorithm algorithm_arg(const Napi::Value& v) {
  return static_cast<BwdAlgorithm>(int_arg(v, "algorithm", static_cast<int64_t>(BwdAlgorithm::kAuto),
                                           static_cast<int64_t>(BwdAlgorithm::kTwoKernel)));
}

// The Fp32Precision code (common/attention_params.h; lib/native.ts FLOAT32_PRECISION_CODE).
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

// The `plan` of a result (lib/attention.ts KernelPlan): the kernel family and, for a FlashAttention-2
// call on CUDA, its main kernel's row of the family's configuration table (flash_configs.h: the
// compiled head dim and the tile, checked against the kernel's traits at compile time). The CPU
// backend and the naive kernel report their family alone (the other fields null).
struct PlanReport {
  const char* family;
  int head_dim = 0, block_m = 0, block_n = 0, warps = 0, stages = 0;  // 0: not reported
};
Napi::Object plan_object(Napi::Env env, const PlanReport& r) {
  const auto number = [&](int v) { return v > 0 ? Napi::Value(Napi::Number::New(env, v)) : env.Null(); };
  Napi::Object o = Napi::Object::New(env);
  o.Set("family", Napi::String::New(env, r.family));
  o.Set("headDim", number(r.head_dim));
  o.Set("blockM", number(r.block_m));
  o.Set("blockN", number(r.block_n));
  o.Set("warps", number(r.warps));
  o.Set("stages", number(r.stages));
  return o;
}
#ifdef FA_WITH_CUDA
PlanReport flash_plan_report(cuda::FlashFamily family, const cuda::flash::FlashConfig& c) {
  return {cuda::family_name(family), c.head_dim, c.block_m, c.block_n, c.warps, c.stages};
}
#endif

// Strided views (q, k, v, out, dout, and the gradients written into given views): the CPU backend and
// the naive CUDA kernel read and write any strides the params struct holds. The CUDA
// FlashAttention-2 kernels (mma.sync, float32, Hopper wgmma + TMA) honour the strides too, but need
// every stride to be a multiple of 16 bytes and every base 16-byte aligned (vector loads and stores;
// the TMA descriptors of the Hopper kernels require both): their *_unsupported_reason checks say so.
// When a call breaks only that, the binding does not fall back to the naive kernel (N² memory): if
// the FlashAttention-2 kernel would run on contiguous data, it copies every input view that is not
// contiguous or not 16-byte aligned into a contiguous staging buffer (queued before the kernel), and
// computes every such given gradient into one that is copied into the view after the kernel. Staging
// buffers are freed stream-ordered at once. Views that meet the alignment are read in place.
// An explicit kernel 'naive' reads the views in place. lse and D stay contiguous.

// The options object of attentionForward, read once and converted (lib/native.ts
// NativeAttentionForwardArgs): everything the call uses comes from here, checked before anything is
// allocated.
// The keys both attention calls take, converted from their options snapshot.
struct AttnCallArgs {
  TensorArg q, k, v;
  Dims dims;
  bool causal;
  float scale;
  float softcap;  // 0: none
  Window window;
  Alibi alibi;
  Kernel kernel;
  Fp32Precision fp32_precision;
  bool has_strides;
};

void read_call_args(const OptionsSnapshot& o, AttnCallArgs& a) {
  a.q = tensor_arg(o["q"], "q");
  a.k = tensor_arg(o["k"], "k");
  a.v = tensor_arg(o["v"], "v");
  a.dims = dims_arg(o["dims"]);
  a.causal = bool_arg(o["causal"], "causal");
  a.scale = scale_arg(o["softmaxScale"]);
  a.softcap = softcap_arg(o["softcap"]);
  a.window = window_arg(o["window"]);
  a.alibi = alibi_arg(o["alibiSlopes"], a.dims);
  a.kernel = kernel_arg(o["kernel"]);
  a.fp32_precision = fp32_precision_arg(o["float32Precision"]);
}

// The score options the CUDA kernels do not take yet (softcap, window, ALiBi) run on the CPU backend
// only: a CUDA call with one is refused, naming it, before anything is allocated.
void refuse_cpu_only_options(const AttnCallArgs& a, Device device) {
  if (device == Device::kCpu) return;
  const auto refuse = [](const std::string& expected, const char* feature, const std::string& received) {
    throw range_error("Expected " + expected + " for CUDA tensors (the CUDA kernels do not take " + feature +
                      " yet; the CPU backend does) but received " + received);
  };
  if (a.softcap > 0.0f) refuse("softcap to be 0", "a softcap", std::to_string(a.softcap));
  if (a.window.bounded()) {
    refuse("window to be [-1, -1]", "a sliding window",
           "[" + std::to_string(a.window.left) + ", " + std::to_string(a.window.right) + "]");
  }
  if (a.alibi.slopes != nullptr) {
    refuse("alibiSlopes to be undefined", "ALiBi", std::to_string(a.alibi.slopes->size()) + " slopes");
  }
}

// The score options into the params of either pass (p.alibi_slopes points into a.alibi's copy, which
// the caller keeps alive until the work has run).
void set_score_options(AttentionFwdParams& p, const AttnCallArgs& a) {
  p.softcap = a.softcap;
  p.window_left = a.window.left;
  p.window_right = a.window.right;
  p.alibi_slopes = a.alibi.slopes != nullptr ? a.alibi.slopes->data() : nullptr;
  p.alibi_batch_stride = a.alibi.batch_stride;
}

struct ForwardArgs : AttnCallArgs {
  int64_t strides[9];  // [batch, row, head] of q, k, v when has_strides
};

ForwardArgs forward_args(const Napi::Value& value) {
  const OptionsSnapshot o(value, "options",
                          {{"q", true},
                           {"k", true},
                           {"v", true},
                           {"dims", true},
                           {"causal", true},
                           {"softmaxScale", true},
                           {"softcap", false},
                           {"window", false},
                           {"alibiSlopes", false},
                           {"kernel", true},
                           {"float32Precision", true},
                           {"strides", false}});
  ForwardArgs a;
  read_call_args(o, a);
  a.has_strides = strides_array_arg(o["strides"], {"q", "k", "v"}, "strides", a.strides);
  return a;
}

// attentionForward({ q, k, v, dims, causal, softmaxScale, softcap?, window?, alibiSlopes?, kernel, float32Precision,
// strides? }):
// [out, lse, kernel, plan]. One plain object (OptionsSnapshot: unknown keys and missing required ones are
// refused); q, k, v: tensors ([buffer, offset]); dims: [batch, seqlenQ, seqlenK, headsQ, headsKV,
// headDim]; kernel, float32Precision: codes of csrc/enums.json; strides: undefined (contiguous) or the
// [batch, row, head] strides of q, k, v, 9 integers (head_dim has stride 1). out is a new contiguous
// tensor; kernel the implementation that ran ('flash' | 'naive'); plan its family and tile (PlanReport).
Napi::Value AttentionForward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const ForwardArgs args = forward_args(info[0]);
  const Dims& d = args.dims;
  const bool causal = args.causal;
  const float scale = args.scale;
  const Device device = args.q.device();
  const DType dtype = args.q.dtype();
  expect_float(dtype, "q");
  refuse_cpu_only_options(args, device);
  const int64_t q_numel = checked_numel({d.batch, d.seqlen_q, d.heads_q, d.head_dim}, "q");
  checked_numel({d.batch, d.seqlen_k, d.heads_kv, d.head_dim}, "k");
  const int64_t lse_numel = checked_numel({d.batch, d.heads_q, d.seqlen_q}, "lse");
  const int64_t qs[4] = {d.batch, d.seqlen_q, d.heads_q, d.head_dim};
  const int64_t ks[4] = {d.batch, d.seqlen_k, d.heads_kv, d.head_dim};
  const auto strides_of = [&](int i) { return args.has_strides ? args.strides + 3 * i : nullptr; };
  AttnTensor q = attn_tensor(args.q, strides_of(0), "q", qs, device, dtype);
  AttnTensor k = attn_tensor(args.k, strides_of(1), "k", ks, device, dtype);
  AttnTensor v = attn_tensor(args.v, strides_of(2), "v", ks, device, dtype);
  const Kernel requested = args.kernel;
  const Fp32Precision fp32_precision = args.fp32_precision;

  AttentionFwdParams p;
  fill_fwd_params(p, d, dtype, scale, causal);
  set_score_options(p, args);
  const auto point_at = [&](AttentionFwdParams& pp) {
    set_strides(q, &pp.q_batch_stride, &pp.q_row_stride, &pp.q_head_stride);
    set_strides(k, &pp.k_batch_stride, &pp.k_row_stride, &pp.k_head_stride);
    set_strides(v, &pp.v_batch_stride, &pp.v_row_stride, &pp.v_head_stride);
    pp.q = q.data();
    pp.k = k.data();
    pp.v = v.data();
  };
  point_at(p);
  p.out = q.t.buf->data();  // stand-in for the kernel checks: out is a new pool allocation, aligned like it
  p.fp32_precision = fp32_precision;  // read by the CUDA float32 FA2 forward only
  bool flash_ok = device == Device::kCpu;
  bool stage_views = false;
  const char* flash_unsupported =
      "the CUDA FlashAttention-2 forward needs a GPU of compute capability 8.0 (sm_80) or newer";
#ifdef FA_WITH_CUDA
  cuda::FwdPlan plan;  // the planner's (cuda/flash/flash_plan.h), for the call as given or staged
  if (device == Device::kCuda) {
    plan = cuda::plan_forward(p);
    if (plan.unsupported != nullptr && requested != Kernel::kNaive &&
        (needs_staging(q) || needs_staging(k) || needs_staging(v))) {
      AttentionFwdParams dense = p;  // the same call on contiguous staging buffers (pool-aligned like q's storage)
      fill_fwd_params(dense, d, dtype, scale, causal);
      void* base = q.t.buf->data();
      dense.q = dense.k = dense.v = base;
      dense.out = base;
      dense.fp32_precision = fp32_precision;
      const cuda::FwdPlan staged = cuda::plan_forward(dense);
      if (staged.unsupported == nullptr) {
        plan = staged;
        stage_views = true;
      }
    }
    flash_ok = plan.unsupported == nullptr;
    if (plan.unsupported != nullptr) flash_unsupported = plan.unsupported;
  }
#endif
  [[maybe_unused]] const Kernel kernel = resolve_kernel(requested, device, flash_ok, flash_unsupported);

  BufferPtr out = rt.allocate(device, dtype, q_numel * dtype_size(dtype), true);
  BufferPtr lse = rt.allocate(device, DType::kFloat32, lse_numel * sizeof(float), true);
  if (stage_views && kernel == Kernel::kFlash) {
    for (AttnTensor* a : {&q, &k, &v})
      if (needs_staging(*a)) *a = stage(rt, *a, true);
    point_at(p);
  }
  p.out = out->data();
  p.lse = static_cast<float*>(lse->data());

  if (device == Device::kCpu) {
    cpu::ThreadPool* pool = &rt.pool();
    submit_cpu(rt, {q.t.buf, k.t.buf, v.t.buf}, {out, lse}, [p, pool, slopes = args.alibi.slopes] {
      (void)slopes;  // keeps p.alibi_slopes alive until the work has run
      cpu::flash_fwd(p, *pool);
    });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    if (kernel == Kernel::kFlash) {
      check_launch(rt, cuda::run_forward(p, plan, rt.cuda().stream()),
                   dtype == DType::kFloat32 ? "FlashAttention-2 forward (float32)" : "FlashAttention-2 forward",
                   plan.workspace_bytes);
    } else {
      check_launch(rt, cuda::naive_attention_fwd(p, rt.cuda().stream()), "naive attention forward",
                   cuda::naive_attention_fwd_workspace_bytes(p));
    }
#endif
  }
  PlanReport report{device == Device::kCpu ? "cpu" : "naive"};
#ifdef FA_WITH_CUDA
  if (device == Device::kCuda && kernel == Kernel::kFlash) report = flash_plan_report(plan.family, plan.config);
#endif
  Napi::Array result = Napi::Array::New(env, 4);
  result.Set(0u, NativeBuffer::Wrap(env, out));
  result.Set(1u, NativeBuffer::Wrap(env, lse));
  result.Set(2u, Napi::String::New(env, kernel_name(kernel)));
  result.Set(3u, plan_object(env, report));
  return result;
}

// The options object of attentionBackward, read once and converted (lib/native.ts
// NativeAttentionBackwardArgs).
struct BackwardArgs : AttnCallArgs {
  TensorArg dout, out, lse;
  bool deterministic;
  BwdAlgorithm algorithm;
  int64_t strides[15];  // [batch, row, head] of dout, q, k, v, out when has_strides
  bool given[3];        // whether grads holds a tensor for dq, dk, dv
  TensorArg grads[3];
  bool has_grad_strides;
  int64_t grad_strides[9];  // [batch, row, head] of dq, dk, dv when has_grad_strides
};

constexpr const char* kGradNames[3] = {"dq", "dk", "dv"};

BackwardArgs backward_args(const Napi::Value& value) {
  const OptionsSnapshot o(value, "options",
                          {{"dout", true},
                           {"q", true},
                           {"k", true},
                           {"v", true},
                           {"out", true},
                           {"lse", true},
                           {"dims", true},
                           {"causal", true},
                           {"softmaxScale", true},
                           {"softcap", false},
                           {"window", false},
                           {"alibiSlopes", false},
                           {"kernel", true},
                           {"deterministic", true},
                           {"algorithm", true},
                           {"float32Precision", true},
                           {"strides", false},
                           {"grads", false},
                           {"gradStrides", false}});
  BackwardArgs a;
  a.dout = tensor_arg(o["dout"], "dout");
  read_call_args(o, a);
  a.out = tensor_arg(o["out"], "out");
  a.lse = tensor_arg(o["lse"], "lse");
  a.deterministic = bool_arg(o["deterministic"], "deterministic");
  a.algorithm = algorithm_arg(o["algorithm"]);
  a.has_strides = strides_array_arg(o["strides"], {"dout", "q", "k", "v", "out"}, "strides", a.strides);
  const Napi::Value grads = o["grads"];
  for (int i = 0; i < 3; ++i) a.given[i] = false;
  if (!grads.IsUndefined()) {
    if (!grads.IsArray() || grads.As<Napi::Array>().Length() != 3) {
      throw type_error("Expected grads to be undefined or an Array of 3 [dq, dk, dv] (each a tensor or null) but "
                       "received " + describe(grads));
    }
    auto arr = grads.As<Napi::Array>();
    for (uint32_t i = 0; i < 3; ++i) {
      const Napi::Value g = arr.Get(i);
      if (g.IsNull() || g.IsUndefined()) continue;
      a.grads[i] = tensor_arg(g, kGradNames[i]);
      a.given[i] = true;
    }
  }
  const Napi::Value grad_strides = o["gradStrides"];
  if (grads.IsUndefined() && !grad_strides.IsUndefined()) {
    throw type_error("Expected gradStrides to be undefined when grads is undefined but received " +
                     describe(grad_strides));
  }
  a.has_grad_strides = strides_array_arg(grad_strides, {"dq", "dk", "dv"}, "gradStrides", a.grad_strides);
  return a;
}

// attentionBackward({ dout, q, k, v, out, lse, dims, causal, softmaxScale, softcap?, window?, alibiSlopes?, kernel,
// deterministic, algorithm, float32Precision, strides?, grads?, gradStrides? }): [dq, dk, dv, kernel, algorithm, plan]
// ('flash' | 'naive', 'single-kernel' | 'two-kernel', PlanReport: as run). One plain object, as for
// attentionForward. strides: undefined or 15 [batch, row, head] strides of dout, q, k, v, out. grads:
// undefined or [dq, dk, dv], each a tensor to write the gradient into (a view, e.g. of a packed dqkv)
// or null for a new contiguous tensor; gradStrides: their strides (9; undefined: contiguous), only
// with grads. A given gradient comes back as null.
Napi::Value AttentionBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const BackwardArgs args = backward_args(info[0]);
  const Dims& d = args.dims;
  const bool causal = args.causal;
  const float scale = args.scale;
  const Kernel requested = args.kernel;
  const bool deterministic = args.deterministic;
  const BwdAlgorithm algorithm = args.algorithm;
  const Fp32Precision fp32_precision = args.fp32_precision;
  const Device device = args.q.device();
  const DType dtype = args.q.dtype();
  expect_float(dtype, "q");
  refuse_cpu_only_options(args, device);
  const int64_t q_numel = checked_numel({d.batch, d.seqlen_q, d.heads_q, d.head_dim}, "q");
  const int64_t kv_numel = checked_numel({d.batch, d.seqlen_k, d.heads_kv, d.head_dim}, "k");
  const int64_t lse_numel = checked_numel({d.batch, d.heads_q, d.seqlen_q}, "lse");
  const int64_t qs[4] = {d.batch, d.seqlen_q, d.heads_q, d.head_dim};
  const int64_t ks[4] = {d.batch, d.seqlen_k, d.heads_kv, d.head_dim};
  const auto strides_of = [&](int i) { return args.has_strides ? args.strides + 3 * i : nullptr; };
  AttnTensor q = attn_tensor(args.q, strides_of(1), "q", qs, device, dtype);
  AttnTensor k = attn_tensor(args.k, strides_of(2), "k", ks, device, dtype);
  AttnTensor v = attn_tensor(args.v, strides_of(3), "v", ks, device, dtype);
  AttnTensor out = attn_tensor(args.out, strides_of(4), "out", qs, device, dtype);
  AttnTensor dout = attn_tensor(args.dout, strides_of(0), "dout", qs, device, dtype);
  const AttnTensor lse = lse_tensor(args.lse, device, lse_numel);

  // Gradients written into given views.
  AttnTensor grads[3];
  bool given[3] = {args.given[0], args.given[1], args.given[2]};
  for (int i = 0; i < 3; ++i) {
    if (!given[i]) continue;
    grads[i] = attn_tensor(args.grads[i], args.has_grad_strides ? args.grad_strides + 3 * i : nullptr, kGradNames[i],
                           i == 0 ? qs : ks, device, dtype);
  }
  const std::pair<const char*, const AttnTensor*> inputs[] = {{"dout", &dout}, {"q", &q}, {"k", &k},
                                                              {"v", &v},       {"out", &out}, {"lse", &lse}};
  for (int i = 0; i < 3; ++i) {
    if (!given[i]) continue;
    for (int j = 0; j < i; ++j) {
      if (given[j] && share_elements(grads[i].t, grads[i].v, grads[j].t, grads[j].v)) {
        throw range_error(std::string("Expected ") + kGradNames[i] + " not to share elements with " + kGradNames[j] +
                          " but it does");
      }
    }
    for (const auto& [name, in] : inputs) {
      if (share_elements(grads[i].t, grads[i].v, in->t, in->v)) {
        throw range_error(std::string("Expected ") + kGradNames[i] + " not to share elements with " + name +
                          " (an input of the backward) but it does");
      }
    }
  }
  // Gradients the call allocates: contiguous, pool-aligned (q's storage stands in for the checks).
  for (int i = 0; i < 3; ++i) {
    if (given[i]) continue;
    grads[i].t.buf = q.t.buf;
    grads[i].v.rank = 4;
    for (int e = 0; e < 4; ++e) grads[i].v.sizes[e] = (i == 0 ? qs : ks)[e];
    set_contiguous_strides(grads[i].v.sizes[1], grads[i].v.sizes[2], grads[i].v.sizes[3], &grads[i].v.strides[0],
                           &grads[i].v.strides[1], &grads[i].v.strides[2]);
    grads[i].v.strides[3] = 1;
  }

  AttentionBwdParams p;
  fill_fwd_params(p, d, dtype, scale, causal);
  set_score_options(p, args);
  const auto point_at = [&](AttentionBwdParams& pp) {
    set_strides(q, &pp.q_batch_stride, &pp.q_row_stride, &pp.q_head_stride);
    set_strides(k, &pp.k_batch_stride, &pp.k_row_stride, &pp.k_head_stride);
    set_strides(v, &pp.v_batch_stride, &pp.v_row_stride, &pp.v_head_stride);
    set_strides(out, &pp.o_batch_stride, &pp.o_row_stride, &pp.o_head_stride);
    set_strides(dout, &pp.do_batch_stride, &pp.do_row_stride, &pp.do_head_stride);
    set_strides(grads[0], &pp.dq_batch_stride, &pp.dq_row_stride, &pp.dq_head_stride);
    set_strides(grads[1], &pp.dk_batch_stride, &pp.dk_row_stride, &pp.dk_head_stride);
    set_strides(grads[2], &pp.dv_batch_stride, &pp.dv_row_stride, &pp.dv_head_stride);
    pp.q = q.data();
    pp.k = k.data();
    pp.v = v.data();
    pp.out = out.data();
    pp.dout = dout.data();
    pp.dq = given[0] ? grads[0].data() : q.t.buf->data();
    pp.dk = given[1] ? grads[1].data() : q.t.buf->data();
    pp.dv = given[2] ? grads[2].data() : q.t.buf->data();
  };
  point_at(p);
  p.lse_in = static_cast<const float*>(lse.data());
  p.deterministic = deterministic;
  p.two_kernel = algorithm == BwdAlgorithm::kTwoKernel;
  p.fp32_precision = fp32_precision;
  bool flash_ok = device == Device::kCpu;
  bool stage_views = false;
  const char* flash_unsupported =
      "the CUDA FlashAttention-2 backward needs a GPU of compute capability 8.0 (sm_80) or newer";
#ifdef FA_WITH_CUDA
  cuda::BwdPlan plan;  // the planner's (cuda/flash/flash_plan.h): 'auto' resolved, for the call as given or staged
  if (device == Device::kCuda) {
    plan = cuda::plan_backward(p, algorithm);
    const char* reason = plan.unsupported;
    bool any_view = needs_staging(q) || needs_staging(k) || needs_staging(v) || needs_staging(out) ||
                    needs_staging(dout);
    for (int i = 0; i < 3; ++i) any_view = any_view || (given[i] && needs_staging(grads[i]));
    if (reason != nullptr && requested != Kernel::kNaive && any_view) {
      AttentionBwdParams dense = p;  // the same call on contiguous staging buffers
      fill_fwd_params(dense, d, dtype, scale, causal);
      set_grad_strides_like_inputs(&dense);
      void* base = q.t.buf->data();
      dense.q = dense.k = dense.v = dense.dout = base;
      dense.out = dense.dq = dense.dk = dense.dv = base;
      const cuda::BwdPlan staged = cuda::plan_backward(dense, algorithm);
      if (staged.unsupported == nullptr) {
        reason = nullptr;
        stage_views = true;
        plan = staged;
      }
    }
    flash_ok = reason == nullptr;
    if (reason != nullptr) flash_unsupported = reason;
    p.two_kernel = plan.two_kernel;
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

  // Everything is checked: allocate, stage, queue.
  BufferPtr new_grads[3];
  for (int i = 0; i < 3; ++i) {
    if (given[i]) continue;
    new_grads[i] = rt.allocate(device, dtype, (i == 0 ? q_numel : kv_numel) * dtype_size(dtype), true);
    grads[i].t.buf = new_grads[i];
    grads[i].t.offset = 0;
  }
  AttnTensor targets[3] = {grads[0], grads[1], grads[2]};  // where the gradients must end up
  bool copy_out[3] = {false, false, false};
  if (stage_views && kernel == Kernel::kFlash) {
    for (AttnTensor* a : {&q, &k, &v, &out, &dout})
      if (needs_staging(*a)) *a = stage(rt, *a, true);
    for (int i = 0; i < 3; ++i) {
      if (given[i] && needs_staging(grads[i])) {
        grads[i] = stage(rt, grads[i], false);
        copy_out[i] = true;
      }
    }
  }
  for (int i = 0; i < 3; ++i) given[i] = true;  // every gradient now has a tensor: point at it
  point_at(p);

  if (device == Device::kCpu) {
    cpu::ThreadPool* pool = &rt.pool();
    submit_cpu(rt, {dout.t.buf, q.t.buf, k.t.buf, v.t.buf, out.t.buf, lse.t.buf},
               {grads[0].t.buf, grads[1].t.buf, grads[2].t.buf}, [p, pool, slopes = args.alibi.slopes] {
                 (void)slopes;  // keeps p.alibi_slopes alive until the work has run
                 cpu::flash_bwd(p, *pool);
               });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    if (kernel == Kernel::kFlash) {
      check_launch(rt, cuda::run_backward(p, plan, rt.cuda().stream()),
                   dtype == DType::kFloat32 ? "FlashAttention-2 backward (float32)" : "FlashAttention-2 backward",
                   plan.workspace_bytes);
    } else {
      check_launch(rt, cuda::naive_attention_bwd(p, rt.cuda().stream()), "naive attention backward",
                   cuda::naive_attention_bwd_workspace_bytes(p));
    }
#endif
  }
  for (int i = 0; i < 3; ++i) {
    if (!copy_out[i]) continue;
    enqueue_copy(rt, device, make_copy_params(*targets[i].t.buf, targets[i].v, *grads[i].t.buf, grads[i].v),
                 grads[i].t.buf, targets[i].t.buf);
  }
  PlanReport report{device == Device::kCpu ? "cpu" : "naive"};
#ifdef FA_WITH_CUDA
  if (device == Device::kCuda && kernel == Kernel::kFlash) report = flash_plan_report(plan.family, plan.config);
#endif
  Napi::Array result = Napi::Array::New(env, 6);
  for (uint32_t i = 0; i < 3; ++i) {
    result.Set(i, new_grads[i] ? Napi::Value(NativeBuffer::Wrap(env, new_grads[i])) : Napi::Value(env.Null()));
  }
  result.Set(3u, Napi::String::New(env, kernel_name(kernel)));
  const bool two_kernel = kernel == Kernel::kFlash && device == Device::kCuda && p.two_kernel;
  result.Set(4u, Napi::String::New(env, two_kernel ? "two-kernel" : "single-kernel"));
  result.Set(5u, plan_object(env, report));
  return result;
}

}  // namespace

void InitAttentionOps(Napi::Env env, Napi::Object exports) {
  exports.Set("attentionForward", Napi::Function::New<guarded<AttentionForward, 1>>(env, "attentionForward"));
  exports.Set("attentionBackward", Napi::Function::New<guarded<AttentionBackward, 1>>(env, "attentionBackward"));
}

}  // namespace fa::napi
