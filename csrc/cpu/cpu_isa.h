// Instruction-set selection for the CPU kernels. The tile code is compiled once per instruction set
// in the same translation unit (inside FA_CPU_TARGET_*_BEGIN / FA_CPU_TARGET_END regions), so the
// portable build (plain -O3, no -march) still runs AVX-512 or AVX2+FMA code where the CPU has it;
// active_isa() picks the variant at run time.
#pragma once

#include <atomic>

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

// Upper bound on the variant used, for tests and benchmarks (default: no bound).
inline std::atomic<int>& isa_limit_storage() {
  static std::atomic<int> limit{static_cast<int>(Isa::kAvx512)};
  return limit;
}
inline void set_isa_limit(Isa limit) { isa_limit_storage().store(static_cast<int>(limit)); }

inline Isa active_isa() {
  const int best = static_cast<int>(detected_isa());
  const int limit = isa_limit_storage().load();
  return static_cast<Isa>(best < limit ? best : limit);
}

}  // namespace fa::cpu
