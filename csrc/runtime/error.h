// Errors raised by the runtime and the backends. The N-API layer maps the kind to the JS error class
// (TypeError, RangeError or Error) and keeps the message as it is: messages name the argument, what
// was expected and what was received.
#pragma once
#include <stdexcept>
#include <string>

namespace fa {

class Error : public std::runtime_error {
 public:
  enum class Kind { kGeneric, kType, kRange };
  explicit Error(const std::string& msg, Kind kind = Kind::kGeneric) : std::runtime_error(msg), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

inline Error type_error(const std::string& msg) {
  return Error(msg, Error::Kind::kType);
}
inline Error range_error(const std::string& msg) {
  return Error(msg, Error::Kind::kRange);
}

}  // namespace fa
