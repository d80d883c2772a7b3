/**
 * Plain JS implementations of the nn ops (RMSNorm, LayerNorm, RoPE, GELU, SwiGLU, add), forward
 * and backward, written straight from the formulas of csrc/common/op_params.h. They are the ground
 * truth the backends are tested against, in two precisions:
 *
 * - `precision: 'float64'` (default): the exact reference, every operation in float64 on the
 *   inputs as given.
 * - `precision: <dtype>`: the "same-precision" implementation, the yardstick of the flash-attention
 *   test rule (`max |actual − ref64| ≤ factor · max |samePrecision − ref64| + atol`). With `rd` the
 *   round trip through the dtype and `f` = `Math.fround`: inputs are rounded (`rd`), every
 *   operation is rounded to float32 (`f`), sums are sequential float32 sums in index order
 *   (`acc = f(acc + term)` from 0), and activation outputs are rounded once more (`rd`). Row
 *   statistics (mean, rstd) and parameter gradients are float32 (`f` only).
 *
 * Layouts are flat, row-major and contiguous: `[rows, cols]` for the norms, GELU, SwiGLU (`x` is
 * `[rows, 2·cols]`) and add; `[batch, seqlen, heads, headDim]` for RoPE. Results are Float64Arrays
 * (holding dtype values in same-precision mode).
 * @packageDocumentation
 */
import { DType, dtypeRounder } from '../../half';
import { checkBoolean, checkNumber } from '../common';
import { refDims, refLength, refOptions, refValues } from './check';

/** The arithmetic of a reference call: exact float64, or a plain implementation in a dtype (see the module notes). */
export type NnPrecision = 'float64' | DType;

/** Flat input arrays (values, not half bits). */
export type NnInput = ArrayLike<number>;

/** Sizes of a row-wise op: `rows` rows of `cols` columns (SwiGLU: `cols` is the output's width). */
export interface RowsCols {
  /** Number of rows (the flattened leading dims), a positive integer. */
  rows: number;
  /** Columns per row (SwiGLU: the output's width F; its input has 2F), a positive integer. */
  cols: number;
}

/** Sizes of {@link referenceRope}'s contiguous `[batch, seqlen, heads, headDim]` input. */
export interface RopeDims {
  /** Independent sequences. */
  batch: number;
  /** Positions per sequence: row s is at position positionOffset + s. */
  seqlen: number;
  /** Heads per position. */
  heads: number;
  /** Elements per head vector; even (the halves are rotated against each other). */
  headDim: number;
}

/** The precision option shared by every reference. */
export interface NnReferenceOptions {
  /** 'float64' (default) or the dtype of a same-precision implementation. */
  precision?: NnPrecision;
}

/** Options of the norm references. */
export interface NormReferenceOptions extends NnReferenceOptions {
  /** As the op's `eps`. Default 1e-5. */
  eps?: number;
}

/** Options of {@link referenceRope}. */
export interface RopeReferenceOptions extends NnReferenceOptions {
  /** The base of the frequencies `θ_i = base^(−2i/D)`, > 1. Default 10000. */
  base?: number;
  /** The position of row 0, an integer >= 0. Default 0. */
  positionOffset?: number;
  /** Rotate by the negative angles (the backward, and the inverse of the forward). Default false. */
  inverse?: boolean;
}

/** Options of {@link referenceAdd}. */
export interface AddReferenceOptions extends NnReferenceOptions {
  /** The factor of b. Default 1. */
  alpha?: number;
}

/** Result of {@link referenceRmsNorm} and {@link referenceLayerNorm}. */
export interface NormReferenceResult {
  /** `[rows, cols]`. */
  out: Float64Array;
  /** `[rows]` (LayerNorm; zeros for RMSNorm). */
  mean: Float64Array;
  /** `[rows]`. */
  rstd: Float64Array;
}

/** Result of {@link referenceRmsNormBackward} and {@link referenceLayerNormBackward}. */
export interface NormBackwardReferenceResult {
  /** `[rows, cols]`. */
  dx: Float64Array;
  /** `[cols]`: Σ_rows dout · x̂ (the amount the op adds to dweight). */
  dweight: Float64Array;
  /** `[cols]`: Σ_rows dout (LayerNorm; zeros for RMSNorm). */
  dbias: Float64Array;
}

