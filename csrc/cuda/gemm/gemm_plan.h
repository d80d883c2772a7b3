// The GEMM planner's decision for one call (gemm.cu makes it; the kernel files launch it). Host only.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/gemm_params.h"

namespace fa::cuda::gemm_kernels {

enum class GemmPath : int { kSm80 = 0, kSm90 = 1 };
enum class Sm80Tile : int { kLarge = 0, kSmall = 1 };  // gemm_sm80_traits.h: Sm80Large, Sm80Small

struct GemmPlan {
  GemmPath path = GemmPath::kSm80;
  Sm80Tile tile = Sm80Tile::kLarge;  // sm80 path
  int sm90_config = 0;               // sm90 path: index into gemm_sm90.cu's configurations
  bool vec = true;                   // 16-byte cp.async loads (else element by element)
  int block_m = 128, block_n = 128, block_k = 32;
  int splits = 1;                    // K splits (> 1: partial sums in the workspace, then a reduction)
  int k_tiles_per_split = 0;
  int64_t blocks = 0;                // thread blocks of the main kernel
  // Operands packed into the workspace before the kernels run (rows rounded up to 16 bytes, for
  // operands 16-byte loads cannot read): their leading dimension there (0: read in place) and
  // where they start; the split-K slices follow them.
  int64_t packed_lda = 0, packed_ldb = 0;
  size_t a_pack_offset = 0, b_pack_offset = 0, partial_offset = 0;
  size_t workspace_bytes = 0;
};

// Test and benchmark hooks (test/native/gemm_check.cu): fields >= 0 (splits > 0) replace the
// planner's choice. The planner never picks a path the device or the operands cannot run; an
// override can, and then the launch fails.
struct PlanOverride {
  int path = -1;   // GemmPath
  int vec = -1;    // 0: element-by-element loads on the sm80 path, and no packing of operands
  int tile = -1;   // Sm80Tile, or the sm90 configuration
  int splits = 0;  // K splits (clamped to the K tiles)
};
GemmPlan make_plan(const GemmParams& p, bool allow_workspace, const PlanOverride& force = {});
// Runs a plan (the workspace must hold plan.workspace_bytes; `p` is the call the plan was made for).
cudaError_t run_plan(const GemmParams& p, const GemmPlan& plan, void* workspace, cudaStream_t stream);

// Kernel launches of each path (gemm_sm80*.cu, gemm_sm90.cu). `partial` is the split-K workspace
// (plan.splits slices of m x n fp32) or null when plan.splits == 1.
cudaError_t gemm_sm80_16bit(const GemmParams& p, const GemmPlan& plan, float* partial, cudaStream_t stream);
cudaError_t gemm_sm80_fp32(const GemmParams& p, const GemmPlan& plan, float* partial, cudaStream_t stream);
cudaError_t gemm_sm90(const GemmParams& p, const GemmPlan& plan, float* partial, cudaStream_t stream);
bool gemm_sm90_built();
// The sm90 path's tile of configuration `config` (gemm_sm90.cu; unknown ones: 0): its shape (K tiles
// of 64) and the blocks it keeps on one SM (persistent: 1).
struct Sm90Tile {
  int block_m = 128, block_n = 128, block_k = 64, blocks_per_sm = 1;
  bool tma_store = false;  // its epilogue stores C by TMA (only calls sm90_tma_store_ok accepts, unsplit)
};
Sm90Tile gemm_sm90_tile(int config);
// Whether a call's C can take the TMA-store epilogue: 16-bit C (and pre_out) with 16-byte aligned
// bases and rows, and beta = 0 (C is written, never read).
bool sm90_tma_store_ok(const GemmParams& p);
// Split-K reduction: C = epilogue(sum over splits of the partial slices), in split order.
cudaError_t gemm_splitk_reduce(const GemmParams& p, const float* partial, int splits, cudaStream_t stream);

}  // namespace fa::cuda::gemm_kernels
