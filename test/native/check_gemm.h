// Host side of the GEMM checks (gemm_cpu_check.cc, gemm_check.cu): random operands stored in their
// dtype, a float64 reference of the whole contract (common/gemm_params.h: layouts, alpha, bias,
// GELU tanh, pre_out, beta·C), and the comparison with an error bound derived from the precision
// of the tested path.
//
// Bound per element (u = the accumulation's unit roundoff, 2^-24 for fp32):
//   |C - ref| <= L * (|alpha| * S * (2 * u_in + (K + 2) * u) + |beta * C0| * 2u) + u_out * |ref| + atol
// where S = sum_k |A(i,k) B(k,j)| of the dtype-rounded operands, u_in the rounding of the operands
// inside the path (0 when they reach the FMA exact, 2^-11 for TF32), L = 1.13 the largest slope of
// GELU tanh (1 without it) and u_out the output dtype's unit roundoff. A wrong index, layout or
// epilogue term moves an element by O(sqrt(K)) of the operands' scale, orders of magnitude above
// this bound, so the check can fail; correct fp32 chains stay far below it.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/gemm_params.h"
#include "common/half.h"

namespace gemm_check {

using fa::DType;

// Storage of one tensor in its dtype (bytes), with the values it holds as float.
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<uint8_t> bytes;
  size_t count = 0;
  void* data() { return bytes.data(); }
  const void* data() const { return bytes.data(); }
};

inline float get(const HostTensor& t, size_t i) {
  if (t.dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, t.bytes.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, t.bytes.data() + 2 * i, 2);
  return t.dtype == DType::kBFloat16 ? fa::bf16_to_f32(h) : fa::f16_to_f32(h);
}

inline void set(HostTensor& t, size_t i, float v) {
  if (t.dtype == DType::kFloat32) {
    std::memcpy(t.bytes.data() + 4 * i, &v, 4);
    return;
  }
  const uint16_t h = t.dtype == DType::kBFloat16 ? fa::f32_to_bf16(v) : fa::f32_to_f16(v);
  std::memcpy(t.bytes.data() + 2 * i, &h, 2);
}

inline HostTensor make_tensor(DType dt, size_t count) {
  HostTensor t;
  t.dtype = dt;
  t.count = count;
  t.bytes.assign(count * fa::dtype_size(dt), 0);
  return t;
}

// Normal(0, scale) values, rounded to the dtype.
inline HostTensor random_tensor(DType dt, size_t count, std::mt19937_64& rng, float scale = 1.0f) {
  HostTensor t = make_tensor(dt, count);
  std::normal_distribution<float> nd(0.0f, scale);
  for (size_t i = 0; i < count; ++i) set(t, i, nd(rng));
  return t;
}

inline void fill(HostTensor& t, float v) {
  for (size_t i = 0; i < t.count; ++i) set(t, i, v);
}

