// Per-instruction-set tile primitives of the CPU backend: fp32 vectors (GCC vector extensions),
// a vectorised exp2, a register-blocked GEMM micro-kernel, and the dtype-converting tile loads and
// stores.
//
// Deliberately no include guard: cpu/tile_variants.h includes this file once per
// instruction set, each time inside its own `namespace isa_xxx { namespace {` and, for AVX2 and
// AVX-512, inside a FA_CPU_TARGET_*_BEGIN region, with these macros defined:
//   FA_TILE_LANES  fp32 lanes of one vector: 4 (generic), 8 (AVX2), 16 (AVX-512)
//   FA_TILE_LEVEL  0 generic, 1 AVX2+FMA+F16C, 2 AVX-512F
// It includes nothing itself; the including file provides <immintrin.h> (x86), <cstring>, <cmath>,
// <cstdint>, <limits>, <type_traits>, <utility>, common/half.h, common/dtype.h and cpu/tile_config.h.

constexpr int kLanes = FA_TILE_LANES;
static_assert(kTileAlign % kLanes == 0, "padded tile extents must hold whole vectors");

typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t VecI __attribute__((vector_size(kLanes * sizeof(float))));
// Eight lanes: the column tail of the 16-lane GEMM (every column count is a multiple of 8).
typedef float Vec8 __attribute__((vector_size(8 * sizeof(float))));

// GEMM register block: kMr rows x kNv vectors of C stay in registers (kMr * kNv accumulators plus
// kNv B vectors and one broadcast must fit the 32 zmm / 16 ymm / 16 xmm registers). Measured on the
// speed target, one core (fwd + bwd CPU seconds): AVX-512 4x4 0.24, 8x2 0.24, 4x3 0.27;
// AVX2 4x3 0.38, 4x2 0.41, 8x1 0.40.
#if FA_TILE_LANES == 16
constexpr int kMr = 4;
constexpr int kNv = 4;
#else
constexpr int kMr = 4;
constexpr int kNv = 3;
#endif
static_assert(kTileAlign % kMr == 0, "padded row counts must be whole register blocks");

template <class V>
inline V vload(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}

template <class V>
inline void vstore(float* p, V v) {
  std::memcpy(p, &v, sizeof(V));
}

// A vector literal {s, s, ...}: one broadcast, from memory when s comes from memory. (V{} + s adds
// 0.0f first, which cannot be folded because of -0.0f; a lane-by-lane loop went through the stack.)
template <class V, size_t... kLane>
inline V vsplat_lanes(float s, std::index_sequence<kLane...>) {
  return V{((void)kLane, s)...};
}
template <class V>
inline V vsplat(float s) {
  return vsplat_lanes<V>(s, std::make_index_sequence<sizeof(V) / sizeof(float)>{});
}

// a * b + c, fused where the instruction set has FMA (-std=c++17 disables contraction).
template <class V>
inline V vfma(V a, V b, V c) {
#if FA_TILE_LEVEL >= 2
  if constexpr (sizeof(V) == 64) return _mm512_fmadd_ps(a, b, c);
#endif
#if FA_TILE_LEVEL >= 1
  if constexpr (sizeof(V) == 32) return _mm256_fmadd_ps(a, b, c);
  if constexpr (sizeof(V) == 16) return _mm_fmadd_ps(a, b, c);
#endif
  return a * b + c;
}

inline Vec vmax(Vec a, Vec b) { return a > b ? a : b; }

// Lane numbers 0, 1, ..., kLanes - 1.
inline VecI lane_index() {
  VecI v;
  for (int i = 0; i < kLanes; ++i) v[i] = i;
  return v;
}

