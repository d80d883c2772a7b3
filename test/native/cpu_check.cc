// Standalone check of the CPU FlashAttention-2 backend (no Node): compares flash_fwd / flash_bwd
// against a float64 naive reference (S materialised per head) on fresh random inputs, checks the
// masking contract (rows with no key: out 0, lse +inf, dq 0, never NaN), that every output element
// is written and nothing outside the tensors is, determinism across runs and thread counts (the
// chunked backward included), every instruction-set variant this CPU runs, and the ThreadPool.
// Then times the speed target (B1 H8 S2048 D64 fp32, fwd and bwd, median of 3) and a seqlen-32k
// fwd+bwd with peak RSS.
//
// Usage: cpu_check [--seed N] [--no-perf] [--perf-only] [--verbose]. Exit code 0 iff every check
// passed.
// Built and run by scripts/cpu-check.sh.
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/attention_params.h"
#include "common/half.h"
#include "cpu/cpu_isa.h"
#include "cpu/flash_cpu.h"
#include "cpu/thread_pool.h"

using fa::DType;
using fa::cpu::Isa;
using fa::cpu::ThreadPool;

namespace {

int g_failures = 0;
bool g_verbose = false;  // --verbose: print every comparison's error

void fail(const std::string& what) {
  ++g_failures;
  std::printf("  FAIL %s\n", what.c_str());
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- tensors in storage dtype with arbitrary strides --------------------------------------------

struct Layout {
  int64_t batch = 0, row = 0, head = 0;
};

Layout contiguous_layout(int64_t s, int64_t h, int64_t d) { return {s * h * d, h * d, d}; }

// Rows and batches with gaps between them, to check the strides are honoured and gaps untouched.
constexpr int64_t kRowGap = 24;
constexpr int64_t kBatchGap = 40;
Layout gapped_layout(int64_t s, int64_t h, int64_t d) {
  const int64_t row = h * d + kRowGap;
  return {s * row + kBatchGap, row, d};
}

struct Tensor {
  DType dt = DType::kFloat32;
  int64_t b = 0, s = 0, h = 0, d = 0;
  Layout lay;
  std::vector<float> f32;
  std::vector<uint16_t> h16;

  Tensor(DType dtype, int64_t b_, int64_t s_, int64_t h_, int64_t d_, Layout l)
      : dt(dtype), b(b_), s(s_), h(h_), d(d_), lay(l) {
    const size_t n = static_cast<size_t>(b * lay.batch);
    if (dt == DType::kFloat32) f32.assign(n, 0.0f);
    else h16.assign(n, 0);
  }
  size_t storage() const { return dt == DType::kFloat32 ? f32.size() : h16.size(); }
  void* data() { return dt == DType::kFloat32 ? static_cast<void*>(f32.data()) : static_cast<void*>(h16.data()); }
  int64_t off(int64_t bi, int64_t si, int64_t hi, int64_t di) const {
    return bi * lay.batch + si * lay.row + hi * lay.head + di;
  }
  double get(size_t o) const {
    switch (dt) {
      case DType::kFloat32: return f32[o];
      case DType::kFloat16: return fa::f16_to_f32(h16[o]);
      case DType::kBFloat16: return fa::bf16_to_f32(h16[o]);
    }
    return 0;
  }
  void set(size_t o, float v) {  // rounds to the dtype (RNE)
    switch (dt) {
      case DType::kFloat32: f32[o] = v; break;
      case DType::kFloat16: h16[o] = fa::f32_to_f16(v); break;
      case DType::kBFloat16: h16[o] = fa::f32_to_bf16(v); break;
    }
  }
  void poison() {
    for (size_t o = 0; o < storage(); ++o) set(o, std::numeric_limits<float>::quiet_NaN());
  }
  // Logical elements in canonical [b][s][h][d] order, as doubles.
  std::vector<double> canonical() const {
    std::vector<double> out(static_cast<size_t>(b * s * h * d));
    size_t i = 0;
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t si = 0; si < s; ++si)
        for (int64_t hi = 0; hi < h; ++hi)
          for (int64_t di = 0; di < d; ++di) out[i++] = get(static_cast<size_t>(off(bi, si, hi, di)));
    return out;
  }
  bool same_bits(const Tensor& o) const {
    return dt == DType::kFloat32 ? std::memcmp(f32.data(), o.f32.data(), f32.size() * 4) == 0 : h16 == o.h16;
  }
};

// Standard normal values (int_max == 0), or random nonzero integers in [-int_max, int_max] times
// mul (exact in every dtype here, and so are their products and sums: exact scores).
void fill_random(Tensor& t, std::mt19937_64& rng, int int_max = 0, float mul = 1.0f) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::uniform_int_distribution<int> ints(-int_max, int_max);
  for (int64_t bi = 0; bi < t.b; ++bi)
    for (int64_t si = 0; si < t.s; ++si)
      for (int64_t hi = 0; hi < t.h; ++hi)
        for (int64_t di = 0; di < t.d; ++di) {
          float v = 0.0f;
          while (v == 0.0f) v = int_max ? static_cast<float>(ints(rng)) * mul : dist(rng);  // never zeros
          t.set(static_cast<size_t>(t.off(bi, si, hi, di)), v);
        }
}

