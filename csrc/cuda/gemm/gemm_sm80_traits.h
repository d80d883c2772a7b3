// Tile configurations of the sm_80+ GEMM kernel (gemm_sm80_kernel.cuh). One traits struct per
// (configuration, operand type, layout): the planner (gemm.cu) picks the configuration.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace fa::cuda::gemm_kernels {

// kBlockK16: K per stage for 16-bit operands (fp32 operands take half of it: same bytes per row).
template <int kBlockM_, int kBlockN_, int kBlockK16_, int kWarpsM_, int kWarpsN_, int kStages_, int kMinBlocksPerSm_>
struct Sm80Config {
  static constexpr int kBlockM = kBlockM_, kBlockN = kBlockN_, kBlockK16 = kBlockK16_;
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = kWarpsN_, kStages = kStages_;
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
};

// 128 x 128 tiles, 8 warps of 64 x 32, 4 stages: the large shapes.
using Sm80Large = Sm80Config<128, 128, 32, 2, 4, 4, 1>;
// 64 x 64 tiles, 4 warps of 32 x 32, 4 stages: shapes with few 128 x 128 tiles, and the
// element-by-element fallback for unaligned operands.
using Sm80Small = Sm80Config<64, 64, 32, 2, 2, 4, 2>;

template <typename Elem_, typename Config, bool kAKMajor_, bool kBKMajor_>
struct Sm80Traits {
  using Elem = Elem_;
  static constexpr bool kF32 = std::is_same_v<Elem, float>;
  static constexpr bool kAKMajor = kAKMajor_, kBKMajor = kBKMajor_;
  static constexpr int kBlockM = Config::kBlockM, kBlockN = Config::kBlockN;
  static constexpr int kBlockK = kF32 ? Config::kBlockK16 / 2 : Config::kBlockK16;
  static constexpr int kStages = Config::kStages, kMinBlocksPerSm = Config::kMinBlocksPerSm;
  static constexpr int kWarpsM = Config::kWarpsM, kWarpsN = Config::kWarpsN;
  static constexpr int kNThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kWarpTileM = kBlockM / kWarpsM, kWarpTileN = kBlockN / kWarpsN;
  static constexpr int kMTiles = kWarpTileM / 16, kNTiles = kWarpTileN / 8;
  // Row padding: 16 bytes for k-major rows (8 rows of an ldmatrix / of the fp32 fragment reads land
  // in different banks); MN-major rows 8 elements (fp32: 32 bytes, so rows t and t + 1 of a
  // fragment read are 8 banks apart).
  static constexpr int kPadK = kF32 ? 4 : 8;
  static constexpr int kPadMN = 8;
  static constexpr int kAPitch = kAKMajor ? kBlockK + kPadK : kBlockM + kPadMN;
  static constexpr int kBPitch = kBKMajor ? kBlockK + kPadK : kBlockN + kPadMN;
  static constexpr int kAStageElems = (kAKMajor ? kBlockM : kBlockK) * kAPitch;
  static constexpr int kBStageElems = (kBKMajor ? kBlockN : kBlockK) * kBPitch;
  static constexpr int kPipeBytes = kStages * (kAStageElems + kBStageElems) * static_cast<int>(sizeof(Elem));
  // The staged epilogue reuses the stages: fp32 rows of kBlockN + 8.
  static constexpr int kEpilogueBytes = kBlockM * (kBlockN + 8) * 4;
  static constexpr int kSmemBytes = kPipeBytes > kEpilogueBytes ? kPipeBytes : kEpilogueBytes;
  static_assert(kWarpTileM % 16 == 0 && kWarpTileN % 16 == 0, "warp tiles are whole m16 x n16 pieces");
};

}  // namespace fa::cuda::gemm_kernels
