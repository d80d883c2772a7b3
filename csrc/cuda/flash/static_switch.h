// Runtime value -> compile-time constant, in the style of flash-attention's static_switch.h: the body
// is a lambda-like block that sees the named constant. The one place where runtime choices become
// template parameters of the FA2 kernels.
#pragma once

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

// Head dims with a compiled kernel; others make the enclosing call return cudaErrorNotSupported.
#define FA_HEADDIM_SWITCH(head_dim, NAME, ...)  \
  [&]() -> cudaError_t {                        \
    if ((head_dim) == 64) {                     \
      constexpr static int NAME = 64;           \
      return __VA_ARGS__();                     \
    } else if ((head_dim) == 128) {             \
      constexpr static int NAME = 128;          \
      return __VA_ARGS__();                     \
    }                                           \
    return cudaErrorNotSupported;               \
  }()
