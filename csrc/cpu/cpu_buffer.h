// Workspace helpers: a 64-byte aligned fp32 buffer (throws std::bad_alloc when it cannot be
// allocated), the layout of one worker's (or work item's) scratch, and overflow-checked sizes.
#pragma once

#include <cstddef>
#include <limits>
#include <new>

namespace fa::cpu {

class FloatBuffer {
 public:
  static constexpr std::align_val_t kAlign{64};  // one cache line / one AVX-512 vector

  explicit FloatBuffer(size_t count) {
    if (count == 0) count = 1;
    if (count > std::numeric_limits<size_t>::max() / sizeof(float)) throw std::bad_alloc();
    data_ = static_cast<float*>(::operator new(count * sizeof(float), kAlign));
  }
  ~FloatBuffer() { ::operator delete(data_, kAlign); }
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;

  float* data() const { return data_; }

 private:
  float* data_ = nullptr;
};

// Carves one worker's (or work item's) scratch into regions that each start on a 64-byte boundary.
class ScratchLayout {
 public:
  // Returns the offset, in floats from the scratch's base, of a new region of `floats` floats.
  size_t take(size_t floats) {
    constexpr size_t kFloatsPerLine = 64 / sizeof(float);
    const size_t offset = size_;
    size_ += (floats + kFloatsPerLine - 1) / kFloatsPerLine * kFloatsPerLine;
    return offset;
  }
  size_t size() const { return size_; }  // floats in all

 private:
  size_t size_ = 0;
};

// a * b for workspace sizes, throwing std::bad_alloc instead of wrapping around.
inline size_t checked_mul(size_t a, size_t b) {
  if (a != 0 && b > std::numeric_limits<size_t>::max() / a) throw std::bad_alloc();
  return a * b;
}

}  // namespace fa::cpu
