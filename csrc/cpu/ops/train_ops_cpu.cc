// CPU backend of embedding, cross-entropy, AdamW and the reductions (ops_cpu.h).
//
// Every op splits its work into blocks whose boundaries depend only on the problem's sizes (never on
// the number of threads), runs the blocks over the pool, and combines partial results in block
// order: results are bit-identical for any thread count. The dtype is dispatched once per op (a
// template instantiation per dtype), never per element.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "common/half.h"
#include "cpu/cpu_buffer.h"
#include "cpu/ops/ops_cpu.h"
#include "cpu/thread_pool.h"
#include "runtime/error.h"

namespace fa::cpu {

namespace {

// Elements of work per pool index: large enough to amortise the pool's per-index cost, small enough
// to balance two to a few dozen workers.
constexpr int64_t kGrain = 16384;
// Elements per partial sum of the flat reductions (sum, norm_of): a fixed size, so that the
// partials, and their order, do not depend on the thread count.
constexpr int64_t kReduceChunk = 16384;
// Independent float32 accumulators inside one chunk (they vectorise, and shorten each sum chain).
constexpr int kLanes = 8;
// Rows per partial of column_sum.
constexpr int64_t kColumnRowBlock = 256;
// Columns per task of column_sum.
constexpr int64_t kColumnBlock = 512;
// Distinct ids per task of the embedding backward.
constexpr int64_t kIdsPerTask = 16;

// Storage types: load to float32, store from float32 (round to nearest even).
struct F32 {
  using T = float;
  static float load(T x) { return x; }
  static T store(float x) { return x; }
};
// float16 -> float32 through a table of all 65536 values (256 KiB, built when the addon loads): the
// scalar conversion's branches cost more than the rest of most ops.
std::vector<float> make_f16_table() {
  std::vector<float> t(size_t{1} << 16);
  for (size_t h = 0; h < t.size(); ++h) t[h] = f16_to_f32(static_cast<uint16_t>(h));
  return t;
}
const std::vector<float> kF16Table = make_f16_table();
struct F16 {
  using T = uint16_t;
  static float load(T x) { return kF16Table[x]; }
  static T store(float x) { return f32_to_f16(x); }
};
struct BF16 {
  using T = uint16_t;
  static float load(T x) { return bf16_to_f32(x); }
  static T store(float x) { return f32_to_bf16(x); }
};

// Calls fn(F32{}), fn(F16{}) or fn(BF16{}) for a floating dtype.
template <class Fn>
void dispatch_float(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32: fn(F32{}); return;
    case DType::kFloat16: fn(F16{}); return;
    case DType::kBFloat16: fn(BF16{}); return;
    case DType::kInt32: break;
  }
  throw Error(std::string("internal: a floating dtype was expected but received ") + dtype_name(dtype));
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Rows per pool index for row-wise work on rows of `cols` elements.
int64_t rows_per_task(int64_t cols) { return std::max<int64_t>(1, kGrain / std::max<int64_t>(1, cols)); }

// Runs fn(first_row, end_row) over [0, rows) in blocks of rows_per_task(cols) rows.
template <class Fn>
void for_row_blocks(ThreadPool& pool, int64_t rows, int64_t cols, Fn&& fn) {
  const int64_t per = rows_per_task(cols);
  pool.parallel_for(ceil_div(rows, per), [&](int64_t b, int) { fn(b * per, std::min(rows, (b + 1) * per)); });
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();

// Sum (or sum of squares) of n elements in kLanes interleaved float32 accumulators, combined in a
// fixed order.
template <class S, bool kSquare>
float chunk_sum(const typename S::T* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const float v = S::load(x[i + l]);
      acc[l] += kSquare ? v * v : v;
    }
  }
  for (int l = 0; i < n; ++i, ++l) {
    const float v = S::load(x[i]);
    acc[l] += kSquare ? v * v : v;
  }
  float s = 0.0f;
  for (int l = 0; l < kLanes; ++l) s += acc[l];
  return s;
}

// One chunk of one tensor of a flat reduction.
struct Chunk {
  const void* data;
  int64_t numel;
  DType dtype;
};

// Partial sums of every chunk over the pool, combined in chunk order. float32 partials, combined
// in double and rounded once.
template <bool kSquare>
float reduce_chunks(const std::vector<Chunk>& chunks, float* partials, ThreadPool& pool) {
  pool.parallel_for(static_cast<int64_t>(chunks.size()), [&](int64_t c, int) {
    const Chunk& ch = chunks[static_cast<size_t>(c)];
    dispatch_float(ch.dtype, [&](auto tag) {
      using S = decltype(tag);
      partials[c] = chunk_sum<S, kSquare>(static_cast<const typename S::T*>(ch.data), ch.numel);
    });
  });
  double total = 0.0;
  for (size_t c = 0; c < chunks.size(); ++c) total += partials[c];
  return static_cast<float>(total);
}

void append_chunks(std::vector<Chunk>* chunks, const void* data, int64_t numel, DType dtype) {
  const char* base = static_cast<const char*>(data);
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t i = 0; i < numel; i += kReduceChunk) {
    chunks->push_back({base + i * esize, std::min(kReduceChunk, numel - i), dtype});
  }
}