// ---- float64 reference ----------------------------------------------------------------------------

struct Case {
  int64_t b, sq, sk, hq, hkv, d;
  DType dt;
  bool causal;
  bool gapped;
  // Scores ~1e4 (q, k integers times 100): exact in float32, so what is tested is the max
  // subtraction, the exp2 offsets and an LSE whose float32 ulp is ~1e-3.
  bool large = false;
  std::string name() const {
    char buf[160];
    std::snprintf(buf, sizeof buf, "B%lld Sq%lld Sk%lld Hq%lld Hkv%lld D%lld %s%s%s%s", static_cast<long long>(b),
                  static_cast<long long>(sq), static_cast<long long>(sk), static_cast<long long>(hq),
                  static_cast<long long>(hkv), static_cast<long long>(d), fa::dtype_name(dt), causal ? " causal" : "",
                  gapped ? " strided" : "", large ? " scores~1e4" : "");
    return buf;
  }
};

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;  // canonical layouts; lse [b][hq][sq]
  // Size of the terms summed into dq and dk (scale * sum |P| (|dP| + |D|) |K or Q|): the error scale
  // where dS = P (dP - D) cancels exactly (one visible key makes dq = dk = 0).
  double dq_terms = 0, dk_terms = 0;
};

// Index into canonical [b][s][h][d].
inline size_t cidx(int64_t s, int64_t h, int64_t d, int64_t bi, int64_t si, int64_t hi, int64_t di) {
  return static_cast<size_t>(((bi * s + si) * h + hi) * d + di);
}

Reference reference(const Case& c, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout, double scale) {
  Reference r;
  r.out.assign(static_cast<size_t>(c.b * c.sq * c.hq * c.d), 0.0);
  r.dq.assign(r.out.size(), 0.0);
  r.lse.assign(static_cast<size_t>(c.b * c.hq * c.sq), 0.0);
  r.dk.assign(static_cast<size_t>(c.b * c.sk * c.hkv * c.d), 0.0);
  r.dv.assign(r.dk.size(), 0.0);
  const int64_t group = c.hq / c.hkv;
  std::vector<double> p(static_cast<size_t>(c.sq * c.sk));  // P of one head, [sq][sk]
  std::vector<double> ds(p.size());
  std::vector<double> ds_terms(p.size());  // P (|dP| + |D|)
  for (int64_t bi = 0; bi < c.b; ++bi)
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < c.sq; ++i) {
        double mx = -kInf;
        for (int64_t j = 0; j < c.sk; ++j) {
          double s = -kInf;
          if (!c.causal || j <= i + c.sk - c.sq) {
            s = 0;
            for (int64_t e = 0; e < c.d; ++e)
              s += q[cidx(c.sq, c.hq, c.d, bi, i, h, e)] * k[cidx(c.sk, c.hkv, c.d, bi, j, hk, e)];
            s *= scale;
          }
          p[i * c.sk + j] = s;
          mx = std::max(mx, s);
        }
        double l = 0;
        for (int64_t j = 0; j < c.sk; ++j) {
          const double e = mx == -kInf ? 0.0 : std::exp(p[i * c.sk + j] - mx);
          p[i * c.sk + j] = e;
          l += e;
        }
        r.lse[(bi * c.hq + h) * c.sq + i] = l > 0 ? mx + std::log(l) : kInf;
        for (int64_t j = 0; j < c.sk; ++j) p[i * c.sk + j] = l > 0 ? p[i * c.sk + j] / l : 0.0;
        for (int64_t e = 0; e < c.d; ++e) {
          double o = 0;
          for (int64_t j = 0; j < c.sk; ++j) o += p[i * c.sk + j] * v[cidx(c.sk, c.hkv, c.d, bi, j, hk, e)];
          r.out[cidx(c.sq, c.hq, c.d, bi, i, h, e)] = o;
        }
      }
      // Backward: dP = dO V^T, D = rowsum(dO o O), dS = P o (dP - D).
      for (int64_t i = 0; i < c.sq; ++i) {
        double dd = 0;
        for (int64_t e = 0; e < c.d; ++e)
          dd += dout[cidx(c.sq, c.hq, c.d, bi, i, h, e)] * r.out[cidx(c.sq, c.hq, c.d, bi, i, h, e)];
        for (int64_t j = 0; j < c.sk; ++j) {
          double dp = 0;
          for (int64_t e = 0; e < c.d; ++e)
            dp += dout[cidx(c.sq, c.hq, c.d, bi, i, h, e)] * v[cidx(c.sk, c.hkv, c.d, bi, j, hk, e)];
          ds[i * c.sk + j] = p[i * c.sk + j] * (dp - dd);
          ds_terms[i * c.sk + j] = p[i * c.sk + j] * (std::fabs(dp) + std::fabs(dd));
        }
      }
      for (int64_t i = 0; i < c.sq; ++i)
        for (int64_t e = 0; e < c.d; ++e) {
          double acc = 0, terms = 0;
          for (int64_t j = 0; j < c.sk; ++j) {
            acc += ds[i * c.sk + j] * k[cidx(c.sk, c.hkv, c.d, bi, j, hk, e)];
            terms += ds_terms[i * c.sk + j] * std::fabs(k[cidx(c.sk, c.hkv, c.d, bi, j, hk, e)]);
          }
          r.dq[cidx(c.sq, c.hq, c.d, bi, i, h, e)] = scale * acc;
          r.dq_terms = std::max(r.dq_terms, scale * terms);
        }
      for (int64_t j = 0; j < c.sk; ++j)
        for (int64_t e = 0; e < c.d; ++e) {
          double acc_k = 0, acc_v = 0, terms = 0;
          for (int64_t i = 0; i < c.sq; ++i) {
            acc_k += ds[i * c.sk + j] * q[cidx(c.sq, c.hq, c.d, bi, i, h, e)];
            terms += ds_terms[i * c.sk + j] * std::fabs(q[cidx(c.sq, c.hq, c.d, bi, i, h, e)]);
            acc_v += p[i * c.sk + j] * dout[cidx(c.sq, c.hq, c.d, bi, i, h, e)];
          }
          r.dk[cidx(c.sk, c.hkv, c.d, bi, j, hk, e)] += scale * acc_k;
          r.dv[cidx(c.sk, c.hkv, c.d, bi, j, hk, e)] += acc_v;
          r.dk_terms = std::max(r.dk_terms, scale * terms);
        }
    }
  return r;
}

