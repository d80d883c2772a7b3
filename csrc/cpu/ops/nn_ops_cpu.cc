// CPU backend of the norms, RoPE, activations and the residual add (ops_cpu.h). Every op loads its
// elements into float32, computes in float32 and rounds once on store; the dtype is dispatched once
// per op into a loop templated on the storage type. Work is split into tasks of a fixed size (never
// depending on the thread count), so every result, the norms' parameter gradients included, is the
// same bit for bit on any number of threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/half.h"
#include "cpu/ops/ops_cpu.h"
#include "cpu/thread_pool.h"
#include "runtime/error.h"

namespace fa::cpu {

namespace {

// ---- storage types ---------------------------------------------------------------------------------
// One struct per dtype: its storage type, load (exact) and store (round to nearest even).
struct F32 {
  using T = float;
  static float load(float v) { return v; }
  static float store(float v) { return v; }
};
struct F16 {
  using T = uint16_t;
  static float load(uint16_t v) { return f16_to_f32(v); }
  static uint16_t store(float v) { return f32_to_f16(v); }
};
struct BF16 {
  using T = uint16_t;
  static float load(uint16_t v) { return bf16_to_f32(v); }
  static uint16_t store(float v) { return f32_to_bf16(v); }
};

// Calls fn(F32{}), fn(F16{}) or fn(BF16{}) for `dtype`: the one dtype switch of an op.
template <typename Fn>
void dispatch_float(DType dtype, const char* op, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(F32{}); return;
    case DType::kFloat16: fn(F16{}); return;
    case DType::kBFloat16: fn(BF16{}); return;
    default: break;
  }
  throw type_error(std::string(op) + ": expected dtype float32, float16 or bfloat16 but received " + dtype_name(dtype));
}

// Elements per task of the elementwise ops (enough work to amortise handing out one index).
constexpr int64_t kElemsPerTask = 16384;
// The norms' parameter gradients: rows are cut into at most this many chunks of at least
// kMinChunkRows rows; each chunk sums its rows in order, then the chunks are summed in order.
constexpr int64_t kMaxParamChunks = 256;
constexpr int64_t kMinChunkRows = 4;
// Columns per task of the final parameter-gradient reduction.
constexpr int64_t kColsPerTask = 1024;
// Lanes of the row sums: independent float32 accumulators (vectorisable), added in a fixed tree.
constexpr int kLanes = 8;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// sum_{i < n} term(i) in term's type (float or double) over kLanes interleaved accumulators, combined
// in a fixed order.
template <typename Term>
auto lane_sum(int64_t n, Term&& term) {
  using Acc = decltype(term(int64_t{0}));
  Acc acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += term(i + l);
  }
  Acc tail = 0;
  for (; i < n; ++i) tail += term(i);
  return (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) + tail;
}

// The elements [begin, end) of task `index` when n elements are cut into tasks of `per_task`.
struct Span {
  int64_t begin, end;
};
Span task_span(int64_t index, int64_t per_task, int64_t n) {
  const int64_t begin = index * per_task;
  return {begin, std::min(n, begin + per_task)};
}

// Runs fn(begin, end) over [0, n) in tasks of kElemsPerTask elements.
template <typename Fn>
void parallel_elements(ThreadPool& pool, int64_t n, Fn&& fn) {
  pool.parallel_for(ceil_div(n, kElemsPerTask), [&](int64_t index, int) {
    const Span s = task_span(index, kElemsPerTask, n);
    fn(s.begin, s.end);
  });
}

// Rows per task for row-wise ops over rows of `cols` elements: about kElemsPerTask elements, >= 1 row.
int64_t rows_per_task(int64_t cols) {
  return std::max<int64_t>(1, kElemsPerTask / cols);
}

