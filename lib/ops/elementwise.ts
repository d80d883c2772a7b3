/**
 * The residual add, `a + alpha · b`, new or in place, on the CPU and CUDA backends
 * (csrc/common/op_params.h `AddParams`). Computation is float32 for every dtype; results are
 * rounded once, on store.
 * @packageDocumentation
 */
import { binding } from '../native';
import { Tensor, wrapNative } from '../tensor';
import { arg, checkLike, checkNumber, checkOptions, checkTensor } from './common';

/** The largest finite float32: `alpha` is used as a float32. */
const MAX_FLOAT32 = 3.4028234663852886e38;

/** Options of {@link add} and {@link addInPlace}. */
export interface AddOptions {
  /** The factor of b. Finite float32. Default 1. */
  alpha?: number;
}

function checkAdd(a: unknown, b: unknown, options: unknown): { A: Tensor; B: Tensor; alpha: number } {
  const A = checkTensor(a, 'a');
  const B = checkLike(b, 'b', A, 'a');
  const o = checkOptions<AddOptions>(options, 'options', ['alpha']);
  const alpha = o.alpha === undefined ? 1 : checkNumber(o.alpha, 'options.alpha', { min: -MAX_FLOAT32, max: MAX_FLOAT32 });
  return { A, B, alpha };
}

/**
 * `a + alpha · b`, elementwise (the residual connection).
 * @param a any shape, float32, float16 or bfloat16, contiguous, on 'cpu' or 'cuda'.
 * @param b a's dtype, shape and device.
 * @param options `alpha` (default 1).
 * @returns a new tensor like a.
 * @throws TypeError / RangeError naming the argument for a bad call.
 */
export function add(a: Tensor, b: Tensor, options?: AddOptions): Tensor {
  const { A, B, alpha } = checkAdd(a, b, options);
  const out = binding().add(arg(A, 'a'), arg(B, 'b'), A.numel, alpha, false);
  return wrapNative(out as NonNullable<typeof out>, A.shape, A.dtype, A.device);
}

/**
 * `a += alpha · b`, in place (e.g. adding a residual branch's gradient). `b` may be `a` itself; a
 * `b` that overlaps `a` at another offset is refused.
 * @param a any shape, float32, float16 or bfloat16, contiguous, on 'cpu' or 'cuda'; modified in place.
 * @param b a's dtype, shape and device.
 * @param options `alpha` (default 1).
 * @throws TypeError / RangeError naming the argument for a bad call (a is unchanged then).
 */
export function addInPlace(a: Tensor, b: Tensor, options?: AddOptions): void {
  const { A, B, alpha } = checkAdd(a, b, options);
  binding().add(arg(A, 'a'), arg(B, 'b'), A.numel, alpha, true);
}
