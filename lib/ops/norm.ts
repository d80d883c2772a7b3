/**
 * RMSNorm and LayerNorm over the last dim, forward and backward, on the CPU and CUDA backends
 * (csrc/common/op_params.h `NormParams`). Leading dims are flattened into rows: `x [...lead, C]` is
 * `rows = product(lead)` rows of `C` columns. Computation is float32 for every dtype; results are
 * rounded once, on store. The float64 reference and a same-precision implementation are in
 * lib/ops/reference/nn.ts.
 * @packageDocumentation
 */
import { rangeError, typeError, describeValue } from '../errors';
import { binding } from '../native';
import { Tensor, wrapNative } from '../tensor';
import { arg, checkLike, checkNumber, checkOptions, checkTensor, rowsCols } from './common';

/** The default `eps` of {@link rmsNorm} and {@link layerNorm} (PyTorch's). */
export const DEFAULT_NORM_EPS = 1e-5;
/** The largest finite float32: `eps` is used as a float32. */
const MAX_FLOAT32 = 3.4028234663852886e38;

/** Options of {@link rmsNorm} and {@link layerNorm}. */
export interface NormOptions {
  /** Added to the mean square (RMSNorm) or the variance (LayerNorm) before the square root. Finite, >= 0. Default 1e-5. */
  eps?: number;
}

/** Result of {@link rmsNorm}. */
export interface RmsNormResult {
  /** `[...lead, C]`, x's dtype and device: `x · rstd · weight`. */
  out: Tensor;
  /** float32 `[rows]`: `1 / sqrt(mean(x²) + eps)` of each row, for {@link rmsNormBackward}. */
  rstd: Tensor;
}

/** Result of {@link layerNorm}. */
export interface LayerNormResult {
  /** `[...lead, C]`, x's dtype and device: `(x − mean) · rstd · weight + bias`. */
  out: Tensor;
  /** float32 `[rows]`: the mean of each row, for {@link layerNormBackward}. */
  mean: Tensor;
  /** float32 `[rows]`: `1 / sqrt(var(x) + eps)` of each row (biased variance), for {@link layerNormBackward}. */
  rstd: Tensor;
}

/** Parameter gradients of {@link rmsNormBackward}: float32 tensors accumulated into (`+=`). */
export interface RmsNormGrads {
  /** float32 `[C]` on x's device: `dweight += Σ_rows dout · x̂`. Null or absent: not computed. */
  dweight?: Tensor | null;
}

/** Parameter gradients of {@link layerNormBackward}: float32 tensors accumulated into (`+=`). */
export interface LayerNormGrads {
  /** float32 `[C]` on x's device: `dweight += Σ_rows dout · x̂`. Null or absent: not computed. */
  dweight?: Tensor | null;
  /** float32 `[C]` on x's device: `dbias += Σ_rows dout`. Null or absent: not computed. */
  dbias?: Tensor | null;
}

function checkEps(options: unknown): number {
  const o = checkOptions<NormOptions>(options, 'options', ['eps']);
  return o.eps === undefined ? DEFAULT_NORM_EPS : checkNumber(o.eps, 'options.eps', { min: 0, max: MAX_FLOAT32 });
}

/** x, and weight `[C]` of x's dtype and device. */
function checkInputs(x: unknown, weight: unknown): { X: Tensor; W: Tensor; rows: number; cols: number } {
  const X = checkTensor(x, 'x', { minRank: 1 });
  const { rows, cols } = rowsCols(X);
  const W = checkTensor(weight, 'weight', { dtype: X.dtype, device: X.device, shape: [cols] });
  return { X, W, rows, cols };
}

/** An optional float32 `[n]` tensor on `device` (null and undefined mean absent). */
function checkOptionalF32(t: unknown, name: string, device: Tensor['device'], n: number): Tensor | null {
  if (t === null || t === undefined) return null;
  return checkTensor(t, name, { dtype: 'float32', device, shape: [n] });
}

function checkGrads<T extends object>(grads: unknown, allowed: readonly (keyof T & string)[]): Partial<T> {
  return checkOptions<T>(grads, 'grads', allowed);
}

/**
 * RMSNorm over the last dim: `rstd = 1 / sqrt(mean(x²) + eps)`, `out = x · rstd · weight`.
 * Not in place.
 * @param x `[...lead, C]`, float32, float16 or bfloat16, contiguous, on 'cpu' or 'cuda'.
 * @param weight `[C]`, x's dtype and device.
 * @param options `eps` (default 1e-5).
 * @returns new tensors: `out` like x and `rstd` float32 `[rows]`.
 * @throws TypeError / RangeError naming the argument for a bad call (nothing is allocated then).
 */
export function rmsNorm(x: Tensor, weight: Tensor, options?: NormOptions): RmsNormResult {
  const { X, W, rows, cols } = checkInputs(x, weight);
  const eps = checkEps(options);
  const [out, , rstd] = binding().normForward(arg(X, 'x'), arg(W, 'weight'), null, rows, cols, eps, false);
  return { out: wrapNative(out, X.shape, X.dtype, X.device), rstd: wrapNative(rstd, [rows], 'float32', X.device) };
}

