// GPU check and timing of the FA2 backward (csrc/cuda/flash/flash_bwd.cu), built and run by
// scripts/flash-bwd-check.sh:  flash_bwd_check [seed] [--no-bench] [--bench-only]
// Each case: fresh random q, k, v, dout (never zero, rounded to the dtype; the seed is printed), out and
// lse from flash_fwd (the naive forward where flash_fwd has no kernel), then flash_bwd, run kRuns times
// into dq, dk, dv poisoned with NaN (0xFF bytes) before each run, and the naive fp32 backward
// (csrc/cuda/naive_attention.cu) on the same inputs. Reference, per tensor (dq, dk, dv):
//   rule vs-f64 (B*Hq*Sq*Sk*D <= kHostRefMaxWork): on the host, from the same rounded q, k, v, dout,
//     ref   a float64 backward that takes the forward's out and lse (P = exp(scale q k - lse),
//           D = rowsum(dout o out), dS = P (dP - D)), so that it answers exactly the question the
//           kernels get;
//     same  the plain same-precision implementation of lib/reference.ts (referenceAttentionBackward with
//           precision 'float16' / 'bfloat16'), step for step: its own forward and backward with float32
//           accumulation in index order, P rounded to the dtype before P.V and P^T.dout, dS rounded to
//           the dtype before dS.K and dS^T.Q (P and dS themselves from the unrounded float32 values),
//           out, dq, dk and dv rounded to the dtype once stored;
//       max |flash - ref| <= 3 * max(max |naive - ref|, max |same - ref|) + 1e-5.
//     Why same: the project's standard (the flash-attention suite's rule) is "max error <= 2x the error
//     of a plain same-precision implementation (3x for gradients)". Any fp16 / bf16 backward on tensor
//     cores rounds P and dS to the dtype before its products, and that rounding (2^-11 / 2^-8 relative
//     per term) is part of its error; the naive result is fp32 rounded only once to the dtype, a
//     stricter baseline that a correct kernel exceeds by chance (it once gave 3.2x on dq, f16 Sq1025
//     Sk1023 D40 causal). naive stays in the max so that the bound is never stricter than the one
//     before: where same is exact and naive is not (rows that see one key: P = 1 and dP - D = 0 in
//     same's arithmetic, dP and D by one loop) the kernel's float32 noise in dP - D still has room.
//     same runs on the same shapes as ref and costs about as much: 6 d float32 multiply-adds and one
//     exp per visible (i, j) pair against ref's 5 d in float64; measured 0.5x to 0.9x of ref's time on
//     one x86 core (Sq1025 Sk1023 D72 and the like, 0.3 s to 0.5 s per case).
//   rule vs-naive (larger shapes): the naive result is within half an ulp of the dtype of the exact
//   value, so the naive-baseline rule (|flash - exact| <= 3 half-ulps, stricter than vs-f64's) implies,
//   by the triangle inequality,
//       max |flash - naive| <= (3 + 1) * half_ulp(max |naive|) + 1e-5
//   (there is no host same-precision result at these sizes, so this stays the naive-baseline bound).
// plus: no NaN left (every element written, in every run), rows that see no key (causal, Sq > Sk) give
// dq exactly 0, dk and dv bit-identical over the kRuns runs (dq goes through fp32 atomics: its max
// run-to-run difference is printed, and must be 0 in deterministic mode), and flash_bwd_supported is
// true for every case. Paths: flash_bwd as dispatched, flash_bwd with p.deterministic, and on Hopper
// the mma.sync kernel (flash_bwd_sm80) beside the wgmma one, and the two-kernel backward (dq must be
// bit-identical across runs there too).
// Non-finite containment (run_containment_cases, causal, every path): one element of q, k or dout made
// NaN, +inf or -inf, and the call (the forward, for out and lse of the poisoned inputs, then the
// backward) compared element by element with the same call on the clean inputs (containment_pattern).
// What standard attention makes non-finite, with diag = sk - sq and row i seeing key j iff j <= i + diag:
//   q[b, i, h, c] NaN / +inf: row i's lse is NaN: its out, lse and dq, and dk and dv of every key it
//     sees, all columns;
//   k[b, j, hk, c] NaN / +inf (column c of q made positive, so that +inf scores +inf): every row of the
//     query heads of KV head hk that sees key j has NaN lse: those rows' out, lse and dq, and dk and dv of
//     every key they see (with bottom-right causal the last row sees every key: all of dk and dv of hk);
//     -inf scores -inf and drops the key from those rows (finite, changed results): that reach is not
//     checked, only everything outside it;
//   dout[b, i, h, c] NaN / +inf: D_i is non-finite: dq row i and dk of every key row i sees, all
//     columns, and dv of those keys in column c only (out and lse do not change).
// A row that sees no key reaches nothing. Every other element must be bit-identical to the clean call's
// (dq through fp32 atomics: finite and within one ulp, its run-to-run noise). The backward's products
// multiply the P = dS = 0 of hidden pairs by the poisoned operand (0 * NaN = NaN: bug B2,
// bwd_nonfinite.cuh), so the poison sits next to the hidden pairs of tiles that cross the diagonal (see
// main). A failing case prints its first violations (element, expected class, value, clean value).
// Then (unless --no-bench) bf16 timing on the FA2 grid (B*S = 16k, H*D = 2048, S 512 / 1k / 2k / 4k / 8k / 16k,
// D 64 / 128, causal and not): median of 20 cudaEvent-timed single calls after warm-up, and the median
// of 5 rounds of 20 calls queued back to back (check_timing.h); TFLOP/s = 2.5 * 4 B H S^2 D / t (halved when causal), FA2's count for
// the backward. The naive backward (N^2 workspace) is timed at S 512 and 1k only.
// FLASH_BWD_CHECK_BENCH=two-kernel,flash_bwd times only the paths whose names are in the
// comma-separated list; FLASH_BWD_CHECK_BENCH_SEQLENS=8192 and FLASH_BWD_CHECK_BENCH_DIMS=64,128 only
// those sequence lengths and head dims (for a profiler, say). FLASH_BWD_CHECK_PATHS=two-kernel checks only
// the paths listed (for compute-sanitizer on one kernel, say); the cases of the other paths count as
// skipped, and the summary says how many.
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/attention_params.h"
#include "common/dtype.h"
#include "common/half.h"
#include "cuda/flash/flash_bwd.h"
#include "cuda/flash/flash_fwd.h"
#include "cuda/naive_attention.h"
#include "check_args.h"
#include "check_cuda.h"
#include "check_timing.h"
#include "check_containment.h"