int64_t chunk_count(int64_t numel) { return ceil_div(numel, kReduceChunk); }

}  // namespace

// ---- embedding ------------------------------------------------------------------------------------

void embedding_fwd(const EmbeddingParams& p, ThreadPool& pool) {
  dispatch_float(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    using T = typename S::T;
    const T* table = static_cast<const T*>(p.table);
    T* out = static_cast<T*>(p.out);
    const T nan = S::store(kNaN);
    for_row_blocks(pool, p.rows, p.dim, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t id = p.ids[r];
        T* dst = out + r * p.dim;  // [dim]
        if (id < 0 || id >= p.vocab) {
          std::fill(dst, dst + p.dim, nan);
        } else {
          std::memcpy(dst, table + id * p.dim, static_cast<size_t>(p.dim) * sizeof(T));
        }
      }
    });
  });
}

void embedding_bwd(const EmbeddingParams& p, ThreadPool& pool) {
  // Group the rows by id (a stable counting sort): each dtable row then receives its contributions
  // in increasing row order, whatever the thread count, and no two tasks write the same row.
  std::vector<int64_t> start(static_cast<size_t>(p.vocab) + 1, 0);  // [vocab + 1]
  for (int64_t r = 0; r < p.rows; ++r) {
    const int64_t id = p.ids[r];
    if (id >= 0 && id < p.vocab) ++start[static_cast<size_t>(id) + 1];
  }
  std::vector<int64_t> distinct;  // ids that occur, increasing
  for (int64_t v = 0; v < p.vocab; ++v) {
    if (start[static_cast<size_t>(v) + 1] > 0) distinct.push_back(v);
    start[static_cast<size_t>(v) + 1] += start[static_cast<size_t>(v)];
  }
  std::vector<int64_t> order(static_cast<size_t>(start[static_cast<size_t>(p.vocab)]));  // rows grouped by id
  {
    std::vector<int64_t> next(start.begin(), start.end() - 1);
    for (int64_t r = 0; r < p.rows; ++r) {
      const int64_t id = p.ids[r];
      if (id >= 0 && id < p.vocab) order[static_cast<size_t>(next[static_cast<size_t>(id)]++)] = r;
    }
  }
  const int64_t tasks = ceil_div(static_cast<int64_t>(distinct.size()), kIdsPerTask);
  dispatch_float(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    using T = typename S::T;
    const T* dout = static_cast<const T*>(p.dout);
    pool.parallel_for(tasks, [&](int64_t t, int) {
      const int64_t end = std::min<int64_t>(static_cast<int64_t>(distinct.size()), (t + 1) * kIdsPerTask);
      for (int64_t k = t * kIdsPerTask; k < end; ++k) {
        const int64_t id = distinct[static_cast<size_t>(k)];
        float* dst = p.dtable + id * p.dim;  // [dim]
        for (int64_t j = start[static_cast<size_t>(id)]; j < start[static_cast<size_t>(id) + 1]; ++j) {
          const T* src = dout + order[static_cast<size_t>(j)] * p.dim;
          for (int64_t c = 0; c < p.dim; ++c) dst[c] += S::load(src[c]);
        }
      }
    });
  });
}

// ---- cross-entropy ---------------------------------------------------------------------------------

size_t cross_entropy_workspace_bytes(const CrossEntropyParams& p) {
  // The per-row losses before the reduction (kNone writes them to `loss` directly).
  return p.reduction == Reduction::kNone ? 0 : static_cast<size_t>(p.rows) * sizeof(float);
}

