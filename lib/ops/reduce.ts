/**
 * Reductions: the sum of a tensor and the column sums of a matrix (a linear layer's bias gradient).
 * float32 results for every input dtype, accumulated in float32 in an order fixed by the sizes alone
 * (deterministic: the same bits for any thread count, run after run). CPU and CUDA, one API.
 * @packageDocumentation
 */
import { binding } from '../native';
import { Tensor, wrapNative } from '../tensor';
import { arg, checkTensor, rowsCols } from './common';

/**
 * The sum of every element of `x`.
 *
 * @param x float32, float16 or bfloat16, any shape, contiguous.
 * @returns a new float32 `[1]` tensor on x's device. NaN or ±Infinity elements propagate as in any
 *   sum.
 * @throws TypeError / RangeError naming the argument.
 */
export function sum(x: Tensor): Tensor {
  const t = checkTensor(x, 'x');
  const out = binding().sum(arg(t, 'x'), t.numel);
  return wrapNative(out, [1], 'float32', t.device);
}

/**
 * Column sums of `x` seen as `[rows, C]` (the leading dims flattened): `out[c] = Σ_r x[r, c]`.
 *
 * @param x `[...lead, C]` float32, float16 or bfloat16, contiguous (a 1-D `[C]` is one row).
 * @param out optional float32 `[C]` on x's device: when given, the sums are ADDED into it in place
 *   (`out[c] += Σ_r x[r, c]`, a bias gradient's accumulation) and `out` itself is returned. It must
 *   not share storage with x.
 * @returns a new float32 `[C]` tensor, or `out`.
 * @throws TypeError / RangeError naming the argument; a refused call changes nothing.
 */
export function columnSum(x: Tensor, out?: Tensor): Tensor {
  const t = checkTensor(x, 'x');
  const { rows, cols } = rowsCols(t);
  if (out === undefined) {
    const buf = binding().columnSum(arg(t, 'x'), rows, cols, null);
    return wrapNative(buf!, [cols], 'float32', t.device);
  }
  const o = checkTensor(out, 'out', { dtype: 'float32', shape: [cols], device: t.device });
  binding().columnSum(arg(t, 'x'), rows, cols, arg(o, 'out'));
  return o;
}