namespace {

using fa::DType;

// Rule vs-f64: flash error may be 3x the larger of the naive kernel's and the same-precision
// implementation's (the flash-attention suite's factor for gradients).
constexpr double kGradErrFactor = 3.0;
constexpr double kAbsSlack = 1e-5;       // tiny: the bound is essentially the 3x term
// Rule vs-naive: |flash - naive| <= |flash - exact| + |naive - exact| <= (3 + 1) half-ulps.
constexpr double kNaiveRuleHalfUlps = kGradErrFactor + 1.0;
constexpr double kHostRefMaxWork = 2e8;  // B*Hq*Sq*Sk*D up to which the host references (ref, same) run
constexpr int kFp16MantissaBits = 10;
constexpr int kBf16MantissaBits = 7;
constexpr int kRuns = 3;  // flash_bwd runs per case: dk and dv must be bit-identical across them
constexpr double kMinMag = 0.1;
constexpr double kQkMaxMag = 1.5;
constexpr double kVMaxMag = 1.0;
constexpr double kDoutMaxMag = 1.0;
constexpr int64_t kBenchTokens = 16 * 1024;  // B * S
constexpr int64_t kBenchWidth = 2048;        // H * D
constexpr double kBwdFlopsPerFwd = 2.5;      // FA2 counts the backward as 2.5 forwards (5 matmuls vs 2)
constexpr int64_t kNaiveBenchMaxSeqlen = 1024;  // the naive backward materialises two fp32 N^2 buffers
// Containment cases with dq through fp32 atomics (added in a different order in every call): an element
// that must equal the clean call's may differ by one ulp of the dtype (the rounding of a partial sum that
// moved by an fp32 ulp), plus this fraction of max |dq| for elements that cancel (fp32 partial sums err by
// 2^-24 of their magnitude). NaN or inf leaking there is caught by the finiteness that kSame demands.
constexpr double kAtomicDqFloor = 1.0 / 65536;
constexpr double kFp16MinNormal = 1.0 / 16384;  // 2^-14

const char* short_name(DType t) { return t == DType::kFloat16 ? "f16" : "bf16"; }

uint16_t to_bits(DType t, float x) { return t == DType::kFloat16 ? fa::f32_to_f16(x) : fa::f32_to_bf16(x); }
float from_bits(DType t, uint16_t h) { return t == DType::kFloat16 ? fa::f16_to_f32(h) : fa::bf16_to_f32(h); }

// x rounded to t and back: rd(x) of lib/reference.ts's same-precision mode.
float round_to(DType t, float x) { return from_bits(t, to_bits(t, x)); }

// a * b rounded once to float32, Math.fround(a * b): the double product of two floats is exact, so this
// is the correctly rounded float product whatever the host compiler's FMA contraction settings.
float mul32(float a, float b) { return static_cast<float>(static_cast<double>(a) * b); }

// Half an ulp of t at magnitude x (x normal in t): the largest error of one correctly rounded value.
double half_ulp(DType t, double x) {
  int e = 0;
  std::frexp(x, &e);  // x = m 2^e with m in [0.5, 1): the ulp is 2^(e - 1 - mantissa bits)
  return std::ldexp(1.0, e - 2 - (t == DType::kFloat16 ? kFp16MantissaBits : kBf16MantissaBits));
}

struct Case {
  int64_t batch, sq, sk, hq, hkv, d;
  bool causal;
  DType dtype;
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

// Random [rows, heads, d] values (contiguous), rounded to t: magnitude in [kMinMag, max], random sign.
std::vector<float> random_values(int64_t n, DType t, double max_mag, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> mag(kMinMag, max_mag);
  std::bernoulli_distribution neg(0.5);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = from_bits(t, to_bits(t, static_cast<float>(neg(rng) ? -mag(rng) : mag(rng))));
  return v;
}

void upload(const Dev& d, DType t, const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = to_bits(t, v[i]);
  CHECK_CUDA(cudaMemcpy(d.ptr, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
}

// The raw 16-bit values (bit-identity checks compare these).
std::vector<uint16_t> download_bits(const Dev& d, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  CHECK_CUDA(cudaMemcpy(h.data(), d.ptr, h.size() * 2, cudaMemcpyDeviceToHost));
  return h;
}

std::vector<float> to_floats(DType t, const std::vector<uint16_t>& h) {
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i) v[i] = from_bits(t, h[i]);
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
  p.dtype = c.dtype;
  p.softmax_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  p.scale_log2 = p.softmax_scale * fa::kLog2e;
  p.causal = c.causal;
  p.q = q.ptr;
  p.k = k.ptr;
  p.v = v.ptr;
  p.out = o.ptr;
  p.lse = static_cast<float*>(lse.ptr);
  return p;
}

// Backward parameters on top of the forward's (same sizes, strides, q, k, v, out). The forward's lse
// becomes lse_in; the `lse` output field is cleared, as the backward must not use it.
fa::AttentionBwdParams make_bwd_params(const fa::AttentionFwdParams& fwd, const Dev& dout, const Dev& dq,
                                       const Dev& dk, const Dev& dv) {
  fa::AttentionBwdParams p;
  static_cast<fa::AttentionFwdParams&>(p) = fwd;
  p.lse_in = fwd.lse;
  p.lse = nullptr;
  p.dout = dout.ptr;
  p.dq = dq.ptr;
  p.dk = dk.ptr;
  p.dv = dv.ptr;
  p.deterministic = false;  // flash_bwd does not honour it (see flash_bwd.h)
  fa::set_grad_strides_like_inputs(&p);
  return p;
}

// out and lse, the backward's inputs: flash_fwd, or the naive forward where flash_fwd has no kernel.
// Returns which one ran.
const char* run_forward(const fa::AttentionFwdParams& p, cudaStream_t stream) {
  const cudaError_t err = fa::cuda::flash_fwd(p, stream);
  if (err != cudaErrorNotSupported) {
    CHECK_CUDA(err);
    return "flash";
  }
  CHECK_CUDA(fa::cuda::naive_attention_fwd(p, stream));
  return "naive";
}

// float64 gradients, in the layouts of q (dq) and k / v (dk, dv).
struct RefGrads {
  std::vector<double> dq, dk, dv;
};

// The backward in float64 from the same rounded q, k, v, dout and the forward's out and lse (so the
// reference answers exactly the question the kernels get): for every visible (i, j),
//     P = exp(scale q_i.k_j - lse_i), dP = dout_i.v_j, dS = P (dP - D_i) with D_i = dout_i.out_i,
//     dq_i += scale dS k_j, dk_j += scale dS q_i, dv_j += P dout_i;
// dk and dv of a KV head sum over the query heads of its group. Rows that see no key add nothing.
RefGrads host_reference(const Case& c, float softmax_scale, const std::vector<float>& q, const std::vector<float>& k,
                        const std::vector<float>& v, const std::vector<float>& dout, const std::vector<float>& out,
                        const std::vector<float>& lse) {
  RefGrads r;
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  const int64_t group = c.hq / c.hkv;
  const double scale = softmax_scale;  // the float the kernels get
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t kvh = h / group;
      for (int64_t i = 0; i < c.sq; ++i) {
        const int64_t n = visible_keys(c, i);
        const int64_t qo = ((b * c.sq + i) * c.hq + h) * c.d;
        const double row_lse = lse[(b * c.hq + h) * c.sq + i];
        double delta = 0;
        for (int64_t x = 0; x < c.d; ++x) delta += static_cast<double>(dout[qo + x]) * out[qo + x];
        for (int64_t j = 0; j < n; ++j) {
          const int64_t ko = ((b * c.sk + j) * c.hkv + kvh) * c.d;
          double s = 0, dp = 0;
          for (int64_t x = 0; x < c.d; ++x) {
            s += static_cast<double>(q[qo + x]) * k[ko + x];
            dp += static_cast<double>(dout[qo + x]) * v[ko + x];
          }
          const double p = std::exp(scale * s - row_lse);
          const double ds = scale * p * (dp - delta);  // scale folded in: dq and dk both carry it
          for (int64_t x = 0; x < c.d; ++x) {
            r.dq[qo + x] += ds * k[ko + x];
            r.dk[ko + x] += ds * q[qo + x];
            r.dv[ko + x] += p * dout[qo + x];
          }
        }
      }
    }
  return r;
}

// The same-precision gradients (values of the dtype), in the layouts of q (dq) and k / v (dk, dv).
struct SameGrads {
  std::vector<float> dq, dk, dv;
};

// The plain same-precision backward of lib/reference.ts (backwardSame, precision 'float16' / 'bfloat16')
// step for step, operation for operation in float32 (each product and sum rounded, sums in index order;
// exp in double, rounded to float32, as Math.fround(Math.exp(x)); lse is not needed).
// rd = round_to(c.dtype); q, k, v and dout are dtype values already, so step 1 (rounding the inputs)
// changes nothing. Per (batch, KV head): dk and dv accumulators over its query heads in order, and per
// query head and visible row i:
//   s_j = f(scale sum_x q_ix k_jx), m = max s_j, e_j = f(exp(f(s_j - m))), l = sum e_j, p_j = f(e_j / l),
//   pr_j = rd(p_j), out_i = rd(sum_j pr_j v_j), D_i = sum_x dout_ix out_ix (this own out, not the
//   kernel's), dv_j += f(pr_j dout_i), dp_j = sum_x dout_ix v_jx, ds_j = rd(f(p_j f(dp_j - D_i))),
//   dq_i = rd(f(scale sum_j ds_j k_j)), dk_j += f(ds_j q_i);
// at the end dk = rd(f(scale dk)), dv = rd(dv). Rows that see no key: dq = 0, nothing to dk / dv.
SameGrads host_same_precision(const Case& c, float softmax_scale, const std::vector<float>& q,
                              const std::vector<float>& k, const std::vector<float>& v,
                              const std::vector<float>& dout) {
  SameGrads r;
  r.dq.assign(q.size(), 0.0f);
  r.dk.assign(k.size(), 0.0f);
  r.dv.assign(v.size(), 0.0f);
  const int64_t group = c.hq / c.hkv;
  const float scale = softmax_scale;
  const auto rd = [&](float x) { return round_to(c.dtype, x); };
  std::vector<float> dk_acc(c.sk * c.d), dv_acc(c.sk * c.d);  // [Sk, D] of one KV head
  std::vector<float> p(c.sk), pr(c.sk), out(c.d), acc(c.d);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t kvh = 0; kvh < c.hkv; ++kvh) {
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
      const auto koff = [&](int64_t j) { return ((b * c.sk + j) * c.hkv + kvh) * c.d; };
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
        for (int64_t i = 0; i < c.sq; ++i) {
          const int64_t n = visible_keys(c, i);
          if (n == 0) continue;
          const int64_t qo = ((b * c.sq + i) * c.hq + h) * c.d;
          // Forward of the row: float32 scores and softmax, P rounded before P.V, out rounded.
          float m = -INFINITY;
          for (int64_t j = 0; j < n; ++j) {
            const int64_t ko = koff(j);
            float a = 0;
            for (int64_t x = 0; x < c.d; ++x) a += mul32(q[qo + x], k[ko + x]);
            p[j] = mul32(a, scale);
            m = std::max(m, p[j]);
          }
          float l = 0;
          for (int64_t j = 0; j < n; ++j) {
            p[j] = static_cast<float>(std::exp(static_cast<double>(p[j] - m)));
            l += p[j];
          }
          for (int64_t j = 0; j < n; ++j) {
            p[j] /= l;
            pr[j] = rd(p[j]);
          }
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t j = 0; j < n; ++j) {
            const int64_t ko = koff(j);
            for (int64_t x = 0; x < c.d; ++x) acc[x] += mul32(pr[j], v[ko + x]);
          }
          float delta = 0;
          for (int64_t x = 0; x < c.d; ++x) {
            out[x] = rd(acc[x]);
            delta += mul32(dout[qo + x], out[x]);
          }
          // Backward of the row: dS from the float32 P, rounded before dS.K and dS^T.Q.
          std::fill(acc.begin(), acc.end(), 0.0f);  // now dq's accumulator
          for (int64_t j = 0; j < n; ++j) {
            const int64_t ko = koff(j);
            float* dkj = &dk_acc[j * c.d];
            float* dvj = &dv_acc[j * c.d];
            float dp = 0;
            for (int64_t x = 0; x < c.d; ++x) {
              dvj[x] += mul32(pr[j], dout[qo + x]);
              dp += mul32(dout[qo + x], v[ko + x]);
            }
            const float ds = rd(mul32(p[j], dp - delta));
            for (int64_t x = 0; x < c.d; ++x) {
              acc[x] += mul32(ds, k[ko + x]);
              dkj[x] += mul32(ds, q[qo + x]);
            }
          }
          for (int64_t x = 0; x < c.d; ++x) r.dq[qo + x] = rd(mul32(acc[x], scale));
        }
      for (int64_t j = 0; j < c.sk; ++j)
        for (int64_t x = 0; x < c.d; ++x) {
          r.dk[koff(j) + x] = rd(mul32(dk_acc[j * c.d + x], scale));
          r.dv[koff(j) + x] = rd(dv_acc[j * c.d + x]);
        }
    }
  return r;
}

