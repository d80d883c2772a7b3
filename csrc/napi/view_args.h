// Strided tensor arguments for the bindings: a tensor ([buffer, offset]) plus the sizes and element
// strides of the view, re-checked against the buffer (C++ never trusts a shape or a stride from JS).
#pragma once
#include <napi.h>

#include <string>

#include "common/view_layout.h"
#include "napi/addon.h"
#include "napi/dispatch.h"

namespace fa::napi {

// Largest size or stride accepted from JS: exactly representable as a JS number.
inline constexpr int64_t kMaxSafeInteger = (int64_t{1} << 53) - 1;

// Parses `sizes` (an Array of 1..kMaxViewRank positive integers whose product fits in 2^53) into
// v.sizes / v.rank. Throws a TypeError / RangeError naming `arg`.
inline void sizes_arg(const Napi::Value& value, const char* arg, ViewLayout* v) {
  if (!value.IsArray() || value.As<Napi::Array>().Length() < 1 ||
      value.As<Napi::Array>().Length() > static_cast<uint32_t>(kMaxViewRank)) {
    throw type_error(std::string("Expected ") + arg + " to be an Array of 1 to " + std::to_string(kMaxViewRank) +
                     " sizes but received " + describe(value));
  }
  auto a = value.As<Napi::Array>();
  v->rank = static_cast<int>(a.Length());
  int64_t numel = 1;
  for (uint32_t i = 0; i < a.Length(); ++i) {
    v->sizes[i] = int_arg(a.Get(i), arg, 1, kMaxSafeInteger);
    if (v->sizes[i] > kMaxSafeInteger / numel) {
      throw range_error(std::string("Expected ") + arg + " to have fewer than 2^53 elements");
    }
    numel *= v->sizes[i];
  }
}

// Parses `strides` (an Array of v->rank integers >= 0) into v->strides. Undefined means contiguous.
inline void strides_arg(const Napi::Value& value, const char* arg, ViewLayout* v) {
  if (value.IsUndefined()) {
    int64_t s = 1;
    for (int d = v->rank - 1; d >= 0; --d) {
      v->strides[d] = s;
      s *= v->sizes[d];
    }
    return;
  }
  if (!value.IsArray() || value.As<Napi::Array>().Length() != static_cast<uint32_t>(v->rank)) {
    throw type_error(std::string("Expected ") + arg + " to be an Array of " + std::to_string(v->rank) +
                     " strides but received " + describe(value));
  }
  auto a = value.As<Napi::Array>();
  for (int d = 0; d < v->rank; ++d) v->strides[d] = int_arg(a.Get(static_cast<uint32_t>(d)), arg, 0, kMaxSafeInteger);
}

inline int64_t numel_of(const ViewLayout& v) {
  int64_t n = 1;
  for (int d = 0; d < v.rank; ++d) n *= v.sizes[d];
  return n;
}

// Checks that the view lies inside t's buffer (a RangeError naming `arg`) and is nested (distinct
// elements; view_layout.h). Sets v->offset from t.
inline void expect_view(const TensorArg& t, const char* arg, ViewLayout* v) {
  v->offset = t.offset;
  const int64_t extent = view_extent(*v);
  if (extent < 0) throw range_error(std::string("Expected ") + arg + " to reach fewer than 2^62 elements");
  expect_extent(t, arg, t.device(), extent);
  if (!view_nested(*v)) {
    throw range_error(std::string("Expected ") + arg +
                      " to be a view whose elements are distinct (each stride larger than the span of the "
                      "dims with smaller strides) but it is not");
  }
}

// Whether two checked views share an element of one storage.
inline bool share_elements(const TensorArg& a, const ViewLayout& va, const TensorArg& b, const ViewLayout& vb) {
  return a.buf.get() == b.buf.get() && views_overlap(va, vb);
}

}  // namespace fa::napi
