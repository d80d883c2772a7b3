// GPU check and timing of the float32 FA2 backward (csrc/cuda/flash/flash_bwd_fp32.cu), built and run by
// scripts/flash-bwd-fp32-check.sh:  flash_bwd_fp32_check [seed] [--no-bench]
// Each case: fresh random float32 q, k, v, dout (never zero; the seed is printed), out and lse from
// flash_fwd_fp32 in the case's precision (the naive forward where it has no kernel), then
// flash_bwd_fp32, run kRuns times into dq, dk, dv poisoned with NaN (0xFF bytes) before each run, and
// the naive fp32 backward (csrc/cuda/naive_attention.cu, full fp32 FMA) on the same inputs.
//
// References (host, from the same inputs and the forward's out and lse, so that they answer exactly the
// question the kernels get; P = exp(scale q.k - lse), D = rowsum(dout o out), dS = P (dP - D),
// dq = scale dS k, dk = scale dS^T q, dv = P^T dout, dk / dv summed over the query heads of a group):
//   ref   float64 throughout;
//   same  the plain same-precision implementation of the kernel's 'tf32' arithmetic: float32
//         accumulation in index order, every operand of the five products (q, k, v, dout, P, dS)
//         rounded to TF32 first as cvt.rna does; softmax and D in float32 from the unrounded values.
// They are evaluated on every row of dq and every key row of dk / dv when B*Hq*Sq*Sk*D <= kHostRefWork,
// else on a sample of rows (the first and last kEdgeRows and evenly spaced ones in between), each
// sampled row over all of its keys / queries, so that every case has a float64 reference.
// Rules, per tensor (dq, dk, dv), max over the checked elements and every run:
//   'highest'  |flash - ref| <= 3 |naive - ref| + 1e-5       (the flash-attention rule for gradients
//              against the full-fp32 naive kernel), and, so that a 3xTF32 path that silently ran plain
//              TF32 fails,  |flash - ref| <= |same - ref| / 4 + 3 |naive - ref| + 1e-6;
//   'tf32'     |flash - ref| <= 3 |same - ref| + 1e-5.
//              Why this bound: TF32 keeps 10 explicit mantissa bits, so each rounded operand is off by up
//              to 2^-11 relative and each product by up to ~2^-10; over a sum of n products with random
//              signs that is ~2^-11 sqrt(n) |term|, far above fp32 accumulation error, so a float64
//              reference from unrounded inputs sees the rounding itself. The same-precision
//              implementation rounds the same q, k, v, dout values bit for bit as the kernel does (the
//              dominant error, shared), and P, dS the same way up to ties; what differs is fp32
//              accumulation order and the exp2 / ex2.approx path, both 2^-24-level. So the kernel's error
//              is within a small factor of the same implementation's; 3x is the flash-attention suite's
//              factor for gradients, and any layout or masking bug gives O(1) relative errors.
// plus: no NaN left (every element written, in every run), rows that see no key (causal, Sq > Sk) give
// dq exactly 0, dk and dv bit-identical over the kRuns runs, dq bit-identical too in deterministic mode
// (its run-to-run difference is printed otherwise), and flash_bwd_fp32_unsupported_reason is null for
// every case.
// Non-finite containment (run_containment_cases, causal, both precisions and modes): one element of q, k
// or dout made NaN, +inf or -inf, and the call (the forward, for out and lse of the poisoned inputs, then
// the backward) compared element by element with the same call on the clean inputs
// (containment_pattern). What standard attention makes non-finite, with diag = sk - sq and row i seeing
// key j iff j <= i + diag:
//   q[b, i, h, c] NaN / +inf: row i's lse is NaN: its out, lse and dq, and dk and dv of every key it
//     sees, all columns;
//   k[b, j, hk, c] NaN / +inf (column c of q made positive, so that +inf scores +inf): every row of the
//     query heads of KV head hk that sees key j has NaN lse: those rows' out, lse and dq, and dk and dv of
//     every key they see (with bottom-right causal the last row sees every key: all of dk and dv of hk);
//     -inf scores -inf and drops the key from those rows (finite, changed results; NaN under 3xTF32):
//     that reach is not checked, only everything outside it;
//   dout[b, i, h, c] NaN / +inf: D_i is non-finite: dq row i and dk of every key row i sees, all
//     columns, and dv of those keys in column c only (out and lse do not change).
// A row that sees no key reaches nothing. Every other element must be bit-identical to the clean call's
// (dq through fp32 atomics: finite and within its run-to-run noise). The backward's products multiply
// the P = dS = 0 of hidden pairs by the poisoned operand (0 * NaN = NaN: bug B2, bwd_nonfinite.cuh), so
// the poison sits next to the hidden pairs of tiles that cross the diagonal (see main). A failing case
// prints its first violations (element, expected class, value, clean value).
// Then (unless --no-bench) timing (check_timing.h: median of 20 cudaEvent-timed single calls after
// warm-up, and the median of 5 rounds of 20 calls queued back to back) of B4 H1 S8192 D64 (the bench's
// fp32-memory-wall shape) and the FA2 grid (B*S = 16k, H*D = 2048, S 512 / 1k / 2k / 8k, D 64 / 128), causal and
// not, in both precisions (and tf32 deterministic), with the naive backward where its N^2 workspace stays
// below 4 GiB; TFLOP/s = 2.5 * 4 B H S^2 D / t (halved when causal), FA2's count for the backward.
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "check_args.h"
#include "check_cuda.h"
#include "check_timing.h"
#include "check_containment.h"
#include "common/attention_params.h"
#include "cuda/flash/flash_bwd_fp32.h"
#include "cuda/flash/flash_fwd_fp32.h"
#include "cuda/naive_attention.h"