// max |got - want|, NaNs left out (they are counted on their own).
double max_err(const std::vector<float>& got, const std::vector<double>& want) {
  double err = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!std::isnan(got[i])) err = std::max(err, std::fabs(got[i] - want[i]));
  return err;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

int64_t count_nan(const std::vector<float>& v) {
  return std::count_if(v.begin(), v.end(), [](float x) { return std::isnan(x); });
}

// One of dq, dk, dv: flash's error and the tolerance it is held to.
struct TensorCheck {
  const char* name;
  double err;        // vs-f64: max |flash - ref|;  vs-naive: max |flash - naive|
  double naive_err;  // vs-f64 only: max |naive - ref|
  double same_err;   // vs-f64 only: max |same - ref|
  double tol;
};

// Rule vs-f64 for one tensor (every run of flash; the worst counts).
TensorCheck check_vs_f64(const char* name, const std::vector<std::vector<float>>& flash_runs,
                         const std::vector<float>& naive, const std::vector<float>& same,
                         const std::vector<double>& ref) {
  TensorCheck t{name, 0, max_err(naive, ref), max_err(same, ref), 0};
  for (const auto& run : flash_runs) t.err = std::max(t.err, max_err(run, ref));
  t.tol = kGradErrFactor * std::max(t.naive_err, t.same_err) + kAbsSlack;
  return t;
}

