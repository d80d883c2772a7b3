// The strided copy-and-cast engine's params (csrc/cpu/copy_cpu.h, csrc/cuda/copy.h): one struct
// behind Tensor.contiguous(), clone(), cast(), to(), copyFrom() and fill(). Filled by the binding
// (csrc/napi/tensor_ops.cc) after it re-checked every extent against the storage: backends may rely
// on every invariant written here.
//
// Semantics: for every index i = (i_0, ..., i_{rank-1}) with 0 <= i_d < sizes[d],
//     dst[dst_offset + sum_d i_d * dst_strides[d]] = convert(src[src_offset + sum_d i_d * src_strides[d]])
// (fill: = convert(value)). Strides and offsets are in elements of each side's own dtype.
// convert: float -> float goes through float32 and rounds to nearest, ties to even (NaN stays NaN,
// overflow becomes +-Inf); int32 -> float32 / float16 / bfloat16 is the float32 nearest to the
// integer (exact up to 2^24), then rounded like a float; int32 -> int32 copies. float -> int32 is
// refused by the binding (no rounding mode is obviously right for token ids).
// The destination never overlaps itself (the binding checks it) and never overlaps the source
// unless both are the very same view with the same dtype (then the copy is skipped).
#pragma once
#include <cstdint>

#include "dtype.h"

namespace fa {

inline constexpr int kMaxCopyRank = 8;

struct CopyParams {
  int rank = 0;  // 1..kMaxCopyRank after coalesce_copy_dims
  int64_t sizes[kMaxCopyRank] = {};        // each >= 1
  int64_t src_strides[kMaxCopyRank] = {};  // elements, >= 0 (unused by fill)
  int64_t dst_strides[kMaxCopyRank] = {};  // elements, >= 0
  int64_t numel = 0;                       // product of sizes
  DType src_dtype = DType::kFloat32;
  DType dst_dtype = DType::kFloat32;
  const void* src = nullptr;  // first element of the source view (fill: unused)
  void* dst = nullptr;        // first element of the destination view
  // fill only: the value, already checked to be representable (an integer in int32's range for int32).
  double value = 0.0;
};

// Drops size-1 dims and merges neighbours d, d+1 wherever both sides are contiguous across them
// (stride[d] == stride[d+1] * size[d+1]), innermost last. A copy between two contiguous tensors
// becomes rank 1 with stride 1. Leaves rank >= 1.
inline void coalesce_copy_dims(CopyParams& p) {
  int r = 0;
  for (int d = 0; d < p.rank; ++d) {
    if (p.sizes[d] == 1) continue;
    if (r > 0 && p.src_strides[r - 1] == p.src_strides[d] * p.sizes[d] &&
        p.dst_strides[r - 1] == p.dst_strides[d] * p.sizes[d]) {
      p.sizes[r - 1] *= p.sizes[d];
      p.src_strides[r - 1] = p.src_strides[d];
      p.dst_strides[r - 1] = p.dst_strides[d];
      continue;
    }
    p.sizes[r] = p.sizes[d];
    p.src_strides[r] = p.src_strides[d];
    p.dst_strides[r] = p.dst_strides[d];
    ++r;
  }
  if (r == 0) {  // a single element
    p.sizes[0] = 1;
    p.src_strides[0] = 1;
    p.dst_strides[0] = 1;
    r = 1;
  }
  p.rank = r;
}

// Whether both sides are one dense run (rank 1, stride 1) after coalesce_copy_dims.
inline bool copy_is_contiguous(const CopyParams& p) {
  return p.rank == 1 && (p.sizes[0] == 1 || (p.src_strides[0] == 1 && p.dst_strides[0] == 1));
}

}  // namespace fa