// A [cols] parameter in the activation dtype, loaded once into float32 (or empty for null).
template <typename S>
std::vector<float> load_param(const void* p, int64_t cols) {
  std::vector<float> out;
  if (p == nullptr) return out;
  out.resize(static_cast<size_t>(cols));
  const auto* src = static_cast<const typename S::T*>(p);
  for (int64_t c = 0; c < cols; ++c) out[c] = S::load(src[c]);
  return out;
}

// ---- norms -------------------------------------------------------------------------------------------

// A row's mean (LayerNorm; 0 for RMSNorm) and 1 / sqrt(variance + eps) in double, from its values as
// float32: the centred second moment in a second pass over the row in cache (no cancellation for
// large means).
struct RowStats {
  double mean, rstd;
};
RowStats row_stats(const float* xs, int64_t cols, bool layer_norm, float eps) {
  const double n = static_cast<double>(cols);
  double mean = 0.0;
  if (layer_norm) mean = lane_sum(cols, [&](int64_t c) { return static_cast<double>(xs[c]); }) / n;
  const double var = lane_sum(cols, [&](int64_t c) {
                       const double d = xs[c] - mean;
                       return d * d;
                     }) / n;
  return {mean, 1.0 / std::sqrt(var + static_cast<double>(eps))};
}

template <typename S>
void norm_fwd_impl(const NormParams& p, ThreadPool& pool) {
  using T = typename S::T;
  const int64_t cols = p.cols;
  // The row's mean, variance and normalised values in double, rounded once into out, mean and rstd:
  // in float32 the mean's rounding, times rstd * weight, reached 4x the error of a plain float32
  // implementation on some rows (a row of 65 with mean 2 and scale 0.25: 6.3e-6 against 1.5e-6).
  const std::vector<float> w = load_param<S>(p.weight, cols);
  const std::vector<float> b = p.layer_norm ? load_param<S>(p.bias, cols) : std::vector<float>();
  std::vector<float> scratch(static_cast<size_t>(pool.size()) * cols);  // [worker][cols]: the row as float32
  const int64_t per_task = rows_per_task(cols);
  pool.parallel_for(ceil_div(p.rows, per_task), [&](int64_t index, int worker) {
    float* xs = scratch.data() + static_cast<int64_t>(worker) * cols;
    const Span rows = task_span(index, per_task, p.rows);
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      const T* x = static_cast<const T*>(p.x) + r * cols;
      T* out = static_cast<T*>(p.out) + r * cols;
      for (int64_t c = 0; c < cols; ++c) xs[c] = S::load(x[c]);
      const RowStats st = row_stats(xs, cols, p.layer_norm, p.eps);
      const double mean = st.mean, rstd = st.rstd;
      p.rstd[r] = static_cast<float>(rstd);
      if (p.layer_norm) p.mean[r] = static_cast<float>(mean);
      if (b.empty()) {
        for (int64_t c = 0; c < cols; ++c) out[c] = S::store(static_cast<float>((xs[c] - mean) * rstd * w[c]));
      } else {
        for (int64_t c = 0; c < cols; ++c) out[c] = S::store(static_cast<float>((xs[c] - mean) * rstd * w[c] + b[c]));
      }
    }
  });
}

