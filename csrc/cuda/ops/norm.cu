// RMSNorm and LayerNorm (csrc/common/op_params.h), one kernel per direction with the norm as a policy
// (kLayerNorm: subtract the mean, add the bias) and the row split as another (a warp per row up to
// kWarpRowMaxCols columns, a block per row beyond).
//   forward:  per row, the mean (LayerNorm), then the biased variance / mean square from a second pass
//             over the row (two passes, not E[x^2] - E[x]^2: no cancellation; the second read hits L1),
//             then out, mean and rstd.
//   backward: per row, sum(g) and sum(g xhat) in one pass, then dx (in float32, or in double from the
//             row's own statistics on rows one column dominates: row_dx says why); the parameter gradients
//             (dweight += sum over rows of dout xhat, dbias += sum of dout) are column sums over
//             rows, as float32 partials per fixed chunk of rows in the workspace, then a fixed-order
//             sum per column into dweight / dbias (column_partials.cuh). Up to kFusedMaxCols columns
//             (the GPT's 384) one kernel does both (norm_bwd_fused_kernel: each lane keeps its
//             columns' sums in registers over its rows); wider rows take norm_bwd_dx_kernel and then
//             column_partials_kernel, which reads x and dout a second time. Deterministic, no float
//             atomics.
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"
#include "cuda/ops/column_partials.cuh"
#include "cuda/ops/op_utils.cuh"
#include "cuda/ops/ops_cuda.h"

namespace fa::cuda {
namespace {

using ops::kRowBlockThreads;

// A row of up to 2048 columns is at most 8 16-byte accesses per lane (bf16) for one warp; longer rows
// get a block (GPT shapes: C = 384 -> warp per row, 8 rows per block, 2048 blocks for 16384 rows).
constexpr int64_t kWarpRowMaxCols = 2048;
// Rows up to this many columns take the fused backward (dx and the parameter-gradient partials in one
// pass over x and dout); its per-lane sums are kFusedMaxCols / 32 floats per output.
constexpr int kFusedMaxCols = 512;

// One configuration of the norm kernels: storage type, row split, elements per access.
template <typename T_, typename Rows_, int N_, bool kLayerNorm_>
struct NormTraits {
  using T = T_;
  using Rows = Rows_;
  static constexpr int N = N_;  // kVecElems<T> when the launcher's alignment check passed, else 1
  static constexpr bool kLayerNorm = kLayerNorm_;
  static constexpr int kStep = Rows::kThreads * N;  // columns per step of a row loop
};

// ptxas (nvcc 13.0, sm_80 / sm_90a): 40-96 registers, 0 spills.
template <typename Tr>
__global__ void __launch_bounds__(kRowBlockThreads, ops::kRowMinBlocks) norm_fwd_kernel(const NormParams p, float cols_f) {
  using T = typename Tr::T;
  using Rows = typename Tr::Rows;
  constexpr int N = Tr::N;
  __shared__ float scratch[Rows::kScratchValues];
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.weight);
  const T* b = static_cast<const T*>(p.bias);
  T* out = static_cast<T*>(p.out);
  for (int64_t row = Rows::first_row(); row < p.rows; row += Rows::row_stride()) {
    const T* xr = x + row * p.cols;
    float mean = 0.0f;
    if constexpr (Tr::kLayerNorm) {
      float s[1] = {0.0f};
      for (int64_t c = static_cast<int64_t>(Rows::rank()) * N; c < p.cols; c += Tr::kStep) {
        float v[N];
        ops::load_float<N>(xr + c, v);
#pragma unroll
        for (int i = 0; i < N; ++i) s[0] += v[i];
      }
      Rows::sum(s, scratch);
      // Divided, not multiplied by 1/cols: the mean and the variance are then the correctly rounded
      // quotients a plain implementation computes. On ill-conditioned rows (3 columns of nearly equal
      // values) the reciprocal's ulp reached out through rstd: 2.65e-5 against a bound of 1.83e-5.
      mean = s[0] / cols_f;
    }
    float ss[1] = {0.0f};
    for (int64_t c = static_cast<int64_t>(Rows::rank()) * N; c < p.cols; c += Tr::kStep) {
      float v[N];
      ops::load_float<N>(xr + c, v);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        const float d = v[i] - mean;
        ss[0] += d * d;
      }
    }
    Rows::sum(ss, scratch);
    // In double, once per row: rsqrtf's 2 ulp reach dx through (1 - xhat^2) when a row has one
    // column (an RMSNorm dx 4.3e-6 off against a bound of 5.3e-7 on the H100), and 1.0f / sqrtf or
    // __frsqrt_rn call a slow path that spilled 8-48 bytes in the fp32 instances.
    const float rstd = static_cast<float>(rsqrt(static_cast<double>(ss[0] / cols_f + p.eps)));
    for (int64_t c = static_cast<int64_t>(Rows::rank()) * N; c < p.cols; c += Tr::kStep) {
      float v[N], wv[N], y[N];
      ops::load_float<N>(xr + c, v);
      ops::load_float<N>(w + c, wv);
#pragma unroll
      for (int i = 0; i < N; ++i) y[i] = (v[i] - mean) * rstd * wv[i];
      if (Tr::kLayerNorm && b != nullptr) {
        float bv[N];
        ops::load_float<N>(b + c, bv);
#pragma unroll
        for (int i = 0; i < N; ++i) y[i] += bv[i];
      }
      ops::store_float<N>(out + row * p.cols + c, y);
    }
    if (Rows::rank() == 0) {
      p.rstd[row] = rstd;
      if constexpr (Tr::kLayerNorm) p.mean[row] = mean;
    }
  }
}

