// Human-readable sizes for error messages (out-of-memory reports of both backends).
#pragma once
#include <cstddef>
#include <ios>
#include <sstream>
#include <string>

namespace fa {

// "2.0 TiB", "1.5 GiB", "12.0 MiB" or "512 bytes".
inline std::string format_bytes(size_t bytes) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  if (bytes >= (size_t{1} << 40)) {
    os << static_cast<double>(bytes) / static_cast<double>(size_t{1} << 40) << " TiB";
  } else if (bytes >= (size_t{1} << 30)) {
    os << static_cast<double>(bytes) / (1 << 30) << " GiB";
  } else if (bytes >= (size_t{1} << 20)) {
    os << static_cast<double>(bytes) / (1 << 20) << " MiB";
  } else {
    os << bytes << " bytes";
  }
  return os.str();
}

}  // namespace fa
