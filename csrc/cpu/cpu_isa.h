// Instruction-set selection for the CPU kernels. The tile code is compiled once per instruction set
// in the same translation unit (inside FA_CPU_TARGET_*_BEGIN / FA_CPU_TARGET_END regions), so the
// portable build (plain -O3, no -march) still runs AVX-512 or AVX2+FMA code where the CPU has it;
// flash_fwd / flash_bwd take the variant as an argument (default detected_isa()) and clamp it with
// supported_isa(). Nothing here is mutable process-wide state: the detection result is a
// function-local static const, written once and only read after that.
#pragma once

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define FA_CPU_X86 1
#else
#define FA_CPU_X86 0
#endif

#if FA_CPU_X86 && defined(__clang__)
#define FA_CPU_TARGET_AVX2_BEGIN \
  _Pragma("clang attribute push(__attribute__((target(\"avx2,fma,f16c\"))), apply_to = function)")
#define FA_CPU_TARGET_AVX512_BEGIN                                                                    \
  _Pragma("clang attribute push(__attribute__((target(\"avx512f,avx2,fma,f16c\"))), apply_to = function)")
#define FA_CPU_TARGET_END _Pragma("clang attribute pop")
#elif FA_CPU_X86
#define FA_CPU_TARGET_AVX2_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"avx2,fma,f16c\")")
#define FA_CPU_TARGET_AVX512_BEGIN \
  _Pragma("GCC push_options") _Pragma("GCC target(\"avx512f,avx2,fma,f16c\")")
#define FA_CPU_TARGET_END _Pragma("GCC pop_options")
#endif

namespace fa::cpu {

enum class Isa : int {
  kGeneric = 0,  // the compiler's baseline (SSE2 on x86-64), 4-lane vectors
  kAvx2 = 1,     // AVX2 + FMA + F16C, 8 lanes
  kAvx512 = 2,   // AVX-512F (+ AVX2, FMA, F16C), 16 lanes
};

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

// The best variant this CPU (and OS: __builtin_cpu_supports checks the saved register state) runs.
inline Isa detected_isa() {
#if FA_CPU_X86
  static const Isa isa = [] {
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                      __builtin_cpu_supports("f16c");
    if (avx2 && __builtin_cpu_supports("avx512f")) return Isa::kAvx512;
    return avx2 ? Isa::kAvx2 : Isa::kGeneric;
  }();
  return isa;
#else
  return Isa::kGeneric;
#endif
}

// The variant actually run when `requested` is asked for: the lower of it and detected_isa(), so a
// caller (a test forcing each variant, say) can never select code this CPU cannot execute.
inline Isa supported_isa(Isa requested) {
  const Isa best = detected_isa();
  return static_cast<int>(requested) < static_cast<int>(best) ? requested : best;
}

}  // namespace fa::cpu