// dx per row: xhat = (x - mean) rstd, g = dout w,
//   RMSNorm dx = rstd (g - xhat mean(g xhat));  LayerNorm dx = rstd (g - mean(g) - xhat mean(g xhat)).
// In float32 from the forward's mean and rstd, except on rows that one column dominates, where the
// formula cancels: column c's terms cancel by 1 / (1 - xhat_c^2 / cols) (RMSNorm) or
// 1 / (1 - (1 + xhat_c^2) / cols) (LayerNorm); a one-column RMSNorm row is g eps rstd^3 and loses
// x^2 / eps ulps through the float rstd. The first pass also takes max |xhat|, and a row whose
// cancellation factor exceeds 2 is done again in double from its own statistics and rounded once, as
// the CPU backend does every row. (Every row in double halved the bandwidth: bench/NOTES.md.)
// g is rounded to float on its own (__fmul_rn), never contracted into an FMA with the subtraction.
struct RowStatsD {
  double mean, rstd;
};
template <typename Tr>
__device__ __forceinline__ RowStatsD row_stats_d(const typename Tr::T* xr, const NormParams& p, double inv_cols,
                                                 double* scratch) {
  using Rows = typename Tr::Rows;
  constexpr int N = Tr::N;
  double mean = 0.0;
  if constexpr (Tr::kLayerNorm) {
    double s[1] = {0.0};
    for (int64_t c = static_cast<int64_t>(Rows::rank()) * N; c < p.cols; c += Tr::kStep) {
      float v[N];
      ops::load_float<N>(xr + c, v);
#pragma unroll
      for (int i = 0; i < N; ++i) s[0] += v[i];
    }
    Rows::sum(s, scratch);
    mean = s[0] * inv_cols;
  }
  double ss[1] = {0.0};
  for (int64_t c = static_cast<int64_t>(Rows::rank()) * N; c < p.cols; c += Tr::kStep) {
    float v[N];
    ops::load_float<N>(xr + c, v);
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const double d = v[i] - mean;
      ss[0] += d * d;
    }
  }
  Rows::sum(ss, scratch);
  return RowStatsD{mean, rsqrt(ss[0] * inv_cols + static_cast<double>(p.eps))};
}
// Whether a row's dx cancels by more than 2 (the criterion above), from max |xhat| over the row.
template <bool kLayerNorm>
__device__ __forceinline__ bool row_dominated(float xhat_max, float inv_cols) {
  return ((kLayerNorm ? 1.0f : 0.0f) + xhat_max * xhat_max) * inv_cols > 0.5f;
}
// The first pass's terms of N columns (g = dout w rounded on its own, as in the second pass): sum g,
// sum g xhat and, kCheck, max |xhat|.
template <int N, bool kCheck, typename A>
__device__ __forceinline__ void add_dx_sums(const float (&v)[N], const float (&wv)[N], const float (&gv)[N], A mean,
                                            A rstd, A (&s)[2], float& xhat_max) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const float g = __fmul_rn(gv[i], wv[i]);
    const A xhat = (v[i] - mean) * rstd;
    s[0] += g;
    s[1] += g * xhat;
    if constexpr (kCheck) xhat_max = fmaxf(xhat_max, fabsf(xhat));
  }
}
// dx of N columns from the row's sums: rstd (g - mean(g) - xhat mean(g xhat)), rounded once to float.
template <int N, typename A>
__device__ __forceinline__ void dx_values(const float (&v)[N], const float (&wv)[N], const float (&gv)[N], A mean,
                                          A rstd, A mean_g, A mean_gx, float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const A xhat = (v[i] - mean) * rstd;
    d[i] = static_cast<float>(rstd * (__fmul_rn(gv[i], wv[i]) - mean_g - xhat * mean_gx));
  }
}
// dx of one row (the row group's share of it) in accumulator type A from the statistics mean and rstd:
// the sums of g and g xhat, then dx, rounded once to T. kCheck (float): the first pass also takes
// max |xhat|, and a dominated row returns false before anything is written. scratch:
// Rows::kScratchValues values of A (none for a warp).
template <typename Tr, typename A, bool kCheck>
__device__ __forceinline__ bool row_dx_in(const NormParams& p, int64_t row, A mean, A rstd, double inv_cols,
                                          A* scratch) {
  using T = typename Tr::T;
  using Rows = typename Tr::Rows;
  constexpr int N = Tr::N;
  const int64_t base = row * p.cols;
  const T* xr = static_cast<const T*>(p.x) + base;
  const T* dr = static_cast<const T*>(p.dout) + base;
  const T* w = static_cast<const T*>(p.weight);
  A s[2] = {0, 0};         // sum g, sum g xhat
  float xhat_max = 0.0f;   // max |xhat| (kCheck)
  for (int64_t c = static_cast<int64_t>(Rows::rank()) * N; c < p.cols; c += Tr::kStep) {
    float v[N], wv[N], gv[N];
    ops::load_float<N>(xr + c, v);
    ops::load_float<N>(w + c, wv);
    ops::load_float<N>(dr + c, gv);
    add_dx_sums<N, kCheck>(v, wv, gv, mean, rstd, s, xhat_max);
  }
  Rows::sum(s, scratch);
  const A inv_cols_a = static_cast<A>(inv_cols);
  if constexpr (kCheck) {
    xhat_max = Rows::max(xhat_max, scratch);
    if (row_dominated<Tr::kLayerNorm>(xhat_max, inv_cols_a)) return false;  // uniform across the row group
  }
  const A mean_g = Tr::kLayerNorm ? s[0] * inv_cols_a : A(0);
  const A mean_gx = s[1] * inv_cols_a;
  for (int64_t c = static_cast<int64_t>(Rows::rank()) * N; c < p.cols; c += Tr::kStep) {
    float v[N], wv[N], gv[N], d[N];
    ops::load_float<N>(xr + c, v);
    ops::load_float<N>(w + c, wv);
    ops::load_float<N>(dr + c, gv);
    dx_values<N>(v, wv, gv, mean, rstd, mean_g, mean_gx, d);
    ops::store_float<N>(static_cast<T*>(p.dx) + base + c, d);
  }
  return true;
}
// The row's dx in double from its own statistics (the rows one column dominates, above).
template <typename Tr>
__device__ __forceinline__ void row_dx_double(const NormParams& p, int64_t row, double inv_cols, double* scratch) {
  const RowStatsD st = row_stats_d<Tr>(static_cast<const typename Tr::T*>(p.x) + row * p.cols, p, inv_cols, scratch);
  row_dx_in<Tr, double, false>(p, row, st.mean, st.rstd, inv_cols, scratch);
}
// One row's dx: in float32 from the forward's statistics, or, on a dominated row, in double.
template <typename Tr>
__device__ __forceinline__ void row_dx(const NormParams& p, int64_t row, double inv_cols, double* scratch) {
  const float mean = Tr::kLayerNorm ? p.mean_in[row] : 0.0f;
  if (!row_dx_in<Tr, float, true>(p, row, mean, p.rstd_in[row], inv_cols, reinterpret_cast<float*>(scratch)))
    row_dx_double<Tr>(p, row, inv_cols, scratch);
}