// Rule vs-naive for one tensor.
TensorCheck check_vs_naive(const char* name, DType dtype, const std::vector<std::vector<float>>& flash_runs,
                           const std::vector<float>& naive) {
  const std::vector<double> ref(naive.begin(), naive.end());
  TensorCheck t{name, 0, 0, 0, kNaiveRuleHalfUlps * half_ulp(dtype, max_abs(ref)) + kAbsSlack};
  for (const auto& run : flash_runs) t.err = std::max(t.err, max_err(run, ref));
  return t;
}

void print_case_head(bool ok, const Case& c) {
  std::printf("%s %-4s B%" PRId64 " Sq%-5" PRId64 " Sk%-5" PRId64 " Hq%" PRId64 " Hkv%" PRId64 " D%-3" PRId64
              " %-6s",
              ok ? "PASS" : "FAIL", short_name(c.dtype), c.batch, c.sq, c.sk, c.hq, c.hkv, c.d,
              c.causal ? "causal" : "full");
}

// NaN in fp16 and bf16: an element the kernel leaves unwritten shows.
void poison(const Dev& d, int64_t n, cudaStream_t stream) { CHECK_CUDA(cudaMemsetAsync(d.ptr, 0xFF, n * 2, stream)); }

using BwdFn = cudaError_t (*)(const fa::AttentionBwdParams&, cudaStream_t);

// flash_bwd in deterministic mode (ordered accumulator slices instead of atomics).
cudaError_t flash_bwd_deterministic(const fa::AttentionBwdParams& p, cudaStream_t stream) {
  fa::AttentionBwdParams d = p;
  d.deterministic = true;
  return fa::cuda::flash_bwd(d, stream);
}

// The mma.sync kernel in deterministic mode (fp32 accumulator slices summed in order).
cudaError_t flash_bwd_sm80_deterministic(const fa::AttentionBwdParams& p, cudaStream_t stream) {
  fa::AttentionBwdParams d = p;
  d.deterministic = true;
  return fa::cuda::flash_bwd_sm80(d, stream);
}

// flash_bwd as two kernels (dK/dV, then dQ without atomics; Hopper, head dims 32 / 64 / 128).
cudaError_t flash_bwd_two_kernel(const fa::AttentionBwdParams& p, cudaStream_t stream) {
  fa::AttentionBwdParams d = p;
  d.two_kernel = true;
  return fa::cuda::flash_bwd(d, stream);
}

// The two-kernel backward asked for deterministic dq as well (what 'auto' does for `deterministic: true`):
// the flag must change nothing (its dK/dV kernel once read it as "split the tiles" with no splits).
cudaError_t flash_bwd_two_kernel_det(const fa::AttentionBwdParams& p, cudaStream_t stream) {
  fa::AttentionBwdParams d = p;
  d.two_kernel = true;
  d.deterministic = true;
  return fa::cuda::flash_bwd(d, stream);
}

// Cases left out by FLASH_BWD_CHECK_PATHS.
int skipped_cases = 0;

