// The plain parameter structs of the training ops around attention (embedding, norms, RoPE,
// activations, residual add, cross-entropy, AdamW, gradient norm, reductions). Every backend (the
// CPU ops in csrc/cpu/ops, the CUDA kernels in csrc/cuda/ops) receives one of these after lib/ and
// csrc/napi validated the call: backends may rely on every invariant written here.
//
// Conventions shared by every op:
//  - Sizes are >= 1. Tensors are contiguous and row-major unless a struct gives strides (in
//    elements). Pointers point at the first element of the view (the buffer's offset is applied).
//    A view's offset may leave a pointer aligned to its element size only: a backend that uses
//    vector loads checks the alignment of every pointer and row length and takes a scalar path
//    otherwise.
//  - `dtype` is the dtype of the activations (x, out, dout, dx...): float32, float16 or bfloat16.
//    Computation is float32 for every dtype; results are rounded to nearest even once, on store.
//  - Gradients of parameters (dweight, dbias, dtable) and optimizer state are float32 and are
//    ACCUMULATED (+=), so that several backward calls (micro-batches, tied weights) add up; the
//    training loop zeroes them. Activation gradients (dx) are written (=), in the dtype.
//  - Rows are the flattened leading dims: a [batch, seqlen, C] tensor is rows = batch * seqlen,
//    cols = C.
//  - Outputs never alias inputs unless the struct says so (in-place ops).
#pragma once
#include <cstdint>
#include <vector>

#include "dtype.h"