// ptxas (nvcc 13.0, sm_80 / sm_90a): 48-116 registers, 0 spills.
template <typename Tr>
__global__ void __launch_bounds__(kRowBlockThreads, ops::kRowMinBlocks) norm_bwd_dx_kernel(const NormParams p, double inv_cols) {
  using Rows = typename Tr::Rows;
  __shared__ double scratch[Rows::kScratchValues];
  for (int64_t row = Rows::first_row(); row < p.rows; row += Rows::row_stride()) row_dx<Tr>(p, row, inv_cols, scratch);
}

// Fused backward for rows of up to kFusedMaxCols columns (the GPT's C = 384): dx as
// norm_bwd_dx_kernel, plus the parameter-gradient partials of one chunk of rows (column_chunks: the
// same fixed split and workspace layout as column_partials.cuh) in the same second pass over x and
// dout, without a second kernel; a dominated row's dx is then written again by row_dx_double.
// Block b takes chunk b; warp w its rows w, w + kWarps, ...; lane l owns columns
// (k 32 + l) N + [0, N) for k < kMaxK and keeps their sums of dout xhat (and dout) in registers; at
// the end the warps' sums are added in warp order through shared memory into partials[o][b][c], which
// column_finish_kernel adds into dweight / dbias in chunk order. Deterministic, no float atomics.
// ptxas (nvcc 13.0, sm_80 / sm_90a): 80-128 registers, 0 spills.
template <typename Tr, int kMaxK>
__global__ void __launch_bounds__(kRowBlockThreads, ops::kRowMinBlocks)
    norm_bwd_fused_kernel(const NormParams p, double inv_cols, ops::ColumnChunks split, float* __restrict__ partials) {
  using T = typename Tr::T;
  constexpr int N = Tr::N;
  constexpr int kOuts = Tr::kLayerNorm ? 2 : 1;
  constexpr int kWarps = kRowBlockThreads / kWarpSize;
  static_assert(kMaxK * kWarpSize * N >= kFusedMaxCols, "the lanes must cover kFusedMaxCols columns");
  __shared__ float sums[kOuts][kWarps][kFusedMaxCols];
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.weight);
  const T* dout = static_cast<const T*>(p.dout);
  T* dx = static_cast<T*>(p.dx);
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int warp = static_cast<int>(threadIdx.x) / kWarpSize;
  const int64_t chunk = blockIdx.x;
  const int64_t r0 = chunk * split.rows_per_chunk;
  const int64_t r1 = r0 + split.rows_per_chunk < p.rows ? r0 + split.rows_per_chunk : p.rows;
  float pw[kMaxK][N], pb[kMaxK][N];  // sums over this warp's rows of dout xhat and dout
