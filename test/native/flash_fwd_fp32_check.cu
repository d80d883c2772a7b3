// GPU check and timing of the float32 FA2 forward (csrc/cuda/flash/flash_fwd_fp32.cu), built and run by
// scripts/flash-fwd-fp32-check.sh:  flash_fwd_fp32_check [seed] [--no-bench]
// Each case runs in both precisions (Fp32Precision::kTf32, kHighest): fresh random float32 inputs
// (never zero; the seed is printed), out and lse poisoned with NaN (0xFF bytes), then flash_fwd_fp32
// and, for comparison, the naive fp32 kernel (csrc/cuda/naive_attention.cu). Host references per row:
// float64, and a plain same-precision implementation of the kernel's arithmetic (float32 accumulation
// in index order; kTf32: q, k, v and P rounded to TF32 like cvt.rna first, as lib/reference.ts
// precision 'tf32'). Tolerance (the flash-attention suite's rule):
//     max |flash - ref| <= 2 * max |same - ref| + 1e-5                          for out
//     max |flash - ref| <= 2 * max |same - ref| + 1e-5 + 8 * 2^-24 * max |ref|  for lse
// plus: no NaN left (every element written), empty causal rows give out exactly 0 and lse +inf.
// Then (unless --no-bench) timing: median of 20 cudaEvent-timed calls after warm-up, TFLOP/s =
// 4 B H Sq Sk D / t (halved when causal), both precisions and the naive kernel, on the first design
// document's shape (B4 H1 S8192 D64; PyTorch SDPA memory-efficient fp32 on an H100: 2.56 ms) and on a
// few FA2-grid cells.
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
#include <vector>

#include "check_args.h"
#include "check_cuda.h"
#include "check_timing.h"
#include "common/attention_params.h"
#include "cuda/flash/flash_fwd_fp32.h"
#include "cuda/naive_attention.h"

namespace {

using fa::Fp32Precision;

constexpr double kSameErrFactor = 2.0;  // flash error may be 2x the same-precision implementation's
constexpr double kAbsSlack = 1e-5;
constexpr double kLseUlps = 8 * 0x1p-24;  // 4 float32 ulps of |lse| (the base-2 -> natural-log conversion)
constexpr double kMinMag = 0.1;
constexpr double kQkMaxMag = 1.5;
constexpr double kVMaxMag = 1.0;
constexpr size_t kNaiveBenchMaxBytes = size_t{4} << 30;  // the naive kernel's N^2 workspace, for timing
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
};

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

fa::AttentionFwdParams make_params(const Case& c, Fp32Precision precision, const Dev& q, const Dev& k, const Dev& v,
                                   const Dev& o, const Dev& lse) {
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
  p.fp32_precision = precision;
  p.q = q.ptr;
  p.k = k.ptr;
  p.v = v.ptr;
  p.out = o.ptr;
  p.lse = static_cast<float*>(lse.ptr);
  return p;
}

// One query row by the plain same-precision algorithm (float32 accumulation in index order; tf32:
// operands of both products rounded to TF32). qrow is [d]; k and v rows are at kv + j * kv_stride.
void same_precision_row(bool tf32, const float* qrow, const float* k, const float* v, int64_t kv_stride, int64_t n,
                        int64_t d, float scale, std::vector<float>& s, float* orow, float* lse) {
  const auto op = [tf32](float x) { return tf32 ? tf32_round(x) : x; };
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    float acc = 0.0f;
    for (int64_t x = 0; x < d; ++x) acc += op(qrow[x]) * op(k[j * kv_stride + x]);
    s[j] = acc * scale;
    mx = std::max(mx, s[j]);
  }
  float l = 0.0f;
  for (int64_t j = 0; j < n; ++j) l += (s[j] = std::exp(s[j] - mx));
  for (int64_t x = 0; x < d; ++x) orow[x] = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    const float pj = op(s[j] / l);
    for (int64_t x = 0; x < d; ++x) orow[x] += pj * op(v[j * kv_stride + x]);
  }
  *lse = mx + std::log(l);
}

