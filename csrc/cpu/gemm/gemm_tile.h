// Per-instruction-set body of the CPU GEMM (gemm_cpu.cc): panel packing with dtype conversion, the
// register-blocked micro-kernel and the fused epilogue. Included once per instruction set through
// cpu/tile_variants.h (FA_TILE_BODY), after cpu/tile_kernels.h (Vec, vload, vstore, vsplat, vfma,
// kLanes) and gemm_cpu.cc (GemmScratch, GemmTileFn). No include guard, like the other tile bodies.
//
// Blocking (Goto / BLIS style): C is cut into tiles of mc x nc (one work item each); for each kc
// slice of K the item packs its A block (mc x kc, in strips of kGemmMr rows: strip[k * kGemmMr + r])
// and its B block (kc x nc, in strips of at most kGemmNr columns: strip[k * width + j]), both
// converted to fp32 and zero-padded, and runs the micro-kernel over every (A strip, B strip) pair,
// accumulating into a fp32 tile of C in scratch. Each C element is one fma chain over k = 0..K-1
// in order (the scratch tile holds it between kc slices without rounding), so the result does not
// depend on the tiling or on the thread count.

// Micro-kernel shape: kGemmMr rows x kGemmNv vectors of C in registers. AVX-512 (32 zmm): 6 x 4
// vectors = 24 accumulators, 4 B loads and 6 broadcasts per 24 FMAs. AVX2 (16 ymm): 6 x 2 = 12
// accumulators (the classic 6x16). Generic SSE2 (16 xmm, no FMA): 4 x 3.
#if FA_TILE_LANES == 16
constexpr int kGemmMr = 6;
constexpr int kGemmNv = 4;
#elif FA_TILE_LANES == 8
constexpr int kGemmMr = 6;
constexpr int kGemmNv = 2;
#else
constexpr int kGemmMr = 4;
constexpr int kGemmNv = 3;
#endif
constexpr int kGemmNr = kGemmNv * kLanes;  // widest B strip, in columns

// One element of a GEMM operand as fp32 (exact for every dtype).
template <DType kDt>
inline float gemm_load(const void* base, int64_t index) {
  if constexpr (kDt == DType::kFloat32) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (kDt == DType::kBFloat16) {
    return bf16_to_f32(static_cast<const uint16_t*>(base)[index]);
  } else {
#if FA_TILE_LEVEL >= 1
    return _cvtsh_ss(static_cast<const uint16_t*>(base)[index]);
#else
    return f16_to_f32(static_cast<const uint16_t*>(base)[index]);
#endif
  }
}

// Packs A rows [i0, i0 + rows) x k [k0, k0 + kc) into ceil(rows / kGemmMr) strips of kc x kGemmMr
// (rows past `rows` zero).
template <DType kDt>
void gemm_pack_a(const GemmParams& p, int64_t i0, int rows, int64_t k0, int kc, float* __restrict dst) {
  for (int s = 0; s < rows; s += kGemmMr) {
    float* strip = dst + static_cast<int64_t>(s) * kc;
    const int valid = std::min(kGemmMr, rows - s);
    if (p.a_k_major) {  // A(i, k) = a[i * lda + k]: read along k, write with stride kGemmMr
      for (int r = 0; r < valid; ++r) {
        const int64_t row = (i0 + s + r) * p.lda + k0;
        for (int k = 0; k < kc; ++k) strip[k * kGemmMr + r] = gemm_load<kDt>(p.a, row + k);
      }
    } else {  // A(i, k) = a[k * lda + i]: read along i
      for (int k = 0; k < kc; ++k) {
        const int64_t col = (k0 + k) * p.lda + i0 + s;
        for (int r = 0; r < valid; ++r) strip[k * kGemmMr + r] = gemm_load<kDt>(p.a, col + r);
      }
    }
    for (int r = valid; r < kGemmMr; ++r)
      for (int k = 0; k < kc; ++k) strip[k * kGemmMr + r] = 0.0f;
  }
}