#pragma unroll
  for (int k = 0; k < kMaxK; ++k)
#pragma unroll
    for (int i = 0; i < N; ++i) pw[k][i] = pb[k][i] = 0.0f;
  const float inv_cols_f = static_cast<float>(inv_cols);
  for (int64_t row = r0 + warp; row < r1; row += kWarps) {
    // row_dx's float pass, written out over the lane's kMaxK column groups so that the second pass
    // also adds the parameter gradients' terms (from the forward's mean and rstd, as column_partials'
    // NormParamGrads). Row_dx itself, then a third pass for them, ran at 0.80-0.84x the bandwidth.
    const int64_t base = row * p.cols;
    const float mean = Tr::kLayerNorm ? p.mean_in[row] : 0.0f;
    const float rstd = p.rstd_in[row];
    float s[2] = {0.0f, 0.0f};  // sum g, sum g xhat
    float xhat_max = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxK; ++k) {
      const int64_t c = static_cast<int64_t>(k * kWarpSize + lane) * N;
      if (c >= p.cols) continue;
      float v[N], wv[N], gv[N];
      ops::load_float<N>(x + base + c, v);
      ops::load_float<N>(w + c, wv);
      ops::load_float<N>(dout + base + c, gv);
      add_dx_sums<N, true>(v, wv, gv, mean, rstd, s, xhat_max);
    }
    ops::WarpPerRow<kRowBlockThreads>::sum(s, static_cast<float*>(nullptr));
    xhat_max = ops::WarpPerRow<kRowBlockThreads>::max(xhat_max, nullptr);
    const bool dominated = row_dominated<Tr::kLayerNorm>(xhat_max, inv_cols_f);  // uniform across the warp
    const float mean_g = Tr::kLayerNorm ? s[0] * inv_cols_f : 0.0f;
    const float mean_gx = s[1] * inv_cols_f;
