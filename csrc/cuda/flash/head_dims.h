// The head dims that have compiled FA2 kernels, and the rounding of any other head dim up to one of
// them. FA_HEAD_DIM_<d> definitions (scripts/build-config.js, FA_HEAD_DIMS) narrow the set for faster
// builds; with none defined, all are compiled.
#pragma once
#include <cstdint>

#if !defined(FA_HEAD_DIM_32) && !defined(FA_HEAD_DIM_64) && !defined(FA_HEAD_DIM_96) && \
    !defined(FA_HEAD_DIM_128) && !defined(FA_HEAD_DIM_192) && !defined(FA_HEAD_DIM_256)
#define FA_HEAD_DIM_32 1
#define FA_HEAD_DIM_64 1
#define FA_HEAD_DIM_96 1
#define FA_HEAD_DIM_128 1
#define FA_HEAD_DIM_192 1
#define FA_HEAD_DIM_256 1
#endif

namespace fa::cuda::flash {

inline constexpr bool kHasHeadDim32 =
#ifdef FA_HEAD_DIM_32
    true;
#else
    false;
#endif
inline constexpr bool kHasHeadDim64 =
#ifdef FA_HEAD_DIM_64
    true;
#else
    false;
#endif
inline constexpr bool kHasHeadDim96 =
#ifdef FA_HEAD_DIM_96
    true;
#else
    false;
#endif
inline constexpr bool kHasHeadDim128 =
#ifdef FA_HEAD_DIM_128
    true;
#else
    false;
#endif
inline constexpr bool kHasHeadDim192 =
#ifdef FA_HEAD_DIM_192
    true;
#else
    false;
#endif
inline constexpr bool kHasHeadDim256 =
#ifdef FA_HEAD_DIM_256
    true;
#else
    false;
#endif

// The smallest compiled head dim >= head_dim (a multiple of 8 in [8, 256]), or 0 if none is.
inline int padded_head_dim(int64_t head_dim) {
  const struct {
    int dim;
    bool compiled;
  } dims[] = {{32, kHasHeadDim32},   {64, kHasHeadDim64},   {96, kHasHeadDim96},
              {128, kHasHeadDim128}, {192, kHasHeadDim192}, {256, kHasHeadDim256}};
  for (const auto& d : dims)
    if (d.compiled && head_dim <= d.dim) return d.dim;
  return 0;
}

}  // namespace fa::cuda::flash
