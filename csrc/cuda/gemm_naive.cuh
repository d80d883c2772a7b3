// Generic strided, batched fp32 GEMM for the naive reference attention (no cuBLAS, no tensor cores):
//     C_out = alpha * A * B + beta * C_in        (A: m x k, B: k x n, C: m x n, all fp32 arithmetic)
// Every operand is addressed through its own row / column / batch / head strides in elements, so
// transposes are stride swaps and the [batch, seqlen, heads, head_dim] tensors are read in place, with
// the storage dtype converted to fp32 on load and the result converted to C_out's dtype on store.
// Plain shared-memory tiling with 4x4 register blocking; one thread block per 64x64 tile of C, the
// k loop in steps of 16 accumulated in order, so results are deterministic (no atomics, no split-k).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cuda_utils.cuh"

namespace fa::cuda {

// One operand of a batched GEMM. Element (r, c) of batch entry (b, h) lives at
//   ptr + b * batch_stride + (h / head_div) * head_stride + r * row_stride + c * col_stride
// head_div > 1 lets query head h read key/value head h / head_div (GQA).
template <typename T>
struct GemmOperand {
  T* ptr = nullptr;
  int64_t row_stride = 0;
  int64_t col_stride = 0;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t head_div = 1;

  __host__ __device__ T* batch_base(int64_t b, int64_t h) const {
    return ptr + b * batch_stride + (h / head_div) * head_stride;
  }
};

template <typename T>
GemmOperand<T> make_operand(T* ptr, int64_t row_stride, int64_t col_stride, int64_t batch_stride,
                            int64_t head_stride, int64_t head_div = 1) {
  GemmOperand<T> op;
  op.ptr = ptr;
  op.row_stride = row_stride;
  op.col_stride = col_stride;
  op.batch_stride = batch_stride;
  op.head_stride = head_stride;
  op.head_div = head_div;
  return op;
}

// The same matrices, transposed (a stride swap, nothing moves).
template <typename T>
GemmOperand<T> transposed(GemmOperand<T> op) {
  const int64_t row = op.row_stride;
  op.row_stride = op.col_stride;
  op.col_stride = row;
  return op;
}

template <typename T>
GemmOperand<const T> as_const(const GemmOperand<T>& op) {
  return make_operand<const T>(op.ptr, op.row_stride, op.col_stride, op.batch_stride, op.head_stride,
                               op.head_div);
}

// Batch (b, h) of the result maps to head h * group + g of `op` (whose head_div must be 1): used to sum
// over the `group` query heads that share one KV head, batching over KV heads.
template <typename T>
GemmOperand<T> group_member(GemmOperand<T> op, int64_t g, int64_t group) {
  op.ptr += g * op.head_stride;
  op.head_stride *= group;
  return op;
}

template <typename TA, typename TB, typename TC>
struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  // Batch entries are (b, h) for b < batch, h < heads; the kernel walks all batch * heads of them.
  int64_t batch = 1, heads = 1;
  float alpha = 1.0f;
  float beta = 0.0f;              // C_in is read only when beta != 0
  GemmOperand<const TA> a;        // m x k
  GemmOperand<const TB> b;        // k x n
  GemmOperand<const float> c_in;  // m x n, fp32; may alias c_out (each element is read, then written, by one thread)
  GemmOperand<TC> c_out;          // m x n
};