const identity = (x: number): number => x;
const fround = Math.fround;
const { sqrt, pow, cos, sin, tanh, exp, PI } = Math;

/** `f` (per-operation rounding) and `rd` (storage rounding) of a precision. */
interface Arith {
  f: (x: number) => number;
  rd: (x: number) => number;
}

function arithOf(precision: NnPrecision | undefined): Arith {
  if (precision === undefined || precision === 'float64') return { f: identity, rd: identity };
  return { f: fround, rd: dtypeRounder(precision) };
}

/** Checks an options object of these references: its keys, precision, and the numbers it holds. */
function nnOptions<T extends NnReferenceOptions>(options: unknown, keys: readonly (keyof T & string)[]): Partial<T> {
  const o = refOptions<T>(options, 'options', keys) as Record<string, unknown>;
  if (o.eps !== undefined) checkNumber(o.eps, 'options.eps', { min: 0 });
  if (o.base !== undefined) checkNumber(o.base, 'options.base', { above: 1 });
  if (o.positionOffset !== undefined) checkNumber(o.positionOffset, 'options.positionOffset', { integer: true, min: 0 });
  if (o.inverse !== undefined) checkBoolean(o.inverse, 'options.inverse');
  if (o.alpha !== undefined) checkNumber(o.alpha, 'options.alpha');
  return o as Partial<T>;
}

// ---- norms -------------------------------------------------------------------------------------------

/** Row statistics of a norm (mean stays 0 for RMSNorm), in the precision of `a`. */
function rowStats(
  x: NnInput, r: number, cols: number, layerNorm: boolean, eps: number, a: Arith,
): { mean: number; rstd: number } {
  const { f, rd } = a;
  const o = r * cols;
  let mean = 0;
  if (layerNorm) {
    let s = 0;
    for (let c = 0; c < cols; c++) s = f(s + rd(x[o + c]));
    mean = f(s / cols);
  }
  let ss = 0;
  for (let c = 0; c < cols; c++) {
    const d = f(rd(x[o + c]) - mean);
    ss = f(ss + f(d * d));
  }
  const rstd = f(1 / f(sqrt(f(f(ss / cols) + f(eps)))));
  return { mean, rstd };
}

function normForward(
  x: NnInput, weight: NnInput, bias: NnInput | null, dims: RowsCols, layerNorm: boolean,
  options: NormReferenceOptions | undefined,
): NormReferenceResult {
  const { rows, cols } = refDims(dims, 'dims', ['rows', 'cols']);
  refValues(x, 'x', rows * cols);
  refValues(weight, 'weight', cols);
  if (bias !== null) refValues(bias, 'bias', cols);
  options = nnOptions<NormReferenceOptions>(options, ['precision', 'eps']);
  const a = arithOf(options?.precision);
  const { f, rd } = a;
  const eps = options?.eps ?? 1e-5;
  const out = new Float64Array(rows * cols);
  const mean = new Float64Array(rows);
  const rstd = new Float64Array(rows);
  for (let r = 0; r < rows; r++) {
    const s = rowStats(x, r, cols, layerNorm, eps, a);
    mean[r] = s.mean;
    rstd[r] = s.rstd;
    const o = r * cols;
    for (let c = 0; c < cols; c++) {
      const y = f(f(f(rd(x[o + c]) - s.mean) * s.rstd) * rd(weight[c]));
      out[o + c] = rd(bias === null ? y : f(y + rd(bias[c])));
    }
  }
  return { out, mean, rstd };
}