// ---- running the backend --------------------------------------------------------------------------

struct Problem {
  Case c;
  float scale;
  Tensor q, k, v, dout;
  Problem(const Case& cs, std::mt19937_64& rng)
      : c(cs),
        scale(static_cast<float>(1.0 / std::sqrt(static_cast<double>(cs.d)))),
        q(cs.dt, cs.b, cs.sq, cs.hq, cs.d, layout(cs, cs.sq, cs.hq)),
        k(cs.dt, cs.b, cs.sk, cs.hkv, cs.d, layout(cs, cs.sk, cs.hkv)),
        v(cs.dt, cs.b, cs.sk, cs.hkv, cs.d, layout(cs, cs.sk, cs.hkv)),
        dout(cs.dt, cs.b, cs.sq, cs.hq, cs.d, layout(cs, cs.sq, cs.hq)) {
    constexpr int kLargeQkMax = 2, kSmallIntMax = 4;
    constexpr float kLargeQkMul = 100.0f;
    fill_random(q, rng, cs.large ? kLargeQkMax : 0, kLargeQkMul);
    fill_random(k, rng, cs.large ? kLargeQkMax : 0, kLargeQkMul);
    fill_random(v, rng, cs.large ? kSmallIntMax : 0);
    fill_random(dout, rng, cs.large ? kSmallIntMax : 0);
  }
  static Layout layout(const Case& c, int64_t s, int64_t h) {
    return c.gapped ? gapped_layout(s, h, c.d) : contiguous_layout(s, h, c.d);
  }
  Tensor like_q() const { return Tensor(c.dt, c.b, c.sq, c.hq, c.d, q.lay); }
  Tensor like_k() const { return Tensor(c.dt, c.b, c.sk, c.hkv, c.d, k.lay); }
};

struct Outputs {
  Tensor out, dq, dk, dv;
  std::vector<float> lse;
  explicit Outputs(const Problem& pr)
      : out(pr.like_q()), dq(pr.like_q()), dk(pr.like_k()), dv(pr.like_k()),
        lse(static_cast<size_t>(pr.c.b * pr.c.hq * pr.c.sq), 0.0f) {}
};

fa::AttentionBwdParams make_params(Problem& pr, Outputs& o) {
  fa::AttentionBwdParams p;
  const Case& c = pr.c;
  p.batch = c.b;
  p.seqlen_q = c.sq;
  p.seqlen_k = c.sk;
  p.heads_q = c.hq;
  p.heads_kv = c.hkv;
  p.head_dim = c.d;
  p.q_batch_stride = pr.q.lay.batch, p.q_row_stride = pr.q.lay.row, p.q_head_stride = pr.q.lay.head;
  p.k_batch_stride = pr.k.lay.batch, p.k_row_stride = pr.k.lay.row, p.k_head_stride = pr.k.lay.head;
  p.v_batch_stride = pr.v.lay.batch, p.v_row_stride = pr.v.lay.row, p.v_head_stride = pr.v.lay.head;
  p.o_batch_stride = pr.q.lay.batch, p.o_row_stride = pr.q.lay.row, p.o_head_stride = pr.q.lay.head;
  p.dtype = c.dt;
  p.softmax_scale = pr.scale;
  p.scale_log2 = pr.scale * fa::kLog2e;
  p.causal = c.causal;
  p.q = pr.q.data();
  p.k = pr.k.data();
  p.v = pr.v.data();
  p.out = o.out.data();
  p.lse = o.lse.data();
  p.dout = pr.dout.data();
  p.lse_in = o.lse.data();
  p.dq = o.dq.data();
  p.dk = o.dk.data();
  p.dv = o.dv.data();
  fa::set_grad_strides_like_inputs(&p);
  return p;
}

