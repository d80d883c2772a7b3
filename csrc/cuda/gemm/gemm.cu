// CUDA GEMM entry points (gemm.h): validation, the planner (kernel family, tile configuration, K
// splits) and the split-K reduction.
//
// Paths: sm_90a (wgmma + TMA, gemm_sm90.cu) for fp16 / bf16 on compute capability 9.0 when the
// operands suit TMA (16-byte aligned bases and leading dimensions); else the mma.sync kernel
// (gemm_sm80_kernel.cuh) on sm_80+, with 16-byte cp.async loads when the pointers and leading
// dimensions allow it. An operand they cannot read is first packed into the workspace with aligned
// rows; without a workspace it is read element by element (mma.sync kernel).
// Split-K: when the tiles of C alone would leave most SMs idle and K is long (the dW products: M, N
// in the hundreds, K = 16384 rows), K is cut into `splits` ranges of whole K tiles; each writes raw
// fp32 sums into its slice of the caller's workspace and a reduction kernel adds the slices in split
// order (deterministic) and applies the epilogue. Without a workspace the call runs unsplit.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/copy_params.h"
#include "cuda/copy.h"
#include "cuda/cuda_utils.cuh"
#include "cuda/device_props.h"
#include "cuda/flash/launch_checks.h"
#include "cuda/gemm/gemm.h"
#include "cuda/gemm/gemm_common.cuh"
#include "cuda/gemm/gemm_plan.h"

