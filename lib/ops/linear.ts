/**
 * Linear layers over our own GEMM (csrc/common/gemm_params.h): `y = x·Wᵀ + b`, the same with a
 * fused tanh-GELU epilogue, and the backward (`dx = dy·W`, `dW += dyᵀ·x`, `db += Σ_rows dy`).
 * CPU and CUDA, one API. Leading dims of x are flattened into rows.
 *
 * Precision: float16 and bfloat16 multiply on tensor cores (CUDA) or in float32 (CPU), always with
 * float32 accumulation and a float32 epilogue, rounded once on store. float32 inputs on CUDA run in
 * TF32 by default (see {@link LinearOptions.float32Precision}); the CPU computes float32 FMA.
 * @packageDocumentation
 */
import type { Float32Precision } from '../attention';
import { formatShape, rangeError, typeError } from '../errors';
import { binding, FLOAT32_PRECISION_CODE } from '../native';
import { Tensor, wrapNative } from '../tensor';
import { arg, checkBoolean, checkChoice, checkOptions, checkTensor, rowsCols, sameShape } from './common';

/** Options of {@link linear}, {@link linearGelu} and {@link linearBackward}. */
export interface LinearOptions {
  /**
   * How the CUDA GEMM multiplies float32 inputs (ignored for float16/bfloat16 and on the CPU, which
   * computes float32 FMA): `'tf32'` (default) rounds both operands to TF32 (10-bit mantissa) on the
   * tensor cores with float32 accumulation, as PyTorch with `allow_tf32`; `'highest'` splits each
   * operand into two TF32 values (3xTF32) for float32-level accuracy at about 3× the tensor-core work.
   */
  float32Precision?: Float32Precision;
}

/** Output of {@link linearGelu}. */
export interface LinearGeluOutput {
  /** `gelu(pre)`, `[...lead, O]`, x's dtype (GELU: the tanh approximation, as GPT-2). */
  out: Tensor;
  /** `x·Wᵀ + b` before the activation, `[...lead, O]`, x's dtype: the input of `geluBackward`. */
  pre: Tensor;
}

/** The gradients {@link linearBackward} computes. */
export interface LinearGrads {
  /** float32 `[O, I]`: `dweight += dyᵀ·x`, in place. Null or absent: not computed. */
  dweight?: Tensor | null;
  /** float32 `[O]`: `dbias += Σ_rows dy`, in place. Null or absent: not computed. */
  dbias?: Tensor | null;
  /** Whether to compute and return `dx = dy·W`. Default true. */
  dx?: boolean;
}

const PRECISIONS: readonly Float32Precision[] = ['tf32', 'highest'];

function precisionCode(options: unknown, arg0: string): number {
  const o = checkOptions<LinearOptions>(options, arg0, ['float32Precision']);
  const p = o.float32Precision === undefined ? 'tf32' : checkChoice(o.float32Precision, `${arg0}.float32Precision`, PRECISIONS);
  return FLOAT32_PRECISION_CODE[p];
}

interface Checked {
  x: Tensor;
  w: Tensor;
  b: Tensor | null;
  rows: number;
  inFeatures: number;
  outFeatures: number;
  precision: number;
}

function checkForward(x: unknown, weight: unknown, bias: unknown, options: unknown): Checked {
  const xt = checkTensor(x, 'x');
  const w = checkTensor(weight, 'weight', { dtype: xt.dtype, device: xt.device, rank: 2 });
  const { rows, cols } = rowsCols(xt);
  const [outFeatures, inFeatures] = w.shape;
  if (inFeatures !== cols) {
    throw rangeError(`weight to have shape [outFeatures, ${cols}] (x's last dim)`, formatShape(w.shape));
  }
  const b = bias === undefined || bias === null ? null : checkTensor(bias, 'bias', { dtype: xt.dtype, device: xt.device, shape: [outFeatures] });
  const precision = precisionCode(options, 'options');
  return { x: xt, w, b, rows, inFeatures, outFeatures, precision };
}

function run(c: Checked, gelu: boolean): { y: Tensor; pre: Tensor | null } {
  const [y, pre] = binding().linearForward(
    arg(c.x, 'x'), arg(c.w, 'weight'), c.b ? arg(c.b, 'bias') : null, c.rows, c.inFeatures, c.outFeatures, gelu,
    c.precision,
  );
  const shape = [...c.x.shape.slice(0, -1), c.outFeatures];
  return {
    y: wrapNative(y, shape, c.x.dtype, c.x.device),
    pre: pre ? wrapNative(pre, shape, c.x.dtype, c.x.device) : null,
  };
}