// Poisons every output with NaN, then runs forward and backward with instruction set `isa` (the
// backward reads this forward's out and lse).
void run_backend(Problem& pr, Outputs& o, ThreadPool& pool, Isa isa) {
  o.out.poison();
  o.dq.poison();
  o.dk.poison();
  o.dv.poison();
  std::fill(o.lse.begin(), o.lse.end(), std::numeric_limits<float>::quiet_NaN());
  fa::AttentionBwdParams p = make_params(pr, o);
  fa::cpu::flash_fwd(p, pool, isa);
  fa::cpu::flash_bwd(p, pool, isa);
}

// Where the reference cancels to ~0, errors are measured against this fraction of the summed terms.
constexpr double kCancellationFloor = 1e-2;

// Max |got - ref| over the logical elements, relative to max(max |ref|, floor); fails on NaN
// (unwritten or computed), on a tolerance miss, and on any storage element outside the tensor that
// was written.
void compare(const std::string& what, const Tensor& got, const std::vector<double>& ref, double tol,
             const std::string& label, double floor = 0.0) {
  std::vector<char> logical(got.storage(), 0);
  double max_ref = 0, max_err = 0;
  size_t nan_count = 0, i = 0;
  for (int64_t bi = 0; bi < got.b; ++bi)
    for (int64_t si = 0; si < got.s; ++si)
      for (int64_t hi = 0; hi < got.h; ++hi)
        for (int64_t di = 0; di < got.d; ++di, ++i) {
          const size_t o = static_cast<size_t>(got.off(bi, si, hi, di));
          logical[o] = 1;
          const double g = got.get(o);
          if (std::isnan(g)) {
            ++nan_count;
            continue;
          }
          max_ref = std::max(max_ref, std::fabs(ref[i]));
          max_err = std::max(max_err, std::fabs(g - ref[i]));
        }
  size_t touched = 0;
  for (size_t o = 0; o < got.storage(); ++o)
    if (!logical[o] && !std::isnan(got.get(o))) ++touched;
  const double rel = max_err / std::max({max_ref, floor, 1e-30});
  if (g_verbose) std::printf("      %-4s max err %.3g, rel %.3g (tol %.3g)\n", what.c_str(), max_err, rel, tol);
  if (nan_count) fail(label + ": " + what + " has " + std::to_string(nan_count) + " NaN / unwritten elements");
  if (touched) fail(label + ": " + what + " wrote " + std::to_string(touched) + " elements outside the tensor");
  if (!(rel <= tol)) {
    char buf[200];
    std::snprintf(buf, sizeof buf, "%s: %s max err %.3g (rel %.3g > tol %.1g), max|ref| %.3g", label.c_str(),
                  what.c_str(), max_err, rel, tol, max_ref);
    fail(buf);
  }
}

// LSE (float32 for every dtype, from inputs exact in float32): absolute slack plus a few float32
// roundings of |LSE| (its log2-domain offset and the conversion to natural log).
constexpr double kLseAtol = 1e-5;
constexpr double kLseUlps = 4.0;
constexpr double kF32Roundoff = 1.0 / (1 << 24);

// Checks one backend run against the reference, plus the rows-with-no-key contract.
void check_outputs(const Problem& pr, const Outputs& o, const Reference& ref, const std::string& label) {
  const Case& c = pr.c;
  const double tol = c.dt == DType::kFloat32 ? 1e-4 : 1e-2;
  double max_ref_lse = 0;
  for (double x : ref.lse)
    if (std::isfinite(x)) max_ref_lse = std::max(max_ref_lse, std::fabs(x));
  const double lse_tol = kLseAtol + kLseUlps * kF32Roundoff * max_ref_lse;
  // The backward recomputes P from the stored float32 LSE: every P of a row is off by up to its
  // error (relative), which only matters when |LSE| is large.
  const double grad_tol = tol + lse_tol;
  compare("out", o.out, ref.out, tol, label);
  compare("dq", o.dq, ref.dq, grad_tol, label, kCancellationFloor * ref.dq_terms);
  compare("dk", o.dk, ref.dk, grad_tol, label, kCancellationFloor * ref.dk_terms);
  compare("dv", o.dv, ref.dv, grad_tol, label);
  double max_lse = 0, max_err = 0;
  for (size_t i = 0; i < o.lse.size(); ++i) {
    const double g = o.lse[i], r = ref.lse[i];
    if (std::isinf(r)) {
      if (!(std::isinf(g) && g > 0)) fail(label + ": lse of a row with no key is not +inf");
      continue;
    }
    if (!std::isfinite(g)) {
      fail(label + ": lse not finite (" + std::to_string(g) + ") where the reference is");
      continue;
    }
    max_lse = std::max(max_lse, std::fabs(r));
    max_err = std::max(max_err, std::fabs(g - r));
  }
  if (g_verbose) std::printf("      lse  max err %.3g (tol %.3g, max|lse| %.3g)\n", max_err, lse_tol, max_lse);
  if (max_err > lse_tol) fail(label + ": lse max err " + std::to_string(max_err) + " > " + std::to_string(lse_tol));
  // Rows with no visible key: out exactly 0, dq exactly 0.
  const int64_t no_key_rows = c.causal ? std::max<int64_t>(0, c.sq - c.sk) : 0;
  for (int64_t bi = 0; bi < c.b; ++bi)
    for (int64_t si = 0; si < no_key_rows; ++si)
      for (int64_t hi = 0; hi < c.hq; ++hi)
        for (int64_t di = 0; di < c.d; ++di) {
          const size_t off = static_cast<size_t>(o.out.off(bi, si, hi, di));
          if (o.out.get(off) != 0.0 || o.dq.get(off) != 0.0) {
            fail(label + ": a row with no visible key has out or dq != 0");
            return;
          }
        }
}

