// GPU check and timing of the FA2 forward (csrc/cuda/flash/flash_fwd.cu), built and run by
// scripts/flash-fwd-check.sh:  flash_fwd_check [seed] [--no-bench]
// Each case: fresh random inputs (never zero, rounded to the dtype; the seed is printed), out poisoned
// with NaN (0xFF bytes) and lse poisoned, then flash_fwd and the naive reference
// (csrc/cuda/naive_attention.cu) are run and both compared with a float64 host reference on the same
// rounded inputs. Tolerance (the flash-attention suite's rule):
//     max |flash - ref| <= 2 * max |naive - ref| + 1e-5          for out
//     max |lse_flash - lse_ref| <= 1e-3 * max(1, max |lse_ref|)   for lse (fp32 whatever the dtype)
// plus: no NaN left (every element written), empty causal rows give out exactly 0 and lse +inf.
// Non-finite containment (run_nonfinite_case, causal): V of one key gets a NaN in column c1 and another
// key a +inf in column c2; the rows that see the NaN key must hold NaN in c1, those that see the +inf
// key +inf in c2, and every other element of out, and all of lse, must be bit-identical to the same
// call without them (nonfinite_pv.cuh: a hidden P = 0 times NaN must not reach the rows that do not
// see the key).
// Then (unless --no-bench) bf16 timing at B*S = 16k, H*D = 2048, S 2k / 8k, D 64 / 128, causal and not:
// median of 20 cudaEvent-timed calls after warm-up, TFLOP/s = 4 B H S^2 D / t (halved when causal).
// On Hopper the kernel variants below are checked and timed too (FLASH_FWD_CHECK_MASKS=causal or full:
// with that mask only); FLASH_FWD_CHECK_VARIANTS=d192,ws-d256
// runs only those whose names contain one of the comma-separated strings, or, for an entry "=name", are
// that name (and not the shipped paths,
// unless the list holds "shipped": FLASH_FWD_CHECK_VARIANTS=shipped runs those alone).
// FLASH_FWD_CHECK_SEQLENS=4096,8192 times the variants at those sequence lengths only.
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
#include "cuda/flash/flash_fwd.h"
#include "cuda/flash/hopper/flash_fwd_sm90_launch.cuh"
#include "cuda/naive_attention.h"
#include "check_args.h"
#include "check_cuda.h"
#include "check_timing.h"