namespace fa::cuda {
namespace gemm_kernels {
namespace {

// Split-K only when the unsplit grid fills less than this many waves of one block per SM...
constexpr double kSplitBelowWaves = 0.75;
// ...and aim for about this many blocks per SM after splitting.
constexpr int kSplitTargetBlocksPerSm = 2;
// Each split keeps at least this many K tiles (the pipeline's prologue and epilogue amortised).
constexpr int kMinKTilesPerSplit = 8;
constexpr int kMaxSplits = 32;
// sm90: 128-row tiles once 128 x 128 tiles fill this fraction of the SMs (H100, bf16: the lm head's
// forward, 128 such tiles on 132 SMs, 9.9 us with them vs 11.3 us with 64 x 128 tiles); below,
// 64 x 128 tiles (dW of qkv: 44.8 us vs 53.4 us with 128 x 128 and 2 blocks per SM, of fc: 55.8 vs
// 70.8), or, when K is split, the warp-specialized persistent kernel (configuration 12): H100,
// bf16, K = 16384, us (configuration 3 and its split choice -> 12): dW of qkv 44.8 -> 35.9, proj
// 23.0 -> 20.0, fc 54.9 -> 42.0, fc2 61.4 -> 44.0.
constexpr double kSm90BigTileWaves = 0.75;
constexpr int kSm90WsConfig = 12;
// Large products with at least this many K tiles take the warp-specialized kernel instead of 4:
// H100, bf16, us (4 -> 12): fwd fc2 and dx fc (24 K tiles) 44.0 -> 37.7 and 40.5 -> 37.8; dx qkv
// (18) 33.2 -> 33.0, fwd qkv (6) 39.2 -> 66.4.
constexpr int64_t kSm90WsMinKTiles = 24;
// Large products whose C the TMA-store epilogue can write (sm90_tma_store_ok) take configuration 16
// at every K: H100, bf16, us (4 or 12 -> 16): fwd qkv 39.3 -> 28.0, fwd fc 50.2 -> 35.9, fwd fc2
// 37.6 -> 32.7, dx qkv 33.5 -> 26.3, dx fc 37.3 -> 32.3, dx fc2 50.1 -> 36.0 (gemm_sm90.cu).
constexpr int kSm90TmaConfig = 16;

bool is_16bit(DType d) { return d == DType::kFloat16 || d == DType::kBFloat16; }

// 16-byte loads need 16-byte aligned bases and leading dimensions of whole 16-byte chunks.
bool vec_ok(const GemmParams& p) {
  const int64_t es = static_cast<int64_t>(dtype_size(p.ab_dtype));
  return flash::aligned16(p.a) && flash::aligned16(p.b) && (p.lda * es) % 16 == 0 && (p.ldb * es) % 16 == 0;
}

// An operand's storage: `outer` rows of `inner` elements, rows `ld` apart.
struct OperandShape {
  int64_t inner, outer;
};
OperandShape a_shape(const GemmParams& p) { return p.a_k_major ? OperandShape{p.k, p.m} : OperandShape{p.m, p.k}; }
OperandShape b_shape(const GemmParams& p) { return p.b_k_major ? OperandShape{p.k, p.n} : OperandShape{p.n, p.k}; }

// Workspace regions start at multiples of this many bytes.
constexpr size_t kWorkspaceAlign = 256;
size_t align_up(size_t bytes) { return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

struct Device {
  int major = 0, sms = 0;
};

Device current_device() {
  const DeviceProps props = current_device_props();
  return {props.major, props.sms};
}

}  // namespace

bool sm90_tma_store_ok(const GemmParams& p) {
  const int64_t es = static_cast<int64_t>(dtype_size(p.c_dtype));
  return is_16bit(p.c_dtype) && p.c_dtype == p.ab_dtype && p.beta == 0.0f && flash::aligned16(p.c) &&
         (p.ldc * es) % 16 == 0 && (p.pre_out == nullptr || flash::aligned16(p.pre_out));
}

GemmPlan make_plan(const GemmParams& call, bool allow_workspace, const PlanOverride& force) {
  const Device dev = current_device();
  GemmPlan plan;
  // Operands that 16-byte loads cannot read (a base off 16 bytes, or rows of a partial 16-byte
  // chunk: the lm head's dy has 65 columns) are packed into the workspace first, rows rounded up to
  // 16 bytes, when a workspace is given and element loads are not forced; the kernels then read the
  // copy (p below: the planned operands, a packed one at the aligned null). H100, bf16, the lm head's
  // products (dy with 65 columns), us (element loads -> packed, sm90 kernels): dx 33.0 -> 18.2, dW
  // 43.3 -> 27.1 (torch.matmul: 19.3, 38.7).
  GemmParams p = call;
  size_t ws = 0;
  const int64_t es = static_cast<int64_t>(dtype_size(p.ab_dtype));
  const auto pack = [&](const void*& ptr, int64_t& ld, OperandShape shape, int64_t& packed_ld, size_t& offset) {
    if (!allow_workspace || force.vec == 0 || (flash::aligned16(ptr) && (ld * es) % 16 == 0)) return;
    packed_ld = ceil_div<int64_t>(shape.inner * es, 16) * 16 / es;
    offset = ws;
    ws += align_up(static_cast<size_t>(shape.outer * packed_ld * es));
    ptr = nullptr;
    ld = packed_ld;
  };
  pack(p.a, p.lda, a_shape(p), plan.packed_lda, plan.a_pack_offset);
  pack(p.b, p.ldb, b_shape(p), plan.packed_ldb, plan.b_pack_offset);
  int blocks_per_sm = 0;  // of the sm90 configuration (1: persistent)
  plan.vec = force.vec >= 0 ? force.vec != 0 && vec_ok(p) : vec_ok(p);
  const int sms = std::max(dev.sms, 1);
  // An override never forces TMA or 16-byte loads on operands that cannot take them.
  const bool sm90 = (force.path >= 0 ? force.path == static_cast<int>(GemmPath::kSm90)
                                     : dev.major == 9 && is_16bit(p.ab_dtype) && gemm_sm90_built()) &&
                    plan.vec;
  if (sm90) {
    plan.path = GemmPath::kSm90;
    // Large products: the warp-specialized kernel with TMA stores (16, gemm_sm90.cu) where C allows
    // them; else 128 x 192 tiles (4; the warp-specialized 12 when K is long), or 128 x 128 (0) where
    // 192-wide tiles would pad N more (the lm head, N = 65);
    // products whose 128 x 128 tiles do not fill kSm90BigTileWaves of the SMs: the persistent
    // kernel (12) with split-K when K is long and a workspace is given, else 64 x 128 tiles (3).
    const Sm90Tile big = gemm_sm90_tile(0), wide = gemm_sm90_tile(4);
    const int64_t bn = big.block_n, bk = big.block_k;
    const int64_t big_tiles = ceil_div<int64_t>(p.m, big.block_m) * ceil_div<int64_t>(p.n, bn);
    const bool wide_pads_less = ceil_div<int64_t>(p.n, wide.block_n) * wide.block_n <= ceil_div<int64_t>(p.n, bn) * bn;
    const bool small = big_tiles < kSm90BigTileWaves * sms;
    // K long enough for at least two splits of 128 x 128 tiles (the split rule below decides).
    const bool split_k = allow_workspace && ceil_div<int64_t>(p.k, bk) >= 2 * kMinKTilesPerSplit;
    plan.sm90_config = force.tile >= 0       ? force.tile
                       : small               ? (split_k ? kSm90WsConfig : 3)
                       : sm90_tma_store_ok(p) ? kSm90TmaConfig
                       : wide_pads_less      ? (ceil_div<int64_t>(p.k, bk) >= kSm90WsMinKTiles ? kSm90WsConfig : 4)
                                             : 0;
  } else {
    plan.path = GemmPath::kSm80;
    const int64_t large_tiles = ceil_div<int64_t>(p.m, 128) * ceil_div<int64_t>(p.n, 128);
    plan.tile = !plan.vec ? Sm80Tile::kSmall
                : force.tile >= 0 ? static_cast<Sm80Tile>(force.tile)
                : large_tiles >= sms ? Sm80Tile::kLarge : Sm80Tile::kSmall;
    plan.block_m = plan.block_n = plan.tile == Sm80Tile::kLarge ? 128 : 64;
    plan.block_k = p.ab_dtype == DType::kFloat32 ? 16 : 32;
  }
  // The tiles and K splits of the chosen tiles.
  const auto split = [&] {
    const int64_t tiles = ceil_div<int64_t>(p.m, plan.block_m) * ceil_div<int64_t>(p.n, plan.block_n);
    const int64_t k_tiles = ceil_div<int64_t>(p.k, plan.block_k);
    int splits = 1;
    if (allow_workspace && tiles < kSplitBelowWaves * sms) {
      // Several blocks per SM: about kSplitTargetBlocksPerSm of them on each. Persistent (one block
      // per SM): as many work items as fit one wave, since a second, partial wave would cost a whole one.
      const int64_t want =
          blocks_per_sm == 1 ? static_cast<int64_t>(sms) / tiles
                             : ceil_div<int64_t>(static_cast<int64_t>(kSplitTargetBlocksPerSm) * sms, tiles);
      const int64_t most = k_tiles / kMinKTilesPerSplit;
      splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({want, most, kMaxSplits})));
    }
    if (force.splits > 0) splits = static_cast<int>(std::min<int64_t>(force.splits, k_tiles));
    plan.k_tiles_per_split = static_cast<int>(ceil_div<int64_t>(k_tiles, splits));
    plan.splits = static_cast<int>(ceil_div<int64_t>(k_tiles, plan.k_tiles_per_split));  // none empty
    plan.blocks = tiles * plan.splits;
  };
  const auto use_sm90 = [&](int config) {
    const Sm90Tile t = gemm_sm90_tile(config);
    plan.sm90_config = config;
    plan.block_m = t.block_m, plan.block_n = t.block_n, plan.block_k = t.block_k;
    blocks_per_sm = t.blocks_per_sm;
    split();
    return t;
  };
  if (plan.path == GemmPath::kSm90) {
    // A TMA-store configuration (an override's, too) that cannot store this call, or would split
    // it, runs the staged epilogue of configuration 12 instead.
    const Sm90Tile t = use_sm90(plan.sm90_config);
    if (t.tma_store && (!sm90_tma_store_ok(p) || plan.splits > 1)) use_sm90(kSm90WsConfig);
  } else {
    split();
  }
  plan.partial_offset = ws;
  if (plan.splits > 1) ws += static_cast<size_t>(plan.splits) * p.m * p.n * sizeof(float);
  plan.workspace_bytes = ws;
  return plan;
}

namespace {

// One thread per pair of columns of a row of C: the splits' sums in split order (8-byte loads when
// the slices' rows allow them), then the epilogue (gemm_common.cuh). Wider chunks leave too few
// threads where the output is small and the splits many: H100, bf16, us per dW call (2 columns,
// scalar loads / 8 columns, 16-byte loads): proj with 14 splits 19.9 / 22.4, lm head with 22 splits
// 40.2 / 43.4, qkv with 4 splits 37.1 / 36.6.
constexpr int kReduceCols = 2;
template <typename Elem>
__global__ void splitk_reduce_kernel(const GemmParams p, const float* __restrict partial, int splits) {
  const int64_t chunks_per_row = ceil_div<int64_t>(p.n, kReduceCols);
  const int64_t total = p.m * chunks_per_row;
  const int64_t slice = p.m * p.n;
  const bool slice_vec = p.n % 4 == 0 && (reinterpret_cast<uintptr_t>(partial) & 15u) == 0;
  const EpilogueVec ev = epilogue_vec(p);
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = idx / chunks_per_row, col = (idx % chunks_per_row) * kReduceCols;
    const int count = p.n - col < kReduceCols ? static_cast<int>(p.n - col) : kReduceCols;
    const float* src = partial + row * p.n + col;
    float t[kReduceCols] = {};
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {
      float v[kReduceCols];
      load_n<float, kReduceCols>(src + s * slice, 0, v, count, slice_vec && count == kReduceCols, true);
#pragma unroll
      for (int e = 0; e < kReduceCols; ++e) t[e] += v[e];
    }
    epilogue_n<Elem, kReduceCols>(p, row, col, t, count, ev);
  }
}

constexpr int kReduceThreads = 256;
constexpr int64_t kReduceMaxBlocks = 65536;

// dst[o * dst_ld + i] = src[o * src_ld + i] for the operand's rows, by the strided copy engine
// (cuda/copy.h); the padding of dst's rows is left unwritten (the kernels' bounds stop at `inner`).
cudaError_t pack_operand(const void* src, int64_t src_ld, OperandShape shape, DType dtype, void* dst, int64_t dst_ld,
                         cudaStream_t stream) {
  CopyParams c;
  c.rank = 2;
  c.sizes[0] = shape.outer, c.sizes[1] = shape.inner;
  c.src_strides[0] = src_ld, c.src_strides[1] = 1;
  c.dst_strides[0] = dst_ld, c.dst_strides[1] = 1;
  c.numel = shape.outer * shape.inner;
  c.src_dtype = c.dst_dtype = dtype;
  c.src = src;
  c.dst = dst;
  coalesce_copy_dims(c);
  return fa::cuda::copy(c, stream);
}

}  // namespace