bool same_results(const Outputs& a, const Outputs& b) {
  return a.out.same_bits(b.out) && a.dq.same_bits(b.dq) && a.dk.same_bits(b.dk) && a.dv.same_bits(b.dv) &&
         std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0;
}

std::vector<Isa> isas_to_test() {
  std::vector<Isa> isas;
  for (int i = 0; i <= static_cast<int>(fa::cpu::detected_isa()); ++i) isas.push_back(static_cast<Isa>(i));
  return isas;
}

std::vector<Case> correctness_cases() {
  std::vector<Case> cases;
  const DType dts[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  const int64_t dims[] = {8, 40, 64, 80, 128, 256};
  for (DType dt : dts) {
    for (int64_t s : {1, 17, 97, 1023, 1025})
      for (bool causal : {false, true}) cases.push_back({1, s, s, 2, 2, 64, dt, causal, false});
    const int64_t pairs[][2] = {{113, 203}, {203, 113}, {1, 239}, {3, 799}, {1024, 1023}};
    int di = 0;
    for (const auto& sqsk : pairs)
      for (bool causal : {false, true}) cases.push_back({2, sqsk[0], sqsk[1], 2, 1, dims[di++ % 6], dt, causal, false});
    for (int64_t d : dims) cases.push_back({1, 77, 131, 2, 2, d, dt, d % 16 == 0, false});
    cases.push_back({2, 150, 90, 8, 2, 64, dt, true, false});   // GQA 4:1, causal, Sq > Sk
    cases.push_back({1, 90, 150, 8, 2, 40, dt, true, false});   // GQA 4:1, causal, Sq < Sk
    cases.push_back({2, 130, 130, 4, 1, 80, dt, false, false});  // MQA
    cases.push_back({1, 70, 200, 4, 1, 128, dt, true, true});   // MQA, causal, strided layout
    cases.push_back({2, 200, 70, 4, 2, 64, dt, true, true});    // causal Sq > Sk, strided layout
    cases.push_back({1, 97, 113, 2, 1, 64, dt, true, false, true});    // scores ~1e4, causal, GQA
    cases.push_back({1, 130, 70, 2, 2, 40, dt, false, false, true});  // scores ~1e4
    // batch * heads_kv >= 16: one K/V chunk per (batch, kv head) whatever the length, dQ stored
    // directly (above, fewer pairs: seqlens of 1023 and more have 2 chunks and a dQ reduction).
    cases.push_back({4, 150, 170, 16, 8, 40, dt, false, false});
    cases.push_back({4, 300, 100, 8, 8, 64, dt, true, false});  // Q tiles that see no key
  }
  // Chunked backward (B1, one kv head: K/V tiles split into chunks whose dQ partials are reduced),
  // with and without GQA; heads_kv == 1, so each is also checked for bit-identical results on pools
  // of 1, 2, 3 and 9 threads. Seqlen 1500: 24 K/V tiles in 3 chunks (8 tiles each; causal 5, 6, 13).
  for (int64_t hq : {1, 4})
    for (bool causal : {false, true}) cases.push_back({1, 1500, 1500, hq, 1, 64, DType::kFloat32, causal, false});
  cases.push_back({1, 100, 8200, 2, 1, 16, DType::kFloat32, true, false});   // 16 chunks (the most)
  cases.push_back({1, 2100, 1100, 1, 1, 32, DType::kBFloat16, true, false});  // rows 0-999 see no chunk
  return cases;
}

void run_correctness(uint64_t seed) {
  std::mt19937_64 rng(seed);
  ThreadPool pool(0);
  ThreadPool pool1(1), pool2(2), pool3(3), pool9(9);
  const std::vector<Isa> isas = isas_to_test();
  std::printf("correctness (pool of %d threads; variants:", pool.size());
  for (Isa isa : isas) std::printf(" %s", fa::cpu::isa_name(isa));
  std::printf(")\n");
  int n = 0;
  for (const Case& c : correctness_cases()) {
    Problem pr(c, rng);
    const Reference ref = reference(c, pr.q.canonical(), pr.k.canonical(), pr.v.canonical(), pr.dout.canonical(),
                                    static_cast<double>(pr.scale));
    const int before = g_failures;
    for (Isa isa : isas) {
      const std::string label = c.name() + " [" + fa::cpu::isa_name(isa) + "]";
      Outputs o(pr);
      run_backend(pr, o, pool, isa);
      check_outputs(pr, o, ref, label);
      // Determinism: again on the same pool, and on pools of 1, 2, 3 and 9 threads (9: more threads
      // than backward items, so each item gets its own scratch slot instead of its worker's).
      if (n % 4 == 0 || c.hkv == 1) {
        for (ThreadPool* other : {&pool, &pool1, &pool2, &pool3, &pool9}) {
          Outputs o2(pr);
          run_backend(pr, o2, *other, isa);
          if (!same_results(o, o2))
            fail(label + ": results differ between runs (pool of " + std::to_string(other->size()) + ")");
        }
      }
    }
    std::printf("  %-3s %s\n", g_failures == before ? "ok" : "BAD", c.name().c_str());
    ++n;
  }
}

// ---- non-finite inputs -------------------------------------------------------------------------------

// NaN / Inf in one element must reach only the outputs that depend on it (test/numerics.test.ts has
// the full per-element rules; this runs the same paths natively, on every ISA and under ASan/UBSan,
// with more tiles: the masked products of csrc/cpu/tile_kernels.h's gemm_masked). Causal, seqlen_q 200
// > seqlen_k 170 (30 rows see no key, row i sees keys j <= i - 30), GQA 2:1, batch 2; the poison sits
// in batch 1, kv head 1, key row 77 (seen by rows >= 107) or query row 150 (which sees keys 0-120).
// Checked: every output of batch 0 and of the other kv head is finite (no leak across sequences and
// heads); with the poison in k or v, out / lse / dq of the rows that do not see key 77 are finite, and
// those rows' out is bit-identical to the clean run's; with it in q, dk / dv of the keys row 150 does
// not see (121-169) are finite and equal the clean run's.
void run_nonfinite() {
  std::printf("non-finite inputs\n");
  ThreadPool pool(0);
  std::mt19937_64 rng(7);
  const float kPoison[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
  constexpr int64_t kKey = 77, kRow = 150, kHkv = 1, kB = 1;
  for (DType dt : {DType::kFloat32, DType::kBFloat16})
    for (Isa isa : isas_to_test())
      for (int where = 0; where < 3; ++where)    // 0: k, 1: v, 2: q
        for (int pi = 0; pi < 3; ++pi) {
          const Case c{2, 200, 170, 4, 2, 64, dt, /*causal=*/true, /*gapped=*/false};
          Problem clean(c, rng);
          Problem bad = clean;
          Tensor& t = where == 0 ? bad.k : where == 1 ? bad.v : bad.q;
          const int64_t row = where == 2 ? kRow : kKey, head = where == 2 ? 2 * kHkv : kHkv;
          t.set(static_cast<size_t>(t.off(kB, row, head, 5)), kPoison[pi]);
          Outputs oc(clean), ob(bad);
          run_backend(clean, oc, pool, isa);
          run_backend(bad, ob, pool, isa);
          const std::string label = std::string(where == 0 ? "k" : where == 1 ? "v" : "q") + " " +
                                    (pi == 0 ? "NaN" : pi == 1 ? "+Inf" : "-Inf") + " " + fa::dtype_name(dt) + " [" +
                                    fa::cpu::isa_name(isa) + "]";
          const int before = g_failures;
          const auto finite_q = [&](const Tensor& x, int64_t bi, int64_t si, int64_t hi) {
            for (int64_t di = 0; di < c.d; ++di)
              if (!std::isfinite(x.get(static_cast<size_t>(x.off(bi, si, hi, di))))) return false;
            return true;
          };
          const auto same_row = [&](const Tensor& x, const Tensor& y, int64_t bi, int64_t si, int64_t hi) {
            for (int64_t di = 0; di < c.d; ++di) {
              const size_t o = static_cast<size_t>(x.off(bi, si, hi, di));
              if (x.get(o) != y.get(o)) return false;
            }
            return true;
          };
          for (int64_t bi = 0; bi < c.b; ++bi)
            for (int64_t hi = 0; hi < c.hq; ++hi) {
              const bool poisoned_head = bi == kB && hi / (c.hq / c.hkv) == kHkv;
              for (int64_t si = 0; si < c.sq; ++si) {
                const bool sees_key = si - 30 >= kKey;
                const bool untouched = !poisoned_head || (where != 2 && !sees_key) || (where == 2 && hi != 2 * kHkv) ||
                                       (where == 2 && si != kRow);
                if (!untouched) continue;
                const float l = ob.lse[static_cast<size_t>((bi * c.hq + hi) * c.sq + si)];
                if (!finite_q(ob.out, bi, si, hi) || !finite_q(ob.dq, bi, si, hi) || std::isnan(l))
                  fail(label + ": row " + std::to_string(si) + " head " + std::to_string(hi) + " batch " +
                       std::to_string(bi) + " was reached");
                else if (!same_row(ob.out, oc.out, bi, si, hi))
                  fail(label + ": out row " + std::to_string(si) + " head " + std::to_string(hi) + " changed");
              }
            }
          for (int64_t bi = 0; bi < c.b; ++bi)
            for (int64_t hk = 0; hk < c.hkv; ++hk)
              for (int64_t j = 0; j < c.sk; ++j) {
                const bool reached = bi == kB && hk == kHkv && (where != 2 || j <= kRow - 30);
                if (reached && where != 1) continue;  // k: dk of key 77 and every key its rows see; q: keys row 150 sees
                if (where == 1 && reached) continue;   // v: dk of every key the rows that see key 77 see
                if (!finite_q(ob.dk, bi, j, hk) || !finite_q(ob.dv, bi, j, hk))
                  fail(label + ": dk / dv of key " + std::to_string(j) + " kv head " + std::to_string(hk) + " batch " +
                       std::to_string(bi) + " were reached");
                else if (where == 2 && (!same_row(ob.dk, oc.dk, bi, j, hk) || !same_row(ob.dv, oc.dv, bi, j, hk)))
                  fail(label + ": dk / dv of key " + std::to_string(j) + " changed");
              }
          std::printf("  %-3s %s\n", g_failures == before ? "ok" : "BAD", label.c_str());
        }
}

// ---- ThreadPool -------------------------------------------------------------------------------------

void check_thread_pool() {
  std::printf("thread pool\n");
  const int before = g_failures;
  for (int threads : {0, 1, 2, 5}) {
    ThreadPool pool(threads);
    if (pool.size() < 1) fail("pool size < 1");
    int calls = 0;
    pool.parallel_for(0, [&](int64_t, int) { ++calls; });
    if (calls != 0) fail("parallel_for(0) ran fn");
    pool.parallel_for(1, [&](int64_t i, int w) { calls += (i == 0 && w == 0); });
    if (calls != 1) fail("parallel_for(1) did not run index 0 on worker 0 once");
    for (int rep = 0; rep < 50; ++rep) {
      const int64_t n = 1 + rep * 37;
      std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
      std::vector<std::atomic<int>> busy(static_cast<size_t>(pool.size()));
      std::atomic<bool> bad{false};
      pool.parallel_for(n, [&](int64_t i, int w) {
        if (w < 0 || w >= pool.size() || busy[static_cast<size_t>(w)].exchange(1) != 0) bad = true;
        seen[static_cast<size_t>(i)].fetch_add(1);
        busy[static_cast<size_t>(w)].store(0);
      });
      for (auto& s : seen)
        if (s.load() != 1) bad = true;
      if (bad) {
        fail("parallel_for: an index not run exactly once, or a worker id reused concurrently");
        break;
      }
    }
    // The first exception is rethrown after all workers finished; the pool stays usable.
    for (int rep = 0; rep < 20; ++rep) {
      std::atomic<int> running{0};
      std::atomic<bool> overlap{false};
      try {
        pool.parallel_for(100, [&](int64_t i, int) {
          running.fetch_add(1);
          if (i == 7) {
            running.fetch_sub(1);
            throw std::runtime_error("boom 7");
          }
          running.fetch_sub(1);
        });
        fail("parallel_for swallowed an exception");
      } catch (const std::runtime_error& e) {
        if (std::string(e.what()) != "boom 7") fail("parallel_for rethrew the wrong exception");
        if (running.load() != 0) overlap = true;
      }
      if (overlap) fail("parallel_for returned while fn was still running");
    }
    std::atomic<int64_t> sum{0};
    pool.parallel_for(1000, [&](int64_t i, int) { sum += i; });
    if (sum.load() != 999 * 1000 / 2) fail("parallel_for after an exception lost indices");
  }
  {  // two threads calling parallel_for on one pool are serialised, both complete
    ThreadPool pool(3);
    std::atomic<int64_t> sum{0};
    auto caller = [&] {
      for (int rep = 0; rep < 50; ++rep) pool.parallel_for(100, [&](int64_t i, int) { sum += i; });
    };
    std::thread other(caller);
    caller();
    other.join();
    if (sum.load() != 2 * 50 * (99 * 100 / 2)) fail("concurrent parallel_for callers lost indices");
  }
  for (int i = 0; i < 200; ++i) {  // construction / destruction never hangs
    ThreadPool pool(3);
    if (i % 2) pool.parallel_for(3, [](int64_t, int) {});
  }
  std::printf("  %-3s construction, n = 0 / 1 / many, worker ids, exceptions, reuse, concurrent callers\n",
              g_failures == before ? "ok" : "BAD");
}

// ---- timing -----------------------------------------------------------------------------------------

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU seconds of all threads of this process: next to the wall time, it shows how much of the
// machine the run actually got (the machine may be shared).
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double median3(double a, double b, double c) { return std::max(std::min(a, b), std::min(std::max(a, b), c)); }

void run_perf(uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x5eed);
  ThreadPool pool(0);
  const Case c{1, 2048, 2048, 8, 8, 64, DType::kFloat32, false, false};
  Problem pr(c, rng);
  const double flops_fwd = 4.0 * c.b * c.hq * c.sq * c.sk * c.d;
  std::printf("speed target: %s, fwd+bwd < 2 s, pool of %d threads (median of 3)\n", c.name().c_str(), pool.size());
  for (Isa isa : isas_to_test()) {
    double tf[3], tb[3], cf[3], cb[3];
    for (int rep = 0; rep < 3; ++rep) {
      Outputs o(pr);
      fa::AttentionBwdParams p = make_params(pr, o);
      double c0 = process_cpu_seconds();
      auto t0 = std::chrono::steady_clock::now();
      fa::cpu::flash_fwd(p, pool, isa);
      tf[rep] = seconds_since(t0);
      cf[rep] = process_cpu_seconds() - c0;
      c0 = process_cpu_seconds();
      t0 = std::chrono::steady_clock::now();
      fa::cpu::flash_bwd(p, pool, isa);
      tb[rep] = seconds_since(t0);
      cb[rep] = process_cpu_seconds() - c0;
    }
    const double f = median3(tf[0], tf[1], tf[2]), b = median3(tb[0], tb[1], tb[2]);
    const bool target = isa == fa::cpu::detected_isa();
    std::printf("  %-8s fwd %.3f s (%.0f GFLOP/s, CPU %.3f s)  bwd %.3f s (%.0f GFLOP/s, CPU %.3f s)  total %.3f s%s\n",
                fa::cpu::isa_name(isa), f, flops_fwd / f * 1e-9, median3(cf[0], cf[1], cf[2]), b,
                2.5 * flops_fwd / b * 1e-9, median3(cb[0], cb[1], cb[2]), f + b,
                target ? (f + b < 2.0 ? "  [target met]" : "  [TARGET MISSED]") : "");
    if (target && !(f + b < 2.0)) fail("speed target missed");
  }
}

long peak_rss_kib() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;  // KiB on Linux
}