// 2^x for every lane: x is clamped to [-127, 127], split into round(x) + f with |f| <= 0.5; 2^f
// by the Cephes exp2f polynomial (relative error ~1e-7) and 2^round(x) through the exponent bits.
// x = -inf (masked scores) gives exactly 0; 2^-127 (exponent field 0) flushes to 0 as well.
inline Vec exp2v(Vec x) {
  constexpr float kMin = -127.0f;
  constexpr float kMax = 127.0f;
  constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: (x + magic) - magic rounds to integer
  const Vec lo = vsplat<Vec>(kMin);
  const Vec hi = vsplat<Vec>(kMax);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const Vec magic = vsplat<Vec>(kRoundMagic);
  const Vec r = (x + magic) - magic;
  const Vec f = x - r;
  Vec p = vsplat<Vec>(1.535336188319500e-4f);
  p = vfma(p, f, vsplat<Vec>(1.339887440266574e-3f));
  p = vfma(p, f, vsplat<Vec>(9.618437357674640e-3f));
  p = vfma(p, f, vsplat<Vec>(5.550332471162809e-2f));
  p = vfma(p, f, vsplat<Vec>(2.402264791363012e-1f));
  p = vfma(p, f, vsplat<Vec>(6.931472028550421e-1f));
  p = vfma(p, f, vsplat<Vec>(1.0f));
  constexpr int32_t kExpBias = 127;
  constexpr int kMantissaBits = 23;
  const VecI e = (__builtin_convertvector(r, VecI) + kExpBias) << kMantissaBits;
  return p * __builtin_bit_cast(Vec, e);
}

// tanh for every lane, within a few ulps: below |x| = 0.625 the odd minimax polynomial x + x^3 P(x^2)
// of Cephes' tanhf (no cancellation near 0), above it sign(x) (1 - 2 / (e^2|x| + 1)) through exp2v,
// which saturates to exactly +-1 (exp2v clamps at 2^127). NaN stays NaN.
inline Vec tanhv(Vec x) {
  const Vec ax = x < Vec{} ? -x : x;
  const Vec z = x * x;
  Vec p = vsplat<Vec>(-5.70498872745e-3f);
  p = vfma(p, z, vsplat<Vec>(2.06390887954e-2f));
  p = vfma(p, z, vsplat<Vec>(-5.37397155531e-2f));
  p = vfma(p, z, vsplat<Vec>(1.33314422036e-1f));
  p = vfma(p, z, vsplat<Vec>(-3.33332819422e-1f));
  const Vec small = vfma(p * z, x, x);
  const Vec one = vsplat<Vec>(1.0f);
  const Vec big = one - vsplat<Vec>(2.0f) / (exp2v(ax * vsplat<Vec>(2.0f * kLog2e)) + one);
  const Vec sbig = x < Vec{} ? -big : big;
  return ax < vsplat<Vec>(0.625f) ? small : sbig;
}

// The score policy of both passes (AttentionFwdParams::softcap): with a softcap c > 0 the raw scores
// S = q.k of `count` entries (a multiple of kLanes) become the scaled and capped c tanh(scale S / c)
// in place, rounded as the reference's same-precision mode rounds each step (lib/reference.ts); with
// `dtanh` the backward's factor of dS, 1 - t^2 (t the tanh), is kept too.
inline void softcap_scores(float* s, int count, float scale, float cap, float* dtanh) {
  const Vec sc = vsplat<Vec>(scale), c = vsplat<Vec>(cap);
  for (int i = 0; i < count; i += kLanes) {
    const Vec th = tanhv((sc * vload<Vec>(s + i)) / c);
    if (dtanh != nullptr) vstore<Vec>(dtanh + i, vsplat<Vec>(1.0f) - th * th);
    vstore<Vec>(s + i, c * th);
  }
}

