// The CPU copy-and-cast engine behind copy_cpu.h. The coalesced copy is cut into rows (the innermost
// dim) and rows are grouped into chunks of about kChunkElems elements handed to the thread pool; a
// row converts element by element (the compiler vectorises the dense same-dtype case into memcpy).
#include "cpu/copy_cpu.h"

#include <algorithm>
#include <cstring>

#include "common/half.h"
#include "cpu/thread_pool.h"

namespace fa::cpu {

namespace {

// Elements per thread-pool task: large enough to amortise the hand-out, small enough to balance.
constexpr int64_t kChunkElems = int64_t{1} << 16;

float load_f32(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kFloat16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::kInt32: return static_cast<float>(static_cast<const int32_t*>(base)[i]);
  }
  return 0.0f;
}

void store_f32(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(base)[i] = v; break;
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = f32_to_f16(v); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); break;
    case DType::kInt32: break;  // float -> int32 is refused by the binding
  }
}

// One row of `n` elements: src[s0 + k * ss] -> dst[d0 + k * ds].
void copy_row(const CopyParams& p, int64_t s0, int64_t d0, int64_t n, int64_t ss, int64_t ds) {
  if (p.src_dtype == p.dst_dtype) {
    const size_t elem = dtype_size(p.src_dtype);
    const auto* s = static_cast<const char*>(p.src);
    auto* d = static_cast<char*>(p.dst);
    if (ss == 1 && ds == 1) {
      std::memcpy(d + d0 * elem, s + s0 * elem, static_cast<size_t>(n) * elem);
    } else if (elem == 4) {
      for (int64_t k = 0; k < n; ++k) std::memcpy(d + (d0 + k * ds) * 4, s + (s0 + k * ss) * 4, 4);
    } else {
      for (int64_t k = 0; k < n; ++k) std::memcpy(d + (d0 + k * ds) * 2, s + (s0 + k * ss) * 2, 2);
    }
    return;
  }
  for (int64_t k = 0; k < n; ++k) store_f32(p.dst, p.dst_dtype, d0 + k * ds, load_f32(p.src, p.src_dtype, s0 + k * ss));
}

void fill_row(const CopyParams& p, int64_t d0, int64_t n, int64_t ds) {
  if (p.dst_dtype == DType::kInt32) {
    auto* d = static_cast<int32_t*>(p.dst);
    const auto v = static_cast<int32_t>(p.value);
    for (int64_t k = 0; k < n; ++k) d[d0 + k * ds] = v;
    return;
  }
  const auto v = static_cast<float>(p.value);
  for (int64_t k = 0; k < n; ++k) store_f32(p.dst, p.dst_dtype, d0 + k * ds, v);
}

// Runs row_fn(src_offset, dst_offset, first, count) over every row (all dims but the innermost) of a
// coalesced p, elements [first, first + count) of the row, in tasks of about kChunkElems elements over
// the pool: several short rows per task, or a long row (a dense copy is one row) cut into pieces.
template <typename RowFn>
void for_each_row(const CopyParams& p, ThreadPool& pool, RowFn&& row_fn) {
  const int inner = p.rank - 1;
  const int64_t row_len = p.sizes[inner];
  const int64_t rows = p.numel / row_len;
  const int64_t rows_per_task = std::max<int64_t>(1, kChunkElems / row_len);
  const int64_t pieces = row_len > kChunkElems ? (row_len + kChunkElems - 1) / kChunkElems : 1;
  const int64_t piece_len = (row_len + pieces - 1) / pieces;
  const int64_t tasks = pieces > 1 ? rows * pieces : (rows + rows_per_task - 1) / rows_per_task;
  const auto row_offsets = [&](int64_t r, int64_t* so, int64_t* dof) {
    int64_t rem = r;
    *so = 0;
    *dof = 0;
    for (int d = inner - 1; d >= 0; --d) {
      const int64_t i = rem % p.sizes[d];
      rem /= p.sizes[d];
      *so += i * p.src_strides[d];
      *dof += i * p.dst_strides[d];
    }
  };
  auto run_task = [&](int64_t task, int) {
    int64_t so, dof;
    if (pieces > 1) {
      const int64_t r = task / pieces, first = (task % pieces) * piece_len;
      row_offsets(r, &so, &dof);
      row_fn(so, dof, first, std::min(piece_len, row_len - first));
      return;
    }
    const int64_t r1 = std::min(rows, (task + 1) * rows_per_task);
    for (int64_t r = task * rows_per_task; r < r1; ++r) {
      row_offsets(r, &so, &dof);
      row_fn(so, dof, int64_t{0}, row_len);
    }
  };
  if (tasks == 1) {
    run_task(0, 0);
  } else {
    pool.parallel_for(tasks, run_task);
  }
}

}  // namespace

void copy(const CopyParams& params, ThreadPool& pool) {
  CopyParams p = params;
  coalesce_copy_dims(p);
  const int inner = p.rank - 1;
  const int64_t ss = p.src_strides[inner], ds = p.dst_strides[inner];
  for_each_row(p, pool, [&](int64_t so, int64_t dof, int64_t first, int64_t count) {
    copy_row(p, so + first * ss, dof + first * ds, count, ss, ds);
  });
}

void fill(const CopyParams& params, ThreadPool& pool) {
  CopyParams p = params;
  for (int d = 0; d < p.rank; ++d) p.src_strides[d] = p.dst_strides[d];  // coalesce by dst alone
  coalesce_copy_dims(p);
  const int inner = p.rank - 1;
  const int64_t ds = p.dst_strides[inner];
  for_each_row(p, pool, [&](int64_t, int64_t dof, int64_t first, int64_t count) {
    fill_row(p, dof + first * ds, count, ds);
  });
}

}  // namespace fa::cpu