inline double unit_roundoff(DType dt) {
  switch (dt) {
    case DType::kFloat16: return std::ldexp(1.0, -11);
    case DType::kBFloat16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

inline const char* short_name(DType dt) {
  return dt == DType::kFloat32 ? "f32" : dt == DType::kFloat16 ? "f16" : "bf16";
}

// One test case: shape, dtypes, layouts, padding of the leading dimensions, epilogue.
struct Case {
  int64_t m = 1, n = 1, k = 1;
  DType ab = DType::kFloat32, c = DType::kFloat32;
  bool a_k_major = true, b_k_major = true;
  int64_t pad_a = 0, pad_b = 0, pad_c = 0;  // extra elements per leading dimension
  float alpha = 1.0f, beta = 0.0f;
  int bias = 0;  // 0 none, 1 bias of ab dtype, 2 float32 bias
  bool gelu = false, pre_out = false;
  fa::Fp32Precision precision = fa::Fp32Precision::kTf32;

  int64_t lda() const { return (a_k_major ? k : m) + pad_a; }
  int64_t ldb() const { return (b_k_major ? k : n) + pad_b; }
  int64_t ldc() const { return n + pad_c; }
  size_t a_count() const { return static_cast<size_t>((a_k_major ? m : k) * lda()); }
  size_t b_count() const { return static_cast<size_t>((b_k_major ? n : k) * ldb()); }
  size_t c_count() const { return static_cast<size_t>(m * ldc()); }

  std::string name() const {
    char buf[256];
    std::snprintf(buf, sizeof buf, "m%lld n%lld k%lld %s->%s %c%c pad%lld/%lld/%lld a%g b%g%s%s%s%s",
                  static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k), short_name(ab),
                  short_name(c), a_k_major ? 'T' : 'N', b_k_major ? 'T' : 'N', static_cast<long long>(pad_a),
                  static_cast<long long>(pad_b), static_cast<long long>(pad_c), alpha, beta,
                  bias == 1 ? " bias" : bias == 2 ? " bias32" : "", gelu ? " gelu" : "", pre_out ? " pre" : "",
                  ab == DType::kFloat32 && precision == fa::Fp32Precision::kHighest ? " highest" : "");
    return buf;
  }
};

// Operands and outputs of one case on the host. c0 is C before the call (random when beta != 0,
// NaN poison otherwise); padding columns of C and pre_out hold a sentinel (rounded to the dtype) that
// must survive.
struct Data {
  HostTensor a, b, bias, c0, pre0;
};

constexpr float kSentinel = 12345.0f;

inline Data make_data(const Case& cs, std::mt19937_64& rng) {
  Data d;
  d.a = random_tensor(cs.ab, cs.a_count(), rng);
  d.b = random_tensor(cs.ab, cs.b_count(), rng);
  if (cs.bias != 0) d.bias = random_tensor(cs.bias == 1 ? cs.ab : DType::kFloat32, static_cast<size_t>(cs.n), rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  d.c0 = cs.beta != 0.0f ? random_tensor(cs.c, cs.c_count(), rng) : make_tensor(cs.c, cs.c_count());
  if (cs.beta == 0.0f) fill(d.c0, nan);
  d.pre0 = make_tensor(cs.c, cs.pre_out ? cs.c_count() : 0);
  fill(d.pre0, nan);
  for (int64_t i = 0; i < cs.m; ++i)
    for (int64_t j = cs.n; j < cs.ldc(); ++j) {
      set(d.c0, static_cast<size_t>(i * cs.ldc() + j), kSentinel);
      if (cs.pre_out) set(d.pre0, static_cast<size_t>(i * cs.ldc() + j), kSentinel);
    }
  return d;
}

// The params of a case over the given storage (host or device pointers).
inline fa::GemmParams params(const Case& cs, const void* a, const void* b, const void* bias, void* c, void* pre) {
  fa::GemmParams p;
  p.m = cs.m;
  p.n = cs.n;
  p.k = cs.k;
  p.ab_dtype = cs.ab;
  p.a = a;
  p.lda = cs.lda();
  p.a_k_major = cs.a_k_major;
  p.b = b;
  p.ldb = cs.ldb();
  p.b_k_major = cs.b_k_major;
  p.c = c;
  p.ldc = cs.ldc();
  p.c_dtype = cs.c;
  p.alpha = cs.alpha;
  p.beta = cs.beta;
  p.bias = cs.bias != 0 ? bias : nullptr;
  p.bias_dtype = cs.bias == 2 ? DType::kFloat32 : cs.ab;
  p.activation = cs.gelu ? fa::GemmActivation::kGeluTanh : fa::GemmActivation::kNone;
  p.pre_out = cs.pre_out ? pre : nullptr;
  p.fp32_precision = cs.precision;
  return p;
}

inline double gelu_tanh(double x) {
  const double k = 0.79788456080286535588;  // sqrt(2 / pi)
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

struct Result {
  double max_err = 0, max_ratio = 0;  // largest |C - ref| and largest |C - ref| / bound
  int64_t bad = 0, bad_pre = 0, unwritten = 0, clobbered = 0;
  std::string first_bad;
};

// Compares the outputs c (and pre, when the case has it) against the float64 reference for the rows
// `rows` (every row when empty). u_in / u_acc: see the file comment.
inline Result compare(const Case& cs, const Data& d, const HostTensor& c, const HostTensor& pre, double u_in,
                      double u_acc, const std::vector<int64_t>& rows_in = {}) {
  Result r;
  std::vector<int64_t> rows = rows_in;
  if (rows.empty())
    for (int64_t i = 0; i < cs.m; ++i) rows.push_back(i);
  const double lip = cs.gelu ? 1.13 : 1.0;
  const double u_out = cs.c == DType::kFloat32 ? std::ldexp(1.0, -24) : unit_roundoff(cs.c);
  constexpr double kAtol = 1e-6;
  constexpr double kEpilogueUlps = 8;
  std::vector<double> acc(cs.n), sabs(cs.n);
  auto a_at = [&](int64_t i, int64_t k) {
    return static_cast<double>(get(d.a, static_cast<size_t>(cs.a_k_major ? i * cs.lda() + k : k * cs.lda() + i)));
  };
  std::vector<double> bt(static_cast<size_t>(cs.n * cs.k));  // B transposed to [n][k], double
  for (int64_t kk = 0; kk < cs.k; ++kk)
    for (int64_t j = 0; j < cs.n; ++j)
      bt[j * cs.k + kk] = get(d.b, static_cast<size_t>(cs.b_k_major ? j * cs.ldb() + kk : kk * cs.ldb() + j));
  std::vector<double> arow(cs.k);
  for (int64_t i : rows) {
    for (int64_t kk = 0; kk < cs.k; ++kk) arow[kk] = a_at(i, kk);
    for (int64_t j = 0; j < cs.n; ++j) {
      const double* bj = &bt[j * cs.k];
      double s = 0, sa = 0;
      for (int64_t kk = 0; kk < cs.k; ++kk) {
        const double t = arow[kk] * bj[kk];
        s += t;
        sa += std::fabs(t);
      }
      const size_t idx = static_cast<size_t>(i * cs.ldc() + j);
      double t = cs.alpha * s + (cs.bias != 0 ? get(d.bias, static_cast<size_t>(j)) : 0.0);
      const double pre_ref = t;
      if (cs.gelu) t = gelu_tanh(t);
      const double c0 = cs.beta != 0.0f ? static_cast<double>(get(d.c0, idx)) : 0.0;
      t += cs.beta * c0;
      const double acc_err = std::fabs(cs.alpha) * sa * (2 * u_in + (cs.k + 2) * u_acc);
      // The epilogue's own fp32 steps (scale, bias add, tanh, beta add) add a few units of 2^-24.
      const double epi_err = kEpilogueUlps * std::ldexp(1.0, -24) * (std::fabs(t) + lip * std::fabs(pre_ref));
      const double bound =
          lip * (acc_err + std::fabs(cs.beta * c0) * 2 * u_acc) + u_out * std::fabs(t) + epi_err + kAtol;
      const double got = get(c, idx);
      if (std::isnan(got)) ++r.unwritten;
      const double err = std::fabs(got - t);
      if (!(err <= bound)) {
        if (r.bad == 0) {
          char buf[200];
          std::snprintf(buf, sizeof buf, "C(%lld,%lld) = %.9g, ref %.9g, bound %.3g", static_cast<long long>(i),
                        static_cast<long long>(j), got, t, bound);
          r.first_bad = buf;
        }
        ++r.bad;
      }
      if (std::isfinite(err)) {
        r.max_err = std::max(r.max_err, err);
        r.max_ratio = std::max(r.max_ratio, err / bound);
      }
      if (cs.pre_out) {
        const double pbound = acc_err + u_out * std::fabs(pre_ref) + kAtol;
        const double perr = std::fabs(get(pre, idx) - pre_ref);
        if (!(perr <= pbound)) ++r.bad_pre;
      }
    }
    for (int64_t j = cs.n; j < cs.ldc(); ++j) {
      const size_t idx = static_cast<size_t>(i * cs.ldc() + j);
      if (get(c, idx) != get(d.c0, idx) || (cs.pre_out && get(pre, idx) != get(d.pre0, idx))) ++r.clobbered;
    }
  }
  return r;
}

inline bool ok(const Result& r) { return r.bad == 0 && r.bad_pre == 0 && r.unwritten == 0 && r.clobbered == 0; }

inline void print_result(const Case& cs, const Result& r, bool verbose) {
  if (ok(r) && !verbose) return;
  std::printf("  %s %s: max err %.3g (%.3f of bound)%s", ok(r) ? "ok  " : "FAIL", cs.name().c_str(), r.max_err,
              r.max_ratio, ok(r) ? "\n" : "");
  if (!ok(r))
    std::printf(", %lld bad, %lld bad pre, %lld unwritten, %lld clobbered; first %s\n",
                static_cast<long long>(r.bad), static_cast<long long>(r.bad_pre), static_cast<long long>(r.unwritten),
                static_cast<long long>(r.clobbered), r.first_bad.c_str());
}

}  // namespace gemm_check