namespace {

using fa::DType;

constexpr double kNaiveErrFactor = 2.0;  // flash error may be 2x the naive kernel's own error
constexpr double kAbsSlack = 1e-5;  // tiny: the bound is essentially 2x the naive kernel's error
constexpr double kLseTol = 1e-3;
constexpr double kMinMag = 0.1;
constexpr double kQkMaxMag = 1.5;
constexpr double kVMaxMag = 1.0;
constexpr int64_t kBenchTokens = 16 * 1024;  // B * S
constexpr int64_t kBenchWidth = 2048;        // H * D

const char* short_name(DType t) { return t == DType::kFloat16 ? "f16" : "bf16"; }

uint16_t to_bits(DType t, float x) { return t == DType::kFloat16 ? fa::f32_to_f16(x) : fa::f32_to_bf16(x); }
float from_bits(DType t, uint16_t h) { return t == DType::kFloat16 ? fa::f16_to_f32(h) : fa::bf16_to_f32(h); }

struct Case {
  int64_t batch, sq, sk, hq, hkv, d;
  bool causal;
  DType dtype;
};

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

std::vector<float> download(const Dev& d, DType t, int64_t n) {
  std::vector<uint16_t> h(static_cast<size_t>(n));
  CHECK_CUDA(cudaMemcpy(h.data(), d.ptr, h.size() * 2, cudaMemcpyDeviceToHost));
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

using FwdFn = cudaError_t (*)(const fa::AttentionFwdParams&, cudaStream_t);

// Alternative Hopper configurations, timed beside the shipped one (bf16 only): keys per tile,
// warpgroups, stages, thread blocks per SM; kTmaStoreO false: O stored from registers.
template <int kHeadDim, int kBlockN, int kWarpGroups, int kStages, int kMinBlocks = 1, bool kTmaStoreO = true>
cudaError_t sm90_variant(const fa::AttentionFwdParams& p, cudaStream_t stream) {
  using Traits = fa::cuda::flash::sm90::FlashFwdSm90Traits<kHeadDim, kBlockN, kWarpGroups, kStages, __nv_bfloat16,
                                                           kMinBlocks, kTmaStoreO>;
  if (p.dtype != DType::kBFloat16 || p.head_dim != kHeadDim) return cudaErrorNotSupported;
  return p.causal ? fa::cuda::launch_flash_fwd_sm90<Traits, true>(p, stream)
                  : fa::cuda::launch_flash_fwd_sm90<Traits, false>(p, stream);
}

// The warp-specialized Hopper kernel (flash_fwd_sm90_ws_kernel.cuh): keys per tile, stages, consumer
// warpgroups (64 query rows each), the causal items' L2 sections (KiB of K/V, at most kMaxHeads heads;
// 0: the traits' 32 MiB and 32 heads), Q buffers (0: the traits' choice); kTmaStoreO false: O stored
// from registers. bf16 only.
template <int kHeadDim, int kBlockN, int kStages, int kConsumers = 2, uint32_t kSectionKiB = 0,
          uint32_t kMaxHeads = 0, int kQStages = 0, bool kTmaStoreO = true>
cudaError_t sm90_ws_variant(const fa::AttentionFwdParams& p, cudaStream_t stream) {
  using Default = fa::cuda::flash::sm90::FlashFwdSm90WsTraits<kHeadDim, kBlockN, kStages, __nv_bfloat16, kConsumers>;
  using Traits = fa::cuda::flash::sm90::FlashFwdSm90WsTraits<
      kHeadDim, kBlockN, kStages, __nv_bfloat16, kConsumers, kSectionKiB != 0 ? kSectionKiB : Default::kL2SectionKiB,
      kQStages, kTmaStoreO, kMaxHeads != 0 ? kMaxHeads : Default::kL2SectionMaxHeads>;
  if (p.dtype != DType::kBFloat16 || p.head_dim != kHeadDim) return cudaErrorNotSupported;
  return p.causal ? fa::cuda::launch_flash_fwd_sm90_ws<Traits, true>(p, stream)
                  : fa::cuda::launch_flash_fwd_sm90_ws<Traits, false>(p, stream);
}
// Causal sections of one head, and of all heads.
constexpr uint32_t kOneHead = 1, kAllHeads = ~0u;

bool run_case(const Case& c, const char* path, FwdFn fwd, std::mt19937_64& rng) {
  const int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hkv * c.d;
  const int64_t nlse = c.batch * c.hq * c.sq;
  const auto q = random_values(nq, c.dtype, kQkMaxMag, rng);
  const auto k = random_values(nk, c.dtype, kQkMaxMag, rng);
  const auto v = random_values(nk, c.dtype, kVMaxMag, rng);
  Dev dq(nq * 2), dk(nk * 2), dv(nk * 2), dout_flash(nq * 2), dout_naive(nq * 2), dlse_flash(nlse * 4),
      dlse_naive(nlse * 4);
  upload(dq, c.dtype, q);
  upload(dk, c.dtype, k);
  upload(dv, c.dtype, v);
  CHECK_CUDA(cudaMemset(dout_flash.ptr, 0xFF, nq * 2));  // NaN in fp16 and bf16
  CHECK_CUDA(cudaMemset(dlse_flash.ptr, 0xFF, nlse * 4));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  const auto pf = make_params(c, dq, dk, dv, dout_flash, dlse_flash);
  const auto pn = make_params(c, dq, dk, dv, dout_naive, dlse_naive);
  CHECK_CUDA(fwd(pf, stream));
  CHECK_CUDA(fa::cuda::naive_attention_fwd(pn, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaStreamDestroy(stream));
  const auto of = download(dout_flash, c.dtype, nq), on = download(dout_naive, c.dtype, nq);
  std::vector<float> lf(nlse);
  CHECK_CUDA(cudaMemcpy(lf.data(), dlse_flash.ptr, nlse * 4, cudaMemcpyDeviceToHost));

  // float64 reference, row by row.
  const int64_t group = c.hq / c.hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  double err_flash = 0, err_naive = 0, err_lse = 0, max_lse = 1;
  int64_t bad = 0, bad_empty = 0;
  std::vector<double> s(c.sk), orow(c.d);
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
        const int64_t kvh = h / group;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n; ++j) {
          const int64_t ko = ((b * c.sk + j) * c.hkv + kvh) * c.d;
          double acc = 0;
          for (int64_t x = 0; x < c.d; ++x) acc += static_cast<double>(q[qo + x]) * k[ko + x];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
        std::fill(orow.begin(), orow.end(), 0.0);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t vo = ((b * c.sk + j) * c.hkv + kvh) * c.d;
          for (int64_t x = 0; x < c.d; ++x) orow[x] += s[j] * v[vo + x];
        }
        for (int64_t x = 0; x < c.d; ++x) {
          const double ref = orow[x] / sum;
          if (std::isnan(of[qo + x])) ++bad;
          err_flash = std::max(err_flash, std::fabs(of[qo + x] - ref));
          err_naive = std::max(err_naive, std::fabs(on[qo + x] - ref));
        }
        const double lse_ref = mx + std::log(sum);
        if (std::isnan(lse_got)) ++bad;
        err_lse = std::max(err_lse, std::fabs(lse_got - lse_ref));
        max_lse = std::max(max_lse, std::fabs(lse_ref));
      }
  const double tol = kNaiveErrFactor * err_naive + kAbsSlack;
  const bool ok = bad == 0 && bad_empty == 0 && err_flash <= tol && err_lse <= kLseTol * max_lse;
  std::printf("%s %-10s %-4s B%" PRId64 " Sq%-5" PRId64 " Sk%-5" PRId64 " Hq%" PRId64 " Hkv%" PRId64 " D%-3" PRId64
              " %-6s out_err=%.2e (naive %.2e, tol %.2e) lse_err=%.2e nan=%" PRId64 " bad_empty=%" PRId64 "\n",
              ok ? "PASS" : "FAIL", path, short_name(c.dtype), c.batch, c.sq, c.sk, c.hq, c.hkv, c.d,
              c.causal ? "causal" : "full", err_flash, err_naive, tol, err_lse / max_lse, bad, bad_empty);
  return ok;
}

// One causal call with and without a NaN (key j1, column c1) and a +inf (key j2, column c2) in V of
// batch b, kv head hk: see the file comment.
bool run_nonfinite_case(const Case& c, int64_t j1, int64_t j2, const char* path, FwdFn fwd, std::mt19937_64& rng) {
  const int64_t nq = c.batch * c.sq * c.hq * c.d, nk = c.batch * c.sk * c.hkv * c.d;
  const int64_t nlse = c.batch * c.hq * c.sq;
  const int64_t b = c.batch - 1, hk = c.hkv - 1, c1 = 5 % c.d, c2 = (c.d - 3) % c.d;
  const auto q = random_values(nq, c.dtype, kQkMaxMag, rng);
  const auto k = random_values(nk, c.dtype, kQkMaxMag, rng);
  auto v = random_values(nk, c.dtype, kVMaxMag, rng);
  Dev dq(nq * 2), dk(nk * 2), dv(nk * 2), dout(nq * 2), dlse(nlse * 4);
  upload(dq, c.dtype, q);
  upload(dk, c.dtype, k);
  const auto run = [&](std::vector<float>* out, std::vector<float>* lse) {
    upload(dv, c.dtype, v);
    CHECK_CUDA(cudaMemset(dout.ptr, 0xFF, nq * 2));
    CHECK_CUDA(cudaMemset(dlse.ptr, 0xFF, nlse * 4));
    CHECK_CUDA(fwd(make_params(c, dq, dk, dv, dout, dlse), nullptr));
    CHECK_CUDA(cudaDeviceSynchronize());
    *out = download(dout, c.dtype, nq);
    lse->resize(nlse);
    CHECK_CUDA(cudaMemcpy(lse->data(), dlse.ptr, nlse * 4, cudaMemcpyDeviceToHost));
  };
  std::vector<float> clean, clean_lse, bad, bad_lse;
  run(&clean, &clean_lse);
  v[((b * c.sk + j1) * c.hkv + hk) * c.d + c1] = std::numeric_limits<float>::quiet_NaN();
  v[((b * c.sk + j2) * c.hkv + hk) * c.d + c2] = std::numeric_limits<float>::infinity();
  run(&bad, &bad_lse);
  const auto same_bits = [](float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0; };
  int64_t wrong = 0, poisoned = 0;
  const int64_t group = c.hq / c.hkv;
  for (int64_t bb = 0; bb < c.batch; ++bb)
    for (int64_t i = 0; i < c.sq; ++i)
      for (int64_t h = 0; h < c.hq; ++h) {
        const bool hit = bb == b && h / group == hk;
        const bool sees1 = hit && j1 <= i + c.sk - c.sq, sees2 = hit && j2 <= i + c.sk - c.sq;
        const int64_t o = ((bb * c.sq + i) * c.hq + h) * c.d;
        for (int64_t x = 0; x < c.d; ++x) {
          const float y = bad[o + x];
          if (sees1 && x == c1) {
            ++poisoned;
            wrong += !std::isnan(y);
          } else if (sees2 && x == c2) {
            ++poisoned;
            wrong += !(std::isinf(y) && y > 0);
          } else {
            wrong += !same_bits(y, clean[o + x]);
          }
        }
      }
  for (int64_t x = 0; x < nlse; ++x) wrong += !same_bits(bad_lse[x], clean_lse[x]);
  const bool ok = wrong == 0 && poisoned > 0;
  std::printf("%s %-10s %-4s B%" PRId64 " Sq%-5" PRId64 " Sk%-5" PRId64 " Hq%" PRId64 " Hkv%" PRId64 " D%-3" PRId64
              " causal NaN in v[key %" PRId64 "] +inf in v[key %" PRId64 "]: %" PRId64 " poisoned elements, %" PRId64
              " wrong\n",
              ok ? "PASS" : "FAIL", path, short_name(c.dtype), c.batch, c.sq, c.sk, c.hq, c.hkv, c.d, j1, j2, poisoned,
              wrong);
  return ok;
}

// The timing inputs: every timed shape has B * S * H * D = kBenchTokens * kBenchWidth elements per
// tensor, so one set of random q, k, v serves them all (made once: generating them took 2.5 s a shape).
struct BenchInputs {
  static constexpr int64_t kElems = kBenchTokens * kBenchWidth;
  Dev q{kElems * 2}, k{kElems * 2}, v{kElems * 2}, out{kElems * 2}, lse{kBenchTokens * (kBenchWidth / 16) * 4};
  explicit BenchInputs(std::mt19937_64& rng) {
    upload(q, DType::kBFloat16, random_values(kElems, DType::kBFloat16, kQkMaxMag, rng));
    upload(k, DType::kBFloat16, random_values(kElems, DType::kBFloat16, kQkMaxMag, rng));
    upload(v, DType::kBFloat16, random_values(kElems, DType::kBFloat16, kVMaxMag, rng));
  }
};

void bench(int64_t seqlen, int64_t d, bool causal, const char* path, FwdFn fwd, BenchInputs& in) {
  Case c{kBenchTokens / seqlen, seqlen, seqlen, kBenchWidth / d, kBenchWidth / d, d, causal, DType::kBFloat16};
  const auto p = make_params(c, in.q, in.k, in.v, in.out, in.lse);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamDefault));
  const LaunchTimes tm = time_launches([&] { return fwd(p, stream); }, stream);
  const double flops = 4.0 * c.batch * c.hq * static_cast<double>(seqlen) * seqlen * d * (causal ? 0.5 : 1.0);
  std::printf("BENCH %-12s bf16 B%" PRId64 " H%" PRId64 " S%-5" PRId64 " D%-3" PRId64
              " %-6s median %.3f ms  %.1f TFLOP/s | back to back %.3f ms  %.1f TFLOP/s\n",
              path, c.batch, c.hq, seqlen, d, causal ? "causal" : "full", tm.median_ms, tflops_per_s(flops, tm.median_ms),
              tm.queued_ms, tflops_per_s(flops, tm.queued_ms));
  CHECK_CUDA(cudaStreamDestroy(stream));
}

}  // namespace