// One case through the backward `bwd` (named `path` in the output line). A deterministic `bwd` must
// also give bit-identical dq across the runs.
bool run_case(const Case& c, const char* path, BwdFn bwd, bool deterministic, std::mt19937_64& rng) {
  if (!listed("FLASH_BWD_CHECK_PATHS", path)) {
    ++skipped_cases;
    return true;
  }
  const int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hkv * c.d;
  const int64_t nlse = c.batch * c.hq * c.sq;
  const auto q = random_values(nq, c.dtype, kQkMaxMag, rng);
  const auto k = random_values(nk, c.dtype, kQkMaxMag, rng);
  const auto v = random_values(nk, c.dtype, kVMaxMag, rng);
  const auto dout = random_values(nq, c.dtype, kDoutMaxMag, rng);
  Dev q_dev(nq * 2), k_dev(nk * 2), v_dev(nk * 2), dout_dev(nq * 2), out_dev(nq * 2), lse_dev(nlse * 4);
  Dev flash_dq(nq * 2), flash_dk(nk * 2), flash_dv(nk * 2), naive_dq(nq * 2), naive_dk(nk * 2), naive_dv(nk * 2);
  upload(q_dev, c.dtype, q);
  upload(k_dev, c.dtype, k);
  upload(v_dev, c.dtype, v);
  upload(dout_dev, c.dtype, dout);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  const auto pfwd = make_params(c, q_dev, k_dev, v_dev, out_dev, lse_dev);
  const char* fwd_path = run_forward(pfwd, stream);
  const auto pf = make_bwd_params(pfwd, dout_dev, flash_dq, flash_dk, flash_dv);
  const auto pn = make_bwd_params(pfwd, dout_dev, naive_dq, naive_dk, naive_dv);
  if (!fa::cuda::flash_bwd_supported(pf)) {
    CHECK_CUDA(cudaStreamSynchronize(stream));
    CHECK_CUDA(cudaStreamDestroy(stream));
    print_case_head(false, c);
    std::printf(" flash_bwd_supported is false\n");
    return false;
  }
  poison(naive_dq, nq, stream);
  poison(naive_dk, nk, stream);
  poison(naive_dv, nk, stream);
  CHECK_CUDA(fa::cuda::naive_attention_bwd(pn, stream));
  // kRuns flash runs, each into freshly poisoned outputs; the raw bits of every run are kept.
  std::vector<std::vector<uint16_t>> dq_bits, dk_bits, dv_bits;
  for (int run = 0; run < kRuns; ++run) {
    poison(flash_dq, nq, stream);
    poison(flash_dk, nk, stream);
    poison(flash_dv, nk, stream);
    CHECK_CUDA(bwd(pf, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    dq_bits.push_back(download_bits(flash_dq, nq));
    dk_bits.push_back(download_bits(flash_dk, nk));
    dv_bits.push_back(download_bits(flash_dv, nk));
  }
  CHECK_CUDA(cudaStreamDestroy(stream));
  std::vector<std::vector<float>> dq_runs, dk_runs, dv_runs;
  for (int run = 0; run < kRuns; ++run) {
    dq_runs.push_back(to_floats(c.dtype, dq_bits[run]));
    dk_runs.push_back(to_floats(c.dtype, dk_bits[run]));
    dv_runs.push_back(to_floats(c.dtype, dv_bits[run]));
  }
  const auto ndq = to_floats(c.dtype, download_bits(naive_dq, nq));
  const auto ndk = to_floats(c.dtype, download_bits(naive_dk, nk));
  const auto ndv = to_floats(c.dtype, download_bits(naive_dv, nk));

  // Every element written, in every run; the naive result too (a NaN there would hide flash errors).
  int64_t nan = 0;
  for (int run = 0; run < kRuns; ++run)
    nan += count_nan(dq_runs[run]) + count_nan(dk_runs[run]) + count_nan(dv_runs[run]);
  const int64_t naive_nan = count_nan(ndq) + count_nan(ndk) + count_nan(ndv);

  // Rows that see no key (the first sq - sk rows when causal): dq exactly 0 (either sign), in every run.
  int64_t bad_empty = 0;
  const int64_t row_width = c.hq * c.d;  // dq elements of one query row, all heads
  for (const auto& run : dq_runs)
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t i = 0; i < c.sq && visible_keys(c, i) == 0; ++i)
        for (int64_t x = 0; x < row_width; ++x) bad_empty += run[(b * c.sq + i) * row_width + x] != 0.0f;

  // Run to run: dk and dv bit for bit; dq only reported (fp32 atomics in varying order).
  int64_t dkdv_diff = 0;
  double dq_rerun = 0;
  for (int run = 1; run < kRuns; ++run) {
    for (int64_t x = 0; x < nk; ++x)
      dkdv_diff += (dk_bits[run][x] != dk_bits[0][x]) + (dv_bits[run][x] != dv_bits[0][x]);
    for (int64_t x = 0; x < nq; ++x)
      dq_rerun = std::max(dq_rerun, static_cast<double>(std::fabs(dq_runs[run][x] - dq_runs[0][x])));
  }

  const bool host_ref = static_cast<double>(c.batch * c.hq) * c.sq * c.sk * c.d <= kHostRefMaxWork;
  std::vector<TensorCheck> checks;
  if (host_ref) {
    std::vector<float> lse(nlse);
    CHECK_CUDA(cudaMemcpy(lse.data(), lse_dev.ptr, nlse * 4, cudaMemcpyDeviceToHost));
    const auto out = to_floats(c.dtype, download_bits(out_dev, nq));
    const RefGrads ref = host_reference(c, pf.softmax_scale, q, k, v, dout, out, lse);
    const SameGrads same = host_same_precision(c, pf.softmax_scale, q, k, v, dout);
    checks = {check_vs_f64("dq", dq_runs, ndq, same.dq, ref.dq), check_vs_f64("dk", dk_runs, ndk, same.dk, ref.dk),
              check_vs_f64("dv", dv_runs, ndv, same.dv, ref.dv)};
  } else {
    checks = {check_vs_naive("dq", c.dtype, dq_runs, ndq), check_vs_naive("dk", c.dtype, dk_runs, ndk),
              check_vs_naive("dv", c.dtype, dv_runs, ndv)};
  }
  bool ok = nan == 0 && naive_nan == 0 && bad_empty == 0 && dkdv_diff == 0 && (!deterministic || dq_rerun == 0);
  for (const TensorCheck& t : checks) ok = ok && t.err <= t.tol;
  print_case_head(ok, c);
  std::printf(" %s", host_ref ? "vs-f64  " : "vs-naive");
  for (const TensorCheck& t : checks) {
    if (host_ref)
      std::printf(" %s=%.2e (naive %.2e, same %.2e, tol %.2e)", t.name, t.err, t.naive_err, t.same_err, t.tol);
    else
      std::printf(" %s=%.2e (tol %.2e)", t.name, t.err, t.tol);
  }
  std::printf(" nan=%" PRId64 " (naive %" PRId64 ") bad_empty=%" PRId64 " dkdv_rerun_diff=%" PRId64
              " dq_rerun=%.2e fwd=%s bwd=%s\n",
              nan, naive_nan, bad_empty, dkdv_diff, dq_rerun, fwd_path, path);
  return ok;
}

// ---- Non-finite containment (the rules are in the file comment) ----

// Inputs of a containment call (values of the dtype).
struct Inputs {
  std::vector<float> q, k, v, dout;
};

// What one forward + backward call gave: out, dq, dk, dv (values of the dtype) and lse.
struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
  const char* fwd_path;
};

