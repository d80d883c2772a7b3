/**
 * Plain JS implementations of the training ops of lib/ops (embedding, linear, cross-entropy, AdamW,
 * gradient norm, sum, column sums), written straight from the formulas of csrc/common/op_params.h
 * and gemm_params.h. With `precision: 'float64'` (the default) they are the ground truth every
 * backend is tested against; with a dtype they are the "same-precision" implementation of the
 * accuracy rule: float32 arithmetic (every operation rounded with Math.fround, sums accumulated in
 * plain order), results rounded to the dtype once, as a straightforward kernel would compute.
 * `'tf32'` (linear only) additionally rounds the GEMM operands to TF32 first, as the CUDA GEMM's
 * default for float32.
 *
 * Arrays are flat, row-major and contiguous; values, not half bits. Inputs are taken as given (round
 * them to the tested dtype first). Results are new Float64Arrays (NaN where the op gives NaN). Bad
 * arguments (sizes, lengths, array kinds, options) are refused before any work (./check.ts).
 * @packageDocumentation
 */
import { DType, dtypeRounder } from '../../half';
import { roundToTf32 } from '../../reference';
import { describeValue, typeError } from '../../errors';
import { checkChoice, checkNumber } from '../common';
import { refFlag, refLength, refOptions, refPrecisions, refSize, refValues } from './check';

/** Any flat array of numbers. */
export type TrainReferenceInput = ArrayLike<number>;

/** Arithmetic of a reference: exact-ish float64, or float32 math with results rounded to a dtype. */
export type TrainReferencePrecision = 'float64' | DType | 'tf32';

/** The `precision` option shared by every reference. Default 'float64'. */
export interface TrainPrecisionOption {
  /** 'float64' (the ground truth), a dtype (float32 math, results in that dtype), or 'tf32' (linear). */
  precision?: TrainReferencePrecision;
}

const fround = Math.fround;
const identity = (x: number): number => x;
const exp = Math.exp;
const log = Math.log;
const sqrt = Math.sqrt;
const tanh = Math.tanh;

interface Arith {
  /** Rounds an intermediate: identity in float64, fround otherwise. */
  r: (x: number) => number;
  /** Rounds a result to the output dtype. */
  out: (x: number) => number;
  /** Rounds a GEMM operand (TF32 for 'tf32'). */
  operand: (x: number) => number;
}

function arith(precision: TrainReferencePrecision = 'float64', outDtype?: DType): Arith {
  if (precision === 'float64') return { r: identity, out: identity, operand: identity };
  if (precision === 'tf32') return { r: fround, out: outDtype ? dtypeRounder(outDtype) : fround, operand: roundToTf32 };
  return { r: fround, out: dtypeRounder(outDtype ?? precision), operand: identity };
}

// ---- embedding ------------------------------------------------------------------------------------

/**
 * Embedding forward: `out[i, :] = table[ids[i], :]`, a NaN row for an id outside `[0, vocab)`.
 * Exact in every precision (a copy). Returns `[ids.length, dim]`.
 */
export function referenceEmbedding(ids: TrainReferenceInput, table: TrainReferenceInput, vocab: number, dim: number): Float64Array {
  refSize(vocab, 'vocab');
  refSize(dim, 'dim');
  refValues(ids, 'ids', undefined, true);
  refValues(table, 'table', vocab * dim);
  const out = new Float64Array(ids.length * dim);
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i];
    for (let c = 0; c < dim; c++) out[i * dim + c] = id >= 0 && id < vocab ? table[id * dim + c] : NaN;
  }
  return out;
}

/**
 * Embedding backward: `dtable + scatter(dout)`, i.e. `dtable[ids[i], :] += dout[i, :]` in the order of
 * i (rows with an id outside `[0, vocab)` add nothing). `dtable` is the float32 accumulator's value
 * before the call; not modified. Returns the new `[vocab, dim]`. Same precision: float32 adds.
 */
export function referenceEmbeddingBackward(
  ids: TrainReferenceInput, dout: TrainReferenceInput, dtable: TrainReferenceInput, vocab: number, dim: number,
  options: TrainPrecisionOption = {},
): Float64Array {
  refSize(vocab, 'vocab');
  refSize(dim, 'dim');
  refValues(dout, 'dout', refLength(ids, 'ids', true) * dim);
  refValues(dtable, 'dtable', vocab * dim);
  options = refOptions<TrainPrecisionOption>(options, 'options', ['precision']);
  const { r } = arith(options.precision, 'float32');
  const out = Float64Array.from(dtable);
  for (let i = 0; i < ids.length; i++) {
    const id = ids[i];
    if (!(id >= 0 && id < vocab)) continue;
    for (let c = 0; c < dim; c++) out[id * dim + c] = r(out[id * dim + c] + dout[i * dim + c]);
  }
  return out;
}