/**
 * `y = x·Wᵀ + b`.
 *
 * @param x `[...lead, I]` float32, float16 or bfloat16, contiguous.
 * @param weight `[O, I]`, x's dtype and device, contiguous (PyTorch's `nn.Linear.weight` layout).
 * @param bias optional `[O]`, x's dtype; null or absent: no bias.
 * @param options see {@link LinearOptions}.
 * @returns a new `[...lead, O]` tensor of x's dtype.
 * @throws TypeError / RangeError naming the argument (also a RangeError when the CUDA GEMM does not
 *   exist for the call, saying why); a refused call changes nothing.
 */
export function linear(x: Tensor, weight: Tensor, bias?: Tensor | null, options?: LinearOptions): Tensor {
  return run(checkForward(x, weight, bias, options), false).y;
}

/**
 * `pre = x·Wᵀ + b` and `out = gelu(pre)` (tanh approximation) in one GEMM, the activation fused into
 * its epilogue (computed in float32 on the accumulator). Arguments as for {@link linear}.
 *
 * @returns new tensors `out` and `pre`, both `[...lead, O]` in x's dtype. Keep `pre` for the
 *   backward: `linearBackward(geluBackward(dout, pre), x, weight, grads)`.
 */
export function linearGelu(x: Tensor, weight: Tensor, bias?: Tensor | null, options?: LinearOptions): LinearGeluOutput {
  const { y, pre } = run(checkForward(x, weight, bias, options), true);
  return { out: y, pre: pre as Tensor };
}

/**
 * The backward of {@link linear}: `dx = dy·W` (returned), `dweight += dyᵀ·x` and `dbias += Σ_rows dy`
 * (float32, accumulated in place, so micro-batches and tied weights add up; zero them before a step).
 *
 * @param dy `[...lead, O]`: the gradient of the output (for {@link linearGelu}, of `pre`), x's dtype.
 * @param x `[...lead, I]`, as given to the forward.
 * @param weight `[O, I]`, as given to the forward.
 * @param grads which gradients to compute (see {@link LinearGrads}); dweight and dbias must not share
 *   storage with dy, x, weight or each other.
 * @param options see {@link LinearOptions}.
 * @returns dx, a new `[...lead, I]` tensor of x's dtype, or null when `grads.dx` is false.
 * @throws TypeError / RangeError naming the argument; a refused call changes nothing.
 */
export function linearBackward(
  dy: Tensor, x: Tensor, weight: Tensor, grads: LinearGrads, options?: LinearOptions,
): Tensor | null {
  const d = checkTensor(dy, 'dy');
  const xt = checkTensor(x, 'x', { dtype: d.dtype, device: d.device });
  const w = checkTensor(weight, 'weight', { dtype: d.dtype, device: d.device, rank: 2 });
  const [outFeatures, inFeatures] = w.shape;
  const { rows, cols } = rowsCols(xt);
  if (cols !== inFeatures) {
    throw rangeError(`x to have ${inFeatures} columns (weight's second dim)`, formatShape(xt.shape));
  }
  const dyShape = [...xt.shape.slice(0, -1), outFeatures];
  if (!sameShape(d.shape, dyShape)) {
    throw rangeError(`dy to have shape ${formatShape(dyShape)} (x's leading dims, weight's first dim)`, formatShape(d.shape));
  }
  if (grads === undefined) throw typeError('grads to be an object { dweight?, dbias?, dx? }', 'undefined');
  const g = checkOptions<LinearGrads>(grads, 'grads', ['dweight', 'dbias', 'dx']);
  const dw = g.dweight === undefined || g.dweight === null ? null
    : checkTensor(g.dweight, 'grads.dweight', { dtype: 'float32', device: d.device, shape: [outFeatures, inFeatures] });
  const db = g.dbias === undefined || g.dbias === null ? null
    : checkTensor(g.dbias, 'grads.dbias', { dtype: 'float32', device: d.device, shape: [outFeatures] });
  const wantDx = g.dx === undefined ? true : checkBoolean(g.dx, 'grads.dx');
  const precision = precisionCode(options, 'options');
  const dx = binding().linearBackward(
    arg(d, 'dy'), arg(xt, 'x'), arg(w, 'weight'), dw ? arg(dw, 'grads.dweight') : null, db ? arg(db, 'grads.dbias') : null,
    wantDx, rows, inFeatures, outFeatures, precision,
  );
  return dx ? wrapNative(dx, xt.shape, xt.dtype, xt.device) : null;
}