// ALiBi, the score policy after the softcap: s[e] -= slope * |d0 + step * e| for e in [0, count), d0
// the signed distance (query position + seqlen_k - seqlen_q - key position) of element 0 and step +1
// along query rows, -1 along keys. count is a multiple of kLanes.
inline void alibi_scores(float* s, int count, float slope, int64_t d0, int step) {
  Vec ramp;  // step * lane
  for (int l = 0; l < kLanes; ++l) ramp[l] = static_cast<float>(step * l);
  const Vec sl = vsplat<Vec>(slope);
  for (int i = 0; i < count; i += kLanes) {
    const Vec dist = vsplat<Vec>(static_cast<float>(d0 + static_cast<int64_t>(step) * i)) + ramp;
    vstore<Vec>(s + i, vload<Vec>(s + i) - sl * (dist < Vec{} ? -dist : dist));
  }
}

// ---- GEMM -----------------------------------------------------------------------------------------
// C[M x N] (= or +=) A[M x K] * B[K x N], all fp32. B and C are row-major (leading dimensions ldb,
// ldc); A is read one element at a time (broadcast), so either layout is as fast.

enum class ALayout {
  kRowMajor,  // A(m, k) = a[m * lda + k]
  kColMajor,  // A(m, k) = a[k * lda + m]  (A stored transposed)
};

// One kMr x (NV vectors) block of C, accumulated in registers over all of K.
template <class V, int NV, ALayout L, bool kAccumulate>
inline void gemm_block(int K, const float* __restrict a, int64_t lda, const float* __restrict b, int64_t ldb,
                       float* __restrict c, int64_t ldc) {
  constexpr int kVl = static_cast<int>(sizeof(V) / sizeof(float));
  V acc[kMr][NV];  // (kMr, NV * kVl) block of C
  for (int r = 0; r < kMr; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = kAccumulate ? vload<V>(c + r * ldc + j * kVl) : V{};
  for (int k = 0; k < K; ++k) {
    const float* bk = b + k * ldb;
    V bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = vload<V>(bk + j * kVl);
    for (int r = 0; r < kMr; ++r) {
      const V av = vsplat<V>(L == ALayout::kRowMajor ? a[r * lda + k] : a[k * lda + r]);
      for (int j = 0; j < NV; ++j) acc[r][j] = vfma(av, bv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < kMr; ++r)
    for (int j = 0; j < NV; ++j) vstore<V>(c + r * ldc + j * kVl, acc[r][j]);
}

// Requirements: M % kMr == 0, N % 8 == 0, K >= 0. Every C element is one fma chain over k = 0..K-1
// in order (starting from 0 or from C), whatever the blocking: the backward relies on this for
// results that do not depend on which loop computed them.
template <ALayout L, bool kAccumulate>
void gemm(int M, int N, int K, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
          int64_t ldc) {
  for (int m = 0; m < M; m += kMr) {
    const float* am = L == ALayout::kRowMajor ? a + m * lda : a + m;
    float* cm = c + m * ldc;
    int n = 0;
    for (; n + kNv * kLanes <= N; n += kNv * kLanes)
      gemm_block<Vec, kNv, L, kAccumulate>(K, am, lda, b + n, ldb, cm + n, ldc);
    const int rest = (N - n) / kLanes;  // whole vectors left, < kNv
    if constexpr (kNv > 3) {
      if (rest == 3) gemm_block<Vec, 3, L, kAccumulate>(K, am, lda, b + n, ldb, cm + n, ldc);
    }
    if (rest == 2) gemm_block<Vec, 2, L, kAccumulate>(K, am, lda, b + n, ldb, cm + n, ldc);
    if (rest == 1) gemm_block<Vec, 1, L, kAccumulate>(K, am, lda, b + n, ldb, cm + n, ldc);
    n += rest * kLanes;
    if constexpr (kLanes > 8) {
      if (n < N) gemm_block<Vec8, 1, L, kAccumulate>(K, am, lda, b + n, ldb, cm + n, ldc);
    }
  }
}

// ---- exact products over a causal mask -------------------------------------------------------------
//
// A tile that crosses the causal diagonal multiplies the mask's zeros (P or dS = 0 where a row does
// not see a key) by the other operand like any other value, and 0 * NaN = 0 * Inf = NaN: a NaN or
// Inf in a key or value that a row does not see, or in a row's q or dout, would reach outputs that do
// not depend on it (issue 6: NaN propagates to the rows that depend on it and no further). Such tiles
// are checked for non-finite operands, and the products that could be reached run as gemm_masked.

// a * b + c for one element, rounded as vfma rounds it (fused where the instruction set has FMA).
inline float sfma(float a, float b, float c) {
#if FA_TILE_LEVEL >= 1
  return std::fma(a, b, c);
#else
  return a * b + c;
#endif
}

// Whether rows [0, rows) x columns [0, cols) of a row-major tile (row pitch ld) hold a NaN or an Inf.
// Scalar: it runs on the tiles that cross the causal diagonal only.
inline bool any_nonfinite(const float* x, int rows, int cols, int64_t ld) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c)
      if (!std::isfinite(x[r * ld + c])) return true;
  return false;
}

// C (M x N) += A B with A as in gemm<L, true>, each element the same fma chain over k = 0..K-1 in
// order, but with the terms where keep(m, n, k) is false left out instead of multiplied. The left-out
// terms are the mask's exact zeros, which add nothing to a finite chain (fma(0, x, acc) = acc): every
// output the mask does not reach is bit-identical to gemm's. Scalar, for tiles with non-finite inputs.
template <ALayout L, class Keep>
void gemm_masked(int M, int N, int K, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
                 int64_t ldc, Keep keep) {
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float acc = c[m * ldc + n];
      for (int k = 0; k < K; ++k)
        if (keep(m, n, k)) acc = sfma(L == ALayout::kRowMajor ? a[m * lda + k] : a[k * lda + m], b[k * ldb + n], acc);
      c[m * ldc + n] = acc;
    }
}

