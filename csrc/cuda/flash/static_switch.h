// Runtime value -> compile-time constant, in the style of flash-attention's static_switch.h: the body
// is a lambda-like block that sees the named constant. The one place where runtime choices become
// template parameters of the FA2 kernels.
#pragma once
#include "cuda/flash/head_dims.h"

#define FA_BOOL_SWITCH(cond, NAME, ...)        \
  [&] {                                        \
    if (cond) {                                \
      constexpr static bool NAME = true;       \
      return __VA_ARGS__();                    \
    } else {                                   \
      constexpr static bool NAME = false;      \
      return __VA_ARGS__();                    \
    }                                          \
  }()

#define FA_HEADDIM_CASE(value, NAME, ...)  \
  if (padded == (value)) {                 \
    constexpr static int NAME = (value);   \
    return __VA_ARGS__();                  \
  }

// Compiled head dim (head_dims.h: the given one rounded up) as NAME; a head dim with no compiled
// kernel at or above it makes the enclosing call return cudaErrorNotSupported.
#ifdef FA_HEAD_DIM_32
#define FA_HD_CASE_32(NAME, ...) FA_HEADDIM_CASE(32, NAME, __VA_ARGS__)
#else
#define FA_HD_CASE_32(NAME, ...)
#endif
#ifdef FA_HEAD_DIM_64
#define FA_HD_CASE_64(NAME, ...) FA_HEADDIM_CASE(64, NAME, __VA_ARGS__)
#else
#define FA_HD_CASE_64(NAME, ...)
#endif
#ifdef FA_HEAD_DIM_96
#define FA_HD_CASE_96(NAME, ...) FA_HEADDIM_CASE(96, NAME, __VA_ARGS__)
#else
#define FA_HD_CASE_96(NAME, ...)
#endif
#ifdef FA_HEAD_DIM_128
#define FA_HD_CASE_128(NAME, ...) FA_HEADDIM_CASE(128, NAME, __VA_ARGS__)
#else
#define FA_HD_CASE_128(NAME, ...)
#endif
#ifdef FA_HEAD_DIM_192
#define FA_HD_CASE_192(NAME, ...) FA_HEADDIM_CASE(192, NAME, __VA_ARGS__)
#else
#define FA_HD_CASE_192(NAME, ...)
#endif
#ifdef FA_HEAD_DIM_256
#define FA_HD_CASE_256(NAME, ...) FA_HEADDIM_CASE(256, NAME, __VA_ARGS__)
#else
#define FA_HD_CASE_256(NAME, ...)
#endif

#define FA_HEADDIM_SWITCH(head_dim, NAME, ...)                            \
  [&]() -> cudaError_t {                                                  \
    const int padded = ::fa::cuda::flash::padded_head_dim(head_dim);      \
    FA_HD_CASE_32(NAME, __VA_ARGS__)                                      \
    FA_HD_CASE_64(NAME, __VA_ARGS__)                                      \
    FA_HD_CASE_96(NAME, __VA_ARGS__)                                      \
    FA_HD_CASE_128(NAME, __VA_ARGS__)                                     \
    FA_HD_CASE_192(NAME, __VA_ARGS__)                                     \
    FA_HD_CASE_256(NAME, __VA_ARGS__)                                     \
    return cudaErrorNotSupported;                                         \
  }()
