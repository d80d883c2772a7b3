// Bindings of the train ops (lib/ops/embedding.ts, linear.ts, loss.ts, optim.ts, reduce.ts):
// re-validate what lib/ validated (every size is checked against the storage it indexes), fill the
// params struct (csrc/common/op_params.h, gemm_params.h), and queue the backend on the device's
// stream: the CPU executor (csrc/cpu/ops, csrc/cpu/gemm) or the CUDA stream (csrc/cuda/ops,
// csrc/cuda/gemm). In-place tensors are listed as both inputs and outputs of CPU work, so an error
// upstream reaches their later readers.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/gemm_params.h"
#include "common/op_params.h"
#include "cpu/gemm/gemm_cpu.h"
#include "cpu/ops/ops_cpu.h"
#include "napi/addon.h"
#include "napi/dispatch.h"
#ifdef FA_WITH_CUDA
#include "cuda/gemm/gemm.h"
#include "cuda/ops/ops_cuda.h"
#endif

namespace fa::napi {

namespace {

// Sizes from JS are safe integers; products are re-checked by checked_numel.
constexpr int64_t kMaxSize = (int64_t{1} << 53) - 1;
// Rows of the global norm's tensor list.
constexpr uint32_t kMaxNormTensors = 1u << 20;

bool is_absent(const Napi::Value& v) { return v.IsNull() || v.IsUndefined(); }

int64_t size_arg(const Napi::Value& v, const char* arg) { return int_arg(v, arg, 1, kMaxSize); }

// A finite number that is also a finite float32, within [min, max] (or (min, max] with
// min_exclusive); infinite bounds are no bound.
float float_arg(const Napi::Value& v, const char* arg, double min, double max, bool min_exclusive = false) {
  const double d = number_arg(v, arg);
  const float f = static_cast<float>(d);
  const bool low_ok = min_exclusive ? d > min : d >= min;
  if (!std::isfinite(d) || !std::isfinite(f) || !low_ok || d > max) {
    std::string bounds;
    auto num = [&](double x) { return Napi::Number::New(v.Env(), x).ToString().Utf8Value(); };
    if (std::isfinite(min)) bounds += (min_exclusive ? " > " : " >= ") + num(min);
    if (std::isfinite(max)) bounds += (bounds.empty() ? " <= " : " and <= ") + num(max);
    throw range_error(std::string("Expected ") + arg + " to be a finite float32" + bounds + " but received " +
                      describe(v));
  }
  return f;
}

// An Adam decay rate: a number in [0, 1) whose float32 is below 1 too.
float beta_arg(const Napi::Value& v, const char* arg) {
  const double d = number_arg(v, arg);
  const float f = static_cast<float>(d);
  if (!(d >= 0.0) || !(f < 1.0f)) {
    throw range_error(std::string("Expected ") + arg + " to be a number >= 0 and < 1 (as a float32) but received " +
                      describe(v));
  }
  return f;
}

Fp32Precision fp32_precision_arg(const Napi::Value& v) {
  return static_cast<Fp32Precision>(int_arg(v, "float32Precision", static_cast<int64_t>(Fp32Precision::kTf32),
                                            static_cast<int64_t>(Fp32Precision::kHighest)));
}

// A floating tensor on `device` reaching `extent` elements.
void expect_float_tensor(const TensorArg& t, const char* arg, Device device, DType dtype, int64_t extent) {
  expect_float(t.dtype(), arg);
  expect_tensor(t, arg, device, dtype, extent);
}

// Refuses two tensor arguments on one storage where one of them is written.
void expect_distinct(const TensorArg& a, const char* a_name, const TensorArg& b, const char* b_name) {
  if (a.buf == b.buf) {
    throw range_error(std::string("Expected ") + a_name + " and " + b_name +
                      " to be different tensors (storages) but received the same storage for both");
  }
}

BufferPtr output(Runtime& rt, Device device, DType dtype, int64_t numel) {
  return rt.allocate(device, dtype, static_cast<size_t>(numel) * dtype_size(dtype), true);
}

#ifdef FA_WITH_CUDA
// Launches one GEMM on the stream with its workspace.
void launch_gemm(Runtime& rt, const GemmParams& g, const char* what) {
  const size_t ws = cuda::gemm_workspace_bytes(g);
  BufferPtr buf = cuda_workspace(rt, ws);
  check_launch(rt, cuda::gemm(g, buf ? buf->data() : nullptr, rt.cuda().stream()), what, ws);
}

void expect_gemm_supported(const GemmParams& g, const char* what) {
  if (const char* why = cuda::gemm_unsupported_reason(g)) {
    throw range_error(std::string("Expected a CUDA GEMM for ") + what + " but none exists: " + why);
  }
}
#endif

// ---- embedding ------------------------------------------------------------------------------------

// embeddingForward(ids, table, rows, vocab, dim): out [rows, dim] of table's dtype
Napi::Value EmbeddingForward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg ids = tensor_arg(info[0], "ids");
  const TensorArg table = tensor_arg(info[1], "table");
  const int64_t rows = size_arg(info[2], "rows");
  const int64_t vocab = size_arg(info[3], "vocab");
  const int64_t dim = size_arg(info[4], "dim");
  const Device device = table.device();
  const DType dtype = table.dtype();
  expect_float_tensor(table, "table", device, dtype, checked_numel({vocab, dim}, "table"));
  expect_tensor(ids, "ids", device, DType::kInt32, rows);
  const int64_t out_numel = checked_numel({rows, dim}, "out");

