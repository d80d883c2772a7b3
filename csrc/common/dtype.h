// Element types shared by every layer. The numeric values are part of the JS <-> C++ contract:
// they come from csrc/enums.json (enum_codes.h, generated; lib/enum-codes.ts holds the same).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/enum_codes.h"

namespace fa {

enum class DType : int32_t {
  kFloat32 = codes::kDTypeFloat32,
  kFloat16 = codes::kDTypeFloat16,
  kBFloat16 = codes::kDTypeBfloat16,
  kInt32 = codes::kDTypeInt32,  // token ids and class targets; no arithmetic op takes it as a floating operand
};

inline constexpr size_t dtype_size(DType t) { return t == DType::kFloat32 || t == DType::kInt32 ? 4 : 2; }
inline constexpr bool dtype_is_float(DType t) { return t != DType::kInt32; }

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt32: return "int32";
  }
  return "unknown";
}

inline bool dtype_from_int(int32_t v, DType* out) {
  if (v < 0 || v > 3) return false;
  *out = static_cast<DType>(v);
  return true;
}

}  // namespace fa