function normBackward(
  dout: NnInput, x: NnInput, weight: NnInput, dims: RowsCols, layerNorm: boolean,
  options: NormReferenceOptions | undefined,
): NormBackwardReferenceResult {
  const { rows, cols } = refDims(dims, 'dims', ['rows', 'cols']);
  refValues(dout, 'dout', rows * cols);
  refValues(x, 'x', rows * cols);
  refValues(weight, 'weight', cols);
  options = nnOptions<NormReferenceOptions>(options, ['precision', 'eps']);
  const a = arithOf(options?.precision);
  const { f, rd } = a;
  const eps = options?.eps ?? 1e-5;
  const dx = new Float64Array(rows * cols);
  const dweight = new Float64Array(cols);
  const dbias = new Float64Array(cols);
  const xhat = new Float64Array(cols);
  const g = new Float64Array(cols);
  for (let r = 0; r < rows; r++) {
    const { mean, rstd } = rowStats(x, r, cols, layerNorm, eps, a);
    const o = r * cols;
    let sgx = 0;
    let sg = 0;
    for (let c = 0; c < cols; c++) {
      const dy = rd(dout[o + c]);
      xhat[c] = f(f(rd(x[o + c]) - mean) * rstd);
      g[c] = f(dy * rd(weight[c]));
      sgx = f(sgx + f(g[c] * xhat[c]));
      sg = f(sg + g[c]);
      dweight[c] = f(dweight[c] + f(dy * xhat[c]));
      dbias[c] = f(dbias[c] + dy);
    }
    const meanGx = f(sgx / cols);
    const meanG = layerNorm ? f(sg / cols) : 0;
    for (let c = 0; c < cols; c++) dx[o + c] = rd(f(rstd * f(f(g[c] - meanG) - f(xhat[c] * meanGx))));
  }
  if (!layerNorm) dbias.fill(0);
  return { dx, dweight, dbias };
}

/**
 * RMSNorm: `rstd = 1 / sqrt(mean(x²) + eps)`, `out = x · rstd · weight`.
 * @param x `[rows, cols]`.
 * @param weight `[cols]`.
 * @param dims rows and cols.
 * @param options `eps` (default 1e-5) and `precision` (see the module notes).
 * @returns `out` `[rows, cols]`, `rstd` `[rows]` (and `mean`, zeros).
 * @throws RangeError on sizes that do not match the arrays.
 */
export function referenceRmsNorm(x: NnInput, weight: NnInput, dims: RowsCols, options?: NormReferenceOptions): NormReferenceResult {
  return normForward(x, weight, null, dims, false, options);
}

/**
 * LayerNorm (biased variance): `out = (x − mean) · rstd · weight + bias`, `rstd = 1 / sqrt(var + eps)`.
 * @param x `[rows, cols]`.
 * @param weight `[cols]`.
 * @param bias `[cols]` or null.
 * @param dims rows and cols.
 * @param options `eps` (default 1e-5) and `precision` (see the module notes).
 * @returns `out` `[rows, cols]`, `mean` and `rstd` `[rows]`.
 * @throws RangeError on sizes that do not match the arrays.
 */
export function referenceLayerNorm(
  x: NnInput, weight: NnInput, bias: NnInput | null, dims: RowsCols, options?: NormReferenceOptions,
): NormReferenceResult {
  return normForward(x, weight, bias, dims, true, options);
}

/**
 * Gradients of {@link referenceRmsNorm} (the row statistics recomputed from x):
 * `dx = rstd · (g − x̂ · mean(g · x̂))` with `x̂ = x · rstd`, `g = dout · weight`; `dweight = Σ_rows dout · x̂`.
 * @param dout `[rows, cols]`.
 * @param x `[rows, cols]`.
 * @param weight `[cols]`.
 * @param dims rows and cols.
 * @param options `eps` (default 1e-5) and `precision` (see the module notes).
 * @returns `dx` `[rows, cols]`, `dweight` `[cols]` (and `dbias`, zeros).
 * @throws RangeError on sizes that do not match the arrays.
 */
export function referenceRmsNormBackward(
  dout: NnInput, x: NnInput, weight: NnInput, dims: RowsCols, options?: NormReferenceOptions,
): NormBackwardReferenceResult {
  return normBackward(dout, x, weight, dims, false, options);
}

/**
 * Gradients of {@link referenceLayerNorm} (the row statistics recomputed from x):
 * `dx = rstd · (g − mean(g) − x̂ · mean(g · x̂))` with `x̂ = (x − mean) · rstd`, `g = dout · weight`;
 * `dweight = Σ_rows dout · x̂`, `dbias = Σ_rows dout`.
 * @param dout `[rows, cols]`.
 * @param x `[rows, cols]`.
 * @param weight `[cols]`.
 * @param dims rows and cols.
 * @param options `eps` (default 1e-5) and `precision` (see the module notes).
 * @returns `dx` `[rows, cols]`, `dweight` and `dbias` `[cols]`.
 * @throws RangeError on sizes that do not match the arrays.
 */
