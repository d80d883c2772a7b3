// Standalone check of the CUDA GEMM (csrc/cuda/gemm): every layout, dtype and epilogue on awkward
// sizes (1, 7, 65, 127, 129, 1000, 16384; K 1, 8, 13, 384, 16384) against the float64 reference of
// check_gemm.h, with C poisoned (NaN) when beta = 0, padded leading dimensions whose padding must
// survive, unaligned operands (the element-by-element fallback), forced split-K, and every path the
// device runs (sm80 mma.sync everywhere, sm90 wgmma on Hopper). Then the timing of the GPT's linear
// layer products (M = 16384 tokens, C = 384): median of kTimedCalls calls after warm-up, TFLOP/s,
// one "BENCH" line per product that bench/gemm_torch.py puts beside torch.matmul.
//
// Usage: gemm_check [seed] [--no-bench] [--bench-only]. Exit code 0 iff every check passed.
// Environment: GEMM_BENCH_ONLY=fwd_qkv,dw_fc and GEMM_BENCH_DTYPES=bf16 narrow the timing;
// GEMM_PROFILE=1 launches each timed plan once, untimed, for ncu; GEMM_SPLIT_SWEEP=1 adds the dW
// products' K-split sweep.
// Built and run by scripts/gemm-check.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "check_args.h"
#include "check_cuda.h"
#include "check_gemm.h"
#include "check_timing.h"
#include "cuda/gemm/gemm.h"
#include "cuda/gemm/gemm_plan.h"

using fa::DType;
using namespace gemm_check;
namespace fg = fa::cuda::gemm_kernels;