template <typename S>
void norm_bwd_impl(const NormParams& p, ThreadPool& pool) {
  using T = typename S::T;
  const int64_t cols = p.cols;
  const std::vector<float> w = load_param<S>(p.weight, cols);
  const bool want_dw = p.dweight != nullptr;
  const bool want_db = p.layer_norm && p.dbias != nullptr;
  // Fixed chunks of rows (independent of the thread count): chunk k sums the parameter gradients of
  // its rows in row order into partial[k]; the chunks are then summed in chunk order.
  const int64_t chunk_rows = std::max(kMinChunkRows, ceil_div(p.rows, kMaxParamChunks));
  const int64_t chunks = ceil_div(p.rows, chunk_rows);
  std::vector<float> dw_part(want_dw ? static_cast<size_t>(chunks * cols) : 0, 0.0f);  // [chunks][cols]
  std::vector<float> db_part(want_db ? static_cast<size_t>(chunks * cols) : 0, 0.0f);  // [chunks][cols]
  std::vector<float> scratch(static_cast<size_t>(pool.size()) * 3 * cols);          // [worker][xhat | g | x]
  const double n = static_cast<double>(cols);
  pool.parallel_for(chunks, [&](int64_t chunk, int worker) {
    float* xhat = scratch.data() + static_cast<int64_t>(worker) * 3 * cols;
    float* g = xhat + cols;
    float* xs = g + cols;
    float* dw = want_dw ? dw_part.data() + chunk * cols : nullptr;
    float* db = want_db ? db_part.data() + chunk * cols : nullptr;
    const Span rows = task_span(chunk, chunk_rows, p.rows);
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      const T* x = static_cast<const T*>(p.x) + r * cols;
      const T* dout = static_cast<const T*>(p.dout) + r * cols;
      T* dx = static_cast<T*>(p.dx) + r * cols;
      const float mean = p.layer_norm ? p.mean_in[r] : 0.0f;
      const float rstd = p.rstd_in[r];
      for (int64_t c = 0; c < cols; ++c) {
        const float dy = S::load(dout[c]);
        xs[c] = S::load(x[c]);
        xhat[c] = (xs[c] - mean) * rstd;
        g[c] = dy * w[c];
        if (dw != nullptr) dw[c] += dy * xhat[c];
        if (db != nullptr) db[c] += dy;
      }
      // dx from the row's own statistics in double, rounded once: through the float rstd and float
      // products, dx = rstd (g - xhat mean(g xhat)) is ill-conditioned on rows that one column
      // dominates (a one-column RMSNorm row is rstd g (1 - xhat^2) = g eps rstd^3: 1 - xhat^2 loses
      // x^2 / eps ulps), and the float32 evaluation was above 3x a plain one's error for ~1% of the
      // test's seeds of 7 one-column rows (a numpy model of both; the CUDA backend, which still
      // evaluates it so, once read 2.3e-6 against a bound of 1.1e-6). In double: ~0.02%.
      const RowStats st = row_stats(xs, cols, p.layer_norm, p.eps);
      const double mean_d = st.mean, rstd_d = st.rstd;
      const auto xhat_d = [&](int64_t c) { return (xs[c] - mean_d) * rstd_d; };
      const double mean_gx = lane_sum(cols, [&](int64_t c) { return g[c] * xhat_d(c); }) / n;
      const double mean_g =
          p.layer_norm ? lane_sum(cols, [&](int64_t c) { return static_cast<double>(g[c]); }) / n : 0.0;
      for (int64_t c = 0; c < cols; ++c)
        dx[c] = S::store(static_cast<float>(rstd_d * (g[c] - mean_g - xhat_d(c) * mean_gx)));
    }
  });
  if (!want_dw && !want_db) return;
  pool.parallel_for(ceil_div(cols, kColsPerTask), [&](int64_t index, int) {
    const Span cs = task_span(index, kColsPerTask, cols);
    for (int64_t c = cs.begin; c < cs.end; ++c) {
      if (want_dw) {
        float s = 0.0f;
        for (int64_t k = 0; k < chunks; ++k) s += dw_part[k * cols + c];
        p.dweight[c] += s;
      }
      if (want_db) {
        float s = 0.0f;
        for (int64_t k = 0; k < chunks; ++k) s += db_part[k * cols + c];
        p.dbias[c] += s;
      }
    }
  });
}

// ---- RoPE ----------------------------------------------------------------------------------------------