export function referenceLayerNormBackward(
  dout: NnInput, x: NnInput, weight: NnInput, dims: RowsCols, options?: NormReferenceOptions,
): NormBackwardReferenceResult {
  return normBackward(dout, x, weight, dims, true, options);
}

// ---- RoPE ----------------------------------------------------------------------------------------------

/**
 * RoPE with rotate-half pairing on a contiguous `[batch, seqlen, heads, headDim]` array (not in
 * place). float64: `θ_i = base^(−2i/D)` and the angle `p·θ_i` in float64. Same precision: as the
 * backends, `θ_i` from float64 rounded to float32, the angle `f(f(p) · θ_i)`, and `f(cos)`, `f(sin)`.
 * @param x `[batch, seqlen, heads, headDim]`, flat.
 * @param dims the sizes (headDim even).
 * @param options `base` (10000), `positionOffset` (0), `inverse` (false), `precision`.
 * @returns the rotated values, `[batch, seqlen, heads, headDim]`.
 * @throws RangeError on sizes that do not match the array, or an odd headDim.
 */
export function referenceRope(x: NnInput, dims: RopeDims, options?: RopeReferenceOptions): Float64Array {
  const { batch, seqlen, heads, headDim } = refDims(dims, 'dims', ['batch', 'seqlen', 'heads', 'headDim']);
  if (headDim % 2 !== 0) throw new RangeError(`Expected headDim to be even but received ${headDim}`);
  refValues(x, 'x', batch * seqlen * heads * headDim);
  options = nnOptions<RopeReferenceOptions>(options, ['precision', 'base', 'positionOffset', 'inverse']);
  const { f, rd } = arithOf(options?.precision);
  const base = options?.base ?? 10000;
  const offset = options?.positionOffset ?? 0;
  const sign = options?.inverse ? -1 : 1;
  const half = headDim / 2;
  const theta = new Float64Array(half);
  for (let i = 0; i < half; i++) theta[i] = f(pow(f(base), (-2 * i) / headDim));
  const cs = new Float64Array(half);
  const sn = new Float64Array(half);
  const out = new Float64Array(x.length);
  for (let s = 0; s < seqlen; s++) {
    const p = f(offset + s);
    for (let i = 0; i < half; i++) {
      const angle = f(p * theta[i]);
      cs[i] = f(cos(angle));
      sn[i] = sign * f(sin(angle));
    }
    for (let b = 0; b < batch; b++) {
      for (let h = 0; h < heads; h++) {
        const o = ((b * seqlen + s) * heads + h) * headDim;
        for (let i = 0; i < half; i++) {
          const x1 = rd(x[o + i]);
          const x2 = rd(x[o + i + half]);
          out[o + i] = rd(f(f(x1 * cs[i]) - f(x2 * sn[i])));
          out[o + i + half] = rd(f(f(x1 * sn[i]) + f(x2 * cs[i])));
        }
      }
    }
  }
  return out;
}

// ---- activations ---------------------------------------------------------------------------------

const SQRT_2_OVER_PI = sqrt(2 / PI);
const GELU_CUBIC = 0.044715;

/**
 * GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/π) (x + 0.044715 x³)))`, elementwise.
 * @param x any length.
 * @param options `precision`.
 * @returns gelu(x).
 */
export function referenceGelu(x: NnInput, options?: NnReferenceOptions): Float64Array {
  refValues(x, 'x');
  options = nnOptions<NnReferenceOptions>(options, ['precision']);
  const { f, rd } = arithOf(options?.precision);
  const k = f(SQRT_2_OVER_PI);
  const c3 = f(GELU_CUBIC);
  const out = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const v = rd(x[i]);
    const t = f(tanh(f(k * f(v + f(c3 * f(f(v * v) * v))))));
    out[i] = rd(f(f(0.5 * v) * f(1 + t)));
  }
  return out;
}

/**
 * Gradient of {@link referenceGelu}: `dx = dout · gelu'(x)`, with
 * `gelu'(x) = 0.5 (1 + t) + 0.5 x (1 − t²) sqrt(2/π) (1 + 3·0.044715 x²)`, `t = tanh(...)`.
 * @param dout like x.
 * @param x any length.
 * @param options `precision`.
 * @returns dx.
 * @throws RangeError when the lengths differ.
 */