namespace {

using fa::Fp32Precision;

constexpr double kNaiveErrFactor = 3.0;  // 'highest': 3x the full-fp32 naive kernel's error
constexpr double kSameErrFactor = 3.0;   // 'tf32': 3x the same-precision implementation's error
constexpr double kAbsSlack = 1e-5;
// 'highest' must also beat plain TF32 by this factor (3xTF32 is ~2^11 times more accurate per product).
constexpr double kHighestGain = 4.0;
constexpr double kHighestNoiseSlack = 1e-6;
constexpr double kHostRefWork = 5e7;  // B*Hq*rows*keys*D of each host pass (dq rows, dk / dv key rows)
constexpr int64_t kEdgeRows = 32;     // sampled passes always check the first and last rows
constexpr int kRuns = 3;              // flash runs per case: dk, dv (and dq when deterministic) bit-identical
constexpr double kMinMag = 0.1;
constexpr double kQkMaxMag = 1.5;
constexpr double kVMaxMag = 1.0;
constexpr double kDoutMaxMag = 1.0;
constexpr int64_t kBenchTokens = 16 * 1024;  // B * S of the FA2 grid
constexpr int64_t kBenchWidth = 2048;        // H * D of the FA2 grid
constexpr double kBwdFlopsPerFwd = 2.5;      // FA2 counts the backward as 2.5 forwards (5 matmuls vs 2)
constexpr size_t kNaiveBenchMaxBytes = size_t{4} << 30;  // the naive backward's N^2 workspace, for timing
// Containment cases with dq through fp32 atomics (added in a different order in every call): an element
// that must equal the clean call's may differ by the rounding of the fp32 partial sums, 2^-24 of their
// magnitude each; this fraction of max |dq| bounds that with room. NaN or inf leaking there is caught by
// the finiteness that kSame demands.
constexpr double kAtomicDqFloor = 1.0 / 65536;
constexpr uint32_t kTf32HalfUlp = 0x1000;  // bit 12: the highest of the 13 mantissa bits TF32 drops
constexpr uint32_t kTf32Mask = 0xffffe000;
constexpr uint32_t kF32ExpMask = 0x7f800000;

const char* precision_name(Fp32Precision p) { return p == Fp32Precision::kHighest ? "highest" : "tf32"; }

// cvt.rna.tf32.f32 on the host: round the 13 dropped mantissa bits to nearest, ties away from zero.
float tf32_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & kF32ExpMask) != kF32ExpMask) u += kTf32HalfUlp;
  u &= kTf32Mask;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

struct Case {
  int64_t batch, sq, sk, hq, hkv, d;
  bool causal;
  Fp32Precision precision;
  bool deterministic;
};

// Keys query row i sees: all, or j <= i + (sk - sq) when causal (none for the first sq - sk rows).
int64_t visible_keys(const Case& c, int64_t i) {
  return c.causal ? std::clamp<int64_t>(i + c.sk - c.sq + 1, 0, c.sk) : c.sk;
}

struct Dev {
  void* ptr = nullptr;
  explicit Dev(size_t n) { CHECK_CUDA(cudaMalloc(&ptr, n)); }
  ~Dev() { CHECK_CUDA(cudaFree(ptr)); }
};

// Random values: magnitude in [kMinMag, max], random sign.
std::vector<float> random_values(int64_t n, double max_mag, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> mag(kMinMag, max_mag);
  std::bernoulli_distribution neg(0.5);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(neg(rng) ? -mag(rng) : mag(rng));
  return v;
}

