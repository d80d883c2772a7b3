// Host-side checks the FA2 launchers share before they accept a call: 16-byte alignment of the
// tensors (the cp.async / TMA granule) and strides in whole granules (the device's attributes:
// cuda/device_props.h). Plain C++ (CUDA runtime API only).
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <initializer_list>

#include "common/attention_params.h"

namespace fa::cuda::flash {

inline constexpr uintptr_t kCopyAlignBytes = 16;

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % kCopyAlignBytes == 0; }

// True when every stride is a multiple of `elems`.
inline bool strides_multiple_of(std::initializer_list<int64_t> strides, int64_t elems) {
  for (int64_t s : strides)
    if (s % elems != 0) return false;
  return true;
}

// Why a forward call's tensors do not suit the kernels' 16-byte copies (q, k, v and out 16-byte
// aligned, every stride a multiple of `elems` elements), or nullptr. `strides_reason` is the
// sentence naming that multiple.
inline const char* fwd_layout_reason(const AttentionFwdParams& p, int64_t elems, const char* strides_reason) {
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.out))
    return "q, k, v and out must be 16-byte aligned";
  if (!strides_multiple_of({p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.k_batch_stride, p.k_row_stride,
                            p.k_head_stride, p.v_batch_stride, p.v_row_stride, p.v_head_stride, p.o_batch_stride,
                            p.o_row_stride, p.o_head_stride},
                           elems))
    return strides_reason;
  return nullptr;
}
// The same for a backward call: dout and the gradients too.
inline const char* bwd_layout_reason(const AttentionBwdParams& p, int64_t elems, const char* strides_reason) {
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.out) || !aligned16(p.dout) ||
      !aligned16(p.dq) || !aligned16(p.dk) || !aligned16(p.dv))
    return "q, k, v, out, dout and the gradients must be 16-byte aligned";
  if (!strides_multiple_of({p.q_batch_stride, p.q_row_stride, p.q_head_stride, p.k_batch_stride, p.k_row_stride,
                            p.k_head_stride, p.v_batch_stride, p.v_row_stride, p.v_head_stride, p.o_batch_stride,
                            p.o_row_stride, p.o_head_stride, p.do_batch_stride, p.do_row_stride, p.do_head_stride,
                            p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride, p.dk_batch_stride, p.dk_row_stride,
                            p.dk_head_stride, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride},
                           elems))
    return strides_reason;
  return nullptr;
}

}  // namespace fa::cuda::flash