// run_forward (so that a poisoned call's out and lse come from its own inputs, by the path the clean
// call took) and `bwd`, every output poisoned with NaN first. The legacy default stream throughout, as
// the synchronous uploads use it.
Outputs run_fwd_bwd(const Case& c, const Inputs& in, BwdFn bwd) {
  const int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hkv * c.d;
  const int64_t nlse = c.batch * c.hq * c.sq;
  Dev q_dev(nq * 2), k_dev(nk * 2), v_dev(nk * 2), dout_dev(nq * 2), out_dev(nq * 2), lse_dev(nlse * 4);
  Dev dq_dev(nq * 2), dk_dev(nk * 2), dv_dev(nk * 2);
  upload(q_dev, c.dtype, in.q);
  upload(k_dev, c.dtype, in.k);
  upload(v_dev, c.dtype, in.v);
  upload(dout_dev, c.dtype, in.dout);
  poison(out_dev, nq, nullptr);
  CHECK_CUDA(cudaMemsetAsync(lse_dev.ptr, 0xFF, nlse * 4, nullptr));
  poison(dq_dev, nq, nullptr);
  poison(dk_dev, nk, nullptr);
  poison(dv_dev, nk, nullptr);
  const auto pfwd = make_params(c, q_dev, k_dev, v_dev, out_dev, lse_dev);
  Outputs o;
  o.fwd_path = run_forward(pfwd, nullptr);
  CHECK_CUDA(bwd(make_bwd_params(pfwd, dout_dev, dq_dev, dk_dev, dv_dev), nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());
  o.out = to_floats(c.dtype, download_bits(out_dev, nq));
  o.lse.resize(nlse);
  CHECK_CUDA(cudaMemcpy(o.lse.data(), lse_dev.ptr, nlse * 4, cudaMemcpyDeviceToHost));
  o.dq = to_floats(c.dtype, download_bits(dq_dev, nq));
  o.dk = to_floats(c.dtype, download_bits(dk_dev, nk));
  o.dv = to_floats(c.dtype, download_bits(dv_dev, nk));
  return o;
}

// One containment case: the call with `poison` in its inputs against `clean`, the same call on the clean
// inputs `in` (clean_nonfinite: its non-finite out, dq, dk, dv elements, which must be none), element by
// element against containment_pattern. dq is compared bit for bit where `bwd` gives bit-identical dq
// (deterministic), else within the run-to-run noise of its atomics (kAtomicDqFloor).
bool run_nonfinite_case(const Case& c, const Inputs& in, const Outputs& clean, int64_t clean_nonfinite,
                        const Poison& poison, const char* path, BwdFn bwd, bool deterministic) {
  Inputs bad = in;
  const bool in_k = poison.operand == Operand::kK;
  std::vector<float>& t = poison.operand == Operand::kQ ? bad.q : in_k ? bad.k : bad.dout;
  const int64_t rows = in_k ? c.sk : c.sq, heads = in_k ? c.hkv : c.hq;
  t[((poison.batch * rows + poison.row) * heads + poison.head) * c.d + poison.col] = poison.value;
  const Outputs got = run_fwd_bwd(c, bad, bwd);
  const Pattern want = containment_pattern(c, poison);

  double dq_max = 0;
  for (float x : clean.dq) dq_max = std::max(dq_max, static_cast<double>(std::fabs(x)));
  const double dq_floor = kAtomicDqFloor * dq_max;
  const double min_normal = c.dtype == DType::kFloat16 ? kFp16MinNormal : std::numeric_limits<float>::min();
  const auto exact = [](float x, float y) { return same_bits(x, y); };
  const auto near = [&](float x, float y) {
    const double ulp = 2 * half_ulp(c.dtype, std::max<double>(std::fabs(x), min_normal));
    return std::isfinite(y) && std::fabs(static_cast<double>(y) - x) <= ulp + dq_floor;
  };
  std::vector<std::string> shown;
  const ContainmentCounts n = count_containment(c, poison, clean, got, want, deterministic, exact, near, &shown);
  const bool ok = n.wrong() == 0 && clean_nonfinite == 0;
  print_case_head(ok, c);
  std::printf(" containment %-4s in %s[%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "] (%s): %" PRId64
              " non-finite wanted, %" PRId64 " unchecked; wrong: out %" PRId64 " lse %" PRId64 " dq %" PRId64
              " (%s) dk %" PRId64 " dv %" PRId64 "; clean_nonfinite=%" PRId64 " fwd=%s bwd=%s\n",
              value_name(poison.value), operand_name(poison.operand), poison.batch, poison.row, poison.head, poison.col,
              n.reach, n.wanted, n.unchecked, n.out, n.lse, n.dq, deterministic ? "bits" : "atomics: 1 ulp", n.dk, n.dv,
              clean_nonfinite, got.fwd_path, path);
  for (const std::string& s : shown) std::printf("    %s\n", s.c_str());
  return ok;
}

// Where the containment cases of a shape put their poison: a query row (q, dout) and a key (k), and on
// a shape with rows that see no key one of those (empty_row; -1 if none). See main.
struct ContainmentShape {
  int64_t sq, sk, row, key, empty_row;
};