template <typename S>
void rope_impl(const RopeParams& p, const std::vector<float>& cos_t, const std::vector<float>& sin_t,
               ThreadPool& pool) {
  using T = typename S::T;
  const int64_t half = p.head_dim / 2;
  const int64_t rows = p.batch * p.seqlen;  // (b, s) pairs
  const int64_t per_task = rows_per_task(p.heads * p.head_dim);
  pool.parallel_for(ceil_div(rows, per_task), [&](int64_t index, int) {
    const Span span = task_span(index, per_task, rows);
    for (int64_t bs = span.begin; bs < span.end; ++bs) {
      const int64_t b = bs / p.seqlen, s = bs % p.seqlen;
      const float* cs = cos_t.data() + s * half;
      const float* sn = sin_t.data() + s * half;
      T* row = static_cast<T*>(p.x) + b * p.batch_stride + s * p.row_stride;
      for (int64_t h = 0; h < p.heads; ++h) {
        T* x = row + h * p.head_stride;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = S::load(x[i]);
          const float x2 = S::load(x[i + half]);
          x[i] = S::store(x1 * cs[i] - x2 * sn[i]);
          x[i + half] = S::store(x1 * sn[i] + x2 * cs[i]);
        }
      }
    }
  });
}

// ---- activations -------------------------------------------------------------------------------------

constexpr float kSqrt2OverPi = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): one expf instead of tanhf
// (1.8x faster here), and no cancellation in 1 + tanh(u) for negative x.
// e = exp(-2u), with -2u capped below float32's exp overflow (e stays finite; beyond the cap the
// result is the limit within float32 anyway).
constexpr float kMaxExpArg = 88.0f;

inline float gelu_exp(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return std::exp(std::min(-2.0f * u, kMaxExpArg));
}

inline float gelu(float x) {
  return x / (1.0f + gelu_exp(x));
}

// gelu'(x) = 0.5 (1 + t) + 0.5 x (1 - t^2) u', t = tanh(u). With s = sigmoid(2u) = 1 / (1 + e):
// 0.5 (1 + t) = s and 1 - t^2 = 4 s (1 - s), 1 - s = e s (no cancellation for s near 1), so
// gelu'(x) = s + 2 x e s^2 u', u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
inline float gelu_grad(float x) {
  const float e = gelu_exp(x);
  const float s = 1.0f / (1.0f + e);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return s + 2.0f * x * (e * s) * s * du;
}

inline float sigmoid(float a) {
  return 1.0f / (1.0f + std::exp(-a));
}

}  // namespace

void norm_fwd(const NormParams& p, ThreadPool& pool) {
  dispatch_float(p.dtype, "norm_fwd", [&](auto s) { norm_fwd_impl<decltype(s)>(p, pool); });
}

void norm_bwd(const NormParams& p, ThreadPool& pool) {
  dispatch_float(p.dtype, "norm_bwd", [&](auto s) { norm_bwd_impl<decltype(s)>(p, pool); });
}

void rope(const RopeParams& p, ThreadPool& pool) {
  // The angle table [seqlen][half], as op_params.h defines it: theta_i from double precision, the
  // angle float32(p) * float32(theta_i), sin and cos in float32.
  const int64_t half = p.head_dim / 2;
  std::vector<float> theta(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    theta[i] = static_cast<float>(std::pow(static_cast<double>(p.base), -2.0 * static_cast<double>(i) /
                                                                            static_cast<double>(p.head_dim)));
  }
  std::vector<float> cos_t(static_cast<size_t>(p.seqlen * half));
  std::vector<float> sin_t(static_cast<size_t>(p.seqlen * half));
  const float sign = p.inverse ? -1.0f : 1.0f;  // sin(-a) = -sin(a), cos(-a) = cos(a) exactly
  const int64_t per_task = rows_per_task(half);
  pool.parallel_for(ceil_div(p.seqlen, per_task), [&](int64_t index, int) {
    const Span span = task_span(index, per_task, p.seqlen);
    for (int64_t s = span.begin; s < span.end; ++s) {
      const float pos = static_cast<float>(p.position_offset + s);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * theta[i];
        cos_t[s * half + i] = std::cos(angle);
        sin_t[s * half + i] = sign * std::sin(angle);
      }
    }
  });
  dispatch_float(p.dtype, "rope", [&](auto s) { rope_impl<decltype(s)>(p, cos_t, sin_t, pool); });
}