// ---- dtype conversion -----------------------------------------------------------------------------

// dst[0, cols) = scale * fp32(src[offset + 0, cols)); cols % 8 == 0. The conversion is exact for
// every dtype.
inline void convert_row(const void* src, DType dt, int64_t offset, int cols, float scale, float* __restrict dst) {
  switch (dt) {
    case DType::kFloat32: {
      using V = std::conditional_t<(kLanes <= 8), Vec, Vec8>;  // 8 lanes at most: cols may be 8
      constexpr int kVl = static_cast<int>(sizeof(V) / sizeof(float));
      const float* s = static_cast<const float*>(src) + offset;
      if (scale != 1.0f) {
        for (int c = 0; c < cols; c += kVl) vstore<V>(dst + c, vload<V>(s + c) * scale);
        return;
      }
      for (int c = 0; c < cols; c += kVl) {
        V v = vload<V>(s + c);
#if defined(__x86_64__)
        // Opaque to the optimiser, so the loop stays an inline vector copy: GCC otherwise turns it
        // into a libc memcpy call per 256-byte row (20% of the forward when it copied V per tile).
        __asm__("" : "+x"(v));
#endif
        vstore<V>(dst + c, v);
      }
      return;
    }
    case DType::kBFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      for (int c = 0; c < cols; ++c) {
        const uint32_t u = static_cast<uint32_t>(s[c]) << 16;
        float f;
        std::memcpy(&f, &u, sizeof(float));
        dst[c] = scale * f;
      }
      return;
    }
    case DType::kFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
#if FA_TILE_LEVEL >= 1
      const __m256 sv = _mm256_set1_ps(scale);
      for (int c = 0; c < cols; c += 8) {
        const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + c)));
        _mm256_storeu_ps(dst + c, _mm256_mul_ps(sv, f));
      }
#else
      for (int c = 0; c < cols; ++c) dst[c] = scale * f16_to_f32(s[c]);
#endif
      return;
    }
    case DType::kInt32:  // attention validates a floating dtype before any kernel runs
      return;
  }
}