// The containment cases of one (shape, head dim, dtype) through `bwd`: clean inputs drawn once and the
// clean call run once, then one poisoned call per case (NaN and +inf in q and dout, NaN, +inf and -inf
// in k; NaN in q and dout of the empty row). Causal, batch 2, GQA 2:1; the poison sits in the last batch
// and the last (query or KV) head, so that the other batch and heads are untouched witnesses. Returns
// the failures and adds the cases to *total.
int run_containment_cases(const ContainmentShape& s, int64_t d, DType t, const char* path, BwdFn bwd,
                          bool deterministic, std::mt19937_64& rng, int* total) {
  const Case c{2, s.sq, s.sk, 4, 2, d, true, t};
  const int64_t b = c.batch - 1, h = c.hq - 1, hk = c.hkv - 1;
  // Poisoned columns: in q, k and dout at different places of the head dim (both halves of it, for the
  // kernels that split dK / dV's columns over two warps).
  const int64_t qc = 5 % d, kc = d / 2 + 1, dc = d - 3;
  const std::vector<Poison> poisons = containment_poisons(s, b, h, hk, qc, kc, dc);
  if (!listed("FLASH_BWD_CHECK_PATHS", path)) {
    *total += static_cast<int>(poisons.size());
    skipped_cases += static_cast<int>(poisons.size());
    return 0;
  }
  const int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hkv * c.d;
  Inputs in{random_values(nq, t, kQkMaxMag, rng), random_values(nk, t, kQkMaxMag, rng),
            random_values(nk, t, kVMaxMag, rng), random_values(nq, t, kDoutMaxMag, rng)};
  make_q_column_positive(c, in.q, b, hk, kc);  // in the clean call too
  const Outputs clean = run_fwd_bwd(c, in, bwd);
  const int64_t clean_nonfinite = count_nonfinite_outputs(clean);
  int failed = 0;
  for (const Poison& p : poisons) {
    ++*total;
    failed += !run_nonfinite_case(c, in, clean, clean_nonfinite, p, path, bwd, deterministic);
  }
  return failed;
}

// The bench's inputs, bf16, drawn once and shared by every cell: every cell has B * S = kBenchTokens
// and H * D = kBenchWidth, so the same buffers hold each cell's q, k, v, dout and gradients (drawing 4 x
// 33M values on the host took seconds, per (seqlen, head dim) most of the bench's time: a run of the
// bench over 512-16k and two head dims took 75 s, H100 host, 2026-11-27). lse holds B * H * S floats
// for head dims down to 16.
struct BenchInputs {
  static constexpr int64_t kElems = kBenchTokens * kBenchWidth;
  Dev q{kElems * 2}, k{kElems * 2}, v{kElems * 2}, dout{kElems * 2}, out{kElems * 2},
      lse{kBenchTokens * (kBenchWidth / 16) * 4}, dq{kElems * 2}, dk{kElems * 2}, dv{kElems * 2};
  explicit BenchInputs(std::mt19937_64& rng) {
    upload(q, DType::kBFloat16, random_values(kElems, DType::kBFloat16, kQkMaxMag, rng));
    upload(k, DType::kBFloat16, random_values(kElems, DType::kBFloat16, kQkMaxMag, rng));
    upload(v, DType::kBFloat16, random_values(kElems, DType::kBFloat16, kVMaxMag, rng));
    upload(dout, DType::kBFloat16, random_values(kElems, DType::kBFloat16, kDoutMaxMag, rng));
  }
};