namespace fa {

// ---- embedding -----------------------------------------------------------------------------------
// Forward: out[i, :] = table[ids[i], :]. An id outside [0, vocab) gives a row of NaN (the kernel
// never reads outside the table); lib/ checks ids it uploads itself.
// Backward: dtable[ids[i], :] += dout[i, :] (float32); rows with an id outside [0, vocab) add nothing.
struct EmbeddingParams {
  int64_t rows = 0;   // number of ids
  int64_t vocab = 0;  // rows of the table
  int64_t dim = 0;    // columns of the table
  DType dtype = DType::kFloat32;  // of table, out, dout
  const int32_t* ids = nullptr;   // [rows]
  const void* table = nullptr;    // [vocab, dim]            forward
  void* out = nullptr;            // [rows, dim]             forward
  const void* dout = nullptr;     // [rows, dim]             backward
  float* dtable = nullptr;        // [vocab, dim] float32 += backward
};

// ---- RMSNorm and LayerNorm -------------------------------------------------------------------------
// RMSNorm:   rstd = 1 / sqrt(mean(x^2) + eps);            out = x * rstd * weight
// LayerNorm: mean = mean(x); rstd = 1 / sqrt(var(x) + eps); out = (x - mean) * rstd * weight + bias
// (var is the biased variance, as PyTorch's layer_norm.) weight and bias have the dtype of x.
// Backward (xhat = (x - mean) * rstd, or x * rstd for RMSNorm; g = dout * weight):
//   RMSNorm:   dx = rstd * (g - xhat * mean(g * xhat))
//   LayerNorm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   dweight += sum over rows of dout * xhat;  dbias += sum over rows of dout (LayerNorm)
struct NormParams {
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kFloat32;
  float eps = 1e-5f;           // finite, >= 0
  bool layer_norm = false;     // false: RMSNorm (mean and bias unused)
  const void* x = nullptr;     // [rows, cols]
  const void* weight = nullptr;  // [cols]
  const void* bias = nullptr;    // [cols], LayerNorm forward only; may be null (no bias)
  // Forward outputs.
  void* out = nullptr;         // [rows, cols]
  float* mean = nullptr;       // [rows], LayerNorm only
  float* rstd = nullptr;       // [rows]
  // Backward: inputs x, weight, mean, rstd (as the forward wrote them) and dout; outputs dx, and the
  // accumulated parameter gradients (dbias may be null: no bias).
  const void* dout = nullptr;  // [rows, cols]
  const float* mean_in = nullptr;
  const float* rstd_in = nullptr;
  void* dx = nullptr;          // [rows, cols]
  float* dweight = nullptr;    // [cols] float32 +=
  float* dbias = nullptr;      // [cols] float32 +=, LayerNorm only
  void* workspace = nullptr;   // backward: norm_bwd_workspace_bytes(p) bytes (CUDA; may be null when 0)
};

// ---- rotary position embedding (RoPE), in place ------------------------------------------------------
// x is a strided [batch, seqlen, heads, head_dim] view (head_dim even, its stride 1), e.g. q or k
// inside a packed [batch, seqlen, 3, heads, head_dim] projection. Rotate-half pairing (GPT-NeoX,
// Llama): for i < head_dim / 2, with position p = position_offset + s,
//   theta_i = base^(-2i / head_dim), angle = p * theta_i (computed as float32(p) * float32(theta_i)
//   with theta_i from double precision, then sin/cos in float32 to ~1 ulp),
//   (x_i, x_{i+half}) <- (x_i cos - x_{i+half} sin, x_i sin + x_{i+half} cos).
// inverse = true rotates by -angle: the backward of RoPE applied to dq / dk.
struct RopeParams {
  int64_t batch = 0, seqlen = 0, heads = 0, head_dim = 0;
  int64_t batch_stride = 0, row_stride = 0, head_stride = 0;  // elements; head_dim's stride is 1
  DType dtype = DType::kFloat32;
  void* x = nullptr;  // read and written in place
  float base = 10000.0f;  // finite, > 1
  int64_t position_offset = 0;  // >= 0: the position of row s is position_offset + s
  bool inverse = false;
};

// ---- activations ---------------------------------------------------------------------------------
// GELU, tanh approximation (GPT-2; PyTorch's gelu(approximate='tanh')):
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// forward: out = gelu(x). backward: dx = dout * gelu'(x).
struct GeluParams {
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  const void* x = nullptr;
  const void* dout = nullptr;  // backward only
  void* out = nullptr;         // forward: gelu(x); backward: dx
};

// SwiGLU over a [rows, 2 * cols] input whose first half is the gate a and second half the value b:
//   forward:  out[r, c] = silu(a) * b, silu(a) = a * sigmoid(a)           out is [rows, cols]
//   backward: da = dout * b * sigmoid(a) * (1 + a (1 - sigmoid(a))); db = dout * silu(a);
//             dx = [da | db] is [rows, 2 * cols]
struct SwigluParams {
  int64_t rows = 0;
  int64_t cols = 0;  // width of the output (half the input's)
  DType dtype = DType::kFloat32;
  const void* x = nullptr;     // [rows, 2 * cols]
  const void* dout = nullptr;  // [rows, cols], backward only
  void* out = nullptr;         // forward: [rows, cols]; backward: dx [rows, 2 * cols]
};

// ---- residual add ----------------------------------------------------------------------------------
// out = a + alpha * b, elementwise over numel elements of one dtype. `out` may equal `a` (in place:
// a += alpha * b, the gradient accumulation of a residual branch).
struct AddParams {
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  float alpha = 1.0f;
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
};

// ---- fused softmax cross-entropy -------------------------------------------------------------------
// Per row r with target t = targets[r]:
//   lse_r = log(sum_j exp(logits[r, j]));  loss_r = lse_r - logits[r, t]
// A row whose target equals ignore_index has loss 0 and dlogits 0 and is not counted. A target
// outside [0, vocab) that is not ignore_index gives loss NaN and a NaN dlogits row (never a read
// outside the row).
// Reduction: kNone writes loss[r] per row; kSum writes loss[0] = sum; kMean writes loss[0] =
// sum / count of counted rows (NaN when none is counted, as PyTorch).
// With dlogits: dlogits[r, j] = grad_scale * w * (softmax_j - [j == t]), w = 1 / count for kMean
// and 1 otherwise (the gradient of the reduced loss for an upstream gradient of grad_scale).
// kMean needs the count before the gradient: backends compute it on the device.
enum class Reduction : int32_t {  // csrc/enums.json
  kNone = codes::kReductionNone,
  kSum = codes::kReductionSum,
  kMean = codes::kReductionMean,
};
struct CrossEntropyParams {
  int64_t rows = 0;
  int64_t vocab = 0;
  DType dtype = DType::kFloat32;  // of logits and dlogits
  const void* logits = nullptr;   // [rows, vocab]
  const int32_t* targets = nullptr;  // [rows]
  int32_t ignore_index = -100;
  Reduction reduction = Reduction::kMean;
  float* loss = nullptr;          // float32: [rows] for kNone, else [1]
  void* dlogits = nullptr;        // [rows, vocab] or null (no gradient)
  float grad_scale = 1.0f;
  void* workspace = nullptr;      // cross_entropy_workspace_bytes(p) bytes (may be 0: null)
};

// ---- AdamW, in place --------------------------------------------------------------------------------
// PyTorch's AdamW (decoupled weight decay) on one flat tensor, with float32 master weights:
//   g = grad * grad_scale * clip,  clip = clip_norm ? min(1, max_norm / (*clip_norm + 1e-6)) : 1
//   w = master (or param when param is float32 and master is null)
//   w -= lr * weight_decay * w
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   w -= lr * (m / bias_correction1) / (sqrt(v / bias_correction2) + eps)
//   param = dtype(w) (rounded to nearest even), master = w
// bias_correction{1,2} = 1 - beta^step, computed on the host in double. Elements whose g is NaN or
// Inf update like any other (the caller skips the step if it wants to).
struct AdamWParams {
  int64_t numel = 0;
  DType dtype = DType::kFloat32;  // of param
  void* param = nullptr;          // [numel] in place
  float* master = nullptr;        // [numel] float32 in place; null when dtype is float32
  const float* grad = nullptr;    // [numel]
  float* m = nullptr;             // [numel] in place
  float* v = nullptr;             // [numel] in place
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  float bias_correction1 = 1.0f, bias_correction2 = 1.0f;
  float grad_scale = 1.0f;
  const float* clip_norm = nullptr;  // device scalar (a gradNorm result) or null
  float max_norm = 0.0f;             // > 0 when clip_norm is set
};

// ---- reductions ------------------------------------------------------------------------------------
// Global L2 norm of a list of tensors (float32 gradients, or any dtype): out[0] = sqrt(sum of x^2
// over every element of every tensor), accumulated in float32 in a fixed order (deterministic).
struct TensorSpan {
  const void* data = nullptr;
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
};
struct NormOfParams {
  std::vector<TensorSpan> tensors;  // at least one
  float* out = nullptr;             // [1] float32
  void* workspace = nullptr;        // norm_of_workspace_bytes(p) bytes
};

// Column sums of x [rows, cols]: out[c] (+)= sum over r of x[r, c], float32 (the bias gradient of a
// linear layer). `accumulate`: += instead of =.
struct ColumnSumParams {
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kFloat32;
  const void* x = nullptr;
  float* out = nullptr;
  bool accumulate = true;
  void* workspace = nullptr;  // column_sum_workspace_bytes(p) bytes
};

// Sum of every element of x into out[0] (float32), deterministic order.
struct SumParams {
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  const void* x = nullptr;
  float* out = nullptr;
  void* workspace = nullptr;  // sum_workspace_bytes(p) bytes
};

}  // namespace fa