bool run_case(const Case& c, Fp32Precision precision, std::mt19937_64& rng) {
  const int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hkv * c.d;
  const int64_t nlse = c.batch * c.hq * c.sq;
  const auto q = random_values(nq, kQkMaxMag, rng);
  const auto k = random_values(nk, kQkMaxMag, rng);
  const auto v = random_values(nk, kVMaxMag, rng);
  Dev dq(nq * 4), dk(nk * 4), dv(nk * 4), dout_flash(nq * 4), dout_naive(nq * 4), dlse_flash(nlse * 4),
      dlse_naive(nlse * 4);
  upload(dq, q);
  upload(dk, k);
  upload(dv, v);
  CHECK_CUDA(cudaMemset(dout_flash.ptr, 0xFF, nq * 4));  // NaN
  CHECK_CUDA(cudaMemset(dlse_flash.ptr, 0xFF, nlse * 4));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  const auto pf = make_params(c, precision, dq, dk, dv, dout_flash, dlse_flash);
  const auto pn = make_params(c, precision, dq, dk, dv, dout_naive, dlse_naive);
  CHECK_CUDA(fa::cuda::flash_fwd_fp32(pf, stream));
  CHECK_CUDA(fa::cuda::naive_attention_fwd(pn, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
  const auto of = download(dout_flash, nq), on = download(dout_naive, nq), lf = download(dlse_flash, nlse);

  // Row by row: float64 reference and the same-precision implementation.
  const int64_t group = c.hq / c.hkv, kv_stride = c.hkv * c.d;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  const bool tf32 = precision == Fp32Precision::kTf32;
  double err_flash = 0, err_same = 0, err_naive = 0, err_lse = 0, err_lse_same = 0, max_lse = 0;
  int64_t bad = 0, bad_empty = 0;
  std::vector<double> s(c.sk), orow(c.d);
  std::vector<float> s32(c.sk), osame(c.d);
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.sq; ++i) {
        const int64_t n = c.causal ? std::clamp<int64_t>(i + c.sk - c.sq + 1, 0, c.sk) : c.sk;
        const int64_t qo = ((b * c.sq + i) * c.hq + h) * c.d;
        const float lse_got = lf[(b * c.hq + h) * c.sq + i];
        if (n == 0) {
          for (int64_t x = 0; x < c.d; ++x) bad_empty += of[qo + x] != 0.0f;
          bad_empty += !(std::isinf(lse_got) && lse_got > 0);
          continue;
        }
        const float* kb = k.data() + (b * c.sk * c.hkv + h / group) * c.d;
        const float* vb = v.data() + (b * c.sk * c.hkv + h / group) * c.d;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t x = 0; x < c.d; ++x) acc += static_cast<double>(q[qo + x]) * kb[j * kv_stride + x];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
        std::fill(orow.begin(), orow.end(), 0.0);
        for (int64_t j = 0; j < n; ++j)
          for (int64_t x = 0; x < c.d; ++x) orow[x] += s[j] * vb[j * kv_stride + x];
        float lse_same = 0;
        same_precision_row(tf32, q.data() + qo, kb, vb, kv_stride, n, c.d, static_cast<float>(scale), s32,
                           osame.data(), &lse_same);
        for (int64_t x = 0; x < c.d; ++x) {
          const double ref = orow[x] / sum;
          if (std::isnan(of[qo + x])) ++bad;
          err_flash = std::max(err_flash, std::fabs(of[qo + x] - ref));
          err_same = std::max(err_same, std::fabs(osame[x] - ref));
          err_naive = std::max(err_naive, std::fabs(on[qo + x] - ref));
        }
        const double lse_ref = mx + std::log(sum);
        if (std::isnan(lse_got)) ++bad;
        err_lse = std::max(err_lse, std::fabs(lse_got - lse_ref));
        err_lse_same = std::max(err_lse_same, std::fabs(lse_same - lse_ref));
        max_lse = std::max(max_lse, std::fabs(lse_ref));
      }
  const double tol = kSameErrFactor * err_same + kAbsSlack;
  const double lse_tol = kSameErrFactor * err_lse_same + kAbsSlack + kLseUlps * max_lse;
  const bool ok = bad == 0 && bad_empty == 0 && err_flash <= tol && err_lse <= lse_tol;
  std::printf("%s %-7s B%" PRId64 " Sq%-5" PRId64 " Sk%-5" PRId64 " Hq%-5" PRId64 " Hkv%-3" PRId64 " D%-3" PRId64
              " %-6s out_err=%.2e (same %.2e, naive %.2e, tol %.2e) lse_err=%.2e (tol %.2e) nan=%" PRId64
              " bad_empty=%" PRId64 "\n",
              ok ? "PASS" : "FAIL", precision_name(precision), c.batch, c.sq, c.sk, c.hq, c.hkv, c.d,
              c.causal ? "causal" : "full", err_flash, err_same, err_naive, tol, err_lse, lse_tol, bad, bad_empty);
  return ok;
}