int main(int argc, char** argv) {
  const CheckSetup setup = check_setup(argc, argv, "flash_fwd_check", /*bench_only_supported=*/true);
  const bool run_bench = setup.run_bench;
  std::mt19937_64 rng(setup.seed);

  struct Shape {
    int64_t batch, sq, sk, hq, hkv;
  };
  const Shape shapes[] = {
      {2, 1, 1, 2, 2},       {2, 17, 17, 2, 2},   {2, 97, 97, 2, 2},  {1, 1023, 1023, 2, 2},
      {1, 1025, 1025, 2, 2}, {2, 113, 203, 2, 2}, {2, 203, 113, 2, 2}, {2, 1, 239, 2, 2},
      {2, 97, 97, 8, 2},     {1, 203, 113, 4, 1}, {1, 1025, 1025, 4, 1},  // GQA 4:1
  };
  struct Path {
    const char* name;
    FwdFn fn;
  };
  std::vector<Path> paths = {{fa::cuda::flash_fwd_path(), fa::cuda::flash_fwd}};
  if (std::strcmp(fa::cuda::flash_fwd_path(), "sm80-mma") != 0) paths.push_back({"sm80-mma", fa::cuda::flash_fwd_sm80});
  int failed = 0, total = 0;
  const char* const wanted = std::getenv("FLASH_FWD_CHECK_VARIANTS");
  if (wanted != nullptr && std::strstr(wanted, "shipped") == nullptr) paths.clear();
  for (const Path& path : setup.run_checks ? paths : std::vector<Path>{}) {
    for (DType t : {DType::kFloat16, DType::kBFloat16})
      for (int64_t d : {64, 128})
        for (bool causal : {false, true})
          for (const Shape& s : shapes) {
            ++total;
            failed += !run_case(Case{s.batch, s.sq, s.sk, s.hq, s.hkv, d, causal, t}, path.name, path.fn, rng);
          }
    // Every other compiled head dim and some padded ones, on two shapes with tails.
    for (int64_t d : {8, 32, 40, 72, 96, 136, 192, 200, 248, 256})
      for (bool causal : {false, true}) {
        const DType t = causal ? DType::kBFloat16 : DType::kFloat16;
        total += 2;
        failed += !run_case(Case{2, 97, 203, 4, 2, d, causal, t}, path.name, path.fn, rng);
        failed += !run_case(Case{1, 1025, 1023, 2, 1, d, causal, t}, path.name, path.fn, rng);
      }
    // Non-finite containment: keys inside tiles that cross the diagonal, seqlen_q = / < / > seqlen_k.
    for (int64_t d : {40, 64, 128, 256})
      for (DType t : {DType::kFloat16, DType::kBFloat16}) {
        total += 3;
        failed += !run_nonfinite_case(Case{2, 300, 300, 4, 2, d, true, t}, 70, 141, path.name, path.fn, rng);
        failed += !run_nonfinite_case(Case{2, 250, 400, 4, 2, d, true, t}, 190, 333, path.name, path.fn, rng);
        failed += !run_nonfinite_case(Case{1, 400, 250, 2, 1, d, true, t}, 3, 100, path.name, path.fn, rng);
      }
  }
  struct Variant {
    const char* name;
    int64_t d;
    FwdFn fn;
  };
  // The shipped d64 / d128 configurations (flash_configs.h) beside the warp-specialized kernel's.
  const Variant all_variants[] = {
      {"d128n128w2s3", 128, sm90_variant<128, 128, 2, 3>},
      {"d128n128w2s3-d", 128, sm90_variant<128, 128, 2, 3, 1, false>},
      {"ws-d128n128s2", 128, sm90_ws_variant<128, 128, 2>},
      {"ws-d128n128s2-q1", 128, sm90_ws_variant<128, 128, 2, 2, 0, 0, 1>},
      {"ws-d128n128s2-q2d", 128, sm90_ws_variant<128, 128, 2, 2, 0, 0, 2, false>},
      {"ws-d128n128s2-h1", 128, sm90_ws_variant<128, 128, 2, 2, kOneHead>},
      {"ws-d128n128s2-all", 128, sm90_ws_variant<128, 128, 2, 2, kAllHeads, kAllHeads>},
      {"ws-d128n176s2", 128, sm90_ws_variant<128, 176, 2>},
      {"ws-d128n176s2-d", 128, sm90_ws_variant<128, 176, 2, 2, 0, 0, 0, false>},
      {"d64n64w2s3b2", 64, sm90_variant<64, 64, 2, 3, 2>},
      {"d64n64w2s3b2-d", 64, sm90_variant<64, 64, 2, 3, 2, false>},
      {"ws-d64n128s2", 64, sm90_ws_variant<64, 128, 2>},
      {"ws-d64n128s2c3", 64, sm90_ws_variant<64, 128, 2, 3>},
      {"ws-d64n128s3c3", 64, sm90_ws_variant<64, 128, 3, 3>},
      {"ws-d64n128s3c3-q1", 64, sm90_ws_variant<64, 128, 3, 3, 0, 0, 1>},
      {"ws-d64n128s3c3-q2d", 64, sm90_ws_variant<64, 128, 3, 3, 0, 0, 2, false>},
      {"ws-d64n96s3c3", 64, sm90_ws_variant<64, 96, 3, 3>},
      {"d96n128w2s3", 96, sm90_variant<96, 128, 2, 3>},
      {"d96n128w2s3-d", 96, sm90_variant<96, 128, 2, 3, 1, false>},
      {"ws-d96n128s2", 96, sm90_ws_variant<96, 128, 2>},
      {"ws-d96n128s2-q1", 96, sm90_ws_variant<96, 128, 2, 2, 0, 0, 1>},
      {"ws-d96n128s2-q2d", 96, sm90_ws_variant<96, 128, 2, 2, 0, 0, 2, false>},
      {"ws-d96n176s2", 96, sm90_ws_variant<96, 176, 2>},
      {"ws-d96n192s2", 96, sm90_ws_variant<96, 192, 2>},
      {"d192n64w2s3", 192, sm90_variant<192, 64, 2, 3>},
      {"d192n64w2s3-d", 192, sm90_variant<192, 64, 2, 3, 1, false>},
      {"ws-d192n96s2", 192, sm90_ws_variant<192, 96, 2>},
      {"ws-d192n112s2", 192, sm90_ws_variant<192, 112, 2>},
      {"ws-d192n112s2-d", 192, sm90_ws_variant<192, 112, 2, 2, 0, 0, 0, false>},
      {"d256n32w2s3", 256, sm90_variant<256, 32, 2, 3>},
      {"d256n32w2s3-d", 256, sm90_variant<256, 32, 2, 3, 1, false>},
      {"ws-d256n64s2", 256, sm90_ws_variant<256, 64, 2>},
      {"ws-d256n80s2", 256, sm90_ws_variant<256, 80, 2>},
      {"ws-d256n80s2-d", 256, sm90_ws_variant<256, 80, 2, 2, 0, 0, 0, false>},
  };
  std::vector<Variant> variants;
  for (const Variant& var : all_variants) {
    bool keep = wanted == nullptr;
    for (const char* w = wanted; w != nullptr && !keep; w = std::strchr(w, ',') ? std::strchr(w, ',') + 1 : nullptr) {
      const size_t len = std::strcspn(w, ",");
      const std::string want(w, len);
      keep = len > 1 && want[0] == '=' ? want.substr(1) == var.name
                                       : len > 0 && std::string(var.name).find(want) != std::string::npos;
    }
    if (keep) variants.push_back(var);
  }
  const bool hopper = std::strcmp(fa::cuda::flash_fwd_path(), "sm90-wgmma") == 0;
  // FLASH_FWD_CHECK_MASKS=causal (or full): the variants are checked and timed with that mask only.
  const char* const masks = std::getenv("FLASH_FWD_CHECK_MASKS");
  const auto mask_wanted = [&](bool causal) {
    return masks == nullptr || std::strcmp(masks, causal ? "causal" : "full") == 0;
  };
  if (hopper && setup.run_checks)
    for (const Variant& var : variants)
      for (bool causal : {false, true}) {
        if (!mask_wanted(causal)) continue;
        total += 2;
        failed += !run_case(Case{2, 97, 203, 4, 2, var.d, causal, DType::kBFloat16}, var.name, var.fn, rng);
        failed += !run_case(Case{1, 1025, 1023, 2, 1, var.d, causal, DType::kBFloat16}, var.name, var.fn, rng);
        // More work items than SMs (the persistent kernels walk several), causal with seqlen_q above,
        // equal to and below seqlen_k (items that see no key, and no tile crossing the diagonal).
        total += 3;
        failed += !run_case(Case{2, 1100, 1100, 8, 2, var.d, causal, DType::kBFloat16}, var.name, var.fn, rng);
        failed += !run_case(Case{3, 700, 300, 8, 4, var.d, causal, DType::kBFloat16}, var.name, var.fn, rng);
        failed += !run_case(Case{3, 300, 700, 8, 8, var.d, causal, DType::kBFloat16}, var.name, var.fn, rng);
        // Long keys: the causal items cut the 16 heads into L2 sections of 14 (2.25 MiB of K/V per head;
        // tile_scheduler.cuh), the last one short; short keys: 40 heads in sections of at most 32.
        total += 2;
        failed += !run_case(Case{5, 300, 300, 8, 8, var.d, causal, DType::kBFloat16}, var.name, var.fn, rng);
        failed += !run_case(Case{2, 300, 9001, 8, var.d == 64 ? 8 : 4, var.d, causal, DType::kBFloat16}, var.name,
                            var.fn, rng);
      }
  // Non-finite containment on the variants (the warp-specialized kernels check V in the producer).
  if (hopper && setup.run_checks && mask_wanted(true))
    for (const Variant& var : variants) {
      total += 3;
      failed += !run_nonfinite_case(Case{2, 300, 300, 4, 2, var.d, true, DType::kBFloat16}, 70, 141, var.name, var.fn, rng);
      failed += !run_nonfinite_case(Case{2, 250, 400, 4, 2, var.d, true, DType::kBFloat16}, 190, 333, var.name, var.fn, rng);
      failed += !run_nonfinite_case(Case{1, 400, 250, 2, 1, var.d, true, DType::kBFloat16}, 3, 100, var.name, var.fn, rng);
    }
  if (setup.run_checks) std::printf("%s: %d of %d cases failed\n", failed ? "FAIL" : "PASS", failed, total);
  std::unique_ptr<BenchInputs> bench_in;
  if (run_bench && (hopper || !paths.empty())) bench_in = std::make_unique<BenchInputs>(rng);
  // The variants of one shape are timed one after another, in two rounds: the GPU's clocks drift under
  // sustained load, so variants timed minutes apart would not compare.
  if (run_bench && hopper)
    for (int64_t seqlen : {512, 1024, 2048, 4096, 8192, 16384})
      for (bool causal : {false, true}) {
        if (!mask_wanted(causal) || !listed("FLASH_FWD_CHECK_SEQLENS", std::to_string(seqlen))) continue;
        for (int round = 0; round < 2; ++round)
          for (const Variant& var : variants) bench(seqlen, var.d, causal, var.name, var.fn, *bench_in);
      }
  if (run_bench && !paths.empty())
    for (const Path& path : {paths.front()})  // the shipped path (the variants above time sm90's)
      for (int64_t seqlen : {512, 2048, 8192})
        for (int64_t d : {64, 128, 256})
          for (bool causal : {false, true}) bench(seqlen, d, causal, path.name, path.fn, *bench_in);
  return failed ? 1 : 0;
}