// Tile configuration. 256 threads as a 16 x 16 grid; thread (tm, tn) owns C rows tm + 16 i and columns
// tn + 16 j (i, j < 4), so a warp reads 16 consecutive B values and 2 broadcast A values per step.
// Registers: with __launch_bounds__(256) alone ptxas gave the fp32 x fp32 instantiation 128 (sm_80) /
// 168 (sm_90a) registers (it hoists the shared loads of a whole k step), one block per SM; asking for
// kMinBlocksPerSm = 2 caps every instantiation at 128. ptxas (nvcc 13.0) with it: 96-128 registers
// (sm_80), 110-128 (sm_90a), 0 spills, 8320 bytes of static shared memory.
struct GemmTile {
  static constexpr int kM = 64;         // rows of C per block
  static constexpr int kN = 64;         // columns of C per block
  static constexpr int kK = 16;         // depth of one shared-memory step
  static constexpr int kThreadsM = 16;
  static constexpr int kThreadsN = 16;
  static constexpr int kThreads = kThreadsM * kThreadsN;
  static constexpr int kMinBlocksPerSm = 2;
  static constexpr int kRegM = kM / kThreadsM;  // C rows per thread
  static constexpr int kRegN = kN / kThreadsN;  // C columns per thread
  static constexpr int kPad = 1;                // keeps column-wise shared stores off one bank
  static constexpr int kLoadsA = kM * kK / kThreads;  // A elements each thread stages per step
  static constexpr int kLoadsB = kK * kN / kThreads;  // B elements each thread stages per step
  static_assert(kM % kThreadsM == 0 && kN % kThreadsN == 0, "C tile must split evenly over the threads");
  static_assert(kM * kK % kThreads == 0 && kK * kN % kThreads == 0, "A and B tiles must split evenly");
};

template <typename TA, typename TB, typename TC>
__global__ void __launch_bounds__(GemmTile::kThreads, GemmTile::kMinBlocksPerSm)
    gemm_naive_kernel(const GemmArgs<TA, TB, TC> g) {
  using Tile = GemmTile;
  __shared__ float a_tile[Tile::kK][Tile::kM + Tile::kPad];  // A block stored k-major: [k][m]
  __shared__ float b_tile[Tile::kK][Tile::kN + Tile::kPad];  // B block: [k][n]

  const int tm = threadIdx.x / Tile::kThreadsN;
  const int tn = threadIdx.x % Tile::kThreadsN;
  const int64_t tiles_n = ceil_div<int64_t>(g.n, Tile::kN);
  const int64_t tiles = ceil_div<int64_t>(g.m, Tile::kM) * tiles_n;
  const int64_t total = tiles * g.batch * g.heads;
  // Stage tiles along whichever dimension is contiguous in memory (coalescing only; both are correct).
  const bool a_k_contiguous = g.a.col_stride == 1;
  const bool b_k_contiguous = g.b.row_stride == 1;

  for (int64_t t = blockIdx.x; t < total; t += gridDim.x) {
    const int64_t entry = t / tiles;  // batch entry (b, h)
    const int64_t tile = t % tiles;   // n-tiles fastest: neighbouring blocks share their A rows
    const int64_t bi = entry / g.heads;
    const int64_t hi = entry % g.heads;
    const int64_t m0 = (tile / tiles_n) * Tile::kM;
    const int64_t n0 = (tile % tiles_n) * Tile::kN;
    const TA* a = g.a.batch_base(bi, hi);
    const TB* b = g.b.batch_base(bi, hi);

    float acc[Tile::kRegM][Tile::kRegN] = {};
    for (int64_t k0 = 0; k0 < g.k; k0 += Tile::kK) {
#pragma unroll
      for (int r = 0; r < Tile::kLoadsA; ++r) {
        const int e = threadIdx.x + r * Tile::kThreads;
        const int mm = a_k_contiguous ? e / Tile::kK : e % Tile::kM;
        const int kk = a_k_contiguous ? e % Tile::kK : e / Tile::kM;
        const int64_t gm = m0 + mm;
        const int64_t gk = k0 + kk;
        a_tile[kk][mm] = (gm < g.m && gk < g.k) ? to_float(a[gm * g.a.row_stride + gk * g.a.col_stride]) : 0.0f;
      }
#pragma unroll
      for (int r = 0; r < Tile::kLoadsB; ++r) {
        const int e = threadIdx.x + r * Tile::kThreads;
        const int nn = b_k_contiguous ? e / Tile::kK : e % Tile::kN;
        const int kk = b_k_contiguous ? e % Tile::kK : e / Tile::kN;
        const int64_t gk = k0 + kk;
        const int64_t gn = n0 + nn;
        b_tile[kk][nn] = (gk < g.k && gn < g.n) ? to_float(b[gk * g.b.row_stride + gn * g.b.col_stride]) : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < Tile::kK; ++kk) {
        float av[Tile::kRegM];
        float bv[Tile::kRegN];
#pragma unroll
        for (int i = 0; i < Tile::kRegM; ++i) av[i] = a_tile[kk][tm + i * Tile::kThreadsM];
#pragma unroll
        for (int j = 0; j < Tile::kRegN; ++j) bv[j] = b_tile[kk][tn + j * Tile::kThreadsN];
#pragma unroll
        for (int i = 0; i < Tile::kRegM; ++i) {
#pragma unroll
          for (int j = 0; j < Tile::kRegN; ++j) acc[i][j] += av[i] * bv[j];
        }
      }
      __syncthreads();
    }

    const float* c_in = g.beta != 0.0f ? g.c_in.batch_base(bi, hi) : nullptr;
    TC* c_out = g.c_out.batch_base(bi, hi);
#pragma unroll
    for (int i = 0; i < Tile::kRegM; ++i) {
      const int64_t gm = m0 + tm + i * Tile::kThreadsM;
      if (gm >= g.m) continue;
#pragma unroll
      for (int j = 0; j < Tile::kRegN; ++j) {
        const int64_t gn = n0 + tn + j * Tile::kThreadsN;
        if (gn >= g.n) continue;
        float v = g.alpha * acc[i][j];
        if (g.beta != 0.0f) v += g.beta * c_in[gm * g.c_in.row_stride + gn * g.c_in.col_stride];
        c_out[gm * g.c_out.row_stride + gn * g.c_out.col_stride] = from_float<TC>(v);
      }
    }
  }
}

