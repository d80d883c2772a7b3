// Standalone check of the CPU GEMM (csrc/cpu/gemm): every layout, dtype and epilogue on awkward
// sizes against the float64 reference of check_gemm.h, poisoned outputs, padded leading dimensions
// whose padding must survive, determinism across thread counts, every instruction-set variant this
// CPU runs, and refused params. Then GFLOP/s on the linear layer's products of the CPU presets.
//
// Usage: gemm_cpu_check [--seed N] [--no-perf] [--verbose]. Exit code 0 iff every check passed.
// Built and run by scripts/gemm-cpu-check.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "check_gemm.h"
#include "cpu/cpu_isa.h"
#include "cpu/gemm/gemm_cpu.h"
#include "cpu/thread_pool.h"

using fa::DType;
using fa::cpu::Isa;
using fa::cpu::ThreadPool;
using namespace gemm_check;

namespace {

int g_failures = 0;
bool g_verbose = false;

void fail(const std::string& what) {
  ++g_failures;
  std::printf("  FAIL %s\n", what.c_str());
}

struct Outputs {
  HostTensor c, pre;
};

Outputs run(const Case& cs, const Data& d, ThreadPool& pool, Isa isa) {
  Outputs o{d.c0, d.pre0};
  fa::cpu::gemm(params(cs, d.a.data(), d.b.data(), d.bias.data(), o.c.data(), o.pre.data()), pool, isa);
  return o;
}

void check_case(const Case& cs, std::mt19937_64& rng, ThreadPool& pool, Isa isa) {
  const Data d = make_data(cs, rng);
  const Outputs o = run(cs, d, pool, isa);
  // The generic variant has no FMA: a product is rounded before its add, one more u per term.
  const double u_acc = std::ldexp(1.0, -24) * (isa == Isa::kGeneric ? 2 : 1);
  const Result r = compare(cs, d, o.c, o.pre, 0.0, u_acc);
  print_result(cs, r, g_verbose);
  if (!ok(r)) ++g_failures;
}

void check_cases(std::mt19937_64& rng, ThreadPool& pool, Isa isa) {
  std::printf("cases, %s variant, %d threads\n", fa::cpu::isa_name(fa::cpu::supported_isa(isa)), pool.size());
  const int before = g_failures;
  int count = 0;
  const DType dts[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  // Layouts x dtypes x c dtype on awkward shapes, the plain epilogue.
  const int64_t shapes[][3] = {{1, 1, 1},   {7, 13, 8},  {65, 127, 13}, {129, 65, 384}, {1, 1000, 7},
                               {1000, 1, 5}, {97, 113, 129}, {6, 16, 1}, {200, 300, 257}};
  for (auto& s : shapes)
    for (DType ab : dts)
      for (int lay = 0; lay < 4; ++lay)
        for (int cf = 0; cf < 2; ++cf) {
          Case cs;
          cs.m = s[0], cs.n = s[1], cs.k = s[2];
          cs.ab = ab;
          cs.c = cf ? DType::kFloat32 : ab;
          cs.a_k_major = lay & 1;
          cs.b_k_major = lay & 2;
          check_case(cs, rng, pool, isa);
          ++count;
        }
  // Epilogues: alpha, bias (ab dtype and float32), GELU with and without pre_out, beta (accumulate),
  // padded leading dimensions.
  for (DType ab : dts)
    for (int e = 0; e < 8; ++e) {
      Case cs;
      cs.m = 37, cs.n = 71, cs.k = 45;
      cs.ab = ab;
      cs.c = e & 1 ? DType::kFloat32 : ab;
      cs.a_k_major = e & 2;
      cs.b_k_major = e & 4;
      cs.pad_a = 3, cs.pad_b = 5, cs.pad_c = 2;
      cs.alpha = 0.75f;
      cs.beta = e >= 4 ? 1.0f : e >= 2 ? -0.5f : 0.0f;
      cs.bias = 1 + e % 2;
      cs.gelu = e != 5;
      cs.pre_out = e % 3 != 0;
      check_case(cs, rng, pool, isa);
      ++count;
    }
  // The linear layer's three products (dW with beta = 1 into float32).
  for (DType ab : dts) {
    Case fwd;  // y = x·Wᵀ + b, GELU
    fwd.m = 300, fwd.n = 96, fwd.k = 64, fwd.ab = fwd.c = ab, fwd.bias = 1, fwd.gelu = true, fwd.pre_out = true;
    Case dx;  // dx = dy·W
    dx.m = 300, dx.n = 64, dx.k = 96, dx.ab = dx.c = ab, dx.b_k_major = false;
    Case dw;  // dW += dyᵀ·x
    dw.m = 96, dw.n = 64, dw.k = 300, dw.ab = ab, dw.c = DType::kFloat32, dw.a_k_major = false, dw.b_k_major = false,
    dw.beta = 1.0f;
    check_case(fwd, rng, pool, isa);
    check_case(dx, rng, pool, isa);
    check_case(dw, rng, pool, isa);
    count += 3;
  }
  std::printf("  %d cases, %d failed\n", count, g_failures - before);
}

// Same bits whatever the thread count: each element is one fma chain in k order.
void check_determinism(std::mt19937_64& rng) {
  std::printf("determinism across thread counts\n");
  Case cs;
  cs.m = 203, cs.n = 517, cs.k = 300, cs.ab = DType::kBFloat16, cs.c = DType::kFloat32, cs.bias = 2, cs.gelu = true;
  const Data d = make_data(cs, rng);
  ThreadPool p1(1), p2(2), p5(5);
  const Outputs o1 = run(cs, d, p1, fa::cpu::detected_isa());
  const Outputs o2 = run(cs, d, p2, fa::cpu::detected_isa());
  const Outputs o5 = run(cs, d, p5, fa::cpu::detected_isa());
  if (o1.c.bytes != o2.c.bytes || o1.c.bytes != o5.c.bytes) fail("results differ between 1, 2 and 5 threads");
}

void check_refusals(ThreadPool& pool) {
  std::printf("refused params\n");
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 4}, c[4] = {0, 0, 0, 0};
  auto base = [&] {
    fa::GemmParams p;
    p.m = p.n = p.k = 2;
    p.a = a, p.b = b, p.c = c;
    p.lda = p.ldb = p.ldc = 2;
    return p;
  };
  struct Bad {
    const char* what;
    void (*edit)(fa::GemmParams&);
  };
  const Bad bads[] = {
      {"m = 0", [](fa::GemmParams& p) { p.m = 0; }},
      {"k = -1", [](fa::GemmParams& p) { p.k = -1; }},
      {"lda < k", [](fa::GemmParams& p) { p.lda = 1; }},
      {"ldb < n (n-major)", [](fa::GemmParams& p) { p.b_k_major = false, p.ldb = 1; }},
      {"ldc < n", [](fa::GemmParams& p) { p.ldc = 1; }},
      {"int32 operands", [](fa::GemmParams& p) { p.ab_dtype = DType::kInt32; }},
      {"c_dtype float16 with float32 operands", [](fa::GemmParams& p) { p.c_dtype = DType::kFloat16; }},
      {"null a", [](fa::GemmParams& p) { p.a = nullptr; }},
  };
  for (const Bad& bad : bads) {
    fa::GemmParams p = base();
    bad.edit(p);
    try {
      fa::cpu::gemm(p, pool);
      fail(std::string("accepted ") + bad.what);
    } catch (const std::invalid_argument& e) {
      if (g_verbose) std::printf("  refused %s: %s\n", bad.what, e.what());
    }
  }
  if (c[0] != 0 || c[3] != 0) fail("a refused call wrote C");
}

void perf(ThreadPool& pool) {
  std::printf("GFLOP/s, %d threads, %s (median of 5 after a warm-up)\n", pool.size(),
              fa::cpu::isa_name(fa::cpu::detected_isa()));
  std::mt19937_64 rng(7);
  struct Shape {
    const char* name;
    int64_t m, n, k;
    bool a_k, b_k;
    DType ab;
  };
  // The tiny CPU preset's linear layers are in this range: rows 2048, C 128; and a default-width layer.
  const Shape shapes[] = {
      {"fwd qkv 2048x384x128 f32", 2048, 384, 128, true, true, DType::kFloat32},
      {"fwd fc2 2048x128x512 f32", 2048, 128, 512, true, true, DType::kFloat32},
      {"dx    2048x128x384 f32", 2048, 128, 384, true, false, DType::kFloat32},
      {"dW    384x128x2048 f32", 384, 128, 2048, false, false, DType::kFloat32},
      {"fwd   4096x1152x384 f32", 4096, 1152, 384, true, true, DType::kFloat32},
      {"fwd   4096x1152x384 bf16", 4096, 1152, 384, true, true, DType::kBFloat16},
  };
  for (const Shape& s : shapes) {
    Case cs;
    cs.m = s.m, cs.n = s.n, cs.k = s.k, cs.ab = s.ab, cs.c = DType::kFloat32, cs.a_k_major = s.a_k,
    cs.b_k_major = s.b_k;
    const Data d = make_data(cs, rng);
    Outputs o{d.c0, d.pre0};
    const fa::GemmParams p = params(cs, d.a.data(), d.b.data(), nullptr, o.c.data(), nullptr);
    fa::cpu::gemm(p, pool);
    std::vector<double> secs;
    for (int it = 0; it < 5; ++it) {
      const auto t0 = std::chrono::steady_clock::now();
      fa::cpu::gemm(p, pool);
      secs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(secs.begin(), secs.end());
    const double flops = 2.0 * s.m * s.n * s.k;
    std::printf("  %-28s %8.3f ms %7.1f GFLOP/s\n", s.name, secs[2] * 1e3, flops / secs[2] * 1e-9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  uint64_t seed = std::random_device{}();
  bool run_perf = true;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (std::strcmp(argv[i], "--no-perf") == 0) {
      run_perf = false;
    } else if (std::strcmp(argv[i], "--verbose") == 0) {
      g_verbose = true;
    } else {
      std::fprintf(stderr, "usage: %s [--seed N] [--no-perf] [--verbose]\n", argv[0]);
      return 2;
    }
  }
  std::printf("gemm_cpu_check: seed %llu (rerun with --seed %llu), detected %s\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed),
              fa::cpu::isa_name(fa::cpu::detected_isa()));
  std::mt19937_64 rng(seed);
  ThreadPool pool(0);
  const Isa isas[] = {Isa::kAvx512, Isa::kAvx2, Isa::kGeneric};
  Isa last = Isa::kAvx512;
  for (Isa isa : isas) {
    const Isa use = fa::cpu::supported_isa(isa);
    if (isa != Isa::kAvx512 && use == last) continue;  // clamped to a variant already checked
    last = use;
    check_cases(rng, pool, use);
  }
  check_determinism(rng);
  check_refusals(pool);
  if (run_perf) perf(pool);
  std::printf(g_failures == 0 ? "PASS gemm_cpu_check\n" : "FAIL gemm_cpu_check: %d failures\n", g_failures);
  return g_failures == 0 ? 0 : 1;
}