// Row-major tile load: dst[r * ld + c] = scale * src row r (r < rows, c < cols), rows [rows,
// rows_pad) zero. Row r of src starts at element offset + r * row_stride.
inline void load_rows(const void* src, DType dt, int64_t offset, int64_t row_stride, int rows, int cols,
                      int rows_pad, float scale, float* __restrict dst, int ld) {
  for (int r = 0; r < rows; ++r)
    convert_row(src, dt, offset + r * row_stride, cols, scale, dst + static_cast<int64_t>(r) * ld);
  for (int r = rows; r < rows_pad; ++r) std::memset(dst + static_cast<int64_t>(r) * ld, 0, sizeof(float) * cols);
}

// A rows x cols fp32 tile used only as a GEMM's A operand (read by broadcasts, each element once
// per block of C rows): the source itself when it is fp32 and needs no padding rows, otherwise
// converted into `scratch` (leading dimension cols). B operands are contiguous scratch: their rows
// are re-read for every block of C rows, and source rows heads * head_dim apart (often a power of
// two) alias in the L1 cache; reading V in place as the B of O += P V was 1.2x slower than copying.
struct TileRef {
  const float* data;
  int64_t ld;
};

inline TileRef tile_rows(const void* src, DType dt, int64_t offset, int64_t row_stride, int rows, int cols,
                         int rows_pad, float* scratch) {
  if (dt == DType::kFloat32 && rows == rows_pad) return {static_cast<const float*>(src) + offset, row_stride};
  load_rows(src, dt, offset, row_stride, rows, cols, rows_pad, 1.0f, scratch, cols);
  return {scratch, cols};
}

// Transposed tile load: dst[c * ld + r] = scale * src(r, c) for r < rows, zero for r in [rows,
// rows_pad). `row` is scratch for one converted row (cols floats).
inline void load_rows_transposed(const void* src, DType dt, int64_t offset, int64_t row_stride, int rows,
                                 int cols, int rows_pad, float scale, float* __restrict dst, int ld,
                                 float* __restrict row) {
  for (int r = 0; r < rows; ++r) {
    convert_row(src, dt, offset + r * row_stride, cols, scale, row);
    for (int c = 0; c < cols; ++c) dst[static_cast<int64_t>(c) * ld + r] = row[c];
  }
  for (int c = 0; c < cols; ++c)
    for (int r = rows; r < rows_pad; ++r) dst[static_cast<int64_t>(c) * ld + r] = 0.0f;
}

// dst[offset + c] = dtype(scale * src[c]) for c < cols, rounding to nearest even.
inline void store_row(const float* __restrict src, int cols, float scale, DType dt, void* dst, int64_t offset) {
  switch (dt) {
    case DType::kFloat32: {
      float* d = static_cast<float*>(dst) + offset;
      for (int c = 0; c < cols; ++c) d[c] = scale * src[c];
      return;
    }
    case DType::kBFloat16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int c = 0; c < cols; ++c) d[c] = f32_to_bf16(scale * src[c]);
      return;
    }
    case DType::kFloat16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int c = 0; c < cols; ++c) d[c] = f32_to_f16(scale * src[c]);
      return;
    }
    case DType::kInt32:  // attention validates a floating dtype before any kernel runs
      return;
  }
}

// sum over c < cols of a[c] * b[c] (cols % 8 == 0), lane-wise then across lanes in a fixed order.
inline float dot_row(const float* __restrict a, const float* __restrict b, int cols) {
  using V = std::conditional_t<(kLanes <= 8), Vec, Vec8>;  // 8 lanes at most: cols may be 8
  constexpr int kVl = static_cast<int>(sizeof(V) / sizeof(float));
  V acc{};
  for (int c = 0; c < cols; c += kVl) acc = vfma(vload<V>(a + c), vload<V>(b + c), acc);
  float s = 0.0f;
  for (int i = 0; i < kVl; ++i) s += acc[i];
  return s;
}
