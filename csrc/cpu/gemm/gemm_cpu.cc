// CPU GEMM (gemm_cpu.h, semantics in common/gemm_params.h): packed, register-blocked fp32 FMA with
// the operands converted to fp32 per packed panel, tiles of C spread over the thread pool, the
// epilogue fused into the tile's store. The tile code (gemm_tile.h) is compiled here once per
// instruction set and picked at run time.
#include "cpu/gemm/gemm_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "common/half.h"
#include "cpu/cpu_buffer.h"
#include "cpu/thread_pool.h"
#include "cpu/tile_config.h"

namespace fa::cpu {

// Scratch of one worker: packed A, packed B, the fp32 C tile.
struct GemmScratch {
  float* a;
  float* b;
  float* c;
};
// One tile of C: (params, first row, rows, first column, columns, K per packed slice, scratch).
using GemmTileFn = void (*)(const GemmParams&, int64_t, int, int64_t, int, int, GemmScratch);

#define FA_TILE_BODY "cpu/gemm/gemm_tile.h"
#include "cpu/tile_variants.h"

namespace {

// Tile of C per work item, and K per packed slice. Packed A (mc x kc) and the C tile stay in L2;
// one B strip (kc x 64 fp32 = 32 KiB on AVX-512) stays in L1 while the A strips stream past it.
constexpr int kMcCandidates[] = {96, 48, 24, 12};  // multiples of every variant's micro-kernel rows
constexpr int kNcCandidates[] = {256, 128, 64};    // multiples of the widest vector (16 lanes)
constexpr int kKc = 128;
// Work items per thread wanted before the tiles are made smaller (load balance on small shapes).
constexpr int64_t kMinItemsPerThread = 2;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

bool ab_dtype_ok(DType d) { return d == DType::kFloat32 || d == DType::kFloat16 || d == DType::kBFloat16; }

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("gemm: " + what);
}

void validate(const GemmParams& p) {
  require(p.m >= 1 && p.n >= 1 && p.k >= 1, "expected m, n and k >= 1 but received " + std::to_string(p.m) +
                                                 ", " + std::to_string(p.n) + ", " + std::to_string(p.k));
  constexpr int64_t kMaxExtent = std::numeric_limits<int32_t>::max();
  require(p.m <= kMaxExtent && p.n <= kMaxExtent && p.k <= kMaxExtent, "m, n and k must be below 2^31");
  require(ab_dtype_ok(p.ab_dtype), "expected ab_dtype float32, float16 or bfloat16");
  require(p.c_dtype == p.ab_dtype || p.c_dtype == DType::kFloat32, "expected c_dtype float32 or ab_dtype");
  require(p.bias == nullptr || p.bias_dtype == p.ab_dtype || p.bias_dtype == DType::kFloat32,
          "expected bias_dtype float32 or ab_dtype");
  require(p.a != nullptr && p.b != nullptr && p.c != nullptr, "a, b and c must not be null");
  require(p.lda >= (p.a_k_major ? p.k : p.m), "lda is smaller than the rows of A's layout");
  require(p.ldb >= (p.b_k_major ? p.k : p.n), "ldb is smaller than the rows of B's layout");
  require(p.ldc >= p.n, "ldc is smaller than n");
  require(p.activation == GemmActivation::kNone || p.activation == GemmActivation::kGeluTanh,
          "unknown activation");
  require(std::isfinite(p.alpha) && std::isfinite(p.beta), "alpha and beta must be finite");
}

}  // namespace

void gemm(const GemmParams& p, ThreadPool& pool, Isa isa) {
  validate(p);
  Isa use = supported_isa(isa);
  int mr = isa_generic::gemm_mr(), lanes = isa_generic::gemm_lanes();
  GemmTileFn fn = isa_generic::gemm_tile_fn(p);
#if FA_CPU_X86
  if (use == Isa::kAvx512) {
    mr = isa_avx512::gemm_mr();
    lanes = isa_avx512::gemm_lanes();
    fn = isa_avx512::gemm_tile_fn(p);
  } else if (use == Isa::kAvx2) {
    mr = isa_avx2::gemm_mr();
    lanes = isa_avx2::gemm_lanes();
    fn = isa_avx2::gemm_tile_fn(p);
  }
#else
  (void)use;
#endif

  // Largest tiles that still give every thread kMinItemsPerThread items (or the smallest tiles).
  const int64_t want = kMinItemsPerThread * pool.size();
  size_t mi = 0, ni = 0;
  const size_t m_last = std::size(kMcCandidates) - 1, n_last = std::size(kNcCandidates) - 1;
  auto items = [&] { return ceil_div(p.m, kMcCandidates[mi]) * ceil_div(p.n, kNcCandidates[ni]); };
  while (items() < want && (mi < m_last || ni < n_last)) {
    const bool shrink_m = mi < m_last && (ni == n_last || kMcCandidates[mi] * 2 >= kNcCandidates[ni] ||
                                          p.m > p.n);
    if (shrink_m) ++mi; else ++ni;
  }
  const int mc = kMcCandidates[mi], nc = kNcCandidates[ni];
  const int64_t m_tiles = ceil_div(p.m, mc), n_tiles = ceil_div(p.n, nc);

  // Scratch per worker, sized for the largest tile this call has.
  const int rows_max = static_cast<int>(std::min<int64_t>(mc, p.m));
  const int cols_max = static_cast<int>(std::min<int64_t>(nc, p.n));
  const size_t rows_pad = static_cast<size_t>(ceil_div(rows_max, mr) * mr);
  const size_t cols_pad = static_cast<size_t>(ceil_div(cols_max, lanes) * lanes);
  const size_t kc = static_cast<size_t>(std::min<int64_t>(kKc, p.k));
  ScratchLayout layout;
  const size_t off_a = layout.take(rows_pad * kc);
  const size_t off_b = layout.take(kc * cols_pad);
  const size_t off_c = layout.take(rows_pad * cols_pad);
  const size_t per_worker = layout.size();
  FloatBuffer scratch(checked_mul(per_worker, static_cast<size_t>(pool.size())));
  float* base = scratch.data();

  pool.parallel_for(m_tiles * n_tiles, [&](int64_t item, int worker) {
    const int64_t ti = item / n_tiles, tj = item % n_tiles;
    const int64_t i0 = ti * mc, j0 = tj * nc;
    const int rows = static_cast<int>(std::min<int64_t>(mc, p.m - i0));
    const int cols = static_cast<int>(std::min<int64_t>(nc, p.n - j0));
    float* w = base + per_worker * static_cast<size_t>(worker);
    fn(p, i0, rows, j0, cols, static_cast<int>(kc), {w + off_a, w + off_b, w + off_c});
  });
}

void gemm(const GemmParams& p, ThreadPool& pool) { gemm(p, pool, detected_isa()); }

}  // namespace fa::cpu