// ---- linear -----------------------------------------------------------------------------------------

/** GPT-2's tanh GELU in float64 (precision-independent formula; callers round). */
export function geluTanh(x: number): number {
  return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

/** Options of {@link referenceLinear}. */
export interface ReferenceLinearOptions extends TrainPrecisionOption {
  /** Apply GELU (tanh) after the bias; `pre` is returned too. */
  gelu?: boolean;
  /** dtype of the result for 'tf32' (float32) and the dtypes: the dtype of x. Default: the precision's. */
  dtype?: DType;
}

/**
 * `y = x·Wᵀ + b` (then GELU with `gelu`): x `[rows, inF]`, w `[outF, inF]`, bias `[outF]` or null.
 * Returns `out` `[rows, outF]` and `pre` (the value before GELU; equal to out without it).
 */
export function referenceLinear(
  x: TrainReferenceInput, w: TrainReferenceInput, bias: TrainReferenceInput | null, rows: number, inF: number, outF: number,
  options: ReferenceLinearOptions = {},
): {
  /** `[rows, outF]`: the result (after GELU with `gelu`). */
  out: Float64Array;
  /** `[rows, outF]`: the value before GELU (equal to `out` without it). */
  pre: Float64Array;
} {
  for (const [v, name] of [[rows, 'rows'], [inF, 'inF'], [outF, 'outF']] as const) refSize(v, name);
  refValues(x, 'x', rows * inF);
  refValues(w, 'w', outF * inF);
  if (bias !== null) refValues(bias, 'bias', outF);
  options = refOptions<ReferenceLinearOptions>(options, 'options', ['precision', 'gelu', 'dtype'], refPrecisions(true));
  refFlag(options.gelu, 'options.gelu');
  const a = arith(options.precision, options.dtype);
  const out = new Float64Array(rows * outF);
  const pre = new Float64Array(rows * outF);
  const xo = Float64Array.from(x, a.operand);
  const wo = Float64Array.from(w, a.operand);
  for (let i = 0; i < rows; i++) {
    for (let j = 0; j < outF; j++) {
      let acc = 0;
      for (let k = 0; k < inF; k++) acc = a.r(acc + a.r(xo[i * inF + k] * wo[j * inF + k]));
      const t = a.r(acc + (bias ? bias[j] : 0));
      pre[i * outF + j] = a.out(t);
      out[i * outF + j] = a.out(options.gelu ? a.r(geluTanh(t)) : t);
    }
  }
  return { out, pre };
}

/** Options of {@link referenceLinearBackward}. */
export interface ReferenceLinearBackwardOptions extends TrainPrecisionOption {
  /** Value of the float32 dweight accumulator before the call (`[outF, inF]`); zeros when absent. */
  dweight?: TrainReferenceInput;
  /** Value of the float32 dbias accumulator before the call (`[outF]`); zeros when absent. */
  dbias?: TrainReferenceInput;
  /** dtype of dx. Default: the precision's (float32 for 'float64' and 'tf32'). */
  dtype?: DType;
}

/**
 * The backward of {@link referenceLinear} for dy `[rows, outF]`: `dx = dy·W` `[rows, inF]`,
 * `dweight = dweight0 + dyᵀ·x` `[outF, inF]`, `dbias = dbias0 + Σ_rows dy` `[outF]`.
 */
export function referenceLinearBackward(
  dy: TrainReferenceInput, x: TrainReferenceInput, w: TrainReferenceInput, rows: number, inF: number, outF: number,
  options: ReferenceLinearBackwardOptions = {},
): {
  /** `[rows, inF]`: dy·W. */
  dx: Float64Array;
  /** `[outF, inF]`: the accumulator after the call, dweight0 + dyᵀ·x. */
  dweight: Float64Array;
  /** `[outF]`: the accumulator after the call, dbias0 + Σ_rows dy. */
  dbias: Float64Array;
} {
  for (const [v, name] of [[rows, 'rows'], [inF, 'inF'], [outF, 'outF']] as const) refSize(v, name);
  refValues(dy, 'dy', rows * outF);
  refValues(x, 'x', rows * inF);
  refValues(w, 'w', outF * inF);
  options = refOptions<ReferenceLinearBackwardOptions>(options, 'options', ['precision', 'dweight', 'dbias', 'dtype'], refPrecisions(true));
  if (options.dweight !== undefined) refValues(options.dweight, 'options.dweight', outF * inF);
  if (options.dbias !== undefined) refValues(options.dbias, 'options.dbias', outF);
  const a = arith(options.precision, options.dtype);
  const a32 = arith(options.precision, 'float32');
  const dyo = Float64Array.from(dy, a.operand);
  const xo = Float64Array.from(x, a.operand);
  const wo = Float64Array.from(w, a.operand);
  const dx = new Float64Array(rows * inF);
  for (let i = 0; i < rows; i++) {
    for (let j = 0; j < inF; j++) {
      let acc = 0;
      for (let k = 0; k < outF; k++) acc = a.r(acc + a.r(dyo[i * outF + k] * wo[k * inF + j]));
      dx[i * inF + j] = a.out(acc);
    }
  }
  const dweight = new Float64Array(outF * inF);
  for (let o = 0; o < outF; o++) {
    for (let j = 0; j < inF; j++) {
      let acc = 0;
      for (let r = 0; r < rows; r++) acc = a.r(acc + a.r(dyo[r * outF + o] * xo[r * inF + j]));
      dweight[o * inF + j] = a32.out(acc + (options.dweight ? options.dweight[o * inF + j] : 0));
    }
  }
  const dbias = referenceColumnSum(dy, rows, outF, { precision: options.precision === 'tf32' ? 'float32' : options.precision, out: options.dbias });
  return { dx, dweight, dbias };
}

// ---- cross-entropy ----------------------------------------------------------------------------------

/** Options of {@link referenceCrossEntropy}. */
export interface ReferenceCrossEntropyOptions extends TrainPrecisionOption {
  /** Rows with this target are ignored (loss 0, gradient 0, not counted). Default -100. */
  ignoreIndex?: number;
  /** 'mean' over counted rows, 'sum', or 'none' (one loss per row). Default 'mean'. */
  reduction?: 'mean' | 'sum' | 'none';
  /** Multiplies dlogits (the upstream gradient of the reduced loss). Default 1. */
  gradScale?: number;
  /** dtype of dlogits. Default: the precision's (float32 for 'float64'). */
  dtype?: DType;
}

/**
 * Softmax cross-entropy of logits `[rows, vocab]` against targets `[rows]` (op_params.h
 * `CrossEntropyParams`): the loss (`[rows]` for 'none', else `[1]`) and dlogits `[rows, vocab]` of the
 * reduced loss times gradScale. Ignored rows: loss 0, gradient 0, not counted; a target outside
 * `[0, vocab)`: NaN loss and NaN gradient row.
 */
export function referenceCrossEntropy(
  logits: TrainReferenceInput, targets: TrainReferenceInput, rows: number, vocab: number,
  options: ReferenceCrossEntropyOptions = {},
): {
  /** `[rows]` for 'none', else `[1]`. */
  loss: Float64Array;
  /** `[rows, vocab]`: the gradient of the reduced loss times gradScale. */
  dlogits: Float64Array;
} {
  refSize(rows, 'rows');
  refSize(vocab, 'vocab');
  refValues(logits, 'logits', rows * vocab);
  refValues(targets, 'targets', rows, true);
  options = refOptions<ReferenceCrossEntropyOptions>(options, 'options', ['precision', 'ignoreIndex', 'reduction', 'gradScale', 'dtype']);
  if (options.ignoreIndex !== undefined) checkNumber(options.ignoreIndex, 'options.ignoreIndex', { integer: true });
  if (options.reduction !== undefined) checkChoice(options.reduction, 'options.reduction', ['mean', 'sum', 'none'] as const);
  if (options.gradScale !== undefined) checkNumber(options.gradScale, 'options.gradScale');
  const a = arith(options.precision, options.dtype);
  const ignore = options.ignoreIndex ?? -100;
  const reduction = options.reduction ?? 'mean';
  let counted = 0;
  for (let r = 0; r < rows; r++) if (targets[r] !== ignore) counted++;
  const weight = reduction === 'mean' ? a.r(1 / counted) : 1;
  const scale = a.r((options.gradScale ?? 1) * weight);
  const rowLoss = new Float64Array(rows);
  const dlogits = new Float64Array(rows * vocab);
  const e = new Float64Array(vocab);
  for (let r = 0; r < rows; r++) {
    const t = targets[r];
    if (t === ignore) continue;
    if (!(t >= 0 && t < vocab)) {
      rowLoss[r] = NaN;
      dlogits.fill(NaN, r * vocab, (r + 1) * vocab);
      continue;
    }
    let mx = -Infinity;
    for (let j = 0; j < vocab; j++) mx = Math.max(mx, logits[r * vocab + j]);
    let s = 0;
    for (let j = 0; j < vocab; j++) {
      e[j] = a.r(exp(a.r(logits[r * vocab + j] - mx)));
      s = a.r(s + e[j]);
    }
    const lse = a.r(mx + a.r(log(s)));
    rowLoss[r] = a.r(lse - logits[r * vocab + t]);
    const inv = a.r(1 / s);
    for (let j = 0; j < vocab; j++) {
      dlogits[r * vocab + j] = a.out(a.r(scale * a.r(a.r(e[j] * inv) - (j === t ? 1 : 0))));
    }
  }
  if (reduction === 'none') return { loss: rowLoss, dlogits };
  let total = 0;
  for (let r = 0; r < rows; r++) total = a.r(total + rowLoss[r]);
  return { loss: Float64Array.of(reduction === 'mean' ? a.r(total / counted) : total), dlogits };
}

// ---- AdamW --------------------------------------------------------------------------------------------

/** One parameter's AdamW state, as flat arrays (not modified by the reference). */
export interface ReferenceAdamWState {
  /** The parameter's values (of `dtype`). */
  param: TrainReferenceInput;
  /** The float32 gradient. */
  grad: TrainReferenceInput;
  /** The first moment before the step. */
  m: TrainReferenceInput;
  /** The second moment before the step. */
  v: TrainReferenceInput;
  /** float32 master weights (half params); absent: the param is its own master. */
  master?: TrainReferenceInput;
}

/** Hyper-parameters of {@link referenceAdamW} (defaults as lib/ops/optim.ts). */
export interface ReferenceAdamWOptions extends TrainPrecisionOption {
  /** Learning rate. */
  lr: number;
  /** First-moment decay (used as its float32 value). Default 0.9. */
  beta1?: number;
  /** Second-moment decay (used as its float32 value). Default 0.999. */
  beta2?: number;
  /** Added to the denominator. Default 1e-8. */
  eps?: number;
  /** Decoupled weight decay. Default 0. */
  weightDecay?: number;
  /** Step number, >= 1, for the bias corrections. */
  step: number;
  /** Multiplies the gradient. Default 1. */
  gradScale?: number;
  /** The global gradient norm and the largest one let through, for clipping. */
  clip?: {
    /** The global gradient norm of this step. */
    norm: number;
    /** The largest norm let through: gradients scale by maxNorm / norm when norm exceeds it. */
    maxNorm: number;
  };
  /** dtype of param. Default float32. */
  dtype?: DType;
}

/**
 * One AdamW step (op_params.h `AdamWParams`). Returns the new param (rounded to `dtype` unless
 * 'float64'), master (the unrounded weights), m and v. The bias corrections are computed in double
 * from the float32 betas, as the binding does.
 */
export function referenceAdamW(
  state: ReferenceAdamWState, options: ReferenceAdamWOptions,
): {
  /** The new parameter, rounded to `dtype` unless 'float64'. */
  param: Float64Array;
  /** The new unrounded weights. */
  master: Float64Array;
  /** The new first moment. */
  m: Float64Array;
  /** The new second moment. */
  v: Float64Array;
} {
  const st = refOptions<ReferenceAdamWState>(state, 'state', ['param', 'grad', 'm', 'v', 'master'], []);
  if (state === undefined) throw typeError('state to be an object with param, grad, m and v', 'undefined');
  const count = refLength(st.param, 'state.param');
  for (const k of ['grad', 'm', 'v'] as const) refValues(st[k], `state.${k}`, count);
  if (st.master !== undefined) refValues(st.master, 'state.master', count);
  if (options === undefined) throw typeError('options to be an object with lr and step', 'undefined');
  options = refOptions<ReferenceAdamWOptions>(options, 'options',
    ['precision', 'lr', 'beta1', 'beta2', 'eps', 'weightDecay', 'step', 'gradScale', 'clip', 'dtype']) as ReferenceAdamWOptions;
  checkNumber(options.lr, 'options.lr');
  checkNumber(options.step, 'options.step', { integer: true, min: 1 });
  for (const k of ['beta1', 'beta2', 'eps', 'weightDecay', 'gradScale'] as const) {
    if (options[k] !== undefined) checkNumber(options[k], `options.${k}`);
  }
  if (options.clip !== undefined) {
    const c = refOptions<{ norm: number; maxNorm: number }>(options.clip, 'options.clip', ['norm', 'maxNorm'], []);
    checkNumber(c.norm, 'options.clip.norm');
    checkNumber(c.maxNorm, 'options.clip.maxNorm');
  }
  const precision = options.precision ?? 'float64';
  const a = arith(precision === 'float64' ? 'float64' : 'float32');
  const toParam = precision === 'float64' ? identity : dtypeRounder(options.dtype ?? 'float32');
  const f32 = (x: number): number => (precision === 'float64' ? x : fround(x));
  const beta1 = fround(options.beta1 ?? 0.9);
  const beta2 = fround(options.beta2 ?? 0.999);
  const lr = f32(options.lr);
  const eps = f32(options.eps ?? 1e-8);
  const decay = a.r(lr * f32(options.weightDecay ?? 0));
  const bc1 = f32(1 - Math.pow(beta1, options.step));
  const bc2 = f32(1 - Math.pow(beta2, options.step));
  const clip = options.clip ? Math.min(1, a.r(f32(options.clip.maxNorm) / a.r(options.clip.norm + f32(1e-6)))) : 1;
  const gmul = a.r(f32(options.gradScale ?? 1) * clip);
  const n = state.param.length;
  const out = { param: new Float64Array(n), master: new Float64Array(n), m: new Float64Array(n), v: new Float64Array(n) };
  const omb1 = a.r(1 - beta1);
  const omb2 = a.r(1 - beta2);
  for (let i = 0; i < n; i++) {
    const g = a.r(state.grad[i] * gmul);
    let w = state.master ? state.master[i] : state.param[i];
    w = a.r(w - a.r(decay * w));
    const m = a.r(a.r(beta1 * state.m[i]) + a.r(omb1 * g));
    const v = a.r(a.r(beta2 * state.v[i]) + a.r(omb2 * a.r(g * g)));
    w = a.r(w - a.r(a.r(lr * a.r(m / bc1)) / a.r(a.r(sqrt(a.r(v / bc2))) + eps)));
    out.m[i] = m;
    out.v[i] = v;
    out.master[i] = w;
    out.param[i] = toParam(w);
  }
  return out;
}

// ---- reductions -------------------------------------------------------------------------------------

/** `sqrt(Σ x²)` over every element of every array (float32 sums in order for a dtype precision). */
export function referenceGradNorm(arrays: readonly TrainReferenceInput[], options: TrainPrecisionOption = {}): number {
  if (!Array.isArray(arrays)) throw typeError('arrays to be an Array of arrays of values', describeValue(arrays));
  arrays.forEach((a, i) => refValues(a, `arrays[${i}]`));
  options = refOptions<TrainPrecisionOption>(options, 'options', ['precision']);
  const { r } = arith(options.precision === 'float64' || options.precision === undefined ? 'float64' : 'float32');
  let s = 0;
  for (const x of arrays) for (let i = 0; i < x.length; i++) s = r(s + r(x[i] * x[i]));
  return r(sqrt(s));
}

/** `Σ x` (float32 sum in order for a dtype precision). */
export function referenceSum(x: TrainReferenceInput, options: TrainPrecisionOption = {}): number {
  refValues(x, 'x');
  options = refOptions<TrainPrecisionOption>(options, 'options', ['precision']);
  const { r } = arith(options.precision === 'float64' || options.precision === undefined ? 'float64' : 'float32');
  let s = 0;
  for (let i = 0; i < x.length; i++) s = r(s + x[i]);
  return s;
}

/** Options of {@link referenceColumnSum}. */
export interface ReferenceColumnSumOptions extends TrainPrecisionOption {
  /** The float32 accumulator's value before the call (`[cols]`): the sums are added to it. */
  out?: TrainReferenceInput;
}

/** `out0[c] + Σ_r x[r, c]` for x `[rows, cols]` (float32 sums in row order for a dtype precision). */
export function referenceColumnSum(
  x: TrainReferenceInput, rows: number, cols: number, options: ReferenceColumnSumOptions = {},
): Float64Array {
  refSize(rows, 'rows');
  refSize(cols, 'cols');
  refValues(x, 'x', rows * cols);
  options = refOptions<ReferenceColumnSumOptions>(options, 'options', ['precision', 'out']);
  if (options.out !== undefined) refValues(options.out, 'options.out', cols);
  const { r } = arith(options.precision === 'float64' || options.precision === undefined ? 'float64' : 'float32');
  const out = new Float64Array(cols);
  for (let c = 0; c < cols; c++) {
    let s = 0;
    for (let i = 0; i < rows; i++) s = r(s + x[i * cols + c]);
    out[c] = r(s + (options.out ? options.out[c] : 0));
  }
  return out;
}