void bench(BenchInputs& in, int64_t seqlen, int64_t d, bool causal, const char* name, BwdFn bwd) {
  if (!listed("FLASH_BWD_CHECK_BENCH", name)) return;
  const Case c{kBenchTokens / seqlen, seqlen, seqlen, kBenchWidth / d, kBenchWidth / d, d, causal, DType::kBFloat16};
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  const auto pfwd = make_params(c, in.q, in.k, in.v, in.out, in.lse);
  run_forward(pfwd, stream);
  const auto p = make_bwd_params(pfwd, in.dout, in.dq, in.dk, in.dv);
  const LaunchTimes tm = time_launches([&] { return bwd(p, stream); }, stream);
  const double flops = kBwdFlopsPerFwd * 4.0 * c.batch * c.hq * static_cast<double>(c.sq) * c.sk * c.d *
                       (causal ? 0.5 : 1.0);
  std::printf("BENCH %-9s bf16 B%" PRId64 " H%" PRId64 " S%-5" PRId64 " D%-3" PRId64
              " %-6s median %.3f ms  %.1f TFLOP/s | back to back %.3f ms  %.1f TFLOP/s\n",
              name, c.batch, c.hq, c.sq, c.d, causal ? "causal" : "full", tm.median_ms, tflops_per_s(flops, tm.median_ms),
              tm.queued_ms, tflops_per_s(flops, tm.queued_ms));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

int main(int argc, char** argv) {
  const CheckSetup setup = check_setup(argc, argv, "flash_bwd_check", /*bench_only_supported=*/true);
  const cudaDeviceProp& prop = setup.prop;
  const bool run_bench = setup.run_bench;
  std::mt19937_64 rng(setup.seed);

  struct Shape {
    int64_t batch, sq, sk, hq, hkv;
  };
  const Shape shapes[] = {
      {2, 1, 1, 2, 2},       {2, 17, 17, 2, 2},   {2, 97, 97, 2, 2},   {1, 1023, 1023, 2, 2},
      {1, 1025, 1025, 2, 2}, {2, 113, 203, 2, 2}, {2, 203, 113, 2, 2}, {2, 1, 239, 2, 2},
      {2, 97, 97, 8, 2},                          // GQA 4:1
      {1, 203, 113, 4, 1},   {1, 1025, 1025, 4, 1},  // MQA
  };
  // The dispatcher's choice (the wgmma kernel on Hopper for head dims 32 / 64 / 128), and on Hopper the
  // mma.sync kernel beside it.
  struct Path {
    const char* name;
    BwdFn fn;
    bool deterministic;
  };
  std::vector<Path> paths = {{"flash_bwd", fa::cuda::flash_bwd, false},
                             {"flash_bwd-det", flash_bwd_deterministic, true}};
  if (prop.major == 9) {
    paths.push_back({"sm80-mma", fa::cuda::flash_bwd_sm80, false});
    paths.push_back({"sm80-mma-det", flash_bwd_sm80_deterministic, true});
  }
  int failed = 0, total = 0;
  for (const Path& path : setup.run_checks ? paths : std::vector<Path>{}) {
    for (DType t : {DType::kFloat16, DType::kBFloat16})
      for (int64_t d : {64, 128})
        for (bool causal : {false, true})
          for (const Shape& s : shapes) {
            ++total;
            failed += !run_case(Case{s.batch, s.sq, s.sk, s.hq, s.hkv, d, causal, t}, path.name, path.fn, path.deterministic, rng);
          }
    // Every other head dim the forward compiles and some padded ones, on two shapes with tails.
    for (DType t : {DType::kFloat16, DType::kBFloat16})
      for (int64_t d : {8, 32, 40, 72, 96, 120, 136, 192, 200, 256})
        for (bool causal : {false, true}) {
          total += 2;
          failed += !run_case(Case{2, 97, 203, 4, 2, d, causal, t}, path.name, path.fn, path.deterministic, rng);
          failed += !run_case(Case{1, 1025, 1023, 2, 1, d, causal, t}, path.name, path.fn, path.deterministic, rng);
        }
  }
  // The two-kernel backward (Hopper): the shapes above at head dims 64 and 128, and 32 / 40 on the tails
  // (those with the deterministic flag set too).
  if (prop.major == 9 && setup.run_checks) {
    for (DType t : {DType::kFloat16, DType::kBFloat16})
      for (int64_t d : {64, 128})
        for (bool causal : {false, true})
          for (const Shape& s : shapes) {
            ++total;
            failed += !run_case(Case{s.batch, s.sq, s.sk, s.hq, s.hkv, d, causal, t}, "two-kernel", flash_bwd_two_kernel,
                                true, rng);
          }
    for (int64_t d : {32, 40})
      for (bool causal : {false, true}) {
        total += 2;
        failed += !run_case(Case{2, 97, 203, 4, 2, d, causal, DType::kBFloat16}, "two-kernel-det",
                            flash_bwd_two_kernel_det, true, rng);
        failed += !run_case(Case{1, 1025, 1023, 2, 1, d, causal, DType::kFloat16}, "two-kernel-det",
                            flash_bwd_two_kernel_det, true, rng);
      }
    // Head dims between the Hopper kernels' (72-120 run the d128 kernels on zero-filled columns, 136-192
    // the d192 ones, 200-256 the d256 ones: the wide dK/dV kernel, flash_bwd_wide_sm90_kernel.cuh).
    for (int64_t d : {72, 96, 104, 120, 136, 160, 192, 200, 256})
      for (bool causal : {false, true}) {
        total += 2;
        failed += !run_case(Case{2, 97, 203, 4, 2, d, causal, DType::kBFloat16}, "two-kernel", flash_bwd_two_kernel,
                            true, rng);
        failed += !run_case(Case{1, 1025, 1023, 2, 1, d, causal, DType::kFloat16}, "two-kernel", flash_bwd_two_kernel,
                            true, rng);
      }
  }
  // Non-finite containment: every kernel family at two head dims, both dtypes (alternating over head dims
  // and shapes), with seqlen_q = / < / > seqlen_k. The poison sits next to the hidden pairs of tiles that
  // cross the diagonal (diag = sk - sq). The query row (q, dout): row + diag = 40 (mod 64), its last key,
  // so that the keys after it in the same 64- / 128-key block are hidden from it, and row = 38..42
  // (mod 64), mid query tile. The key (k): key - diag = 40 (mod 64), the first row that sees it, so that
  // the rows before that one in its query tile (40 of a 64-row tile, 40 or 104 of a 128-row one) do not
  // see it. With seqlen_q > seqlen_k, also row 129: it sees no key, in the query tile from row 128 whose
  // rows 130- see keys. flash_bwd_fp32_check.cu uses the same places.
  const ContainmentShape containment_shapes[] = {
      {300, 300, 168, 104, -1}, {200, 330, 102, 298, -1}, {330, 200, 234, 38, 129}};
  struct ContainmentPath {
    const char* name;
    BwdFn fn;
    bool deterministic;
    std::vector<int64_t> dims;
  };
  // The wgmma kernels (head dims 32 / 64 / 128) on Hopper; the mma.sync kernel's two configurations
  // (128-key blocks up to head dim 128, here 40 padded to 64; 64-key blocks with dK / dV's columns split
  // over two warps at 192 / 256), on Hopper through flash_bwd_sm80.
  const std::vector<int64_t> wgmma_dims = {64, 128}, mma_dims = {40, 256};
  const bool hopper = prop.major == 9;
  std::vector<ContainmentPath> containment_paths = {
      {"flash_bwd", fa::cuda::flash_bwd, false, hopper ? wgmma_dims : mma_dims},
      {"flash_bwd-det", flash_bwd_deterministic, true, hopper ? wgmma_dims : mma_dims}};
  if (hopper) {
    containment_paths.push_back({"two-kernel", flash_bwd_two_kernel, true, {64, 96, 128, 192, 256}});
    containment_paths.push_back({"sm80-mma", fa::cuda::flash_bwd_sm80, false, mma_dims});
  }
  for (const ContainmentPath& path : setup.run_checks ? containment_paths : std::vector<ContainmentPath>{})
    for (size_t di = 0; di < path.dims.size(); ++di)
      for (size_t si = 0; si < std::size(containment_shapes); ++si) {
        const DType t = (di + si) % 2 == 0 ? DType::kFloat16 : DType::kBFloat16;
        failed += run_containment_cases(containment_shapes[si], path.dims[di], t, path.name, path.fn,
                                        path.deterministic, rng, &total);
      }
  if (setup.run_checks) {
    std::printf("%s: %d of %d cases failed", failed ? "FAIL" : "PASS", failed, total - skipped_cases);
    if (skipped_cases > 0) std::printf(" (%d cases of paths not in FLASH_BWD_CHECK_PATHS skipped)", skipped_cases);
    std::printf("\n");
  }
  std::unique_ptr<BenchInputs> in;
  if (run_bench)
    for (int64_t seqlen : {512, 1024, 2048, 4096, 8192, 16384})
      for (int64_t d : {64, 96, 128, 192, 256}) {
        if (!listed("FLASH_BWD_CHECK_BENCH_SEQLENS", std::to_string(seqlen)) ||
            !listed("FLASH_BWD_CHECK_BENCH_DIMS", std::to_string(d)))
          continue;
        if (!in) in = std::make_unique<BenchInputs>(rng);
        for (bool causal : {false, true}) {
          for (const Path& path : paths) bench(*in, seqlen, d, causal, path.name, path.fn);
          if (prop.major == 9) bench(*in, seqlen, d, causal, "two-kernel", flash_bwd_two_kernel);
          if (seqlen <= kNaiveBenchMaxSeqlen)
            bench(*in, seqlen, d, causal, "naive-bwd", fa::cuda::naive_attention_bwd);
        }
      }
  return failed ? 1 : 0;
}