template <typename TA, typename TB, typename TC>
cudaError_t launch_gemm(const GemmArgs<TA, TB, TC>& g, cudaStream_t stream) {
  const int64_t tiles = ceil_div<int64_t>(g.m, GemmTile::kM) * ceil_div<int64_t>(g.n, GemmTile::kN);
  gemm_naive_kernel<TA, TB, TC><<<grid_size(tiles * g.batch * g.heads, 1), GemmTile::kThreads, 0, stream>>>(g);
  return cudaGetLastError();
}

// C_out = alpha * sum_{g < group} A_g * B_g, with A_g = group_member(args.a, g, group) and likewise B_g
// (args.beta must be 0). For group > 1 the partial sums go through `acc`, an fp32 scratch of
// batch * heads * m * n floats, in the fixed order g = 0, 1, ...: deterministic, one rounding to TC at
// the end. `acc` is unused when group == 1.
template <typename TA, typename TB, typename TC>
cudaError_t launch_gemm_group_sum(const GemmArgs<TA, TB, TC>& args, int64_t group, float* acc,
                                  cudaStream_t stream) {
  if (group == 1) return launch_gemm(args, stream);
  // acc as a contiguous [batch, heads, m, n] matrix stack.
  const GemmOperand<float> acc_op = make_operand(acc, args.n, int64_t{1}, args.heads * args.m * args.n, args.m * args.n);
  for (int64_t g = 0; g + 1 < group; ++g) {
    GemmArgs<TA, TB, float> step;
    step.m = args.m;
    step.n = args.n;
    step.k = args.k;
    step.batch = args.batch;
    step.heads = args.heads;
    step.alpha = args.alpha;
    step.beta = g == 0 ? 0.0f : 1.0f;
    step.a = group_member(args.a, g, group);
    step.b = group_member(args.b, g, group);
    step.c_in = as_const(acc_op);
    step.c_out = acc_op;
    FA_CUDA_TRY(launch_gemm(step, stream));
  }
  GemmArgs<TA, TB, TC> last = args;
  last.beta = 1.0f;
  last.a = group_member(args.a, group - 1, group);
  last.b = group_member(args.b, group - 1, group);
  last.c_in = as_const(acc_op);
  return launch_gemm(last, stream);
}

}  // namespace fa::cuda