export function referenceGeluBackward(dout: NnInput, x: NnInput, options?: NnReferenceOptions): Float64Array {
  refValues(dout, 'dout', refLength(x, 'x'));
  options = nnOptions<NnReferenceOptions>(options, ['precision']);
  const { f, rd } = arithOf(options?.precision);
  const k = f(SQRT_2_OVER_PI);
  const c3 = f(GELU_CUBIC);
  const c3x3 = f(3 * c3);
  const dx = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) {
    const v = rd(x[i]);
    const v2 = f(v * v);
    const t = f(tanh(f(k * f(v + f(c3 * f(v2 * v))))));
    const dinner = f(k * f(1 + f(c3x3 * v2)));
    const grad = f(f(0.5 * f(1 + t)) + f(f(f(0.5 * v) * f(1 - f(t * t))) * dinner));
    dx[i] = rd(f(rd(dout[i]) * grad));
  }
  return dx;
}

function sigmoidOf(a: number, f: (x: number) => number): number {
  return f(1 / f(1 + f(exp(-a))));
}

/**
 * SwiGLU: for x `[rows, 2·cols]` = `[a | b]`, `out = silu(a) · b` `[rows, cols]`, `silu(a) = a · σ(a)`.
 * @param x `[rows, 2·cols]`.
 * @param dims rows and cols (the output's width).
 * @param options `precision`.
 * @returns `[rows, cols]`.
 * @throws RangeError on sizes that do not match the array.
 */
export function referenceSwiglu(x: NnInput, dims: RowsCols, options?: NnReferenceOptions): Float64Array {
  const { rows, cols } = refDims(dims, 'dims', ['rows', 'cols']);
  refValues(x, 'x', rows * 2 * cols);
  options = nnOptions<NnReferenceOptions>(options, ['precision']);
  const { f, rd } = arithOf(options?.precision);
  const out = new Float64Array(rows * cols);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const a = rd(x[r * 2 * cols + c]);
      const b = rd(x[r * 2 * cols + cols + c]);
      out[r * cols + c] = rd(f(f(a * sigmoidOf(a, f)) * b));
    }
  }
  return out;
}

/**
 * Gradient of {@link referenceSwiglu}: `da = dout · b · σ(a) · (1 + a (1 − σ(a)))`,
 * `db = dout · silu(a)`, `dx = [da | db]`.
 * @param dout `[rows, cols]`.
 * @param x `[rows, 2·cols]`.
 * @param dims rows and cols (the output's width).
 * @param options `precision`.
 * @returns dx `[rows, 2·cols]`.
 * @throws RangeError on sizes that do not match the arrays.
 */
export function referenceSwigluBackward(
  dout: NnInput, x: NnInput, dims: RowsCols, options?: NnReferenceOptions,
): Float64Array {
  const { rows, cols } = refDims(dims, 'dims', ['rows', 'cols']);
  refValues(x, 'x', rows * 2 * cols);
  refValues(dout, 'dout', rows * cols);
  options = nnOptions<NnReferenceOptions>(options, ['precision']);
  const { f, rd } = arithOf(options?.precision);
  const dx = new Float64Array(rows * 2 * cols);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const ia = r * 2 * cols + c;
      const a = rd(x[ia]);
      const b = rd(x[ia + cols]);
      const dy = rd(dout[r * cols + c]);
      const sig = sigmoidOf(a, f);
      dx[ia] = rd(f(f(f(dy * b) * sig) * f(1 + f(a * f(1 - sig)))));
      dx[ia + cols] = rd(f(dy * f(a * sig)));
    }
  }
  return dx;
}

// ---- residual add ----------------------------------------------------------------------------------

/**
 * `a + alpha · b`, elementwise.
 * @param a any length.
 * @param b like a.
 * @param options `alpha` (default 1) and `precision`.
 * @returns the sum.
 * @throws RangeError when the lengths differ.
 */
export function referenceAdd(a: NnInput, b: NnInput, options?: AddReferenceOptions): Float64Array {
  refValues(b, 'b', refLength(a, 'a'));
  options = nnOptions<AddReferenceOptions>(options, ['precision', 'alpha']);
  const { f, rd } = arithOf(options?.precision);
  const alpha = f(options?.alpha ?? 1);
  const out = new Float64Array(a.length);
  for (let i = 0; i < a.length; i++) out[i] = rd(f(rd(a[i]) + f(alpha * rd(b[i]))));
  return out;
}