  EmbeddingParams p;
  p.rows = rows;
  p.vocab = vocab;
  p.dim = dim;
  p.dtype = dtype;
  p.ids = static_cast<const int32_t*>(ids.data());
  p.table = table.data();
  BufferPtr out = output(rt, device, dtype, out_numel);
  p.out = out->data();
  if (device == Device::kCpu) {
    submit_cpu_pooled(rt, {ids.buf, table.buf}, {out}, [p](cpu::ThreadPool& pool) { cpu::embedding_fwd(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    check_launch(rt, cuda::embedding_fwd(p, rt.cuda().stream()), "embedding forward", 0);
#endif
  }
  return NativeBuffer::Wrap(env, out);
}

// embeddingBackward(ids, dout, dtable, rows, vocab, dim): dtable [vocab, dim] float32 += scatter of dout
Napi::Value EmbeddingBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg ids = tensor_arg(info[0], "ids");
  const TensorArg dout = tensor_arg(info[1], "dout");
  const TensorArg dtable = tensor_arg(info[2], "dtable");
  const int64_t rows = size_arg(info[3], "rows");
  const int64_t vocab = size_arg(info[4], "vocab");
  const int64_t dim = size_arg(info[5], "dim");
  const Device device = dout.device();
  const DType dtype = dout.dtype();
  expect_float_tensor(dout, "dout", device, dtype, checked_numel({rows, dim}, "dout"));
  expect_tensor(ids, "ids", device, DType::kInt32, rows);
  expect_tensor(dtable, "dtable", device, DType::kFloat32, checked_numel({vocab, dim}, "dtable"));
  expect_distinct(dtable, "dtable", dout, "dout");

  EmbeddingParams p;
  p.rows = rows;
  p.vocab = vocab;
  p.dim = dim;
  p.dtype = dtype;
  p.ids = static_cast<const int32_t*>(ids.data());
  p.dout = dout.data();
  p.dtable = static_cast<float*>(dtable.data());
  if (device == Device::kCpu) {
    submit_cpu_pooled(rt, {ids.buf, dout.buf, dtable.buf}, {dtable.buf},
        [p](cpu::ThreadPool& pool) { cpu::embedding_bwd(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    check_launch(rt, cuda::embedding_bwd(p, rt.cuda().stream()), "embedding backward", 0);
#endif
  }
  return env.Undefined();
}

// ---- linear ---------------------------------------------------------------------------------------

// y = x·Wᵀ (+ b): x [rows, in] k-major, W [out, in] k-major (gemm_params.h).
GemmParams forward_gemm(const TensorArg& x, const TensorArg& w, int64_t rows, int64_t in, int64_t out, DType dtype,
                        Fp32Precision precision) {
  GemmParams g;
  g.m = rows;
  g.n = out;
  g.k = in;
  g.ab_dtype = dtype;
  g.a = x.data();
  g.lda = in;
  g.a_k_major = true;
  g.b = w.data();
  g.ldb = in;
  g.b_k_major = true;
  g.ldc = out;
  g.c_dtype = dtype;
  g.bias_dtype = dtype;
  g.fp32_precision = precision;
  return g;
}

// linearForward(x, weight, bias | null, rows, in, out, gelu, float32Precision): [y, pre | null]
// y = x·Wᵀ + b, or with gelu: pre = x·Wᵀ + b and y = gelu(pre).
Napi::Value LinearForward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg x = tensor_arg(info[0], "x");
  const TensorArg w = tensor_arg(info[1], "weight");
  const bool has_bias = !is_absent(info[2]);
  TensorArg bias;
  if (has_bias) bias = tensor_arg(info[2], "bias");
  const int64_t rows = size_arg(info[3], "rows");
  const int64_t in = size_arg(info[4], "inFeatures");
  const int64_t out_features = size_arg(info[5], "outFeatures");
  const bool gelu = bool_arg(info[6], "gelu");
  const Fp32Precision precision = fp32_precision_arg(info[7]);
  const Device device = x.device();
  const DType dtype = x.dtype();
  expect_float_tensor(x, "x", device, dtype, checked_numel({rows, in}, "x"));
  expect_tensor(w, "weight", device, dtype, checked_numel({out_features, in}, "weight"));
  if (has_bias) expect_tensor(bias, "bias", device, dtype, out_features);
  const int64_t y_numel = checked_numel({rows, out_features}, "out");

  GemmParams g = forward_gemm(x, w, rows, in, out_features, dtype, precision);
  g.bias = has_bias ? bias.data() : nullptr;
  g.activation = gelu ? GemmActivation::kGeluTanh : GemmActivation::kNone;
#ifdef FA_WITH_CUDA
  if (device == Device::kCuda) expect_gemm_supported(g, "linear (x·Wᵀ + b)");
#endif
  BufferPtr y = output(rt, device, dtype, y_numel);
  BufferPtr pre = gelu ? output(rt, device, dtype, y_numel) : nullptr;
  g.c = y->data();
  g.pre_out = pre ? pre->data() : nullptr;
  if (device == Device::kCpu) {
    std::vector<BufferPtr> inputs{x.buf, w.buf};
    if (has_bias) inputs.push_back(bias.buf);
    std::vector<BufferPtr> outputs{y};
    if (pre) outputs.push_back(pre);
    submit_cpu_pooled(rt, std::move(inputs), std::move(outputs), [g](cpu::ThreadPool& pool) { cpu::gemm(g, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    launch_gemm(rt, g, "linear (x·Wᵀ + b)");
#endif
  }
  Napi::Array result = Napi::Array::New(env, 2);
  result.Set(0u, NativeBuffer::Wrap(env, y));
  result.Set(1u, pre ? Napi::Value(NativeBuffer::Wrap(env, pre)) : env.Null());
  return result;
}

// linearBackward(dy, x, weight, dweight | null, dbias | null, dx, rows, in, out, float32Precision):
// dx [rows, in] (or null when dx is false); dweight += dyᵀ·x, dbias += column sums of dy.
Napi::Value LinearBackward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg dy = tensor_arg(info[0], "dy");
  const TensorArg x = tensor_arg(info[1], "x");
  const TensorArg w = tensor_arg(info[2], "weight");
  const bool has_dw = !is_absent(info[3]);
  const bool has_db = !is_absent(info[4]);
  TensorArg dw, db;
  if (has_dw) dw = tensor_arg(info[3], "dweight");
  if (has_db) db = tensor_arg(info[4], "dbias");
  const bool want_dx = bool_arg(info[5], "dx");
  const int64_t rows = size_arg(info[6], "rows");
  const int64_t in = size_arg(info[7], "inFeatures");
  const int64_t out_features = size_arg(info[8], "outFeatures");
  const Fp32Precision precision = fp32_precision_arg(info[9]);
  const Device device = dy.device();
  const DType dtype = dy.dtype();
  expect_float_tensor(dy, "dy", device, dtype, checked_numel({rows, out_features}, "dy"));
  expect_tensor(x, "x", device, dtype, checked_numel({rows, in}, "x"));
  expect_tensor(w, "weight", device, dtype, checked_numel({out_features, in}, "weight"));
  if (has_dw) {
    expect_tensor(dw, "dweight", device, DType::kFloat32, checked_numel({out_features, in}, "dweight"));
    expect_distinct(dw, "dweight", dy, "dy");
    expect_distinct(dw, "dweight", x, "x");
    expect_distinct(dw, "dweight", w, "weight");
  }
  if (has_db) {
    expect_tensor(db, "dbias", device, DType::kFloat32, out_features);
    expect_distinct(db, "dbias", dy, "dy");
    if (has_dw) expect_distinct(db, "dbias", dw, "dweight");
  }
  const int64_t dx_numel = checked_numel({rows, in}, "dx");

  // dx = dy·W: A = dy [rows, out] k-major, B = W [out, in] n-major.
  GemmParams gx;
  gx.m = rows;
  gx.n = in;
  gx.k = out_features;
  gx.ab_dtype = dtype;
  gx.a = dy.data();
  gx.lda = out_features;
  gx.a_k_major = true;
  gx.b = w.data();
  gx.ldb = in;
  gx.b_k_major = false;
  gx.ldc = in;
  gx.c_dtype = dtype;
  gx.fp32_precision = precision;
  // dW += dyᵀ·x: A = dyᵀ [out, rows] stored as dy (m-major), B = x [rows, in] n-major, C float32, beta 1.
  GemmParams gw;
  gw.m = out_features;
  gw.n = in;
  gw.k = rows;
  gw.ab_dtype = dtype;
  gw.a = dy.data();
  gw.lda = out_features;
  gw.a_k_major = false;
  gw.b = x.data();
  gw.ldb = in;
  gw.b_k_major = false;
  gw.c = has_dw ? dw.data() : nullptr;
  gw.ldc = in;
  gw.c_dtype = DType::kFloat32;
  gw.beta = 1.0f;
  gw.fp32_precision = precision;
  // dbias += column sums of dy.
  ColumnSumParams cs;
  cs.rows = rows;
  cs.cols = out_features;
  cs.dtype = dtype;
  cs.x = dy.data();
  cs.out = has_db ? static_cast<float*>(db.data()) : nullptr;
  cs.accumulate = true;
#ifdef FA_WITH_CUDA
  if (device == Device::kCuda) {
    if (want_dx) expect_gemm_supported(gx, "linearBackward (dx = dy·W)");
    if (has_dw) expect_gemm_supported(gw, "linearBackward (dweight += dyᵀ·x)");
  }
#endif
  BufferPtr dx = want_dx ? output(rt, device, dtype, dx_numel) : nullptr;
  gx.c = dx ? dx->data() : nullptr;
  if (device == Device::kCpu) {
    std::vector<BufferPtr> inputs{dy.buf, x.buf, w.buf};
    std::vector<BufferPtr> outputs;
    if (dx) outputs.push_back(dx);
    if (has_dw) {
      inputs.push_back(dw.buf);
      outputs.push_back(dw.buf);
    }
    if (has_db) {
      inputs.push_back(db.buf);
      outputs.push_back(db.buf);
    }
    submit_cpu_pooled(rt, std::move(inputs), std::move(outputs), [gx, gw, cs](cpu::ThreadPool& pool) {
      if (gx.c) cpu::gemm(gx, pool);
      if (gw.c) cpu::gemm(gw, pool);
      if (cs.out) cpu::column_sum(cs, pool);
    });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    if (dx) launch_gemm(rt, gx, "linearBackward (dx = dy·W)");
    if (has_dw) launch_gemm(rt, gw, "linearBackward (dweight += dyᵀ·x)");
    if (has_db) {
      const size_t ws = cuda::column_sum_workspace_bytes(cs);
      BufferPtr buf = cuda_workspace(rt, ws);
      cs.workspace = buf ? buf->data() : nullptr;
      check_launch(rt, cuda::column_sum(cs, rt.cuda().stream()), "linearBackward (dbias += column sums of dy)", ws);
    }
#endif
  }
  return dx ? Napi::Value(NativeBuffer::Wrap(env, dx)) : env.Null();
}

// ---- cross-entropy ---------------------------------------------------------------------------------

// crossEntropy(logits, targets, rows, vocab, ignoreIndex, reduction, grad, gradScale): [loss, dlogits | null]
Napi::Value CrossEntropy(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg logits = tensor_arg(info[0], "logits");
  const TensorArg targets = tensor_arg(info[1], "targets");
  const int64_t rows = size_arg(info[2], "rows");
  const int64_t vocab = size_arg(info[3], "vocab");
  const int32_t ignore_index = static_cast<int32_t>(int_arg(info[4], "ignoreIndex", std::numeric_limits<int32_t>::min(),
                                                            std::numeric_limits<int32_t>::max()));
  const auto reduction = static_cast<Reduction>(
      int_arg(info[5], "reduction", static_cast<int64_t>(Reduction::kNone), static_cast<int64_t>(Reduction::kMean)));
  const bool grad = bool_arg(info[6], "grad");
  const float grad_scale = float_arg(info[7], "gradScale", -std::numeric_limits<double>::infinity(),
                                     std::numeric_limits<double>::infinity());
  const Device device = logits.device();
  const DType dtype = logits.dtype();
  const int64_t numel = checked_numel({rows, vocab}, "logits");
  expect_float_tensor(logits, "logits", device, dtype, numel);
  expect_tensor(targets, "targets", device, DType::kInt32, rows);

  CrossEntropyParams p;
  p.rows = rows;
  p.vocab = vocab;
  p.dtype = dtype;
  p.logits = logits.data();
  p.targets = static_cast<const int32_t*>(targets.data());
  p.ignore_index = ignore_index;
  p.reduction = reduction;
  p.grad_scale = grad_scale;
  BufferPtr loss = output(rt, device, DType::kFloat32, reduction == Reduction::kNone ? rows : 1);
  BufferPtr dlogits = grad ? output(rt, device, dtype, numel) : nullptr;
  p.loss = static_cast<float*>(loss->data());
  p.dlogits = dlogits ? dlogits->data() : nullptr;
  if (device == Device::kCpu) {
    std::vector<BufferPtr> outputs{loss};
    if (dlogits) outputs.push_back(dlogits);
    submit_cpu_pooled(rt, {logits.buf, targets.buf}, std::move(outputs),
        [p](cpu::ThreadPool& pool) { cpu::cross_entropy(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    const size_t ws = cuda::cross_entropy_workspace_bytes(p);
    BufferPtr buf = cuda_workspace(rt, ws);
    p.workspace = buf ? buf->data() : nullptr;
    check_launch(rt, cuda::cross_entropy(p, rt.cuda().stream()), "cross-entropy", ws);
#endif
  }
  Napi::Array result = Napi::Array::New(env, 2);
  result.Set(0u, NativeBuffer::Wrap(env, loss));
  result.Set(1u, dlogits ? Napi::Value(NativeBuffer::Wrap(env, dlogits)) : env.Null());
  return result;
}

// ---- AdamW -------------------------------------------------------------------------------------------

// adamwStep(param, grad, m, v, master | null, numel, lr, beta1, beta2, eps, weightDecay, step, gradScale,
//           clipNorm | null, maxNorm): updates param, m, v (and master) in place.
Napi::Value AdamWStep(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg param = tensor_arg(info[0], "param");
  const TensorArg grad = tensor_arg(info[1], "grad");
  const TensorArg m = tensor_arg(info[2], "m");
  const TensorArg v = tensor_arg(info[3], "v");
  const bool has_master = !is_absent(info[4]);
  TensorArg master;
  if (has_master) master = tensor_arg(info[4], "master");
  const int64_t numel = size_arg(info[5], "numel");
  const double inf = std::numeric_limits<double>::infinity();
  const float lr = float_arg(info[6], "lr", 0.0, inf);
  const float beta1 = beta_arg(info[7], "beta1");
  const float beta2 = beta_arg(info[8], "beta2");
  const float eps = float_arg(info[9], "eps", 0.0, inf, true);
  const float weight_decay = float_arg(info[10], "weightDecay", 0.0, inf);
  const int64_t step = size_arg(info[11], "step");
  const float grad_scale = float_arg(info[12], "gradScale", -inf, inf);
  const bool has_clip = !is_absent(info[13]);
  TensorArg clip;
  if (has_clip) clip = tensor_arg(info[13], "clipNorm");
  float max_norm = 0.0f;
  if (has_clip) max_norm = float_arg(info[14], "maxNorm", 0.0, inf, true);
  const Device device = param.device();
  const DType dtype = param.dtype();
  expect_float_tensor(param, "param", device, dtype, numel);
  expect_tensor(grad, "grad", device, DType::kFloat32, numel);
  expect_tensor(m, "m", device, DType::kFloat32, numel);
  expect_tensor(v, "v", device, DType::kFloat32, numel);
  if (dtype == DType::kFloat32 && has_master) {
    throw type_error("Expected master to be null for a float32 param (it is its own master weight) but received a tensor");
  }
  if (dtype != DType::kFloat32 && !has_master) {
    throw type_error(std::string("Expected master (float32 master weights) for a ") + dtype_name(dtype) +
                     " param but received null");
  }
  if (has_master) expect_tensor(master, "master", device, DType::kFloat32, numel);
  if (has_clip) expect_tensor(clip, "clipNorm", device, DType::kFloat32, 1);
  // Every written tensor has its own storage, apart from every other argument.
  std::vector<std::pair<const TensorArg*, const char*>> args{{&param, "param"}, {&grad, "grad"}, {&m, "m"}, {&v, "v"}};
  if (has_master) args.push_back({&master, "master"});
  if (has_clip) args.push_back({&clip, "clipNorm"});
  for (size_t i = 0; i < args.size(); ++i) {
    for (size_t j = i + 1; j < args.size(); ++j) expect_distinct(*args[i].first, args[i].second, *args[j].first, args[j].second);
  }

  AdamWParams p;
  p.numel = numel;
  p.dtype = dtype;
  p.param = param.data();
  p.master = has_master ? static_cast<float*>(master.data()) : nullptr;
  p.grad = static_cast<const float*>(grad.data());
  p.m = static_cast<float*>(m.data());
  p.v = static_cast<float*>(v.data());
  p.lr = lr;
  p.beta1 = beta1;
  p.beta2 = beta2;
  p.eps = eps;
  p.weight_decay = weight_decay;
  // In double on the host, then rounded once (the kernels divide by them in float32).
  p.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(step)));
  p.bias_correction2 = static_cast<float>(1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(step)));
  p.grad_scale = grad_scale;
  p.clip_norm = has_clip ? static_cast<const float*>(clip.data()) : nullptr;
  p.max_norm = max_norm;
  if (device == Device::kCpu) {
    std::vector<BufferPtr> inputs{param.buf, grad.buf, m.buf, v.buf};
    std::vector<BufferPtr> outputs{param.buf, m.buf, v.buf};
    if (has_master) {
      inputs.push_back(master.buf);
      outputs.push_back(master.buf);
    }
    if (has_clip) inputs.push_back(clip.buf);
    submit_cpu_pooled(rt, std::move(inputs), std::move(outputs), [p](cpu::ThreadPool& pool) { cpu::adamw(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    check_launch(rt, cuda::adamw(p, rt.cuda().stream()), "AdamW step", 0);
#endif
  }
  return env.Undefined();
}

// ---- reductions ------------------------------------------------------------------------------------

// gradNorm(tensors: Array<tensor>, numels: number[]): float32 [1], the L2 norm of every element
Napi::Value GradNorm(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  if (!info[0].IsArray() || info[0].As<Napi::Array>().Length() == 0) {
    throw type_error("Expected tensors to be a non-empty Array of tensors but received " + describe(info[0]));
  }
  const auto list = info[0].As<Napi::Array>();
  const uint32_t count = list.Length();
  if (count > kMaxNormTensors) {
    throw range_error("Expected tensors to hold at most " + std::to_string(kMaxNormTensors) + " tensors but received " +
                      std::to_string(count));
  }
  if (!info[1].IsArray() || info[1].As<Napi::Array>().Length() != count) {
    throw type_error("Expected numels to be an Array of " + std::to_string(count) + " element counts but received " +
                     describe(info[1]));
  }
  const auto numels = info[1].As<Napi::Array>();
  NormOfParams p;
  std::vector<BufferPtr> inputs;
  Device device = Device::kCpu;
  for (uint32_t i = 0; i < count; ++i) {
    const std::string name = "tensors[" + std::to_string(i) + "]";
    const TensorArg t = tensor_arg(list.Get(i), name.c_str());
    const int64_t n = size_arg(numels.Get(i), ("numels[" + std::to_string(i) + "]").c_str());
    if (i == 0) device = t.device();
    expect_float(t.dtype(), name.c_str());
    expect_extent(t, name.c_str(), device, n);
    p.tensors.push_back({t.data(), n, t.dtype()});
    inputs.push_back(t.buf);
  }
  BufferPtr out = output(rt, device, DType::kFloat32, 1);
  p.out = static_cast<float*>(out->data());
  if (device == Device::kCpu) {
    submit_cpu_pooled(rt, std::move(inputs), {out}, [p](cpu::ThreadPool& pool) { cpu::norm_of(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    const size_t ws = cuda::norm_of_workspace_bytes(p);
    BufferPtr buf = cuda_workspace(rt, ws);
    p.workspace = buf ? buf->data() : nullptr;
    check_launch(rt, cuda::norm_of(p, rt.cuda().stream()), "gradient norm", ws);
#endif
  }
  return NativeBuffer::Wrap(env, out);
}

// sum(x, numel): float32 [1]
Napi::Value Sum(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg x = tensor_arg(info[0], "x");
  const int64_t numel = size_arg(info[1], "numel");
  const Device device = x.device();
  expect_float_tensor(x, "x", device, x.dtype(), numel);
  SumParams p;
  p.numel = numel;
  p.dtype = x.dtype();
  p.x = x.data();
  BufferPtr out = output(rt, device, DType::kFloat32, 1);
  p.out = static_cast<float*>(out->data());
  if (device == Device::kCpu) {
    submit_cpu_pooled(rt, {x.buf}, {out}, [p](cpu::ThreadPool& pool) { cpu::sum(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    const size_t ws = cuda::sum_workspace_bytes(p);
    BufferPtr buf = cuda_workspace(rt, ws);
    p.workspace = buf ? buf->data() : nullptr;
    check_launch(rt, cuda::sum(p, rt.cuda().stream()), "sum", ws);
#endif
  }
  return NativeBuffer::Wrap(env, out);
}

// columnSum(x, rows, cols, out | null): a new float32 [cols] (out null), or out += the column sums
// (returns undefined)
Napi::Value ColumnSum(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Runtime& rt = runtime(env);
  const TensorArg x = tensor_arg(info[0], "x");
  const int64_t rows = size_arg(info[1], "rows");
  const int64_t cols = size_arg(info[2], "cols");
  const bool given = !is_absent(info[3]);
  TensorArg out_arg;
  if (given) out_arg = tensor_arg(info[3], "out");
  const Device device = x.device();
  expect_float_tensor(x, "x", device, x.dtype(), checked_numel({rows, cols}, "x"));
  if (given) {
    expect_tensor(out_arg, "out", device, DType::kFloat32, cols);
    expect_distinct(out_arg, "out", x, "x");
  }
  ColumnSumParams p;
  p.rows = rows;
  p.cols = cols;
  p.dtype = x.dtype();
  p.x = x.data();
  p.accumulate = given;
  BufferPtr out = given ? out_arg.buf : output(rt, device, DType::kFloat32, cols);
  p.out = given ? static_cast<float*>(out_arg.data()) : static_cast<float*>(out->data());
  if (device == Device::kCpu) {
    std::vector<BufferPtr> inputs{x.buf};
    if (given) inputs.push_back(out);
    submit_cpu_pooled(rt, std::move(inputs), {out}, [p](cpu::ThreadPool& pool) { cpu::column_sum(p, pool); });
  } else {
#ifdef FA_WITH_CUDA
    rt.cuda().ensure_usable();
    const size_t ws = cuda::column_sum_workspace_bytes(p);
    BufferPtr buf = cuda_workspace(rt, ws);
    p.workspace = buf ? buf->data() : nullptr;
    check_launch(rt, cuda::column_sum(p, rt.cuda().stream()), "column sum", ws);
#endif
  }
  return given ? env.Undefined() : Napi::Value(NativeBuffer::Wrap(env, out));
}

}  // namespace

void InitTrainOps(Napi::Env env, Napi::Object exports) {
  exports.Set("embeddingForward", Napi::Function::New<guarded<EmbeddingForward, 5>>(env, "embeddingForward"));
  exports.Set("embeddingBackward", Napi::Function::New<guarded<EmbeddingBackward, 6>>(env, "embeddingBackward"));
  exports.Set("linearForward", Napi::Function::New<guarded<LinearForward, 8>>(env, "linearForward"));
  exports.Set("linearBackward", Napi::Function::New<guarded<LinearBackward, 10>>(env, "linearBackward"));
  exports.Set("crossEntropy", Napi::Function::New<guarded<CrossEntropy, 8>>(env, "crossEntropy"));
  exports.Set("adamwStep", Napi::Function::New<guarded<AdamWStep, 15>>(env, "adamwStep"));
  exports.Set("gradNorm", Napi::Function::New<guarded<GradNorm, 2>>(env, "gradNorm"));
  exports.Set("sum", Napi::Function::New<guarded<Sum, 2>>(env, "sum"));
  exports.Set("columnSum", Napi::Function::New<guarded<ColumnSum, 4>>(env, "columnSum"));
}

}  // namespace fa::napi