// Width in columns (a whole number of vectors) of the B strip that starts `col` columns into a tile
// of `cols` columns.
inline int gemm_strip_width(int col, int cols) {
  const int rest = (cols - col + kLanes - 1) / kLanes * kLanes;
  return std::min(kGemmNr, rest);
}

// Packs B k [k0, k0 + kc) x columns [j0, j0 + cols) into strips of kc x width (gemm_strip_width;
// columns past `cols` zero), strip s starting at dst + kc * (first column of s).
template <DType kDt>
void gemm_pack_b(const GemmParams& p, int64_t k0, int kc, int64_t j0, int cols, float* __restrict dst) {
  for (int s = 0; s < cols; s += kGemmNr) {
    const int width = gemm_strip_width(s, cols);
    const int valid = std::min(width, cols - s);
    float* strip = dst + static_cast<int64_t>(s) * kc;
    if (p.b_k_major) {  // B(k, j) = b[j * ldb + k]: read along k, write with stride width
      for (int j = 0; j < valid; ++j) {
        const int64_t col = (j0 + s + j) * p.ldb + k0;
        for (int k = 0; k < kc; ++k) strip[k * width + j] = gemm_load<kDt>(p.b, col + k);
      }
      for (int j = valid; j < width; ++j)
        for (int k = 0; k < kc; ++k) strip[k * width + j] = 0.0f;
    } else {  // B(k, j) = b[k * ldb + j]: read along j
      for (int k = 0; k < kc; ++k) {
        const int64_t row = (k0 + k) * p.ldb + j0 + s;
        float* d = strip + k * width;
        for (int j = 0; j < valid; ++j) d[j] = gemm_load<kDt>(p.b, row + j);
        for (int j = valid; j < width; ++j) d[j] = 0.0f;
      }
    }
  }
}

// C block (kGemmMr x NV vectors, leading dimension ldc) = (accumulate ? C : 0) + A strip · B strip.
template <int NV>
inline void gemm_micro(int kc, const float* __restrict a, const float* __restrict b, float* __restrict c,
                       int64_t ldc, bool accumulate) {
  Vec acc[kGemmMr][NV];  // (kGemmMr, NV * kLanes) block of C
  for (int r = 0; r < kGemmMr; ++r)
    for (int j = 0; j < NV; ++j) acc[r][j] = accumulate ? vload<Vec>(c + r * ldc + j * kLanes) : Vec{};
  for (int k = 0; k < kc; ++k) {
    Vec bv[NV];
    for (int j = 0; j < NV; ++j) bv[j] = vload<Vec>(b + (k * NV + j) * kLanes);
    for (int r = 0; r < kGemmMr; ++r) {
      const Vec av = vsplat<Vec>(a[k * kGemmMr + r]);
      for (int j = 0; j < NV; ++j) acc[r][j] = vfma(av, bv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < kGemmMr; ++r)
    for (int j = 0; j < NV; ++j) vstore<Vec>(c + r * ldc + j * kLanes, acc[r][j]);
}

template <int NV>
inline void gemm_micro_dispatch(int nv, int kc, const float* a, const float* b, float* c, int64_t ldc,
                                bool accumulate) {
  if constexpr (NV >= 1) {
    if (nv == NV) return gemm_micro<NV>(kc, a, b, c, ldc, accumulate);
    gemm_micro_dispatch<NV - 1>(nv, kc, a, b, c, ldc, accumulate);
  }
}

// GELU, tanh approximation, in fp32.
inline float gemm_gelu_tanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  constexpr float kCubic = 0.044715f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + kCubic * x * x * x)));
}

template <DType kDt>
inline void gemm_store(void* base, int64_t index, float v) {
  if constexpr (kDt == DType::kFloat32) {
    static_cast<float*>(base)[index] = v;
  } else if constexpr (kDt == DType::kBFloat16) {
    static_cast<uint16_t*>(base)[index] = f32_to_bf16(v);
  } else {
    static_cast<uint16_t*>(base)[index] = f32_to_f16(v);
  }
}

