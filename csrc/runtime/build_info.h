// Why a build has no CUDA, as scripts/build-config.js records it in FA_CPU_ONLY_REASON (1: FA_CUDA=0,
// 2: no nvcc found, 3: nvcc without libcudart_static.a). The addon reports the code
// (`cpuOnlyReason`); the runtime's errors for CUDA work on such a build quote the message.
#pragma once

namespace fa {

#ifndef FA_WITH_CUDA
#if defined(FA_CPU_ONLY_REASON) && FA_CPU_ONLY_REASON == 1
#define FA_CPU_ONLY_CODE "disabled"
#define FA_CPU_ONLY_WHY "FA_CUDA=0 requested a CPU-only build"
#elif defined(FA_CPU_ONLY_REASON) && FA_CPU_ONLY_REASON == 2
#define FA_CPU_ONLY_CODE "nvcc-not-found"
#define FA_CPU_ONLY_WHY "nvcc was not found at install time"
#elif defined(FA_CPU_ONLY_REASON) && FA_CPU_ONLY_REASON == 3
#define FA_CPU_ONLY_CODE "cudart-not-found"
#define FA_CPU_ONLY_WHY "nvcc was found at install time but not the static CUDA runtime, libcudart_static.a"
#else
#define FA_CPU_ONLY_CODE "unknown"
#define FA_CPU_ONLY_WHY "the build did not record why"
#endif
inline constexpr const char* kCpuOnlyReason = FA_CPU_ONLY_CODE;
inline constexpr const char* kCpuOnlyMessage =
    "this build of flash-attn-node was compiled without CUDA (" FA_CPU_ONLY_WHY ")";
#undef FA_CPU_ONLY_CODE
#undef FA_CPU_ONLY_WHY
#endif

}  // namespace fa