void upload(const Dev& d, const std::vector<float>& v) {
  CHECK_CUDA(cudaMemcpy(d.ptr, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
}

std::vector<float> download(const Dev& d, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  CHECK_CUDA(cudaMemcpy(v.data(), d.ptr, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
  return v;
}

std::vector<uint32_t> download_bits(const Dev& d, int64_t n) {
  std::vector<uint32_t> v(static_cast<size_t>(n));
  CHECK_CUDA(cudaMemcpy(v.data(), d.ptr, v.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  return v;
}

std::vector<float> bits_to_floats(const std::vector<uint32_t>& bits) {
  std::vector<float> v(bits.size());
  std::memcpy(v.data(), bits.data(), bits.size() * sizeof(float));
  return v;
}

fa::AttentionFwdParams make_params(const Case& c, const Dev& q, const Dev& k, const Dev& v, const Dev& o,
                                   const Dev& lse) {
  fa::AttentionFwdParams p;
  p.batch = c.batch;
  p.seqlen_q = c.sq;
  p.seqlen_k = c.sk;
  p.heads_q = c.hq;
  p.heads_kv = c.hkv;
  p.head_dim = c.d;
  fa::set_contiguous_strides(c.sq, c.hq, c.d, &p.q_batch_stride, &p.q_row_stride, &p.q_head_stride);
  fa::set_contiguous_strides(c.sk, c.hkv, c.d, &p.k_batch_stride, &p.k_row_stride, &p.k_head_stride);
  fa::set_contiguous_strides(c.sk, c.hkv, c.d, &p.v_batch_stride, &p.v_row_stride, &p.v_head_stride);
  fa::set_contiguous_strides(c.sq, c.hq, c.d, &p.o_batch_stride, &p.o_row_stride, &p.o_head_stride);
  p.dtype = fa::DType::kFloat32;
  p.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  p.scale_log2 = p.softmax_scale * fa::kLog2e;
  p.causal = c.causal;
  p.fp32_precision = c.precision;
  p.q = q.ptr;
  p.k = k.ptr;
  p.v = v.ptr;
  p.out = o.ptr;
  p.lse = static_cast<float*>(lse.ptr);
  return p;
}

// Backward parameters on top of the forward's (same sizes, strides, q, k, v, out). The forward's lse
// becomes lse_in; the `lse` output field is cleared, as the backward must not use it.
fa::AttentionBwdParams make_bwd_params(const Case& c, const fa::AttentionFwdParams& fwd, const Dev& dout,
                                       const Dev& dq, const Dev& dk, const Dev& dv) {
  fa::AttentionBwdParams p;
  static_cast<fa::AttentionFwdParams&>(p) = fwd;
  p.lse_in = fwd.lse;
  p.lse = nullptr;
  p.dout = dout.ptr;
  p.dq = dq.ptr;
  p.dk = dk.ptr;
  p.dv = dv.ptr;
  p.deterministic = c.deterministic;
  fa::set_grad_strides_like_inputs(&p);
  return p;
}

// out and lse, the backward's inputs: flash_fwd_fp32 in the case's precision, or the naive forward
// where it has no kernel. Returns which one ran.
const char* run_forward(const fa::AttentionFwdParams& p, cudaStream_t stream) {
  const cudaError_t err = fa::cuda::flash_fwd_fp32(p, stream);
  if (err != cudaErrorNotSupported) {
    CHECK_CUDA(err);
    return "flash";
  }
  CHECK_CUDA(fa::cuda::naive_attention_fwd(p, stream));
  return "naive";
}

// Every row below n if there are at most max_rows, else the first and last kEdgeRows and evenly spaced
// rows in between, max_rows in all (at least the edges).
std::vector<int64_t> sample_rows(int64_t n, int64_t max_rows) {
  std::vector<int64_t> rows;
  if (n <= std::max(max_rows, 2 * kEdgeRows)) {
    for (int64_t i = 0; i < n; ++i) rows.push_back(i);
    return rows;
  }
  const int64_t middle = std::max<int64_t>(max_rows - 2 * kEdgeRows, 0);
  for (int64_t i = 0; i < kEdgeRows; ++i) rows.push_back(i);
  for (int64_t m = 0; m < middle; ++m) rows.push_back(kEdgeRows + (m * (n - 2 * kEdgeRows)) / middle);
  for (int64_t i = n - kEdgeRows; i < n; ++i) rows.push_back(i);
  return rows;
}

// The host references on the sampled rows: ref (float64) and same (the float32 / TF32 implementation),
// each in the layout of the full tensor; only the sampled rows (q_rows of dq, k_rows of dk and dv, all
// heads and columns) are filled and compared.
struct HostRef {
  std::vector<int64_t> q_rows, k_rows;
  std::vector<double> dq, dk, dv;
  std::vector<float> same_dq, same_dk, same_dv;
};

struct Inputs {
  std::vector<float> q, k, v, dout, out, lse;  // as the kernels get them
  std::vector<float> qt, kt, vt, doutt;        // rounded to TF32 (the same-precision operands)
};

HostRef host_reference(const Case& c, float softmax_scale, const Inputs& in) {
  HostRef r;
  const int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hkv * c.d;
  const double work_per_row_q = static_cast<double>(c.batch * c.hq) * c.sk * c.d;
  const double work_per_row_k = static_cast<double>(c.batch * c.hq) * c.sq * c.d;
  r.q_rows = sample_rows(c.sq, static_cast<int64_t>(kHostRefWork / work_per_row_q));
  r.k_rows = sample_rows(c.sk, static_cast<int64_t>(kHostRefWork / work_per_row_k));
  r.dq.assign(nq, 0.0);
  r.dk.assign(nk, 0.0);
  r.dv.assign(nk, 0.0);
  r.same_dq.assign(nq, 0.0f);
  r.same_dk.assign(nk, 0.0f);
  r.same_dv.assign(nk, 0.0f);
  const int64_t group = c.hq / c.hkv;
  const double scale = softmax_scale;  // the float the kernels get
  const auto qoff = [&](int64_t b, int64_t i, int64_t h) { return ((b * c.sq + i) * c.hq + h) * c.d; };
  const auto koff = [&](int64_t b, int64_t j, int64_t h) { return ((b * c.sk + j) * c.hkv + h) * c.d; };
  // D per query row, float64 and float32 (the kernels' preprocess is float32 on unrounded values).
  std::vector<double> delta(c.batch * c.hq * c.sq);
  std::vector<float> delta32(delta.size());
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.sq; ++i) {
        const int64_t o = qoff(b, i, h);
        double d64 = 0;
        float d32 = 0;
        for (int64_t x = 0; x < c.d; ++x) {
          d64 += static_cast<double>(in.dout[o + x]) * in.out[o + x];
          d32 += in.dout[o + x] * in.out[o + x];
        }
        delta[(b * c.hq + h) * c.sq + i] = d64;
        delta32[(b * c.hq + h) * c.sq + i] = d32;
      }
  // P and dS of one (query row, key) pair in both precisions.
  struct Pair {
    double p, ds;    // float64
    float pt, dst;   // float32, rounded to TF32 as product operands
  };
  const auto pair = [&](int64_t b, int64_t h, int64_t i, int64_t j) {
    const int64_t qo = qoff(b, i, h), ko = koff(b, j, h / group);
    const int64_t stat = (b * c.hq + h) * c.sq + i;
    double s = 0, dp = 0;
    float s32 = 0, dp32 = 0;
    for (int64_t x = 0; x < c.d; ++x) {
      s += static_cast<double>(in.q[qo + x]) * in.k[ko + x];
      dp += static_cast<double>(in.dout[qo + x]) * in.v[ko + x];
      s32 += in.qt[qo + x] * in.kt[ko + x];  // TF32 x TF32 is exact in float32
      dp32 += in.doutt[qo + x] * in.vt[ko + x];
    }
    Pair pr;
    pr.p = std::exp(scale * s - in.lse[stat]);
    pr.ds = pr.p * (dp - delta[stat]);
    const float p32 = std::exp(softmax_scale * s32 - in.lse[stat]);
    pr.pt = tf32_round(p32);
    pr.dst = tf32_round(p32 * (dp32 - delta32[stat]));
    return pr;
  };
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.hq; ++h) {
      for (int64_t i : r.q_rows) {
        const int64_t qo = qoff(b, i, h);
        std::vector<double> acc(c.d, 0.0);
        std::vector<float> acc32(c.d, 0.0f);
        for (int64_t j = 0; j < visible_keys(c, i); ++j) {
          const Pair pr = pair(b, h, i, j);
          const int64_t ko = koff(b, j, h / group);
          for (int64_t x = 0; x < c.d; ++x) {
            acc[x] += pr.ds * in.k[ko + x];
            acc32[x] += pr.dst * in.kt[ko + x];
          }
        }
        for (int64_t x = 0; x < c.d; ++x) {
          r.dq[qo + x] = scale * acc[x];
          r.same_dq[qo + x] = softmax_scale * acc32[x];
        }
      }
    }
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t kvh = 0; kvh < c.hkv; ++kvh)
      for (int64_t j : r.k_rows) {
        const int64_t ko = koff(b, j, kvh);
        std::vector<double> dk(c.d, 0.0), dv(c.d, 0.0);
        std::vector<float> dk32(c.d, 0.0f), dv32(c.d, 0.0f);
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
          for (int64_t i = 0; i < c.sq; ++i) {
            if (j >= visible_keys(c, i)) continue;
            const Pair pr = pair(b, h, i, j);
            const int64_t qo = qoff(b, i, h);
            for (int64_t x = 0; x < c.d; ++x) {
              dk[x] += pr.ds * in.q[qo + x];
              dv[x] += pr.p * in.dout[qo + x];
              dk32[x] += pr.dst * in.qt[qo + x];
              dv32[x] += pr.pt * in.doutt[qo + x];
            }
          }
        for (int64_t x = 0; x < c.d; ++x) {
          r.dk[ko + x] = scale * dk[x];
          r.dv[ko + x] = dv[x];
          r.same_dk[ko + x] = softmax_scale * dk32[x];
          r.same_dv[ko + x] = dv32[x];
        }
      }
  return r;
}

// max |got - want| over the sampled rows (rows of `row_len` elements: one row index selects `per_row`
// consecutive elements at every (batch) block of `rows_total` rows); NaNs left out (counted on their own).
template <typename T>
double max_err(const std::vector<T>& got, const std::vector<double>& want, const std::vector<int64_t>& rows,
               int64_t batch, int64_t rows_total, int64_t row_len) {
  double err = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i : rows)
      for (int64_t x = 0; x < row_len; ++x) {
        const size_t at = static_cast<size_t>((b * rows_total + i) * row_len + x);
        if (!std::isnan(got[at])) err = std::max(err, std::fabs(static_cast<double>(got[at]) - want[at]));
      }
  return err;
}

int64_t count_nan(const std::vector<float>& v) {
  return std::count_if(v.begin(), v.end(), [](float x) { return std::isnan(x); });
}

// One of dq, dk, dv: flash's error against ref, the comparison implementations' errors, and the tolerance.
struct TensorCheck {
  const char* name;
  double err, naive_err, same_err, tol;
  bool ok;
};

TensorCheck check_tensor(const char* name, const Case& c, const std::vector<std::vector<float>>& flash_runs,
                         const std::vector<float>& naive, const std::vector<float>& same,
                         const std::vector<double>& ref, const std::vector<int64_t>& rows, int64_t rows_total,
                         int64_t row_len) {
  TensorCheck t{name, 0, 0, 0, 0, false};
  for (const auto& run : flash_runs) t.err = std::max(t.err, max_err(run, ref, rows, c.batch, rows_total, row_len));
  t.naive_err = max_err(naive, ref, rows, c.batch, rows_total, row_len);
  t.same_err = max_err(same, ref, rows, c.batch, rows_total, row_len);
  if (c.precision == Fp32Precision::kHighest) {
    t.tol = kNaiveErrFactor * t.naive_err + kAbsSlack;
    const double beats_tf32 = t.same_err / kHighestGain + kNaiveErrFactor * t.naive_err + kHighestNoiseSlack;
    t.ok = t.err <= t.tol && t.err <= beats_tf32;
  } else {
    t.tol = kSameErrFactor * t.same_err + kAbsSlack;
    t.ok = t.err <= t.tol;
  }
  return t;
}

void poison(const Dev& d, int64_t n, cudaStream_t stream) {
  CHECK_CUDA(cudaMemsetAsync(d.ptr, 0xFF, n * sizeof(float), stream));  // NaN
}

void print_case_head(bool ok, const Case& c) {
  std::printf("%s %-7s %-6s B%" PRId64 " Sq%-5" PRId64 " Sk%-5" PRId64 " Hq%" PRId64 " Hkv%" PRId64 " D%-3" PRId64
              " %-6s",
              ok ? "PASS" : "FAIL", precision_name(c.precision), c.deterministic ? "det" : "atomic", c.batch, c.sq,
              c.sk, c.hq, c.hkv, c.d, c.causal ? "causal" : "full");
}

bool run_case(const Case& c, std::mt19937_64& rng) {
  const int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hkv * c.d;
  const int64_t nlse = c.batch * c.hq * c.sq;
  Inputs in;
  in.q = random_values(nq, kQkMaxMag, rng);
  in.k = random_values(nk, kQkMaxMag, rng);
  in.v = random_values(nk, kVMaxMag, rng);
  in.dout = random_values(nq, kDoutMaxMag, rng);
  const size_t fq = nq * sizeof(float), fk = nk * sizeof(float);
  Dev q_dev(fq), k_dev(fk), v_dev(fk), dout_dev(fq), out_dev(fq), lse_dev(nlse * sizeof(float));
  Dev flash_dq(fq), flash_dk(fk), flash_dv(fk), naive_dq(fq), naive_dk(fk), naive_dv(fk);
  upload(q_dev, in.q);
  upload(k_dev, in.k);
  upload(v_dev, in.v);
  upload(dout_dev, in.dout);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  const auto pfwd = make_params(c, q_dev, k_dev, v_dev, out_dev, lse_dev);
  const char* fwd_path = run_forward(pfwd, stream);
  const auto pf = make_bwd_params(c, pfwd, dout_dev, flash_dq, flash_dk, flash_dv);
  const auto pn = make_bwd_params(c, pfwd, dout_dev, naive_dq, naive_dk, naive_dv);
  if (const char* reason = fa::cuda::flash_bwd_fp32_unsupported_reason(pf)) {
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaStreamDestroy(stream));
    print_case_head(false, c);
    std::printf(" unsupported: %s\n", reason);
    return false;
  }
  poison(naive_dq, nq, stream);
  poison(naive_dk, nk, stream);
  poison(naive_dv, nk, stream);
  CHECK_CUDA(fa::cuda::naive_attention_bwd(pn, stream));
  // kRuns flash runs, each into freshly poisoned outputs; the raw bits of every run are kept.
  std::vector<std::vector<uint32_t>> dq_bits, dk_bits, dv_bits;
  for (int run = 0; run < kRuns; ++run) {
    poison(flash_dq, nq, stream);
    poison(flash_dk, nk, stream);
    poison(flash_dv, nk, stream);
    CHECK_CUDA(fa::cuda::flash_bwd_fp32(pf, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    dq_bits.push_back(download_bits(flash_dq, nq));
    dk_bits.push_back(download_bits(flash_dk, nk));
    dv_bits.push_back(download_bits(flash_dv, nk));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::vector<std::vector<float>> dq_runs, dk_runs, dv_runs;
  for (int run = 0; run < kRuns; ++run) {
    dq_runs.push_back(bits_to_floats(dq_bits[run]));
    dk_runs.push_back(bits_to_floats(dk_bits[run]));
    dv_runs.push_back(bits_to_floats(dv_bits[run]));
  }
  const auto ndq = download(naive_dq, nq), ndk = download(naive_dk, nk), ndv = download(naive_dv, nk);

  // Every element written, in every run; the naive result too (a NaN there would hide flash errors).
  int64_t nan = 0;
  for (int run = 0; run < kRuns; ++run)
    nan += count_nan(dq_runs[run]) + count_nan(dk_runs[run]) + count_nan(dv_runs[run]);
  const int64_t naive_nan = count_nan(ndq) + count_nan(ndk) + count_nan(ndv);

  // Rows that see no key (the first sq - sk rows when causal): dq exactly 0 (either sign), in every run.
  int64_t bad_empty = 0;
  const int64_t q_row_width = c.hq * c.d;  // dq elements of one query row, all heads
  for (const auto& run : dq_runs)
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < c.sq && visible_keys(c, i) == 0; ++i)
        for (int64_t x = 0; x < q_row_width; ++x) bad_empty += run[(b * c.sq + i) * q_row_width + x] != 0.0f;

  // Run to run: dk and dv bit for bit; dq bit for bit in deterministic mode, else only reported.
  int64_t dkdv_diff = 0, dq_diff = 0;
  double dq_rerun = 0;
  for (int run = 1; run < kRuns; ++run) {
    for (int64_t x = 0; x < nk; ++x)
      dkdv_diff += (dk_bits[run][x] != dk_bits[0][x]) + (dv_bits[run][x] != dv_bits[0][x]);
    for (int64_t x = 0; x < nq; ++x) {
      dq_diff += dq_bits[run][x] != dq_bits[0][x];
      dq_rerun = std::max(dq_rerun, static_cast<double>(std::fabs(dq_runs[run][x] - dq_runs[0][x])));
    }
  }

  in.lse = download(lse_dev, nlse);
  in.out = download(out_dev, nq);
  const auto round_all = [](const std::vector<float>& v) {
    std::vector<float> r(v.size());
    std::transform(v.begin(), v.end(), r.begin(), tf32_round);
    return r;
  };
  in.qt = round_all(in.q);
  in.kt = round_all(in.k);
  in.vt = round_all(in.v);
  in.doutt = round_all(in.dout);
  const HostRef ref = host_reference(c, pf.softmax_scale, in);
  const int64_t k_row_width = c.hkv * c.d;
  const TensorCheck checks[] = {
      check_tensor("dq", c, dq_runs, ndq, ref.same_dq, ref.dq, ref.q_rows, c.sq, q_row_width),
      check_tensor("dk", c, dk_runs, ndk, ref.same_dk, ref.dk, ref.k_rows, c.sk, k_row_width),
      check_tensor("dv", c, dv_runs, ndv, ref.same_dv, ref.dv, ref.k_rows, c.sk, k_row_width),
  };
  bool ok = nan == 0 && naive_nan == 0 && bad_empty == 0 && dkdv_diff == 0 && (!c.deterministic || dq_diff == 0);
  for (const TensorCheck& t : checks) ok = ok && t.ok;
  print_case_head(ok, c);
  std::printf(" rows %zu/%" PRId64 " keys %zu/%" PRId64, ref.q_rows.size(), c.sq, ref.k_rows.size(), c.sk);
  for (const TensorCheck& t : checks)
    std::printf(" %s=%.2e (naive %.2e, same-tf32 %.2e, tol %.2e)", t.name, t.err, t.naive_err, t.same_err, t.tol);
  std::printf(" nan=%" PRId64 " (naive %" PRId64 ") bad_empty=%" PRId64 " dkdv_rerun_diff=%" PRId64
              " dq_rerun_diff=%" PRId64 " (max %.2e) fwd=%s\n",
              nan, naive_nan, bad_empty, dkdv_diff, dq_diff, dq_rerun, fwd_path);
  return ok;
}

// ---- Non-finite containment (the rules are in the file comment) ----

// Inputs of a containment call.
struct ContainmentInputs {
  std::vector<float> q, k, v, dout;
};

// What one forward + backward call gave.
struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
  const char* fwd_path;
};

// run_forward (so that a poisoned call's out and lse come from its own inputs, by the path the clean
// call took) and flash_bwd_fp32, every output poisoned with NaN first. The legacy default stream
// throughout, as the synchronous uploads use it.
Outputs run_fwd_bwd(const Case& c, const ContainmentInputs& in) {
  const int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hkv * c.d;
  const int64_t nlse = c.batch * c.hq * c.sq;
  const size_t fq = nq * sizeof(float), fk = nk * sizeof(float);
  Dev q_dev(fq), k_dev(fk), v_dev(fk), dout_dev(fq), out_dev(fq), lse_dev(nlse * sizeof(float));
  Dev dq_dev(fq), dk_dev(fk), dv_dev(fk);
  upload(q_dev, in.q);
  upload(k_dev, in.k);
  upload(v_dev, in.v);
  upload(dout_dev, in.dout);
  poison(out_dev, nq, nullptr);
  poison(lse_dev, nlse, nullptr);
  poison(dq_dev, nq, nullptr);
  poison(dk_dev, nk, nullptr);
  poison(dv_dev, nk, nullptr);
  const auto pfwd = make_params(c, q_dev, k_dev, v_dev, out_dev, lse_dev);
  Outputs o;
  o.fwd_path = run_forward(pfwd, nullptr);
  CHECK_CUDA(fa::cuda::flash_bwd_fp32(make_bwd_params(c, pfwd, dout_dev, dq_dev, dk_dev, dv_dev), nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  o.out = download(out_dev, nq);
  o.lse = download(lse_dev, nlse);
  o.dq = download(dq_dev, nq);
  o.dk = download(dk_dev, nk);
  o.dv = download(dv_dev, nk);
  return o;
}

// One containment case: the call with `poison` in its inputs against `clean`, the same call on the clean
// inputs `in` (clean_nonfinite: its non-finite out, dq, dk, dv elements, which must be none), element by
// element against containment_pattern. dq is compared bit for bit in deterministic mode, else within the
// run-to-run noise of its atomics (kAtomicDqFloor).
bool run_nonfinite_case(const Case& c, const ContainmentInputs& in, const Outputs& clean, int64_t clean_nonfinite,
                        const Poison& poison) {
  ContainmentInputs bad = in;
  const bool in_k = poison.operand == Operand::kK;
  std::vector<float>& t = poison.operand == Operand::kQ ? bad.q : in_k ? bad.k : bad.dout;
  const int64_t rows = in_k ? c.sk : c.sq, heads = in_k ? c.hkv : c.hq;
  t[((poison.batch * rows + poison.row) * heads + poison.head) * c.d + poison.col] = poison.value;
  const Outputs got = run_fwd_bwd(c, bad);
  const Pattern want = containment_pattern(c, poison);

  double dq_max = 0;
  for (float x : clean.dq) dq_max = std::max(dq_max, static_cast<double>(std::fabs(x)));
  const double dq_floor = kAtomicDqFloor * dq_max;
  const auto exact = [](float x, float y) { return same_bits(x, y); };
  const auto near = [&](float x, float y) {
    return std::isfinite(y) && std::fabs(static_cast<double>(y) - x) <= dq_floor;
  };
  std::vector<std::string> shown;
  const ContainmentCounts n = count_containment(c, poison, clean, got, want, c.deterministic, exact, near, &shown);
  const bool ok = n.wrong() == 0 && clean_nonfinite == 0;
  print_case_head(ok, c);
  std::printf(" containment %-4s in %s[%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "] (%s): %" PRId64
              " non-finite wanted, %" PRId64 " unchecked; wrong: out %" PRId64 " lse %" PRId64 " dq %" PRId64
              " (%s) dk %" PRId64 " dv %" PRId64 "; clean_nonfinite=%" PRId64 " fwd=%s\n",
              value_name(poison.value), operand_name(poison.operand), poison.batch, poison.row, poison.head, poison.col,
              n.reach, n.wanted, n.unchecked, n.out, n.lse, n.dq, c.deterministic ? "bits" : "atomics: noise", n.dk, n.dv,
              clean_nonfinite, got.fwd_path);
  for (const std::string& s : shown) std::printf("    %s\n", s.c_str());
  return ok;
}

// Where the containment cases of a shape put their poison: a query row (q, dout) and a key (k), and on
// a shape with rows that see no key one of those (empty_row; -1 if none). See main.
struct ContainmentShape {
  int64_t sq, sk, row, key, empty_row;
};

// The containment cases of one (shape, head dim, precision, mode): clean inputs drawn once and the clean
// call run once, then one poisoned call per case (NaN and +inf in q and dout, NaN, +inf and -inf in k;
// NaN in q and dout of the empty row). Causal, batch 2, GQA 2:1; the poison sits in the last batch and
// the last (query or KV) head, so that the other batch and heads are untouched witnesses. Returns the
// failures and adds the cases to *total.
int run_containment_cases(const ContainmentShape& s, int64_t d, Fp32Precision precision, bool deterministic,
                          std::mt19937_64& rng, int* total) {
  const Case c{2, s.sq, s.sk, 4, 2, d, true, precision, deterministic};
  const int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hkv * c.d;
  ContainmentInputs in{random_values(nq, kQkMaxMag, rng), random_values(nk, kQkMaxMag, rng),
                       random_values(nk, kVMaxMag, rng), random_values(nq, kDoutMaxMag, rng)};
  const int64_t b = c.batch - 1, h = c.hq - 1, hk = c.hkv - 1;
  // Poisoned columns: in q, k and dout at different places of the head dim (both halves of it, for the
  // configurations that split dK / dV's columns over two warps).
  const int64_t qc = 5 % d, kc = d / 2 + 1, dc = d - 3;
  make_q_column_positive(c, in.q, b, hk, kc);  // in the clean call too
  const Outputs clean = run_fwd_bwd(c, in);
  const int64_t clean_nonfinite = count_nonfinite_outputs(clean);
  const std::vector<Poison> poisons = containment_poisons(s, b, h, hk, qc, kc, dc);
  int failed = 0;
  for (const Poison& p : poisons) {
    ++*total;
    failed += !run_nonfinite_case(c, in, clean, clean_nonfinite, p);
  }
  return failed;
}

using BwdFn = cudaError_t (*)(const fa::AttentionBwdParams&, cudaStream_t);

void bench(const Case& c, const char* name, BwdFn bwd, std::mt19937_64& rng) {
  const int64_t n = c.batch * c.sq * c.hq * c.d;  // self-attention shapes: sq = sk, hq = hkv
  const size_t bytes = n * sizeof(float);
  Dev q_dev(bytes), k_dev(bytes), v_dev(bytes), dout_dev(bytes), out_dev(bytes), lse_dev(c.batch * c.hq * c.sq * 4);
  Dev dq(bytes), dk(bytes), dv(bytes);
  upload(q_dev, random_values(n, kQkMaxMag, rng));
  upload(k_dev, random_values(n, kQkMaxMag, rng));
  upload(v_dev, random_values(n, kVMaxMag, rng));
  upload(dout_dev, random_values(n, kDoutMaxMag, rng));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  const auto pfwd = make_params(c, q_dev, k_dev, v_dev, out_dev, lse_dev);
  run_forward(pfwd, stream);
  const auto p = make_bwd_params(c, pfwd, dout_dev, dq, dk, dv);
  const LaunchTimes t = time_launches([&] { return bwd(p, stream); }, stream);
  const double flops = kBwdFlopsPerFwd * 4.0 * c.batch * c.hq * static_cast<double>(c.sq) * c.sk * c.d *
                       (c.causal ? 0.5 : 1.0);
  std::printf("BENCH %-18s fp32 B%" PRId64 " H%-3" PRId64 " S%-5" PRId64 " D%-3" PRId64
              " %-6s median %.3f ms (min %.3f)  %.1f TFLOP/s | back to back %.3f ms  %.1f TFLOP/s\n",
              name, c.batch, c.hq, c.sq, c.d, c.causal ? "causal" : "full", t.median_ms, t.min_ms,
              tflops_per_s(flops, t.median_ms), t.queued_ms, tflops_per_s(flops, t.queued_ms));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

int main(int argc, char** argv) {
  const CheckSetup setup = check_setup(argc, argv, "flash_bwd_fp32_check");
  const bool run_bench = setup.run_bench;
  std::mt19937_64 rng(setup.seed);

  struct Shape {
    int64_t batch, sq, sk, hq, hkv;
  };
  const Shape shapes[] = {
      {2, 1, 1, 2, 2},       {2, 17, 17, 2, 2},   {2, 97, 97, 2, 2},   {1, 1023, 1023, 2, 2},
      {1, 1025, 1025, 2, 2}, {2, 113, 203, 2, 2}, {2, 203, 113, 2, 2}, {2, 1, 239, 2, 2},
      {2, 97, 97, 8, 2},                             // GQA 4:1
      {1, 203, 113, 4, 1},   {1, 1025, 1025, 4, 1},  // MQA
  };
  // Every other specialised head dim and padded ones (40 -> 64, 200 -> 256), on two shapes with tails.
  const Shape tail_shapes[] = {{2, 97, 203, 4, 2}, {1, 1025, 1023, 2, 1}};
  int failed = 0, total = 0;
  for (bool deterministic : {false, true})
    for (Fp32Precision precision : {Fp32Precision::kTf32, Fp32Precision::kHighest}) {
      for (int64_t d : {64, 128})
        for (bool causal : {false, true})
          for (const Shape& s : shapes) {
            ++total;
            failed += !run_case(Case{s.batch, s.sq, s.sk, s.hq, s.hkv, d, causal, precision, deterministic}, rng);
          }
      for (int64_t d : {32, 40, 96, 192, 200, 256})
        for (bool causal : {false, true})
          for (const Shape& s : tail_shapes) {
            ++total;
            failed += !run_case(Case{s.batch, s.sq, s.sk, s.hq, s.hkv, d, causal, precision, deterministic}, rng);
          }
    }
  // Non-finite containment: both precisions and modes, head dims 64 (32-row query tiles, 64-key blocks),
  // 128 (16 rows, 64 keys) and 256 (16 rows, 32 keys; those two split dK / dV's columns over two warps),
  // with seqlen_q = / < / > seqlen_k. The poison sits next to the hidden pairs of tiles that cross the
  // diagonal (diag = sk - sq), at the places flash_bwd_check.cu uses. The query row (q, dout):
  // row + diag = 40 (mod 64), its last key, so that the keys after it in the same 32- / 64-key block are
  // hidden from it, and row = 6..10 (mod 16), mid query tile. The key (k): key - diag = 40 (mod 64), the
  // first row that sees it, so that the 8 rows before that one in its 16- or 32-row query tile do not see
  // it. With seqlen_q > seqlen_k, also row 129: it sees no key, in the query tile from row 128 whose rows
  // 130- see keys.
  const ContainmentShape containment_shapes[] = {
      {300, 300, 168, 104, -1}, {200, 330, 102, 298, -1}, {330, 200, 234, 38, 129}};
  for (bool deterministic : {false, true})
    for (Fp32Precision precision : {Fp32Precision::kTf32, Fp32Precision::kHighest})
      for (int64_t d : {64, 128, 256})
        for (const ContainmentShape& s : containment_shapes)
          failed += run_containment_cases(s, d, precision, deterministic, rng, &total);
  std::printf("%s: %d of %d cases failed\n", failed ? "FAIL" : "PASS", failed, total);
  if (run_bench) {
    std::vector<Case> cells;
    for (bool causal : {false, true}) cells.push_back({4, 8192, 8192, 1, 1, 64, causal, Fp32Precision::kTf32, false});
    for (int64_t seqlen : {512, 1024, 2048, 8192})
      for (int64_t d : {64, 128})
        for (bool causal : {false, true})
          cells.push_back({kBenchTokens / seqlen, seqlen, seqlen, kBenchWidth / d, kBenchWidth / d, d, causal,
                           Fp32Precision::kTf32, false});
    for (Case c : cells) {
      bench(c, "flash-tf32", fa::cuda::flash_bwd_fp32, rng);
      c.deterministic = true;
      bench(c, "flash-tf32-det", fa::cuda::flash_bwd_fp32, rng);
      c.deterministic = false;
      c.precision = Fp32Precision::kHighest;
      bench(c, "flash-highest", fa::cuda::flash_bwd_fp32, rng);
      fa::AttentionBwdParams sizes;
      sizes.batch = c.batch;
      sizes.heads_q = c.hq;
      sizes.heads_kv = c.hkv;
      sizes.seqlen_q = c.sq;
      sizes.seqlen_k = c.sk;
      sizes.head_dim = c.d;
      if (fa::cuda::naive_attention_bwd_workspace_bytes(sizes) <= kNaiveBenchMaxBytes)
        bench(c, "naive-bwd", fa::cuda::naive_attention_bwd, rng);
    }
  }
  return failed ? 1 : 0;
}