// Epilogue of one tile: acc is rows x cols (leading dimension ld) at C(i0, j0).
template <DType kCdt>
void gemm_epilogue(const GemmParams& p, int64_t i0, int rows, int64_t j0, int cols, const float* acc, int ld) {
  const bool gelu = p.activation == GemmActivation::kGeluTanh;
  for (int r = 0; r < rows; ++r) {
    const int64_t row = (i0 + r) * p.ldc + j0;
    const float* a = acc + static_cast<int64_t>(r) * ld;
    for (int j = 0; j < cols; ++j) {
      float t = p.alpha * a[j];
      if (p.bias != nullptr) {
        t += p.bias_dtype == DType::kFloat32 ? static_cast<const float*>(p.bias)[j0 + j]
             : p.bias_dtype == DType::kBFloat16 ? gemm_load<DType::kBFloat16>(p.bias, j0 + j)
                                                : gemm_load<DType::kFloat16>(p.bias, j0 + j);
      }
      if (p.pre_out != nullptr) gemm_store<kCdt>(p.pre_out, row + j, t);
      if (gelu) t = gemm_gelu_tanh(t);
      if (p.beta != 0.0f) t += p.beta * gemm_load<kCdt>(p.c, row + j);
      gemm_store<kCdt>(p.c, row + j, t);
    }
  }
}

// One tile of C: rows [i0, i0 + rows) x columns [j0, j0 + cols), all of K.
template <DType kAbDt, DType kCdt>
void gemm_tile(const GemmParams& p, int64_t i0, int rows, int64_t j0, int cols, int kc_max, GemmScratch s) {
  const int rows_pad = (rows + kGemmMr - 1) / kGemmMr * kGemmMr;
  const int ld = (cols + kLanes - 1) / kLanes * kLanes;
  if (p.k == 0)
    for (int r = 0; r < rows_pad; ++r) std::fill(s.c + static_cast<int64_t>(r) * ld, s.c + static_cast<int64_t>(r + 1) * ld, 0.0f);
  for (int64_t k0 = 0; k0 < p.k; k0 += kc_max) {
    const int kc = static_cast<int>(std::min<int64_t>(kc_max, p.k - k0));
    gemm_pack_a<kAbDt>(p, i0, rows, k0, kc, s.a);
    gemm_pack_b<kAbDt>(p, k0, kc, j0, cols, s.b);
    const bool accumulate = k0 > 0;
    for (int j = 0; j < cols; j += kGemmNr) {
      const int nv = gemm_strip_width(j, cols) / kLanes;
      const float* bs = s.b + static_cast<int64_t>(j) * kc;
      for (int r = 0; r < rows_pad; r += kGemmMr)
        gemm_micro_dispatch<kGemmNv>(nv, kc, s.a + static_cast<int64_t>(r) * kc, bs,
                                     s.c + static_cast<int64_t>(r) * ld + j, ld, accumulate);
    }
  }
  gemm_epilogue<kCdt>(p, i0, rows, j0, cols, s.c, ld);
}

template <DType kAbDt>
GemmTileFn gemm_tile_for_c(DType c_dtype) {
  switch (c_dtype) {
    case DType::kBFloat16: return gemm_tile<kAbDt, DType::kBFloat16>;
    case DType::kFloat16: return gemm_tile<kAbDt, DType::kFloat16>;
    default: return gemm_tile<kAbDt, DType::kFloat32>;
  }
}

// The tile function for the params' dtypes (validated by the caller).
inline GemmTileFn gemm_tile_fn(const GemmParams& p) {
  switch (p.ab_dtype) {
    case DType::kBFloat16: return gemm_tile_for_c<DType::kBFloat16>(p.c_dtype);
    case DType::kFloat16: return gemm_tile_for_c<DType::kFloat16>(p.c_dtype);
    default: return gemm_tile_for_c<DType::kFloat32>(p.c_dtype);
  }
}

inline int gemm_mr() { return kGemmMr; }
inline int gemm_lanes() { return kLanes; }