namespace {

int g_failures = 0;
int g_cases = 0;
// The sm90 tile configurations built (gemm_sm90.cu): 128 x 128, 64 x 128, 128 x 192, the
// warp-specialized 128 x 128 with two tile groups, and the same with the TMA-store epilogue (calls
// it cannot store run 12).
constexpr int kSm90Configs[] = {0, 3, 4, 12, 16};

// Device copy of a host tensor, at a byte offset from a 256-byte aligned allocation (offset 2 makes a
// 16-bit tensor unaligned for 16-byte loads).
struct DeviceTensor {
  void* base = nullptr;
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceTensor(const HostTensor& h, size_t offset = 0) {
    bytes = h.bytes.size();
    CHECK_CUDA(cudaMalloc(&base, bytes + offset + 16));
    ptr = static_cast<char*>(base) + offset;
    if (bytes) CHECK_CUDA(cudaMemcpy(ptr, h.bytes.data(), bytes, cudaMemcpyHostToDevice));
  }
  ~DeviceTensor() { cudaFree(base); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  void read(HostTensor& h) const {
    if (bytes) CHECK_CUDA(cudaMemcpy(h.bytes.data(), ptr, bytes, cudaMemcpyDeviceToHost));
  }
};

const char* path_name(const fg::GemmPlan& plan) {
  if (plan.path == fg::GemmPath::kSm90) {
    static const char* const kNames[] = {"sm90/0",  "sm90/1",  "sm90/2",  "sm90/3",  "sm90/4",  "sm90/5",
                                         "sm90/6",  "sm90/7",  "sm90/8",  "sm90/9",  "sm90/10", "sm90/11",
                                         "sm90/12", "sm90/13", "sm90/14", "sm90/15", "sm90/16"};
    constexpr int kCount = static_cast<int>(sizeof(kNames) / sizeof(kNames[0]));
    return plan.sm90_config >= 0 && plan.sm90_config < kCount ? kNames[plan.sm90_config] : "sm90/?";
  }
  if (!plan.vec) return "sm80/scalar";
  return plan.tile == fg::Sm80Tile::kLarge ? "sm80/large" : "sm80/small";
}

// Runs one case with the given override (path, loads, splits) and compares. Rows checked: all when
// the reference is cheap, else a sample (first, last, random); NaN (unwritten) is scanned everywhere.
void check_case(const Case& cs, std::mt19937_64& rng, const fg::PlanOverride& force, bool unaligned = false) {
  const Data d = make_data(cs, rng);
  const size_t off = unaligned ? fa::dtype_size(cs.ab) : 0;
  DeviceTensor da(d.a, off), db(d.b, off), dbias(d.bias), dc(d.c0), dpre(d.pre0);
  const fa::GemmParams p = params(cs, da.ptr, db.ptr, dbias.ptr, dc.ptr, dpre.ptr);
  if (const char* why = fa::cuda::gemm_unsupported_reason(p)) {
    std::printf("  FAIL %s: unsupported: %s\n", cs.name().c_str(), why);
    ++g_failures;
    return;
  }
  const fg::GemmPlan plan = fg::make_plan(p, true, force);
  void* ws = nullptr;
  if (plan.workspace_bytes) CHECK_CUDA(cudaMalloc(&ws, plan.workspace_bytes));
  const cudaError_t err = fg::run_plan(p, plan, ws, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  if (ws) CHECK_CUDA(cudaFree(ws));
  ++g_cases;
  if (err != cudaSuccess) {
    std::printf("  FAIL %s [%s]: launch returned %s\n", cs.name().c_str(), path_name(plan), cudaGetErrorName(err));
    ++g_failures;
    return;
  }
  HostTensor c = d.c0, pre = d.pre0;
  dc.read(c);
  dpre.read(pre);
  std::vector<int64_t> rows;
  constexpr double kFullCheckMacs = 4e8;
  if (static_cast<double>(cs.m) * cs.n * cs.k > kFullCheckMacs) {
    const int64_t kSample = std::max<int64_t>(2, static_cast<int64_t>(kFullCheckMacs / (static_cast<double>(cs.n) * cs.k)));
    rows.push_back(0);
    rows.push_back(cs.m - 1);
    std::uniform_int_distribution<int64_t> pick(0, cs.m - 1);
    for (int64_t i = 2; i < std::min<int64_t>(kSample, cs.m); ++i) rows.push_back(pick(rng));
  }
  // Operand rounding inside the path: TF32 (2^-11 per operand) or 3xTF32 (~2^-21); 16-bit operands
  // reach the tensor cores exactly. Tensor-core fp32 accumulation: 2^-23 per add, as a bound.
  double u_in = 0.0;
  if (cs.ab == DType::kFloat32) u_in = cs.precision == fa::Fp32Precision::kHighest ? std::ldexp(1.0, -21) : std::ldexp(1.0, -11);
  Result r = compare(cs, d, c, pre, u_in, std::ldexp(1.0, -23), rows);
  if (!rows.empty())  // the rows not compared must still be written
    for (int64_t i = 0; i < cs.m; ++i)
      for (int64_t j = 0; j < cs.n; ++j)
        if (std::isnan(get(c, static_cast<size_t>(i * cs.ldc() + j)))) ++r.unwritten;
  if (!ok(r)) {
    ++g_failures;
    std::printf("  [%s splits %d] ", path_name(plan), plan.splits);
    print_result(cs, r, false);
  }
}

Case make(int64_t m, int64_t n, int64_t k, DType ab, DType c, bool ak, bool bk) {
  Case cs;
  cs.m = m, cs.n = n, cs.k = k, cs.ab = ab, cs.c = c, cs.a_k_major = ak, cs.b_k_major = bk;
  return cs;
}

void check_path(std::mt19937_64& rng, const char* name, fg::PlanOverride force, bool with_fp32) {
  const int before = g_failures, cases_before = g_cases;
  std::printf("path %s\n", name);
  std::vector<DType> dts = {DType::kFloat16, DType::kBFloat16};
  if (with_fp32) dts.push_back(DType::kFloat32);
  // Awkward shapes x layouts x dtypes (C in the operands' dtype and in float32).
  const int64_t shapes[][3] = {{1, 1, 1},     {7, 65, 13},   {65, 7, 8},    {127, 129, 384}, {129, 127, 13},
                               {1000, 65, 384}, {16384, 7, 8}, {1, 1000, 384}, {7, 1, 16384},  {65, 129, 16384},
                               {1000, 1000, 1}, {16384, 129, 384}};
  for (auto& s : shapes)
    for (DType ab : dts)
      for (int lay = 0; lay < 4; ++lay) {
        Case cs = make(s[0], s[1], s[2], ab, (lay + static_cast<int>(ab)) % 2 ? DType::kFloat32 : ab, lay & 1, lay & 2);
        check_case(cs, rng, force);
      }
  // Epilogues, padded leading dimensions, alpha / beta.
  for (DType ab : dts)
    for (int e = 0; e < 8; ++e) {
      Case cs = make(129, 200, 72, ab, e & 1 ? DType::kFloat32 : ab, e & 2, e & 4);
      cs.pad_a = 8, cs.pad_b = 16, cs.pad_c = 3;
      cs.alpha = 0.5f;
      cs.beta = e >= 4 ? 1.0f : e >= 2 ? -0.5f : 0.0f;
      cs.bias = 1 + e % 2;
      cs.gelu = e != 5;
      cs.pre_out = e % 3 != 0;
      check_case(cs, rng, force);
    }
  // 16-bit C with 16-byte rows and beta = 0 (what the TMA-store epilogue takes): tails in M, N and
  // K, C padded by 16 bytes, alpha, each bias, GELU with and without pre_out; then products of
  // several tiles per persistent block.
  for (DType ab : {DType::kFloat16, DType::kBFloat16})
    for (int e = 0; e < 8; ++e) {
      Case cs = make(e < 4 ? 300 : 1, e < 4 ? 200 : 1000, e % 2 ? 72 : 384, ab, ab, e & 1, e & 2);
      cs.pad_c = e & 4 ? 8 : 0;
      cs.alpha = e & 1 ? 0.5f : 1.0f;
      cs.bias = e % 3;
      cs.gelu = e >= 2;
      cs.pre_out = e >= 5;
      check_case(cs, rng, force);
    }
  for (DType ab : {DType::kFloat16, DType::kBFloat16}) {
    Case cs = make(8200, 1152, 384, ab, ab, true, true);
    check_case(cs, rng, force);
    Case g = make(4100, 1536, 384, ab, ab, true, true);
    g.bias = 1, g.gelu = true, g.pre_out = true;
    check_case(g, rng, force);
  }
  if (with_fp32) {  // 3xTF32
    for (int lay = 0; lay < 4; ++lay) {
      Case cs = make(200, 130, 1000, DType::kFloat32, DType::kFloat32, lay & 1, lay & 2);
      cs.precision = fa::Fp32Precision::kHighest;
      cs.bias = 2;
      check_case(cs, rng, force);
    }
  }
  // Forced split-K (the reduction kernel sums the splits in order, then runs the epilogue) on dW-like
  // products.
  for (int splits : {3, 5})
    for (DType ab : dts) {
      fg::PlanOverride f = force;
      f.splits = splits;
      Case cs = make(130, 70, 3000, ab, DType::kFloat32, false, false);
      cs.beta = 1.0f;
      check_case(cs, rng, f);
      Case g = make(65, 96, 1000, ab, ab, true, true);
      g.bias = 1, g.gelu = true, g.pre_out = true;
      check_case(g, rng, f);
    }
  std::printf("  %d cases, %d failed\n", g_cases - cases_before, g_failures - before);
}

void check_unaligned(std::mt19937_64& rng) {
  const int before = g_failures, cases_before = g_cases;
  std::printf("unaligned operands (packed into the workspace, and element-by-element loads)\n");
  fg::PlanOverride elementwise;
  elementwise.vec = 0;
  for (const fg::PlanOverride& force : {fg::PlanOverride{}, elementwise})
    for (DType ab : {DType::kFloat16, DType::kBFloat16, DType::kFloat32})
      for (int lay = 0; lay < 4; ++lay) {
        Case cs = make(77, 65, 45, ab, ab, lay & 1, lay & 2);  // odd leading dimensions
        cs.bias = 1, cs.gelu = lay == 3;
        check_case(cs, rng, force, false);
        Case u = make(64, 64, 64, ab, DType::kFloat32, lay & 1, lay & 2);  // aligned ld, base off by one element
        check_case(u, rng, force, true);
        Case split = make(65, 384, 4100, ab, DType::kFloat32, lay & 1, lay & 2);  // packed and split over K
        split.beta = 1.0f;
        check_case(split, rng, force, false);
      }
  std::printf("  %d cases, %d failed\n", g_cases - cases_before, g_failures - before);
}

// ---- timing --------------------------------------------------------------------------------------

struct Product {
  std::string name;
  int64_t m, n, k;
  bool ak, bk;
  bool dw;  // C float32 with beta = 1 (dW +=)
};

std::vector<Product> model_products() {
  constexpr int64_t kTokens = 16384, kC = 384, kVocab = 65;
  const struct {
    const char* name;
    int64_t out, in;
  } layers[] = {{"qkv", 3 * kC, kC}, {"proj", kC, kC}, {"fc", 4 * kC, kC}, {"fc2", kC, 4 * kC}, {"lm_head", kVocab, kC}};
  std::vector<Product> v;
  for (auto& l : layers) v.push_back({std::string("fwd_") + l.name, kTokens, l.out, l.in, true, true, false});
  for (auto& l : layers) v.push_back({std::string("dx_") + l.name, kTokens, l.in, l.out, true, false, false});
  for (auto& l : layers) v.push_back({std::string("dw_") + l.name, l.out, l.in, kTokens, false, false, true});
  return v;
}

void bench(const fa::GemmParams& p, const Product& pr, const char* dtype_name, const char* variant,
           const fg::PlanOverride& force = {}) {
  const fg::GemmPlan plan = fg::make_plan(p, true, force);
  void* ws = nullptr;
  if (plan.workspace_bytes) CHECK_CUDA(cudaMalloc(&ws, plan.workspace_bytes));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  if (std::getenv("GEMM_PROFILE") != nullptr) {  // one launch for a profiler (ncu) to replay, no timing
    CHECK_CUDA(fg::run_plan(p, plan, ws, stream));
    CHECK_CUDA(cudaStreamSynchronize(stream));
    std::printf("PROFILED %-12s %-5s %-9s %-11s splits %2d\n", pr.name.c_str(), dtype_name, variant, path_name(plan),
                plan.splits);
    CHECK_CUDA(cudaStreamDestroy(stream));
    if (ws) CHECK_CUDA(cudaFree(ws));
    return;
  }
  const LaunchTimes t = time_launches([&] { return fg::run_plan(p, plan, ws, stream); }, stream);
  const double flops = 2.0 * pr.m * pr.n * pr.k;
  std::printf("BENCH %-12s %-5s %-9s m %6lld n %5lld k %6lld  %-11s splits %2d  median %8.4f ms  queued %8.4f ms  %7.1f TFLOP/s\n",
              pr.name.c_str(), dtype_name, variant, static_cast<long long>(pr.m), static_cast<long long>(pr.n),
              static_cast<long long>(pr.k), path_name(plan), plan.splits, t.median_ms, t.queued_ms,
              tflops_per_s(flops, t.queued_ms));
  CHECK_CUDA(cudaStreamDestroy(stream));
  if (ws) CHECK_CUDA(cudaFree(ws));
}

// GEMM_BENCH_ONLY / GEMM_BENCH_DTYPES: comma-separated product names (fwd_qkv, ...) and dtype names
// (bf16, f16, f32) to time; unset: all of them.
bool selected(const char* env, const std::string& name) {
  const char* list = std::getenv(env);
  if (list == nullptr || *list == '\0') return true;
  const std::string s = std::string(",") + list + ",";
  return s.find("," + name + ",") != std::string::npos;
}

void run_bench(std::mt19937_64& rng) {
  std::printf("timing: %d warm-up calls, then the median of %d calls (own events each) and the median of %d rounds "
              "of %d queued (each round's mean); TFLOP/s from the queued time\n",
              kWarmupCalls, kTimedCalls, kQueuedRounds, kTimedCalls);
  for (DType dt : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    if (!selected("GEMM_BENCH_DTYPES", short_name(dt))) continue;
    for (const Product& pr : model_products()) {
      if (!selected("GEMM_BENCH_ONLY", pr.name)) continue;
      Case cs = make(pr.m, pr.n, pr.k, dt, pr.dw ? DType::kFloat32 : dt, pr.ak, pr.bk);
      if (pr.dw) cs.beta = 1.0f;
      HostTensor a = random_tensor(dt, cs.a_count(), rng), b = random_tensor(dt, cs.b_count(), rng);
      HostTensor c = random_tensor(cs.c, cs.c_count(), rng);
      DeviceTensor da(a), db(b), dc(c);
      const fa::GemmParams p = params(cs, da.ptr, db.ptr, nullptr, dc.ptr, nullptr);
      bench(p, pr, short_name(dt), "plain");
      if (dt == DType::kBFloat16 && fg::gemm_sm90_built()) {  // the sm90 configurations side by side
        for (int config : kSm90Configs) {
          fg::PlanOverride f;
          f.path = static_cast<int>(fg::GemmPath::kSm90);
          f.tile = config;
          const std::string name = "cfg" + std::to_string(config);
          bench(p, pr, short_name(dt), name.c_str(), f);
        }
      }
      if (pr.dw && dt == DType::kBFloat16 && fg::gemm_sm90_built() && std::getenv("GEMM_SPLIT_SWEEP") != nullptr) {
        // GEMM_SPLIT_SWEEP=1: every sm90 configuration at K splits 1-24 (the planner's split choice).
        for (int config : kSm90Configs)
          for (int splits : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 16, 18, 20, 24}) {
            fg::PlanOverride f;
            f.path = static_cast<int>(fg::GemmPath::kSm90);
            f.tile = config;
            f.splits = splits;
            const std::string name = "cfg" + std::to_string(config) + "s" + std::to_string(splits);
            bench(p, pr, short_name(dt), name.c_str(), f);
          }
      }
      if (pr.name == "fwd_fc" && dt != DType::kFloat32) {  // the fused bias + GELU (+ pre_out) epilogue
        HostTensor bias = random_tensor(dt, static_cast<size_t>(pr.n), rng);
        HostTensor pre = make_tensor(dt, cs.c_count());
        DeviceTensor dbias(bias), dpre(pre);
        fa::GemmParams q = params(cs, da.ptr, db.ptr, dbias.ptr, dc.ptr, nullptr);
        q.bias = dbias.ptr;
        bench(q, pr, short_name(dt), "bias");
        q.activation = fa::GemmActivation::kGeluTanh;
        bench(q, pr, short_name(dt), "bias_gelu");
        q.pre_out = dpre.ptr;
        bench(q, pr, short_name(dt), "gelu_pre");
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const CheckSetup setup = check_setup(argc, argv, "gemm_check", true);
  std::mt19937_64 rng(setup.seed);
  if (setup.run_checks) {
    fg::PlanOverride sm80;
    sm80.path = static_cast<int>(fg::GemmPath::kSm80);
    check_path(rng, "sm80 (planner's tiles)", sm80, true);
    fg::PlanOverride sm80_small = sm80;
    sm80_small.tile = static_cast<int>(fg::Sm80Tile::kSmall);
    check_path(rng, "sm80 small tiles", sm80_small, true);
    fg::PlanOverride sm80_large = sm80;
    sm80_large.tile = static_cast<int>(fg::Sm80Tile::kLarge);
    check_path(rng, "sm80 large tiles", sm80_large, true);
    fg::PlanOverride scalar = sm80;
    scalar.vec = 0;
    check_path(rng, "sm80 element-by-element loads", scalar, true);
    if (setup.prop.major == 9 && fg::gemm_sm90_built()) {
      for (int config : kSm90Configs) {
        fg::PlanOverride sm90;
        sm90.path = static_cast<int>(fg::GemmPath::kSm90);
        sm90.tile = config;
        const std::string name = "sm90 configuration " + std::to_string(config) + " (sm80 where TMA cannot)";
        check_path(rng, name.c_str(), sm90, false);
      }
    }
    check_path(rng, "planner's choice", {}, true);
    check_unaligned(rng);
    std::printf("%d cases, %d failed\n", g_cases, g_failures);
  }
  if (setup.run_bench) run_bench(rng);
  std::printf(g_failures == 0 ? "PASS gemm_check\n" : "FAIL gemm_check: %d failures\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}