cudaError_t gemm_splitk_reduce(const GemmParams& p, const float* partial, int splits, cudaStream_t stream) {
  const int64_t chunks = p.m * ceil_div<int64_t>(p.n, kReduceCols);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(ceil_div<int64_t>(chunks, kReduceThreads), kReduceMaxBlocks));
  return dispatch_dtype(p.ab_dtype, [&](auto tag) {
    using Elem = typename decltype(tag)::type;
    splitk_reduce_kernel<Elem><<<blocks, kReduceThreads, 0, stream>>>(p, partial, splits);
    return cudaGetLastError();
  });
}

cudaError_t run_plan(const GemmParams& call, const GemmPlan& plan, void* workspace, cudaStream_t stream) {
  if (plan.workspace_bytes > 0 && workspace == nullptr) return cudaErrorInvalidValue;
  unsigned char* ws = static_cast<unsigned char*>(workspace);
  GemmParams p = call;
  if (plan.packed_lda > 0) {
    void* dst = ws + plan.a_pack_offset;
    FA_CUDA_TRY(pack_operand(p.a, p.lda, a_shape(p), p.ab_dtype, dst, plan.packed_lda, stream));
    p.a = dst, p.lda = plan.packed_lda;
  }
  if (plan.packed_ldb > 0) {
    void* dst = ws + plan.b_pack_offset;
    FA_CUDA_TRY(pack_operand(p.b, p.ldb, b_shape(p), p.ab_dtype, dst, plan.packed_ldb, stream));
    p.b = dst, p.ldb = plan.packed_ldb;
  }
  float* partial = plan.splits > 1 ? reinterpret_cast<float*>(ws + plan.partial_offset) : nullptr;
  cudaError_t err;
  if (plan.path == GemmPath::kSm90)
    err = gemm_sm90(p, plan, partial, stream);
  else if (p.ab_dtype == DType::kFloat32)
    err = gemm_sm80_fp32(p, plan, partial, stream);
  else
    err = gemm_sm80_16bit(p, plan, partial, stream);
  if (err != cudaSuccess || plan.splits == 1) return err;
  return gemm_splitk_reduce(p, partial, plan.splits, stream);
}

}  // namespace gemm_kernels