void cross_entropy(const CrossEntropyParams& p, ThreadPool& pool) {
  // The gradient of kMean needs the number of counted rows first.
  int64_t counted = 0;
  for (int64_t r = 0; r < p.rows; ++r) counted += p.targets[r] != p.ignore_index;
  const float weight = p.reduction == Reduction::kMean ? 1.0f / static_cast<float>(counted) : 1.0f;
  const float gscale = p.grad_scale * weight;

  std::vector<float> own_rows;
  float* row_loss = p.loss;  // [rows]
  if (p.reduction != Reduction::kNone) {
    if (p.workspace != nullptr) {
      row_loss = static_cast<float*>(p.workspace);
    } else {
      own_rows.resize(static_cast<size_t>(p.rows));
      row_loss = own_rows.data();
    }
  }
  // One row of exponentials per worker.
  FloatBuffer scratch(static_cast<size_t>(pool.size()) * static_cast<size_t>(p.vocab));

  dispatch_float(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    using T = typename S::T;
    const T* logits = static_cast<const T*>(p.logits);
    T* dlogits = static_cast<T*>(p.dlogits);
    const T zero = S::store(0.0f);
    const T nan = S::store(kNaN);
    const int64_t per = rows_per_task(p.vocab);
    pool.parallel_for(ceil_div(p.rows, per), [&](int64_t b, int worker) {
      float* e = scratch.data() + static_cast<int64_t>(worker) * p.vocab;  // [vocab]
      const int64_t r1 = std::min(p.rows, (b + 1) * per);
      for (int64_t r = b * per; r < r1; ++r) {
        const int64_t t = p.targets[r];
        T* drow = dlogits ? dlogits + r * p.vocab : nullptr;  // [vocab]
        if (t == p.ignore_index) {
          row_loss[r] = 0.0f;
          if (drow) std::fill(drow, drow + p.vocab, zero);
          continue;
        }
        if (t < 0 || t >= p.vocab) {
          row_loss[r] = kNaN;
          if (drow) std::fill(drow, drow + p.vocab, nan);
          continue;
        }
        const T* x = logits + r * p.vocab;  // [vocab]
        float mx = -std::numeric_limits<float>::infinity();
        bool has_nan = false;
        for (int64_t j = 0; j < p.vocab; ++j) {
          const float v = S::load(x[j]);
          has_nan |= std::isnan(v);
          mx = std::max(mx, v);
        }
        if (has_nan) mx = kNaN;  // a NaN logit makes the whole row NaN
        float sum = 0.0f;
        for (int64_t j = 0; j < p.vocab; ++j) {
          e[j] = std::exp(S::load(x[j]) - mx);
          sum += e[j];
        }
        const float lse = mx + std::log(sum);
        row_loss[r] = lse - S::load(x[t]);
        if (drow) {
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j < p.vocab; ++j) drow[j] = S::store(gscale * (e[j] * inv - (j == t ? 1.0f : 0.0f)));
        }
      }
    });
  });

  if (p.reduction != Reduction::kNone) {
    double total = 0.0;  // rows in order: deterministic
    for (int64_t r = 0; r < p.rows; ++r) total += row_loss[r];
    p.loss[0] = p.reduction == Reduction::kMean ? static_cast<float>(total / static_cast<double>(counted))
                                                : static_cast<float>(total);
  }
}

// ---- AdamW -------------------------------------------------------------------------------------------

namespace {

// Elements [begin, end) of one AdamW step; kMaster: the float32 weights live in p.master.
template <class S, bool kMaster>
void adamw_range(const AdamWParams& p, float gmul, int64_t begin, int64_t end) {
  using T = typename S::T;
  T* __restrict__ param = static_cast<T*>(p.param);
  float* __restrict__ master = p.master;
  const float* __restrict__ grad = p.grad;
  float* __restrict__ m1 = p.m;
  float* __restrict__ m2 = p.v;
  const float decay = p.lr * p.weight_decay;
  const float b1 = p.beta1, b2 = p.beta2, c1 = 1.0f - p.beta1, c2 = 1.0f - p.beta2;
  const float bc1 = p.bias_correction1, bc2 = p.bias_correction2, lr = p.lr, eps = p.eps;
  for (int64_t i = begin; i < end; ++i) {
    const float g = grad[i] * gmul;
    float w = kMaster ? master[i] : S::load(param[i]);
    w -= decay * w;
    const float m = b1 * m1[i] + c1 * g;
    const float v = b2 * m2[i] + c2 * (g * g);
    m1[i] = m;
    m2[i] = v;
    w -= lr * (m / bc1) / (std::sqrt(v / bc2) + eps);
    if (kMaster) master[i] = w;
    param[i] = S::store(w);
  }
}

}  // namespace

void adamw(const AdamWParams& p, ThreadPool& pool) {
  float clip = 1.0f;
  if (p.clip_norm != nullptr) clip = std::min(1.0f, p.max_norm / (*p.clip_norm + 1e-6f));
  const float gmul = p.grad_scale * clip;
  dispatch_float(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    pool.parallel_for(ceil_div(p.numel, kGrain), [&](int64_t b, int) {
      const int64_t begin = b * kGrain, end = std::min(p.numel, begin + kGrain);
      if (p.master) {
        adamw_range<S, true>(p, gmul, begin, end);
      } else {
        adamw_range<S, false>(p, gmul, begin, end);
      }
    });
  });
}