// seqlen 32k fwd+bwd: an N^2 fp32 buffer would be 4 GiB; the inputs and outputs are 8 MiB each.
void run_long(uint64_t seed) {
  std::mt19937_64 rng(seed ^ 0x32c);
  const Case c{1, 32768, 32768, 1, 1, 64, DType::kFloat32, false, false};
  const long rss0 = peak_rss_kib();
  Problem pr(c, rng);
  Outputs o(pr);
  ThreadPool pool(0);
  fa::AttentionBwdParams p = make_params(pr, o);
  const double c0 = process_cpu_seconds();
  auto t0 = std::chrono::steady_clock::now();
  fa::cpu::flash_fwd(p, pool);
  const double tf = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  fa::cpu::flash_bwd(p, pool);
  const double tb = seconds_since(t0);
  const double cpu = process_cpu_seconds() - c0;
  const long rss = peak_rss_kib();
  size_t nan = 0;
  for (const Tensor* t : {&o.out, &o.dq, &o.dk, &o.dv})
    for (float x : t->f32) nan += std::isnan(x) ? 1 : 0;
  const double tensors_mib = 8.0 * c.sq * c.d * 4 / (1 << 20);
  std::printf("long sequence: %s, pool of %d threads\n  fwd %.2f s  bwd %.2f s  total %.2f s (CPU %.2f s); peak RSS "
              "%.0f MiB (%.0f MiB before; the 8 input/output tensors are %.0f MiB; N^2 fp32 would be 4096 MiB)\n",
              c.name().c_str(), pool.size(), tf, tb, tf + tb, cpu, rss / 1024.0, rss0 / 1024.0, tensors_mib);
  if (nan) fail("long sequence: NaN in the outputs");
  if (rss / 1024.0 > 1024.0) fail("long sequence: peak RSS above 1 GiB");
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t seed = std::random_device{}();
  bool perf = true, correctness = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--no-perf") perf = false;
    else if (a == "--perf-only") correctness = false;
    else if (a == "--verbose") g_verbose = true;
    else {
      std::fprintf(stderr, "usage: cpu_check [--seed N] [--no-perf] [--perf-only] [--verbose]\n");
      return 2;
    }
  }
  std::printf("cpu_check: seed %llu, best variant %s\n", static_cast<unsigned long long>(seed),
              fa::cpu::isa_name(fa::cpu::detected_isa()));
  if (perf) run_long(seed);  // first, so the peak RSS is its own
  if (correctness) {
    check_thread_pool();
    run_correctness(seed);
    run_nonfinite();
  }
  if (perf) run_perf(seed);
  std::printf("%s: %d failure(s)\n", g_failures ? "FAILED" : "PASSED", g_failures);
  return g_failures ? 1 : 0;
}