const char* gemm_unsupported_reason(const GemmParams& p) {
  if (p.m < 1 || p.n < 1 || p.k < 1) return "the CUDA GEMM needs m, n and k >= 1";
  if (p.m > INT32_MAX || p.n > INT32_MAX || p.k > INT32_MAX) return "the CUDA GEMM needs m, n and k below 2^31";
  if (p.ab_dtype != DType::kFloat32 && p.ab_dtype != DType::kFloat16 && p.ab_dtype != DType::kBFloat16)
    return "the CUDA GEMM takes float32, float16 or bfloat16 operands";
  if (p.c_dtype != p.ab_dtype && p.c_dtype != DType::kFloat32)
    return "the CUDA GEMM writes C as float32 or as the operands' dtype";
  if (p.bias != nullptr && p.bias_dtype != p.ab_dtype && p.bias_dtype != DType::kFloat32)
    return "the CUDA GEMM takes a float32 bias or one of the operands' dtype";
  if (p.lda < (p.a_k_major ? p.k : p.m) || p.ldb < (p.b_k_major ? p.k : p.n) || p.ldc < p.n)
    return "a leading dimension of the CUDA GEMM is smaller than its matrix's rows";
  if (current_device_props().major < 8) return "the CUDA GEMM needs a GPU of compute capability 8.0 (Ampere) or newer";
  return nullptr;
}

size_t gemm_workspace_bytes(const GemmParams& p) {
  if (gemm_unsupported_reason(p) != nullptr) return 0;
  return gemm_kernels::make_plan(p, true).workspace_bytes;
}

cudaError_t gemm(const GemmParams& p, void* workspace, cudaStream_t stream) {
  // The reason check asks whether a kernel exists for the shape (the binding asks it before it
  // allocates C); the pointers are the launch's to check.
  if (gemm_unsupported_reason(p) != nullptr) return cudaErrorInvalidValue;
  if (p.a == nullptr || p.b == nullptr || p.c == nullptr) return cudaErrorInvalidValue;
  return gemm_kernels::run_plan(p, gemm_kernels::make_plan(p, workspace != nullptr), workspace, stream);
}

}  // namespace fa::cuda
