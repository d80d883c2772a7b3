/**
 * GELU (tanh approximation) and SwiGLU, forward and backward, on the CPU and CUDA backends
 * (csrc/common/op_params.h `GeluParams`, `SwigluParams`). Computation is float32 for every dtype;
 * results are rounded once, on store. Every function returns a new tensor (never in place).
 * @packageDocumentation
 */
import { formatShape, rangeError } from '../errors';
import { binding } from '../native';
import { Tensor, wrapNative } from '../tensor';
import { arg, checkLike, checkTensor, rowsCols, sameShape } from './common';

/**
 * GELU with the tanh approximation (GPT-2; PyTorch's `gelu(approximate='tanh')`):
 * `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`, elementwise.
 * @param x any shape, float32, float16 or bfloat16, contiguous, on 'cpu' or 'cuda'.
 * @returns a new tensor like x.
 * @throws TypeError / RangeError naming the argument for a bad call.
 */
export function gelu(x: Tensor): Tensor {
  const X = checkTensor(x, 'x');
  const out = binding().geluForward(arg(X, 'x'), X.numel);
  return wrapNative(out, X.shape, X.dtype, X.device);
}

/**
 * Backward of {@link gelu}: `dx = dout · gelu'(x)`.
 * @param dout the gradient of gelu(x); x's dtype, shape and device.
 * @param x the forward's input.
 * @returns dx, a new tensor like x.
 * @throws TypeError / RangeError naming the argument for a bad call.
 */
export function geluBackward(dout: Tensor, x: Tensor): Tensor {
  const X = checkTensor(x, 'x');
  const D = checkLike(dout, 'dout', X, 'x');
  const dx = binding().geluBackward(arg(D, 'dout'), arg(X, 'x'), X.numel);
  return wrapNative(dx, X.shape, X.dtype, X.device);
}

/** The output shape of SwiGLU for an input shape `[..., 2F]`: `[..., F]`. */
function halfShape(shape: readonly number[]): number[] {
  return [...shape.slice(0, -1), shape[shape.length - 1] / 2];
}

function checkSwigluInput(x: unknown): { X: Tensor; rows: number; cols: number } {
  const X = checkTensor(x, 'x', { minRank: 1 });
  const { rows, cols } = rowsCols(X);
  if (cols % 2 !== 0) {
    throw rangeError('x to have an even last dim (the gate half, then the value half)', formatShape(X.shape));
  }
  return { X, rows, cols: cols / 2 };
}

/**
 * SwiGLU: the last dim of x is `[gate a | value b]`, each of width F; `out = silu(a) · b` with
 * `silu(a) = a · sigmoid(a)`.
 * @param x `[..., 2F]`, float32, float16 or bfloat16, contiguous, on 'cpu' or 'cuda'.
 * @returns a new tensor `[..., F]`, x's dtype and device.
 * @throws TypeError / RangeError naming the argument for a bad call.
 */
export function swiglu(x: Tensor): Tensor {
  const { X, rows, cols } = checkSwigluInput(x);
  const out = binding().swigluForward(arg(X, 'x'), rows, cols);
  return wrapNative(out, halfShape(X.shape), X.dtype, X.device);
}

/**
 * Backward of {@link swiglu}: `da = dout · b · σ(a) · (1 + a (1 − σ(a)))`, `db = dout · silu(a)`.
 * @param dout `[..., F]`, the gradient of swiglu(x); x's dtype and device.
 * @param x `[..., 2F]`, the forward's input.
 * @returns dx = `[da | db]`, a new tensor `[..., 2F]` like x.
 * @throws TypeError / RangeError naming the argument for a bad call.
 */
export function swigluBackward(dout: Tensor, x: Tensor): Tensor {
  const { X, rows, cols } = checkSwigluInput(x);
  const want = halfShape(X.shape);
  const D = checkTensor(dout, 'dout', { dtype: X.dtype, device: X.device });
  if (!sameShape(D.shape, want)) {
    throw rangeError(`dout to have shape ${formatShape(want)} (x's with the last dim halved)`, formatShape(D.shape));
  }
  const dx = binding().swigluBackward(arg(D, 'dout'), arg(X, 'x'), rows, cols);
  return wrapNative(dx, X.shape, X.dtype, X.device);
}