/**
 * LayerNorm over the last dim (biased variance, as PyTorch's layer_norm): `mean = mean(x)`,
 * `rstd = 1 / sqrt(var(x) + eps)`, `out = (x − mean) · rstd · weight + bias`. Not in place.
 * @param x `[...lead, C]`, float32, float16 or bfloat16, contiguous, on 'cpu' or 'cuda'.
 * @param weight `[C]`, x's dtype and device.
 * @param bias `[C]`, x's dtype and device, or null (no bias).
 * @param options `eps` (default 1e-5).
 * @returns new tensors: `out` like x, `mean` and `rstd` float32 `[rows]`.
 * @throws TypeError / RangeError naming the argument for a bad call (nothing is allocated then).
 */
export function layerNorm(x: Tensor, weight: Tensor, bias: Tensor | null, options?: NormOptions): LayerNormResult {
  const { X, W, rows, cols } = checkInputs(x, weight);
  if (bias !== null && !(bias instanceof Tensor)) throw typeError('bias to be a Tensor or null', describeValue(bias));
  const B = bias === null ? null : checkTensor(bias, 'bias', { dtype: X.dtype, device: X.device, shape: [cols] });
  const eps = checkEps(options);
  const [out, mean, rstd] = binding().normForward(
    arg(X, 'x'), arg(W, 'weight'), B === null ? null : arg(B, 'bias'), rows, cols, eps, true,
  );
  return {
    out: wrapNative(out, X.shape, X.dtype, X.device),
    mean: wrapNative(mean as NonNullable<typeof mean>, [rows], 'float32', X.device),
    rstd: wrapNative(rstd, [rows], 'float32', X.device),
  };
}

/**
 * Backward of {@link rmsNorm}: with `x̂ = x · rstd` and `g = dout · weight`,
 * `dx = rstd · (g − x̂ · mean(g · x̂))`, and `dweight += Σ_rows dout · x̂` (float32, summed in a fixed
 * order: the same bits on any number of threads).
 * @param dout `[...lead, C]`, the gradient of `out`; x's dtype, shape and device.
 * @param x the forward's input.
 * @param weight the forward's weight `[C]`.
 * @param rstd the forward's `rstd`, float32 `[rows]`.
 * @param grads `dweight`: float32 `[C]`, accumulated into in place; null or absent to skip it.
 * @returns dx, a new tensor like x (written, not accumulated).
 * @throws TypeError / RangeError naming the argument for a bad call (nothing is allocated or changed then).
 */
export function rmsNormBackward(
  dout: Tensor, x: Tensor, weight: Tensor, rstd: Tensor, grads: RmsNormGrads,
): Tensor {
  const { X, W, rows, cols } = checkInputs(x, weight);
  const D = checkLike(dout, 'dout', X, 'x');
  const R = checkTensor(rstd, 'rstd', { dtype: 'float32', device: X.device, shape: [rows] });
  const g = checkGrads<RmsNormGrads>(grads, ['dweight']);
  const dW = checkOptionalF32(g.dweight, 'grads.dweight', X.device, cols);
  const dx = binding().normBackward(
    arg(D, 'dout'), arg(X, 'x'), arg(W, 'weight'), null, arg(R, 'rstd'), dW === null ? null : arg(dW, 'grads.dweight'),
    null, rows, cols, false,
  );
  return wrapNative(dx, X.shape, X.dtype, X.device);
}

/**
 * Backward of {@link layerNorm}: with `x̂ = (x − mean) · rstd` and `g = dout · weight`,
 * `dx = rstd · (g − mean(g) − x̂ · mean(g · x̂))`, `dweight += Σ_rows dout · x̂` and
 * `dbias += Σ_rows dout` (float32, summed in a fixed order: the same bits on any number of threads).
 * @param dout `[...lead, C]`, the gradient of `out`; x's dtype, shape and device.
 * @param x the forward's input.
 * @param weight the forward's weight `[C]`.
 * @param mean the forward's `mean`, float32 `[rows]`.
 * @param rstd the forward's `rstd`, float32 `[rows]`.
 * @param grads `dweight` and `dbias`: float32 `[C]`, accumulated into in place; null or absent to skip one.
 * @returns dx, a new tensor like x (written, not accumulated).
 * @throws TypeError / RangeError naming the argument for a bad call (nothing is allocated or changed then).
 */
export function layerNormBackward(
  dout: Tensor, x: Tensor, weight: Tensor, mean: Tensor, rstd: Tensor, grads: LayerNormGrads,
): Tensor {
  const { X, W, rows, cols } = checkInputs(x, weight);
  const D = checkLike(dout, 'dout', X, 'x');
  const M = checkTensor(mean, 'mean', { dtype: 'float32', device: X.device, shape: [rows] });
  const R = checkTensor(rstd, 'rstd', { dtype: 'float32', device: X.device, shape: [rows] });
  const g = checkGrads<LayerNormGrads>(grads, ['dweight', 'dbias']);
  const dW = checkOptionalF32(g.dweight, 'grads.dweight', X.device, cols);
  const dB = checkOptionalF32(g.dbias, 'grads.dbias', X.device, cols);
  if (dW !== null && dW === dB) throw rangeError('grads.dbias to be another tensor than grads.dweight', 'the same tensor');
  const dx = binding().normBackward(
    arg(D, 'dout'), arg(X, 'x'), arg(W, 'weight'), arg(M, 'mean'), arg(R, 'rstd'),
    dW === null ? null : arg(dW, 'grads.dweight'), dB === null ? null : arg(dB, 'grads.dbias'), rows, cols, true,
  );
  return wrapNative(dx, X.shape, X.dtype, X.device);
}