#pragma unroll
    for (int k = 0; k < kMaxK; ++k) {
      const int64_t c = static_cast<int64_t>(k * kWarpSize + lane) * N;
      if (c >= p.cols) continue;
      float v[N], wv[N], gv[N], d[N];
      ops::load_float<N>(x + base + c, v);
      ops::load_float<N>(w + c, wv);
      ops::load_float<N>(dout + base + c, gv);
      dx_values<N>(v, wv, gv, mean, rstd, mean_g, mean_gx, d);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        pw[k][i] += gv[i] * ((v[i] - mean) * rstd);
        pb[k][i] += gv[i];
      }
      if (!dominated) ops::store_float<N>(dx + base + c, d);
    }
    if (dominated) row_dx_double<Tr>(p, row, inv_cols, nullptr);  // WarpPerRow: no scratch
  }
#pragma unroll
  for (int k = 0; k < kMaxK; ++k) {
    const int c = (k * kWarpSize + lane) * N;
    if (c >= p.cols) continue;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      sums[0][warp][c + i] = pw[k][i];
      if constexpr (kOuts == 2) sums[kOuts - 1][warp][c + i] = pb[k][i];
    }
  }
  __syncthreads();
  const int cols = static_cast<int>(p.cols);
  for (int t = static_cast<int>(threadIdx.x); t < kOuts * cols; t += kRowBlockThreads) {
    const int o = t / cols, c = t - o * cols;
    double acc = 0.0;  // the warps' sums added exactly, rounded once (see column_partials.cuh)
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) acc += sums[o][wi][c];
    partials[(o * split.chunks + chunk) * p.cols + c] = static_cast<float>(acc);
  }
}

// The parameter-gradient contributions of element (r, c): dout xhat (dweight) and dout (dbias).
template <typename T, bool kLayerNorm>
struct NormParamGrads {
  static constexpr int kOuts = kLayerNorm ? 2 : 1;
  const T* x;
  const T* dout;
  const float* mean;
  const float* rstd;
  int64_t cols;
  __device__ void operator()(int64_t r, int64_t c, float (&v)[kOuts]) const {
    const float xv = to_float(x[r * cols + c]);
    const float g = to_float(dout[r * cols + c]);
    const float xhat = kLayerNorm ? (xv - mean[r]) * rstd[r] : xv * rstd[r];
    v[0] = g * xhat;
    if constexpr (kLayerNorm) v[kOuts - 1] = g;
  }
};

// Picks the row split and the access width, then launches Kernel<NormTraits<...>>.
template <bool kLayerNorm, template <typename> class Kernel, typename T>
cudaError_t launch_rows(const NormParams& p, bool vec, cudaStream_t stream) {
  using Warp = ops::WarpPerRow<kRowBlockThreads>;
  using Block = ops::BlockPerRow<kRowBlockThreads>;
  constexpr int kN = ops::kVecElems<T>;
  const bool warp_rows = p.cols <= kWarpRowMaxCols;
  const unsigned int grid = warp_rows ? Warp::grid(p.rows) : Block::grid(p.rows);
  if (warp_rows && vec) {
    Kernel<NormTraits<T, Warp, kN, kLayerNorm>>::launch(grid, p, stream);
  } else if (warp_rows) {
    Kernel<NormTraits<T, Warp, 1, kLayerNorm>>::launch(grid, p, stream);
  } else if (vec) {
    Kernel<NormTraits<T, Block, kN, kLayerNorm>>::launch(grid, p, stream);
  } else {
    Kernel<NormTraits<T, Block, 1, kLayerNorm>>::launch(grid, p, stream);
  }
  return cudaGetLastError();
}

// 1 / cols, computed on the host (a division in the kernels took the IEEE slow path's call and spilled).
double inv_cols(const NormParams& p) { return 1.0 / static_cast<double>(p.cols); }

template <typename Tr>
struct FwdKernel {
  static void launch(unsigned int grid, const NormParams& p, cudaStream_t stream) {
    norm_fwd_kernel<Tr><<<grid, kRowBlockThreads, 0, stream>>>(p, static_cast<float>(p.cols));
  }
};
template <typename Tr>
struct BwdDxKernel {
  static void launch(unsigned int grid, const NormParams& p, cudaStream_t stream) {
    norm_bwd_dx_kernel<Tr><<<grid, kRowBlockThreads, 0, stream>>>(p, inv_cols(p));
  }
};

