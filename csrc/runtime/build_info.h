// Why a build has no CUDA, as scripts/build-config.js records it in FA_CPU_ONLY_REASON (1: FA_CUDA=0,
// 2: no nvcc found, 3: nvcc without libcudart_static.a). The addon reports the code
// (`cpuOnlyReason`); the runtime's errors for CUDA work on such a build quote the message.
#pragma once

namespace fa {

#ifndef FA_WITH_CUDA
#if !defined(FA_CPU_ONLY_REASON)
inline constexpr const char* kCpuOnlyReason = "unknown";
inline constexpr const char* kCpuOnlyMessage =
    "this build of flash-attn-node was compiled without CUDA (the build did not record why)";
#elif FA_CPU_ONLY_REASON == 1
inline constexpr const char* kCpuOnlyReason = "disabled";
inline constexpr const char* kCpuOnlyMessage =
    "this build of flash-attn-node was compiled without CUDA (FA_CUDA=0 requested a CPU-only build)";
#elif FA_CPU_ONLY_REASON == 2
inline constexpr const char* kCpuOnlyReason = "nvcc-not-found";
inline constexpr const char* kCpuOnlyMessage =
    "this build of flash-attn-node was compiled without CUDA (nvcc was not found at install time)";
#elif FA_CPU_ONLY_REASON == 3
inline constexpr const char* kCpuOnlyReason = "cudart-not-found";
inline constexpr const char* kCpuOnlyMessage =
    "this build of flash-attn-node was compiled without CUDA (nvcc was found at install time but not the static CUDA "
    "runtime, libcudart_static.a)";
#else
inline constexpr const char* kCpuOnlyReason = "unknown";
inline constexpr const char* kCpuOnlyMessage =
    "this build of flash-attn-node was compiled without CUDA (the build did not record why)";
#endif
#endif

}  // namespace fa
