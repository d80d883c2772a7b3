// A strided view of one storage: sizes, element strides and an element offset. The checks the
// bindings run before any op reads or writes through views: the reachable extent, whether a view's
// elements are distinct, and whether two views of one storage share an element.
//
// Every view that lib/tensor.ts creates (view, reshape, narrow, select of a contiguous tensor) is
// "nested": ordered by stride, each stride is larger than the span of all smaller-stride dims,
//     stride_k > sum_{j : stride_j < stride_k} (size_j - 1) * stride_j,
// which makes its elements distinct and their addresses ordered like their indices. views_overlap
// relies on it (callers check nested() first).
#pragma once
#include <algorithm>
#include <cstdint>

namespace fa {

inline constexpr int kMaxViewRank = 8;

struct ViewLayout {
  int rank = 0;
  int64_t sizes[kMaxViewRank] = {};
  int64_t strides[kMaxViewRank] = {};
  int64_t offset = 0;
};

// 1 + the largest element index the view reaches relative to its offset (sum of (size - 1) * stride),
// or -1 if that does not fit in 62 bits. Sizes >= 1 and strides >= 0 are the caller's checks.
inline int64_t view_extent(const ViewLayout& v) {
  constexpr int64_t kLimit = int64_t{1} << 62;
  int64_t e = 1;
  for (int d = 0; d < v.rank; ++d) {
    const int64_t n = v.sizes[d] - 1;
    if (n == 0 || v.strides[d] == 0) continue;
    if (n > (kLimit - e) / v.strides[d]) return -1;
    e += n * v.strides[d];
  }
  return e;
}

// The dims of size > 1, ordered by decreasing stride. Returns how many.
inline int view_order(const ViewLayout& v, int order[kMaxViewRank]) {
  int n = 0;
  for (int d = 0; d < v.rank; ++d)
    if (v.sizes[d] > 1) order[n++] = d;
  for (int i = 1; i < n; ++i) {  // insertion sort: at most kMaxViewRank dims
    const int d = order[i];
    int j = i;
    for (; j > 0 && v.strides[order[j - 1]] < v.strides[d]; --j) order[j] = order[j - 1];
    order[j] = d;
  }
  return n;
}

// Whether the view is nested (see the top of this file); such a view never aliases itself.
inline bool view_nested(const ViewLayout& v) {
  int order[kMaxViewRank];
  const int n = view_order(v, order);
  int64_t span = 0;  // sum of (size - 1) * stride over the dims with smaller strides
  for (int k = n - 1; k >= 0; --k) {
    const int d = order[k];
    if (v.strides[d] <= span) return false;
    span += (v.sizes[d] - 1) * v.strides[d];
  }
  return true;
}

// Whether every element of the view is dense row-major (strides of a contiguous tensor of its sizes).
inline bool view_contiguous(const ViewLayout& v) {
  int64_t s = 1;
  for (int d = v.rank - 1; d >= 0; --d) {
    if (v.sizes[d] != 1 && v.strides[d] != s) return false;
    s *= v.sizes[d];
  }
  return true;
}

namespace detail {
// The largest address of nested view `v` that is <= y, or -1 when none is (every address is >= 0).
inline int64_t floor_member(const ViewLayout& v, const int order[], int n, int64_t y) {
  if (y < v.offset) return -1;
  int64_t r = y - v.offset;
  for (int k = 0; k < n; ++k) {
    const int d = order[k];
    const int64_t i = std::min(v.sizes[d] - 1, r / v.strides[d]);
    r -= i * v.strides[d];
  }
  return y - r;
}
}  // namespace detail

// Whether two nested views of the same storage share an element. Exact: walks the contiguous runs of
// `b` (its stride-1 dim, when it has one) and asks whether `a` has an element inside each run, which
// costs O(rank) per run (a packed dq/dk/dv of [B, S, 3, H, D] has B * S * H runs).
inline bool views_overlap(const ViewLayout& a, const ViewLayout& b) {
  const int64_t ea = view_extent(a), eb = view_extent(b);
  if (a.offset + ea <= b.offset || b.offset + eb <= a.offset) return false;
  int oa[kMaxViewRank], ob[kMaxViewRank];
  const int na = view_order(a, oa);
  const int nb = view_order(b, ob);
  // b's innermost dim is a run when its stride is 1.
  int64_t run = 1;
  int outer = nb;
  if (nb > 0 && b.strides[ob[nb - 1]] == 1) {
    run = b.sizes[ob[nb - 1]];
    outer = nb - 1;
  }
  int64_t idx[kMaxViewRank] = {};
  for (;;) {
    int64_t x = b.offset;
    for (int k = 0; k < outer; ++k) x += idx[k] * b.strides[ob[k]];
    if (detail::floor_member(a, oa, na, x + run - 1) >= x) return true;
    int k = outer - 1;
    for (; k >= 0; --k) {
      if (++idx[k] < b.sizes[ob[k]]) break;
      idx[k] = 0;
    }
    if (k < 0) return false;
  }
}

}  // namespace fa