// ---- reductions ------------------------------------------------------------------------------------

size_t norm_of_workspace_bytes(const NormOfParams& p) {
  int64_t chunks = 0;
  for (const TensorSpan& t : p.tensors) chunks += chunk_count(t.numel);
  return static_cast<size_t>(chunks) * sizeof(float);
}

void norm_of(const NormOfParams& p, ThreadPool& pool) {
  std::vector<Chunk> chunks;
  for (const TensorSpan& t : p.tensors) append_chunks(&chunks, t.data, t.numel, t.dtype);
  std::vector<float> own;
  float* partials = static_cast<float*>(p.workspace);
  if (partials == nullptr) {
    own.resize(chunks.size());
    partials = own.data();
  }
  p.out[0] = std::sqrt(reduce_chunks<true>(chunks, partials, pool));
}

size_t sum_workspace_bytes(const SumParams& p) { return static_cast<size_t>(chunk_count(p.numel)) * sizeof(float); }

void sum(const SumParams& p, ThreadPool& pool) {
  std::vector<Chunk> chunks;
  append_chunks(&chunks, p.x, p.numel, p.dtype);
  std::vector<float> own;
  float* partials = static_cast<float*>(p.workspace);
  if (partials == nullptr) {
    own.resize(chunks.size());
    partials = own.data();
  }
  p.out[0] = reduce_chunks<false>(chunks, partials, pool);
}

size_t column_sum_workspace_bytes(const ColumnSumParams& p) {
  const int64_t blocks = ceil_div(p.rows, kColumnRowBlock);
  return blocks == 1 ? 0 : static_cast<size_t>(blocks) * static_cast<size_t>(p.cols) * sizeof(float);
}

void column_sum(const ColumnSumParams& p, ThreadPool& pool) {
  // Rows in fixed blocks of kColumnRowBlock, each summed in row order into its own partial row
  // [cols]; then the partials in block order. One block: straight into out.
  const int64_t row_blocks = ceil_div(p.rows, kColumnRowBlock);
  const int64_t col_blocks = ceil_div(p.cols, kColumnBlock);
  std::vector<float> own;
  float* partials = static_cast<float*>(p.workspace);  // [row_blocks, cols]
  if (row_blocks > 1 && partials == nullptr) {
    own.resize(static_cast<size_t>(row_blocks) * static_cast<size_t>(p.cols));
    partials = own.data();
  }
  dispatch_float(p.dtype, [&](auto tag) {
    using S = decltype(tag);
    using T = typename S::T;
    const T* x = static_cast<const T*>(p.x);
    // Sums rows [r0, r1) of columns [c0, c1) into dst[0, c1 - c0).
    auto block_sum = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1, float* dst) {
      const int64_t n = c1 - c0;
      for (int64_t c = 0; c < n; ++c) dst[c] = 0.0f;
      for (int64_t r = r0; r < r1; ++r) {
        const T* row = x + r * p.cols + c0;
        for (int64_t c = 0; c < n; ++c) dst[c] += S::load(row[c]);
      }
    };
    if (row_blocks == 1) {
      pool.parallel_for(col_blocks, [&](int64_t cb, int) {
        const int64_t c0 = cb * kColumnBlock, c1 = std::min(p.cols, c0 + kColumnBlock);
        float acc[kColumnBlock];
        block_sum(0, p.rows, c0, c1, acc);
        for (int64_t c = c0; c < c1; ++c) p.out[c] = p.accumulate ? p.out[c] + acc[c - c0] : acc[c - c0];
      });
      return;
    }
    pool.parallel_for(row_blocks * col_blocks, [&](int64_t task, int) {
      const int64_t rb = task / col_blocks, cb = task % col_blocks;
      const int64_t c0 = cb * kColumnBlock, c1 = std::min(p.cols, c0 + kColumnBlock);
      block_sum(rb * kColumnRowBlock, std::min(p.rows, (rb + 1) * kColumnRowBlock), c0, c1,
                partials + rb * p.cols + c0);
    });
    pool.parallel_for(col_blocks, [&](int64_t cb, int) {
      const int64_t c0 = cb * kColumnBlock, c1 = std::min(p.cols, c0 + kColumnBlock);
      for (int64_t c = c0; c < c1; ++c) {
        float s = 0.0f;
        for (int64_t rb = 0; rb < row_blocks; ++rb) s += partials[rb * p.cols + c];
        p.out[c] = p.accumulate ? p.out[c] + s : s;
      }
    });
  });
}

}  // namespace fa::cpu