using FwdFn = cudaError_t (*)(const fa::AttentionFwdParams&, cudaStream_t);

void bench(const Case& c, const char* name, Fp32Precision precision, FwdFn fwd, std::mt19937_64& rng) {
  const int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hkv * c.d;
  Dev dq(nq * 4), dk(nk * 4), dv(nk * 4), dout(nq * 4), dlse(c.batch * c.hq * c.sq * 4);
  upload(dq, random_values(nq, kQkMaxMag, rng));
  upload(dk, random_values(nk, kQkMaxMag, rng));
  upload(dv, random_values(nk, kVMaxMag, rng));
  const auto p = make_params(c, precision, dq, dk, dv, dout, dlse);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  const LaunchTimes tm = time_launches([&] { return fwd(p, stream); }, stream);
  const double flops = 4.0 * c.batch * c.hq * static_cast<double>(c.sq) * c.sk * c.d * (c.causal ? 0.5 : 1.0);
  std::printf("BENCH %-13s fp32 B%" PRId64 " H%-3" PRId64 " S%-5" PRId64 " D%-3" PRId64
              " %-6s median %.3f ms (min %.3f)  %.1f TFLOP/s\n",
              name, c.batch, c.hq, c.sq, c.d, c.causal ? "causal" : "full", tm.median_ms, tm.min_ms,
              tflops_per_s(flops, tm.median_ms));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

int main(int argc, char** argv) {
  const CheckSetup setup = check_setup(argc, argv, "flash_fwd_fp32_check");
  const bool run_bench = setup.run_bench;
  std::mt19937_64 rng(setup.seed);

  struct Shape {
    int64_t batch, sq, sk, hq, hkv;
  };
  const Shape shapes[] = {
      {2, 1, 1, 2, 2},       {2, 17, 17, 2, 2},   {2, 97, 97, 2, 2},   {1, 1025, 1025, 2, 2},
      {2, 113, 203, 2, 2},   {2, 203, 113, 2, 2}, {2, 1, 239, 2, 2},   {1, 3, 799, 2, 2},
      {2, 97, 97, 8, 1},     {1, 203, 113, 8, 1},  // GQA 8:1
  };
  int failed = 0, total = 0;
  for (Fp32Precision precision : {Fp32Precision::kTf32, Fp32Precision::kHighest}) {
    for (int64_t d : {64, 128})
      for (bool causal : {false, true})
        for (const Shape& s : shapes) {
          ++total;
          failed += !run_case(Case{s.batch, s.sq, s.sk, s.hq, s.hkv, d, causal}, precision, rng);
        }
    // Every other specialised head dim and padded ones, on two shapes with tails.
    for (int64_t d : {8, 32, 40, 96, 136, 192, 200, 256})
      for (bool causal : {false, true}) {
        total += 2;
        failed += !run_case(Case{2, 97, 203, 4, 2, d, causal}, precision, rng);
        failed += !run_case(Case{1, 1025, 1023, 2, 1, d, causal}, precision, rng);
      }
    // batch * heads above 65535: the flat grid.
    ++total;
    failed += !run_case(Case{2, 3, 5, 40000, 8, 8, true}, precision, rng);
  }
  std::printf("%s: %d of %d cases failed\n", failed ? "FAIL" : "PASS", failed, total);
  if (run_bench) {
    const Case cells[] = {
        {4, 8192, 8192, 1, 1, 64, false},  // the bench's fp32-memory-wall preset
        {4, 8192, 8192, 1, 1, 64, true},   {8, 2048, 2048, 16, 16, 128, false}, {8, 2048, 2048, 16, 16, 128, true},
        {2, 8192, 8192, 32, 32, 64, true}, {8, 2048, 2048, 8, 8, 256, false},
    };
    for (const Case& c : cells) {
      bench(c, "flash-tf32", Fp32Precision::kTf32, fa::cuda::flash_fwd_fp32, rng);
      bench(c, "flash-highest", Fp32Precision::kHighest, fa::cuda::flash_fwd_fp32, rng);
      fa::AttentionFwdParams sizes;
      sizes.batch = c.batch;
      sizes.heads_q = c.hq;
      sizes.seqlen_q = c.sq;
      sizes.seqlen_k = c.sk;
      if (fa::cuda::naive_attention_fwd_workspace_bytes(sizes) <= kNaiveBenchMaxBytes)
        bench(c, "naive", Fp32Precision::kTf32, fa::cuda::naive_attention_fwd, rng);
    }
  }
  return failed ? 1 : 0;
}
