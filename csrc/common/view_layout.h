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

// Whether some index difference of nested `v` reaches `r`: r = sum_k d_k * stride_k with
// |d_k| <= size_k - 1, over the dims order[k..n) (decreasing strides). `spans[k]` is the span of the
// dims after k, sum_{j > k} (size_j - 1) * stride_j, which is below stride_k (nested). So d_k is
// floor(r / stride_k) or one more (the two leave remainders in [0, stride_k) and [-stride_k, 0)):
// at most two branches a level, 2^rank leaves in all.
inline bool reaches_difference(const ViewLayout& v, const int order[], const int64_t spans[], int n, int k,
                               int64_t r) {
  if (k == n) return r == 0;
  const int64_t s = v.strides[order[k]], m = v.sizes[order[k]] - 1;
  const int64_t q = r >= 0 ? r / s : -((-r + s - 1) / s);  // floor(r / s)
  for (int64_t dk = q; dk <= q + 1; ++dk) {
    const int64_t rest = r - dk * s;
    if (dk >= -m && dk <= m && rest >= -spans[k] && rest <= spans[k] &&
        reaches_difference(v, order, spans, n, k + 1, rest)) {
      return true;
    }
  }
  return false;
}
}  // namespace detail

// Whether two nested views of the same storage share an element. Exact.
// - Same sizes and strides (e.g. the q, k and v views of one packed [B, S, 3, H, D] tensor): they
//   share an element iff the offset difference is a difference of two of the layout's indices, which
//   detail::reaches_difference decides in at most 2^rank steps.
// - Otherwise: walks the contiguous runs of `b` (its stride-1 dim, when it has one) and asks whether
//   `a` has an element inside each run, O(rank) per run (B * S * H runs for such a view; walking them
//   cost ~4 ms per pair for a [64, 256, 3, 6, 64] tensor, which the same-layout path avoids).
inline bool views_overlap(const ViewLayout& a, const ViewLayout& b) {
  const int64_t ea = view_extent(a), eb = view_extent(b);
  if (a.offset + ea <= b.offset || b.offset + eb <= a.offset) return false;
  int oa[kMaxViewRank] = {}, ob[kMaxViewRank] = {};  // view_order fills na and nb of them
  const int na = view_order(a, oa);
  const int nb = view_order(b, ob);
  bool same_layout = na == nb;
  for (int k = 0; k < na && same_layout; ++k) {
    same_layout = a.sizes[oa[k]] == b.sizes[ob[k]] && a.strides[oa[k]] == b.strides[ob[k]];
  }
  if (same_layout) {
    int64_t spans[kMaxViewRank];
    int64_t span = 0;
    for (int k = na - 1; k >= 0; --k) {
      spans[k] = span;
      span += (a.sizes[oa[k]] - 1) * a.strides[oa[k]];
    }
    return detail::reaches_difference(a, oa, spans, na, 0, b.offset - a.offset);
  }
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
