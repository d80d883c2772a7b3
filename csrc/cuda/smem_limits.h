// Shared-memory limits the kernel configurations are checked against at compile time (static_assert
// in each traits struct), in bytes.
#pragma once
#include <cstddef>

namespace fa::cuda {

// sm_90: the most dynamic shared memory one block may opt into, and one SM's total, of which each
// resident block also takes kSmemReservedPerBlock.
inline constexpr size_t kSm90MaxSmemPerBlock = 227 * 1024;
inline constexpr size_t kSm90SmemPerSm = 228 * 1024;
inline constexpr size_t kSmemReservedPerBlock = 1024;
// The smallest per-block opt-in limit of sm_80+ GPUs (sm_86 / sm_89; sm_80 allows 163 KiB): a
// configuration within it runs on every one of them.
inline constexpr size_t kPortableMaxSmemPerBlock = 99 * 1024;

}  // namespace fa::cuda