void gelu_fwd(const GeluParams& p, ThreadPool& pool) {
  dispatch_float(p.dtype, "gelu_fwd", [&](auto s) {
    using S = decltype(s);
    using T = typename S::T;
    const T* x = static_cast<const T*>(p.x);
    T* out = static_cast<T*>(p.out);
    parallel_elements(pool, p.numel, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = S::store(gelu(S::load(x[i])));
    });
  });
}

void gelu_bwd(const GeluParams& p, ThreadPool& pool) {
  dispatch_float(p.dtype, "gelu_bwd", [&](auto s) {
    using S = decltype(s);
    using T = typename S::T;
    const T* x = static_cast<const T*>(p.x);
    const T* dout = static_cast<const T*>(p.dout);
    T* dx = static_cast<T*>(p.out);
    parallel_elements(pool, p.numel, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) dx[i] = S::store(S::load(dout[i]) * gelu_grad(S::load(x[i])));
    });
  });
}

void swiglu_fwd(const SwigluParams& p, ThreadPool& pool) {
  dispatch_float(p.dtype, "swiglu_fwd", [&](auto s) {
    using S = decltype(s);
    using T = typename S::T;
    const int64_t cols = p.cols;
    const int64_t per_task = rows_per_task(2 * cols);
    pool.parallel_for(ceil_div(p.rows, per_task), [&](int64_t index, int) {
      const Span rows = task_span(index, per_task, p.rows);
      for (int64_t r = rows.begin; r < rows.end; ++r) {
        const T* a = static_cast<const T*>(p.x) + r * 2 * cols;  // gate [cols]
        const T* b = a + cols;                                    // value [cols]
        T* out = static_cast<T*>(p.out) + r * cols;
        for (int64_t c = 0; c < cols; ++c) {
          const float av = S::load(a[c]);
          out[c] = S::store(av * sigmoid(av) * S::load(b[c]));
        }
      }
    });
  });
}

void swiglu_bwd(const SwigluParams& p, ThreadPool& pool) {
  dispatch_float(p.dtype, "swiglu_bwd", [&](auto s) {
    using S = decltype(s);
    using T = typename S::T;
    const int64_t cols = p.cols;
    const int64_t per_task = rows_per_task(2 * cols);
    pool.parallel_for(ceil_div(p.rows, per_task), [&](int64_t index, int) {
      const Span rows = task_span(index, per_task, p.rows);
      for (int64_t r = rows.begin; r < rows.end; ++r) {
        const T* a = static_cast<const T*>(p.x) + r * 2 * cols;
        const T* b = a + cols;
        const T* dout = static_cast<const T*>(p.dout) + r * cols;
        T* da = static_cast<T*>(p.out) + r * 2 * cols;  // dx [rows, 2 * cols] = [da | db]
        T* db = da + cols;
        for (int64_t c = 0; c < cols; ++c) {
          const float av = S::load(a[c]), bv = S::load(b[c]), dy = S::load(dout[c]);
          const float sig = sigmoid(av);
          da[c] = S::store(dy * bv * sig * (1.0f + av * (1.0f - sig)));
          db[c] = S::store(dy * (av * sig));
        }
      }
    });
  });
}

void add(const AddParams& p, ThreadPool& pool) {
  dispatch_float(p.dtype, "add", [&](auto s) {
    using S = decltype(s);
    using T = typename S::T;
    const T* a = static_cast<const T*>(p.a);
    const T* b = static_cast<const T*>(p.b);
    T* out = static_cast<T*>(p.out);  // may equal a (in place): each element is read before it is written
    const float alpha = p.alpha;
    parallel_elements(pool, p.numel, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) out[i] = S::store(S::load(a[i]) + alpha * S::load(b[i]));
    });
  });
}

}  // namespace fa::cpu