int param_grad_outputs(const NormParams& p) { return p.layer_norm ? 2 : 1; }
bool wants_param_grads(const NormParams& p) {
  return p.dweight != nullptr || (p.layer_norm && p.dbias != nullptr);
}

// The fused backward (16-byte aligned rows only), then the fixed-order sum of its partials into
// dweight / dbias.
template <typename T, bool kLayerNorm>
cudaError_t launch_fused(const NormParams& p, cudaStream_t stream) {
  using Warp = ops::WarpPerRow<kRowBlockThreads>;
  constexpr int kN = ops::kVecElems<T>;
  constexpr int kOuts = kLayerNorm ? 2 : 1;
  if (p.workspace == nullptr) return cudaErrorInvalidValue;
  const ops::ColumnChunks split = ops::column_chunks(p.rows);
  float* partials = static_cast<float*>(p.workspace);
  const unsigned int grid = static_cast<unsigned int>(split.chunks);
  norm_bwd_fused_kernel<NormTraits<T, Warp, kN, kLayerNorm>, kFusedMaxCols / (kWarpSize * kN)>
      <<<grid, kRowBlockThreads, 0, stream>>>(p, inv_cols(p), split, partials);
  FA_CUDA_TRY(cudaGetLastError());
  ops::column_finish_kernel<kOuts><<<grid_size(p.cols, ops::kColTile), ops::kColumnThreads, 0, stream>>>(
      partials, split.chunks, p.cols, p.dweight, kLayerNorm ? p.dbias : nullptr, true);
  return cudaGetLastError();
}

}  // namespace

cudaError_t norm_fwd(const NormParams& p, cudaStream_t stream) {
  if (p.rows < 1 || p.cols < 1) return cudaSuccess;
  return dispatch_dtype(p.dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool vec = ops::vec_aligned(p.x) && ops::vec_aligned(p.out) && ops::vec_aligned(p.weight) &&
                     (!p.layer_norm || ops::vec_aligned(p.bias)) && ops::vec_rows<T>(p.cols);
    return p.layer_norm ? launch_rows<true, FwdKernel, T>(p, vec, stream)
                        : launch_rows<false, FwdKernel, T>(p, vec, stream);
  });
}

size_t norm_bwd_workspace_bytes(const NormParams& p) {
  if (p.rows < 1 || p.cols < 1 || !wants_param_grads(p)) return 0;
  return ops::column_partials_bytes(p.rows, p.cols, param_grad_outputs(p));
}

cudaError_t norm_bwd(const NormParams& p, cudaStream_t stream) {
  if (p.rows < 1 || p.cols < 1) return cudaSuccess;
  return dispatch_dtype(p.dtype, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    const bool vec = ops::vec_aligned(p.x) && ops::vec_aligned(p.dout) && ops::vec_aligned(p.dx) &&
                     ops::vec_aligned(p.weight) && ops::vec_rows<T>(p.cols);
    // Rows that are not 16-byte aligned take the two kernels: a fused kernel of one element per
    // access keeps 16 column groups of sums per output, and with the double path of dominated rows
    // inlined ptxas spilled 32-56 bytes in its LayerNorm instances.
    if (wants_param_grads(p) && vec && p.cols <= kFusedMaxCols) {
      return p.layer_norm ? launch_fused<T, true>(p, stream) : launch_fused<T, false>(p, stream);
    }
    const cudaError_t dx_status = p.layer_norm ? launch_rows<true, BwdDxKernel, T>(p, vec, stream)
                                               : launch_rows<false, BwdDxKernel, T>(p, vec, stream);
    FA_CUDA_TRY(dx_status);
    if (!wants_param_grads(p)) return cudaSuccess;
    const T* x = static_cast<const T*>(p.x);
    const T* dout = static_cast<const T*>(p.dout);
    if (p.layer_norm) {
      const NormParamGrads<T, true> f{x, dout, p.mean_in, p.rstd_in, p.cols};
      return ops::launch_column_sums(f, p.rows, p.cols, p.dweight, p.dbias, true, p.workspace, stream);
    }
    const NormParamGrads<T, false> f{x, dout, p.mean_in, p.rstd_in, p.cols};
    return ops::launch_column_sums(f, p.rows, p.cols, p.dweight, nullptr, true, p.workspace, stream);
  });
}

}  // namespace fa::cuda
