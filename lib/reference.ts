/**
 * Naive (non-tiled) attention, forward and backward, written straight from the formulas of the
 * design seeds (001: gradients; 002: masking) and following the conventions of
 * `csrc/common/attention_params.h`. It is the ground truth that every backend is tested against.
 *
 * Layout (like FlashAttention-2), all arrays flat, row-major and contiguous:
 * - `q`, `out`, `dout`, `dq`: `[batch, seqlenQ, headsQ, headDim]`
 * - `k`, `v`, `dk`, `dv`:     `[batch, seqlenK, headsKV, headDim]`
 * - `lse`:                    `[batch, headsQ, seqlenQ]`, natural log of the row's sum of exp(scores).
 * - Varlen (`cuSeqlensQ` / `cuSeqlensK`): the sequences packed along one row dimension, `q` etc.
 *   `[totalQ, headsQ, headDim]`, `k` etc. `[totalK, headsKV, headDim]`, `lse` `[headsQ, totalQ]`; each
 *   sequence attends to its own keys, its masks aligned to its own lengths.
 *
 * Semantics:
 * - `S = softmaxScale · Q·Kᵀ`, `P = softmax(S)` over the visible keys of each row, `O = P·V`,
 *   `lse_i = log Σ_j exp(S_ij)` over the visible keys.
 * - Causal masking is aligned to the bottom-right corner: query row `i` sees key `j` iff
 *   `j <= i + seqlenK - seqlenQ`. With `seqlenQ > seqlenK` the first `seqlenQ - seqlenK` rows see no
 *   key: they get `out = 0`, `lse = +Infinity`, `dq = 0`, and add nothing to `dk`/`dv`. Never NaN.
 * - Sliding window `[left, right]` (−1: unbounded), aligned like the causal mask: query row `i` sees key
 *   `j` iff `i + seqlenK − seqlenQ − left <= j <= i + seqlenK − seqlenQ + right`; with `causal`, `right`
 *   is at most 0. A row whose window holds no key is empty, as above.
 * - Softcapping (`softcap = c > 0`): the scores become `c · tanh(S / c)` before the softmax (Gemma 2),
 *   and the backward multiplies dS by `1 − tanh²(S / c)`.
 * - ALiBi (`alibiSlopes`, per head or per batch and head): `−slope · |i + seqlenK − seqlenQ − j|` is
 *   added to each score (after the softcap), as FlashAttention-2 defines it.
 * - Learnable sinks (`sinks`, a logit per query head): each row's softmax denominator gains
 *   `exp(sink)` for a key without a value, so `lse_i = log(exp(sink) + Σ_j exp(S_ij))` (`sink` for a
 *   row that sees no key) and the rows' weights sum to less than 1; the backward returns
 *   `dsinks_h = −Σ_i exp(sink_h − lse_i) · D_i`.
 * - Dropout (`dropout: p` with `seed` and `offset`): `O = (P ∘ Z / (1 − p)) · V`, where `Z` is the keep
 *   mask of `dropoutKeep` (lib/dropout.ts: Philox4x32-10 of (seed, offset, sequence, query head, row,
 *   key)); the lse and `P` itself are those without dropout. The backward regenerates `Z`:
 *   `dV = (P ∘ Z / (1 − p))ᵀ · dO`, `dP = (dO · Vᵀ) ∘ Z / (1 − p)`, `dS = P ∘ (dP − D)` with
 *   `D_i = dO_i · O_i` (O with dropout).
 * - GQA/MQA: query head `h` reads key/value head `floor(h / (headsQ / headsKV))`; `dk`/`dv` of a
 *   key/value head are summed over the query heads that share it.
 * - Backward (seed 001): `D_i = Σ_c dO_ic·O_ic`, `dV = Pᵀ·dO`, `dP = dO·Vᵀ`, `dS = P∘(dP − D)`,
 *   `dQ = scale·dS·K`, `dK = scale·dSᵀ·Q`.
 *
 * Cost: `2·B·Hq·Sq·Sk·d` multiply-adds for the forward, `6·B·Hq·Sq·Sk·d` for the backward (which
 * recomputes the forward). Memory: `O((Sk + Sq)·d)` scratch per key/value head; no `Sq×Sk` matrix is
 * ever stored (the backward streams over query rows).
 *
 * @module reference
 */

import { dropoutWords, resolveDropout, ResolvedDropout } from './dropout';
import { describeValue, quoteList, rangeError, refuseUnknownKeys, typeError } from './errors';
import { checkNumberArg, DType, dtypeRounder } from './half';
import { trueLength } from './tensor';

// Module-level aliases of the Math functions used in the hot loops: a global lookup per call is
// slow inside vm contexts (Jest runs tests in one: ~0.3 µs per `Math.x` access).
const f = Math.fround;
const exp = Math.exp;
const log = Math.log;
const tanh = Math.tanh;

/** Input arrays accepted by the reference: any flat row-major array of numbers (not half bits). */
export type ReferenceInput = Float32Array | Float64Array | ReadonlyArray<number>;

/** Sizes of one attention problem. All are positive integers; `headsQ % headsKV === 0`. */
export interface ReferenceShape {
  /** Number of independent sequences. */
  batch: number;
  /** Query rows per sequence. */
  seqlenQ: number;
  /** Key/value rows per sequence. */
  seqlenK: number;
  /** Query heads (also the heads of `out`, `lse`, `dq`). */
  headsQ: number;
  /** Key/value heads; divides `headsQ` (MQA: 1; MHA: `headsQ`). */
  headsKV: number;
  /** Elements per head vector (any positive integer here; the kernels need a multiple of 8). */
  headDim: number;
}

/** Options of {@link referenceAttention} and {@link referenceAttentionBackward}. */
export interface ReferenceOptions {
  /** Bottom-right aligned causal mask: query `i` sees key `j` iff `j <= i + seqlenK - seqlenQ`. Default false. */
  causal?: boolean;
  /** Multiplies `q·k` before the softmax; finite and > 0. Default `1 / sqrt(headDim)`. */
  softmaxScale?: number;
  /**
   * Sliding window `[left, right]`: query `i` sees key `j` iff
   * `i + seqlenK − seqlenQ − left <= j <= i + seqlenK − seqlenQ + right` (bottom-right aligned, as the
   * causal mask); integers >= −1, −1 leaving that side unbounded. With `causal: true` the right side is
   * bounded at 0. Default `[-1, -1]` (no window).
   */
  window?: readonly [number, number];
  /**
   * Softcapping: with `softcap = c > 0` the scores `s = softmaxScale · q·k` become `c · tanh(s / c)`
   * before the softmax (the backward has the exact gradient). A finite number >= 0; 0 (default) leaves
   * the scores as they are.
   */
  softcap?: number;
  /**
   * ALiBi slopes: `−slope · |i + seqlenK − seqlenQ − j|` is added to the score of query `i` and key `j`
   * (after the softcap), with the slope of the row's query head: `headsQ` values, or `batch · headsQ`
   * (`[batch, headsQ]`) for a slope per sequence. Finite. Default none.
   */
  alibiSlopes?: ReferenceInput;
  /**
   * Learnable attention sinks: a logit per query head (`headsQ` finite values) that joins every row's
   * softmax denominator without a value (gpt-oss). The lse includes it; the backward returns `dsinks`.
   * Default none.
   */
  sinks?: ReferenceInput;
  /**
   * Dropout: the probability of dropping an element of the attention probabilities, in [0, 1); 0
   * (default) drops none. The mask is `dropoutKeep` of lib/dropout.ts for {@link seed} and
   * {@link offset} (row and key counted within each sequence); the kept elements are scaled by
   * `1 / (1 − dropout)`. With dropout > 0, `seed` is required.
   */
  dropout?: number;
  /** Dropout's Philox key: an integer in [0, 2^53). */
  seed?: number;
  /** Dropout's Philox counter offset: an integer in [0, 2^32); default 0. */
  offset?: number;
  /**
   * Varlen: the sequences' query rows as prefix sums (`batch + 1` integers from 0, an Int32Array or
   * number[]), with {@link cuSeqlensK} for the keys. The arrays are then packed: `q`, `out`, `dout`,
   * `dq` `[totalQ, headsQ, headDim]` and `k`, `v`, `dk`, `dv` `[totalK, headsKV, headDim]` (totalQ =
   * `cuSeqlensQ[batch]`), and `lse` is `[headsQ, totalQ]`. Sequence b has `cuSeqlensQ[b + 1] −
   * cuSeqlensQ[b]` queries (0 to `shape.seqlenQ`, the longest) and its own keys; the causal mask and the
   * window are aligned per sequence. Default none (dense).
   */
  cuSeqlensQ?: Int32Array | readonly number[];
  /** Varlen: the sequences' key rows as prefix sums (0 to `shape.seqlenK` keys each); see {@link cuSeqlensQ}. */
  cuSeqlensK?: Int32Array | readonly number[];
  /**
   * Key padding for the batch layout: sequence b's length (`batch` integers from 0 to
   * min(seqlenQ, seqlenK), an Int32Array or number[]). Its keys from that length on are excluded, and so
   * are its queries: their `out`, `dq` are 0 and their `lse` +Infinity. Sequence b is then attention of
   * its first `seqlens[b]` queries over its first `seqlens[b]` keys (the causal mask and the window
   * aligned to them). Not with varlen. Default none.
   */
  seqlens?: Int32Array | readonly number[];
  /**
   * `'float64'` (default): exact reference, every operation in float64 on the inputs as given.
   *
   * A {@link DType}: "same-precision" mode, emulating a plain (non-tiled) implementation that stores
   * tensors in that dtype and accumulates in float32 — the yardstick of the flash-attention test rule
   * (`|actual − ref| ≤ factor·|samePrecision − ref| + atol`). Let `rd(x)` be the round trip through
   * the dtype (`roundToDtype`), `f(x)` = `Math.fround(x)`, and `Σᶠ` a sequential float32 sum
   * `acc = f(acc + f(a·b))` starting from 0 (in index order). With `scale = f(softmaxScale)`:
   *
   * Forward, for each (batch, query head, row i), over the visible keys j in increasing order:
   * 1. inputs rounded: `q̃ = rd(q)`, `k̃ = rd(k)`, `ṽ = rd(v)` (and `dÕ = rd(dout)` in the backward);
   * 2. `s_j = f(scale · Σᶠ_c q̃_ic k̃_jc)`; with a softcap `c` (as float32), `t_j = f(tanh(f(s_j / c)))`
   *    and `s_j = f(c · t_j)`; with an ALiBi slope `a` (as float32), `s_j = f(s_j − f(a · |i + seqlenK −
   *    seqlenQ − j|))`;
   * 3. `m = max_j s_j`, `e_j = f(exp(f(s_j − m)))`, `l = f-sum of e_j`, `p_j = f(e_j / l)`,
   *    `lse_i = f(m + f(log l))` (lse is float32, never rounded to the dtype); with a sink `σ` (as
   *    float32), `m` also takes `σ`, the sum starts from `e_σ = f(exp(f(σ − m)))` and `p_σ = f(e_σ / l)`;
   * 4. `p̃_j = rd(p_j)` (P rounded to the dtype before P·V); with dropout, `p̃_j = rd(f(p_j · z_j))` where
   *    `z_j = f(1 / (1 − dropout))` for a kept element and 0 for a dropped one;
   * 5. `out_ic = rd(Σᶠ_j p̃_j ṽ_jc)`.
   *
   * Backward, additionally:
   * 6. `D_i = Σᶠ_c dÕ_ic · out_ic` (with the rounded `out` of step 5);
   * 7. `dv_j += f(p̃_j · dÕ_ic)` in a float32 accumulator (rows in order, query heads of a group in order);
   * 8. `dp_j = Σᶠ_c dÕ_ic ṽ_jc`;
   * 9. `ds_j = f(p_j · f(dp_j − D_i))` with the float32 `p_j` of step 3 (with dropout, `dp_j = f(dp_j ·
   *    z_j)` first; with a softcap,
   *    `ds_j = f(ds_j · f(1 − f(t_j · t_j)))`), then `d̃s_j = rd(ds_j)` (dS rounded to the dtype before the
   *    dS·K and dSᵀ·Q products);
   * 10. `dq_i = rd(f(scale · Σᶠ_j d̃s_j k̃_j))`;
   * 11. `dk_j += f(d̃s_j · q̃_ic)` in a float32 accumulator; at the end `dk = rd(f(scale · dk))`,
   *     `dv = rd(dv)`;
   * 12. with sinks, `dsinks_h = f(dsinks_h − f(p_σ · D_i))` over the rows in order (batch by batch),
   *     from 0; `dsinks` stays float32.
   *
   * With `'float32'`, `rd = f`: only the float32 accumulation differs from the exact reference.
   *
   * `'tf32'`: float32 tensors whose matrix-product operands are rounded to TF32 first, as tensor cores
   * compute float32 (the CUDA forward's default `float32Precision: 'tf32'`). `rd` splits in two: the
   * operands — q̃, k̃, ṽ and dÕ in step 1, p̃ in step 4, d̃s in step 9 — are
   * `rd = roundToTf32` (10-bit mantissa, ties away from zero, as `cvt.rna.tf32.f32`), and the stored
   * results — out in step 5, dq, dk and dv in steps 10 and 11 — are `rd = f`. Every float32 accumulation
   * stays as above (D in step 6 uses dÕ and the float32 out).
   *
   * Empty (fully masked) rows behave as in float64 mode.
   */
  precision?: ReferencePrecision;
}

/** The arithmetic that {@link ReferenceOptions.precision} emulates. */
export type ReferencePrecision = 'float64' | DType | 'tf32';

// One shared 4-byte scratch word, viewed as float32 and as uint32 (same platform byte order).
const tf32Scratch = new Float32Array(1);
const tf32Bits = new Uint32Array(tf32Scratch.buffer);
const TF32_HALF_ULP = 0x1000; // bit 12: the highest of the 13 mantissa bits that TF32 drops
const TF32_MASK = 0xffffe000; // sign, exponent and the 10 mantissa bits TF32 keeps
const F32_EXP_MASK = 0x7f800000;

/**
 * Rounds to TF32 as the CUDA tensor-core path does (`cvt.rna.tf32.f32`): first to float32, then to a
 * 10-bit mantissa, to nearest with ties away from zero. Finite values beyond the largest TF32 value
 * (`(2 − 2^-10) · 2^127`, by half a TF32 ulp or more) become ±Infinity; ±Infinity, NaN and ±0 are kept.
 * TF32 keeps float32's exponent range, subnormals included.
 * @example roundToTf32(1 + 2 ** -11) === 1 + 2 ** -10 // a tie, away from zero
 */
export function roundToTf32(x: number): number {
  checkNumberArg(x, 'x');
  tf32Scratch[0] = x;
  const u = tf32Bits[0];
  // Adding half of the dropped range to the bit pattern rounds the magnitude (ties up, i.e. away from
  // zero); a carry out of the mantissa bumps the exponent, up to Infinity. Inf and NaN only truncate.
  tf32Bits[0] = ((u & F32_EXP_MASK) === F32_EXP_MASK ? u : u + TF32_HALF_ULP) & TF32_MASK;
  return tf32Scratch[0];
}

/** How same-precision mode rounds the operands of the products and the stored results. */
interface Rounding {
  input: (x: number) => number;
  output: (x: number) => number;
}

function roundingOf(precision: DType | 'tf32'): Rounding {
  if (precision === 'tf32') return { input: roundToTf32, output: f };
  const rd = dtypeRounder(precision);
  return { input: rd, output: rd };
}

/** Result of {@link referenceAttention}. */
export interface ReferenceForwardResult {
  /** `[batch, seqlenQ, headsQ, headDim]` (varlen: `[totalQ, headsQ, headDim]`), the attention output. */
  out: Float64Array;
  /**
   * `[batch, headsQ, seqlenQ]` (varlen: `[headsQ, totalQ]`), natural-log log-sum-exp of the visible scaled scores (and the sink);
   * +Infinity for empty rows (the sink's logit with sinks).
   */
  lse: Float64Array;
}

/** Result of {@link referenceAttentionBackward}. */
export interface ReferenceBackwardResult extends ReferenceForwardResult {
  /** `[batch, seqlenQ, headsQ, headDim]`, gradient of the loss with respect to `q`. */
  dq: Float64Array;
  /** `[batch, seqlenK, headsKV, headDim]`, gradient with respect to `k` (summed over the query heads of a group). */
  dk: Float64Array;
  /** `[batch, seqlenK, headsKV, headDim]`, gradient with respect to `v` (summed over the query heads of a group). */
  dv: Float64Array;
  /** `[headsQ]`, gradient with respect to `sinks` (summed over the batch); present when `sinks` was given. */
  dsinks?: Float64Array;
}

interface Resolved {
  B: number;
  Sq: number;
  Sk: number;
  Hq: number;
  Hkv: number;
  d: number;
  group: number;
  scale: number;
  causal: boolean;
  /** Window sides in keys, Infinity where unbounded. */
  left: number;
  right: number;
  /** 0: no softcap. */
  softcap: number;
  /** The ALiBi slope of (batch, query head) at b · headsQ + h, or null. */
  alibi: Float64Array | null;
  /** The sink logit of each query head, or null. */
  sinks: Float64Array | null;
  /** Dropout (p > 0), or null. */
  dropout: ResolvedDropout | null;
  /** Varlen: the sequences' query and key prefix sums (batch + 1 each), or null (dense). */
  cuQ: Int32Array | null;
  cuK: Int32Array | null;
  /** Key padding: each sequence's length (batch), or null. */
  lens: Int32Array | null;
  /** Query and key rows of the row dimension: batch · seqlen, or the prefix sums' last values. */
  totalQ: number;
  totalK: number;
  precision: ReferencePrecision;
}

const SHAPE_KEYS = ['batch', 'seqlenQ', 'seqlenK', 'headsQ', 'headsKV', 'headDim'] as const;
const OPTION_KEYS = [
  'causal', 'softmaxScale', 'window', 'softcap', 'alibiSlopes', 'sinks', 'dropout', 'seed', 'offset', 'cuSeqlensQ',
  'cuSeqlensK', 'seqlens', 'precision',
] as const;
const PRECISIONS: readonly ReferencePrecision[] = ['float64', 'float32', 'float16', 'bfloat16', 'tf32'];

/** A positive safe integer read from `shape.<name>`. */
function checkPositiveInt(name: string, v: unknown): number {
  if (typeof v !== 'number') throw typeError(`shape.${name} to be a number`, describeValue(v));
  if (!Number.isSafeInteger(v) || v < 1) throw rangeError(`shape.${name} to be an integer >= 1`, String(v));
  return v;
}

/** An array of values (by tag: arrays from another realm pass) of `expected` elements (typed arrays: their real length). */
/**
 * The real length of `a`, an Array of numbers or a typed array whose tag is one of `tags` (by tag:
 * arrays from another realm pass; typed arrays by their real length, not an overridable `length`);
 * anything else is refused as not `kinds`.
 */
function arrayLength(name: string, a: unknown, tags: readonly string[], kinds: string): number {
  const typed = tags.includes(Object.prototype.toString.call(a));
  if (!typed && !(Array.isArray(a) && a.every((x) => typeof x === 'number'))) {
    throw typeError(`${name} to be ${kinds}`, Array.isArray(a) ? 'an Array with a non-number' : describeValue(a));
  }
  return typed ? trueLength(a as ArrayBufferView) : (a as number[]).length;
}
const FLOAT_ARRAYS = ['[object Float32Array]', '[object Float64Array]'];
const INT_ARRAYS = ['[object Int32Array]'];

function checkLength(name: string, a: ReferenceInput, expected: number, dims: string): void {
  // Only arrays of values: an Int16Array / Uint16Array (half-precision bits, say) would be read as
  // numbers and give garbage.
  const length = arrayLength(name, a, FLOAT_ARRAYS,
    'a Float32Array, Float64Array or number[] (float values; convert half-precision bits first)');
  if (length !== expected) throw rangeError(`${name} to have ${expected} elements (${dims})`, String(length));
}

// Reads each key of shape and options once, into the snapshot it checks and returns (a getter that
// changes its answer cannot make the checked and the used values differ); unknown keys are refused.
function resolve(shape: ReferenceShape, options: ReferenceOptions | undefined): Resolved {
  if (shape === null || typeof shape !== 'object' || Array.isArray(shape)) {
    throw typeError(`shape to be an object { ${SHAPE_KEYS.join(', ')} }`, describeValue(shape));
  }
  refuseUnknownKeys(shape, 'shape', SHAPE_KEYS);
  const B = checkPositiveInt('batch', shape.batch);
  const Sq = checkPositiveInt('seqlenQ', shape.seqlenQ);
  const Sk = checkPositiveInt('seqlenK', shape.seqlenK);
  const Hq = checkPositiveInt('headsQ', shape.headsQ);
  const Hkv = checkPositiveInt('headsKV', shape.headsKV);
  const d = checkPositiveInt('headDim', shape.headDim);
  if (Hq % Hkv !== 0) throw rangeError(`shape.headsQ to be a multiple of shape.headsKV (${Hkv})`, String(Hq));
  if (options !== undefined && (options === null || typeof options !== 'object' || Array.isArray(options))) {
    throw typeError('options to be an object or undefined', describeValue(options));
  }
  const opts: Record<string, unknown> = options === undefined ? {} : (options as Record<string, unknown>);
  refuseUnknownKeys(opts, 'options', OPTION_KEYS);
  const {
    causal, softmaxScale: scaleIn, window: windowIn, softcap: softcapIn, alibiSlopes: alibiIn, sinks: sinksIn,
    dropout: dropoutIn, seed: seedIn, offset: offsetIn, cuSeqlensQ: cuQIn, cuSeqlensK: cuKIn, seqlens: lensIn,
    precision: precisionIn,
  } = opts; // each key read once
  if (causal !== undefined && typeof causal !== 'boolean') {
    throw typeError('options.causal to be a boolean', describeValue(causal));
  }
  let scale = 1 / Math.sqrt(d);
  if (scaleIn !== undefined) {
    if (typeof scaleIn !== 'number') throw typeError('options.softmaxScale to be a number', describeValue(scaleIn));
    if (!Number.isFinite(scaleIn) || scaleIn <= 0) throw rangeError('options.softmaxScale to be a finite number > 0', String(scaleIn));
    scale = scaleIn;
  }
  const [left, right] = checkWindow(windowIn);
  let softcap = 0;
  if (softcapIn !== undefined) {
    if (typeof softcapIn !== 'number') throw typeError('options.softcap to be a number', describeValue(softcapIn));
    if (!Number.isFinite(softcapIn) || softcapIn < 0) {
      throw rangeError('options.softcap to be a finite number >= 0 (0: no softcap)', String(softcapIn));
    }
    softcap = softcapIn;
  }
  let alibi: Float64Array | null = null;
  if (alibiIn !== undefined) {
    const a = finiteValues('options.alibiSlopes', alibiIn as ReferenceInput, [Hq, B * Hq], '[headsQ] or [batch, headsQ]');
    alibi = a.length === B * Hq ? a : Float64Array.from({ length: B * Hq }, (_, i) => a[i % Hq]);
  }
  const sinks = sinksIn === undefined ? null : finiteValues('options.sinks', sinksIn as ReferenceInput, [Hq], '[headsQ]');
  let dropout: ResolvedDropout | null = null;
  if (dropoutIn !== undefined) {
    const names = { p: 'options.dropout', seed: 'options.seed', offset: 'options.offset' };
    if (typeof dropoutIn === 'number' && dropoutIn > 0 && seedIn === undefined) {
      throw typeError('options.seed (the dropout mask\'s Philox key) with options.dropout > 0', 'no seed');
    }
    const d = resolveDropout(dropoutIn, seedIn ?? 0, offsetIn, names);
    dropout = d.p > 0 ? d : null;
  }
  if (dropoutIn === undefined && (seedIn !== undefined || offsetIn !== undefined)) {
    throw typeError('options.seed and options.offset only with options.dropout', seedIn !== undefined ? 'a seed' : 'an offset');
  }
  if ((cuQIn === undefined) !== (cuKIn === undefined)) {
    throw typeError('options.cuSeqlensQ and options.cuSeqlensK to be given together',
      cuQIn === undefined ? 'only cuSeqlensK' : 'only cuSeqlensQ');
  }
  const cuQ = cuQIn === undefined ? null : prefixSums('options.cuSeqlensQ', cuQIn, B, Sq, 'seqlenQ');
  const cuK = cuKIn === undefined ? null : prefixSums('options.cuSeqlensK', cuKIn, B, Sk, 'seqlenK');
  if (lensIn !== undefined && cuQ !== null) {
    throw typeError('options.seqlens (key padding of the batch layout) without options.cuSeqlensQ / cuSeqlensK (varlen)',
      'both');
  }
  const lens = lensIn === undefined ? null : sequenceLengths(lensIn, B, Math.min(Sq, Sk));
  const precision = precisionIn ?? 'float64';
  if (!(PRECISIONS as readonly unknown[]).includes(precision)) {
    throw typeError(`options.precision to be ${quoteList(PRECISIONS)}`, describeValue(precision));
  }
  return {
    B, Sq, Sk, Hq, Hkv, d, group: Hq / Hkv, scale, causal: causal === true, left, right, softcap, alibi, sinks, dropout,
    cuQ, cuK, lens, totalQ: cuQ === null ? B * Sq : cuQ[B], totalK: cuK === null ? B * Sk : cuK[B],
    precision: precision as ReferencePrecision,
  };
}

/**
 * A copy of `batch + 1` prefix sums of sequence lengths: integers from 0, non-decreasing, each length at
 * most `max` (shape.<maxName>).
 */
function prefixSums(name: string, a: unknown, batch: number, max: number, maxName: string): Int32Array {
  const length = arrayLength(name, a, INT_ARRAYS, 'an Int32Array or number[]');
  if (length !== batch + 1) throw rangeError(`${name} to have shape.batch + 1 = ${batch + 1} elements`, String(length));
  const values = Array.from({ length }, (_, i) => (a as ArrayLike<number>)[i]);
  if (values[0] !== 0) throw rangeError(`${name}[0] to be 0`, String(values[0]));
  for (let b = 0; b < batch; b++) {
    const next = values[b + 1];
    if (!Number.isSafeInteger(next)) throw rangeError(`${name}[${b + 1}] to be an integer`, String(next));
    const n = next - values[b];
    if (n < 0 || n > max) {
      throw rangeError(`sequence ${b}'s length ${name}[${b + 1}] − ${name}[${b}] to be from 0 to shape.${maxName} = ${max}`, String(n));
    }
  }
  if (values[batch] > 0x7fffffff) throw rangeError(`${name}[${batch}] to fit an int32`, String(values[batch]));
  return Int32Array.from(values);
}

/** A copy of `options.seqlens`: `batch` integers from 0 to `max`. */
function sequenceLengths(a: unknown, batch: number, max: number): Int32Array {
  const name = 'options.seqlens';
  const length = arrayLength(name, a, INT_ARRAYS, 'an Int32Array or number[]');
  if (length !== batch) throw rangeError(`${name} to have shape.batch = ${batch} elements`, String(length));
  const values = Array.from({ length }, (_, i) => (a as ArrayLike<number>)[i]);
  values.forEach((x, b) => {
    if (!Number.isSafeInteger(x) || x < 0 || x > max) {
      throw rangeError(`${name}[${b}] to be an integer from 0 to min(shape.seqlenQ, shape.seqlenK) = ${max}`, String(x));
    }
  });
  return Int32Array.from(values);
}

/** A copy of an array of finite values whose length is one of `lengths`. */
function finiteValues(name: string, a: ReferenceInput, lengths: readonly number[], dims: string): Float64Array {
  const length = arrayLength(name, a, FLOAT_ARRAYS, 'a Float32Array, Float64Array or number[]');
  if (!lengths.includes(length)) {
    throw rangeError(`${name} to have ${[...new Set(lengths)].join(' or ')} elements (${dims})`, String(length));
  }
  const copy = Float64Array.from({ length }, (_, i) => a[i]);
  const bad = copy.findIndex((x) => !Number.isFinite(x));
  if (bad >= 0) throw rangeError(`${name} to hold finite values`, `${copy[bad]} at index ${bad}`);
  return copy;
}

/** `options.window` (undefined: none) as [left, right] key counts, Infinity where unbounded. */
function checkWindow(window: unknown): [number, number] {
  if (window === undefined) return [Infinity, Infinity];
  const what = 'options.window to be [left, right], integers >= -1 (-1: unbounded)';
  if (!Array.isArray(window) || window.length !== 2) throw typeError(what, describeValue(window));
  const sides = [window[0], window[1]]; // each element read once
  for (const x of sides) {
    if (typeof x !== 'number') throw typeError(what, `an element ${describeValue(x)}`);
    if (!Number.isSafeInteger(x) || x < -1) throw rangeError(what, `[${sides.map(String).join(', ')}]`);
  }
  return [sides[0] === -1 ? Infinity : sides[0], sides[1] === -1 ? Infinity : sides[1]];
}

/** What modifies the scores of one row: the softcap, the row's ALiBi slope and its diagonal key. */
interface RowMods {
  cap: number;
  slope: number;
  diag: number;
}

/** The layouts of the query-side and key-side arrays, for messages. */
function layouts(r: Resolved): [string, string] {
  return r.cuQ === null
    ? ['[batch, seqlenQ, headsQ, headDim]', '[batch, seqlenK, headsKV, headDim]']
    : [`[totalQ = ${r.totalQ}, headsQ, headDim]`, `[totalK = ${r.totalK}, headsKV, headDim]`];
}

/** Sequence b's rows of the (packed) row dimension: queries [q0, q0 + sq), keys [k0, k0 + sk). */
interface Seq {
  q0: number;
  sq: number;
  k0: number;
  sk: number;
}

/** Fills and returns `seq` with sequence b's rows (dense: b · seqlen; varlen: the prefix sums). */
function sequence(r: Resolved, b: number, seq: Seq): Seq {
  if (r.cuQ === null || r.cuK === null) {
    seq.q0 = b * r.Sq;
    seq.sq = r.lens === null ? r.Sq : r.lens[b];
    seq.k0 = b * r.Sk;
    seq.sk = r.lens === null ? r.Sk : r.lens[b];
  } else {
    seq.q0 = r.cuQ[b];
    seq.sq = r.cuQ[b + 1] - r.cuQ[b];
    seq.k0 = r.cuK[b];
    seq.sk = r.cuK[b + 1] - r.cuK[b];
  }
  return seq;
}

/** Where row i of sequence b, query head h, keeps its lse: `[batch, headsQ, seqlenQ]`, or `[headsQ, totalQ]` (varlen). */
function lseIndex(r: Resolved, b: number, h: number, seq: Seq, i: number): number {
  return r.cuQ === null ? (b * r.Hq + h) * r.Sq + i : h * r.totalQ + seq.q0 + i;
}

/** The score modifiers of row i of (sequence b, query head h); `mods` is filled and returned. */
function rowMods(r: Resolved, b: number, h: number, seq: Seq, i: number, mods: RowMods): RowMods {
  mods.cap = r.softcap;
  mods.slope = r.alibi === null ? 0 : r.alibi[b * r.Hq + h];
  mods.diag = i + seq.sk - seq.sq;
  return mods;
}

/** The first key query row i sees (with {@link endKey}: keys [firstKey, endKey) of its sequence; none when equal). */
function firstKey(r: Resolved, seq: Seq, i: number): number {
  const lo = i + seq.sk - seq.sq - r.left;
  return lo <= 0 ? 0 : lo >= seq.sk ? seq.sk : lo;
}

/** One past the last key query row i sees, at least firstKey(r, seq, i). */
function endKey(r: Resolved, seq: Seq, i: number): number {
  const right = r.causal ? Math.min(r.right, 0) : r.right;
  const hi = i + seq.sk - seq.sq + right + 1;
  const lo = firstKey(r, seq, i);
  return hi <= lo ? lo : hi >= seq.sk ? seq.sk : hi;
}

/** Copies head `h` of rows [row0, row0 + S) of a `[rows, H, d]` array into `dst` as `[S, d]`, mapped by `conv`. */
function gatherHead(
  src: ReferenceInput,
  row0: number,
  S: number,
  h: number,
  H: number,
  d: number,
  dst: Float64Array | Float32Array,
  conv: ((x: number) => number) | null,
): void {
  for (let s = 0; s < S; s++) {
    const base = ((row0 + s) * H + h) * d;
    const o = s * d;
    if (conv === null) {
      for (let c = 0; c < d; c++) dst[o + c] = src[base + c];
    } else {
      for (let c = 0; c < d; c++) dst[o + c] = conv(src[base + c]);
    }
  }
}

/** Writes `[S, d]` `src` into head `h` of rows [row0, row0 + S) of a `[rows, H, d]` array, multiplied by `mul`, mapped by `conv`. */
function scatterHead(
  src: Float64Array | Float32Array,
  row0: number,
  S: number,
  h: number,
  H: number,
  d: number,
  dst: Float64Array,
  mul: number,
  conv: ((x: number) => number) | null,
): void {
  for (let s = 0; s < S; s++) {
    const base = ((row0 + s) * H + h) * d;
    const o = s * d;
    if (conv === null) {
      for (let c = 0; c < d; c++) dst[base + c] = src[o + c] * mul;
    } else {
      for (let c = 0; c < d; c++) dst[base + c] = conv(f(src[o + c] * mul));
    }
  }
}

/**
 * The dropout factors of a row's keys lo .. lo + n − 1: z[j] = `kept` for a kept element, 0 for a
 * dropped one (lib/dropout.ts's mask, one Philox call per four keys).
 */
function rowDropout(dr: ResolvedDropout, Hq: number, w: { b: number; h: number; i: number; lo: number; n: number },
  kept: number, z: Buffer): void {
  let group = -1;
  for (let j = 0; j < w.n; j++) {
    const col = w.lo + j;
    if (col >> 2 !== group) {
      group = col >> 2;
      dropoutWords(dr, w.b, w.h, Hq, w.i, group, dropWords);
    }
    z[j] = dropWords[col & 3] >= dr.threshold ? kept : 0;
  }
}
const dropWords = new Uint32Array(4);

// ---------------------------------------------------------------------------------------------
// float64 kernels (rows of length d, contiguous)
// ---------------------------------------------------------------------------------------------

/**
 * s[j] = scale · (Q[qo..qo+d) · K[lo + j]) for j < n, float64; with a softcap c > 0, t[j] = tanh(s[j] / c)
 * and s[j] = c · t[j]; then minus the ALiBi bias slope · |diag − (lo + j)|.
 */
function scores64(Q: Float64Array, qo: number, K: Float64Array, lo: number, n: number, d: number, scale: number,
  m: RowMods, s: Float64Array, t: Float64Array): void {
  for (let j = 0; j < n; j++) {
    const o = (lo + j) * d;
    let a = 0;
    for (let c = 0; c < d; c++) a += Q[qo + c] * K[o + c];
    s[j] = a * scale;
    if (m.cap > 0) {
      t[j] = tanh(s[j] / m.cap);
      s[j] = m.cap * t[j];
    }
    if (m.slope !== 0) s[j] -= m.slope * Math.abs(m.diag - lo - j);
  }
}

/**
 * In place: s[0..n) -> softmax(s) with a sink logit (−Infinity: none) in the denominator; returns
 * log(exp(sink) + Σ exp(s)). n >= 1.
 */
function softmax64(s: Float64Array, n: number, sink: number): number {
  let m = sink;
  for (let j = 0; j < n; j++) if (s[j] > m) m = s[j];
  let l = exp(sink - m);
  for (let j = 0; j < n; j++) {
    const e = exp(s[j] - m);
    s[j] = e;
    l += e;
  }
  const inv = 1 / l;
  for (let j = 0; j < n; j++) s[j] *= inv;
  return m + log(l);
}

/** orow = Σ_j p[j] · V[lo + j], float64. */
function pv64(p: Float64Array, V: Float64Array, lo: number, n: number, d: number, orow: Float64Array): void {
  orow.fill(0);
  for (let j = 0; j < n; j++) {
    const pj = p[j];
    const o = (lo + j) * d;
    for (let c = 0; c < d; c++) orow[c] += pj * V[o + c];
  }
}

// ---------------------------------------------------------------------------------------------
// float32-accumulation kernels for same-precision mode (every operation rounded with Math.fround)
// ---------------------------------------------------------------------------------------------


/** scores64 in float32 arithmetic (same-precision mode, step 2 of {@link ReferenceOptions.precision}). */
function scores32(Q: Float32Array, qo: number, K: Float32Array, lo: number, n: number, d: number, scale: number,
  m: RowMods, s: Float32Array, t: Float32Array): void {
  const cap = f(m.cap);
  const slope = f(m.slope);
  for (let j = 0; j < n; j++) {
    const o = (lo + j) * d;
    let a = 0;
    for (let c = 0; c < d; c++) a = f(a + f(Q[qo + c] * K[o + c]));
    s[j] = f(a * scale);
    if (cap > 0) {
      t[j] = f(tanh(f(s[j] / cap)));
      s[j] = f(cap * t[j]);
    }
    if (slope !== 0) s[j] = f(s[j] - f(slope * Math.abs(m.diag - lo - j)));
  }
}

/**
 * In place: s -> float32 softmax p (unrounded to the dtype) with a sink logit (float32; −Infinity:
 * none), whose probability goes to ps[0]; returns the float32 lse (step 3).
 */
function softmax32(s: Float32Array, n: number, sink: number, ps: Float32Array): number {
  let m = sink;
  for (let j = 0; j < n; j++) if (s[j] > m) m = s[j];
  const es = f(exp(f(sink - m)));
  let l = es;
  for (let j = 0; j < n; j++) {
    const e = f(exp(f(s[j] - m)));
    s[j] = e;
    l = f(l + e);
  }
  for (let j = 0; j < n; j++) s[j] = f(s[j] / l);
  ps[0] = f(es / l);
  return f(m + f(log(l)));
}

function pv32(p: Float32Array, V: Float32Array, lo: number, n: number, d: number, acc: Float32Array): void {
  acc.fill(0);
  for (let j = 0; j < n; j++) {
    const pj = p[j];
    const o = (lo + j) * d;
    for (let c = 0; c < d; c++) acc[c] = f(acc[c] + f(pj * V[o + c]));
  }
}

/** Zeroed out and lse, the lse of key padding's excluded queries +Infinity (the loops never visit them). */
function makeOutputs(r: Resolved): { out: Float64Array; lse: Float64Array } {
  const lse = new Float64Array(r.Hq * r.totalQ);
  if (r.lens !== null) lse.fill(Infinity);
  return { out: new Float64Array(r.totalQ * r.Hq * r.d), lse };
}

// ---------------------------------------------------------------------------------------------
// Forward
// ---------------------------------------------------------------------------------------------

/** One query row that sees keys, as {@link walkRows} hands it to a pass. */
interface Row {
  b: number; // sequence
  h: number; // query head
  i: number; // row in the sequence
  ob: number; // offset of its out / dq row
  li: number; // index of its lse
  lo: number; // its keys: [lo, lo + n) of the sequence, n >= 1
  n: number;
  sink: number; // its head's sink logit (as the pass computes it), -Infinity without sinks
  mods: RowMods; // its score modifiers
}

/** What a pass does at each level of {@link walkRows}. */
interface RowWalk {
  /** KV head kh of the sequence: gather its K and V rows (and clear the backward's dK, dV). */
  kvHead(seq: Seq, kh: number): void;
  /** Query head h of the sequence: gather its Q (and dO) rows. */
  queryHead(seq: Seq, h: number): void;
  /** One row that sees keys. */
  row(row: Row): void;
  /** After the query heads of KV head kh (the backward writes dK, dV). */
  kvHeadDone?(seq: Seq, kh: number): void;
}

/**
 * Walks every sequence, its KV heads, the query heads of each group and their rows, in that order.
 * A row that sees no key gets lse +Infinity (its head's sink logit, through `sinkOf`, with sinks) and
 * nothing else; the others go to `walk.row`.
 */
function walkRows(r: Resolved, lse: Float64Array, sinkOf: (x: number) => number, walk: RowWalk): void {
  const seq: Seq = { q0: 0, sq: 0, k0: 0, sk: 0 };
  const row: Row = { b: 0, h: 0, i: 0, ob: 0, li: 0, lo: 0, n: 0, sink: -Infinity, mods: { cap: 0, slope: 0, diag: 0 } };
  for (let b = 0; b < r.B; b++) {
    sequence(r, b, seq);
    for (let kh = 0; kh < r.Hkv; kh++) {
      walk.kvHead(seq, kh);
      for (let h = kh * r.group; h < (kh + 1) * r.group; h++) {
        walk.queryHead(seq, h);
        const sink = r.sinks === null ? -Infinity : sinkOf(r.sinks[h]);
        for (let i = 0; i < seq.sq; i++) {
          const li = lseIndex(r, b, h, seq, i);
          const lo = firstKey(r, seq, i);
          const n = endKey(r, seq, i) - lo;
          if (n === 0) {
            lse[li] = r.sinks === null ? Infinity : sink; // out (and dq) stay 0
            continue;
          }
          row.b = b;
          row.h = h;
          row.i = i;
          row.ob = ((seq.q0 + i) * r.Hq + h) * r.d;
          row.li = li;
          row.lo = lo;
          row.n = n;
          row.sink = sink;
          rowMods(r, b, h, seq, i, row.mods);
          walk.row(row);
        }
      }
      walk.kvHeadDone?.(seq, kh);
    }
  }
}

type Buffer = Float64Array | Float32Array;

/**
 * The gathering steps of a pass: per KV head its K and V rows (and `clear`ed accumulators), per query
 * head its Q rows (and dO rows with `dout`), each mapped by `conv`.
 */
function gathers(r: Resolved, conv: ((x: number) => number) | null, q: ReferenceInput, k: ReferenceInput,
  v: ReferenceInput, Q: Buffer, K: Buffer, V: Buffer, dout?: [ReferenceInput, Buffer], clear: Buffer[] = []):
  Pick<RowWalk, 'kvHead' | 'queryHead'> {
  return {
    kvHead: (seq, kh) => {
      gatherHead(k, seq.k0, seq.sk, kh, r.Hkv, r.d, K, conv);
      gatherHead(v, seq.k0, seq.sk, kh, r.Hkv, r.d, V, conv);
      for (const a of clear) a.fill(0);
    },
    queryHead: (seq, h) => {
      gatherHead(q, seq.q0, seq.sq, h, r.Hq, r.d, Q, conv);
      if (dout !== undefined) gatherHead(dout[0], seq.q0, seq.sq, h, r.Hq, r.d, dout[1], conv);
    },
  };
}

function forward64(q: ReferenceInput, k: ReferenceInput, v: ReferenceInput, r: Resolved): ReferenceForwardResult {
  const { Sq, Sk, d, scale } = r;
  const { out, lse } = makeOutputs(r);
  const K = new Float64Array(Sk * d);
  const V = new Float64Array(Sk * d);
  const Q = new Float64Array(Sq * d);
  const s = new Float64Array(Sk);
  const t = new Float64Array(Sk);
  const z = new Float64Array(Sk); // dropout factors
  const orow = new Float64Array(d);
  walkRows(r, lse, (x) => x, {
    ...gathers(r, null, q, k, v, Q, K, V),
    row: (w) => {
      scores64(Q, w.i * d, K, w.lo, w.n, d, scale, w.mods, s, t);
      lse[w.li] = softmax64(s, w.n, w.sink);
      if (r.dropout !== null) {
        rowDropout(r.dropout, r.Hq, w, r.dropout.scale, z);
        for (let j = 0; j < w.n; j++) s[j] *= z[j];
      }
      pv64(s, V, w.lo, w.n, d, orow);
      for (let c = 0; c < d; c++) out[w.ob + c] = orow[c];
    },
  });
  return { out, lse };
}

function forwardSame(
  q: ReferenceInput,
  k: ReferenceInput,
  v: ReferenceInput,
  r: Resolved,
  precision: DType | 'tf32',
): ReferenceForwardResult {
  const { Sq, Sk, d } = r;
  const { input: rd, output: rdOut } = roundingOf(precision);
  const scale = f(r.scale);
  const { out, lse } = makeOutputs(r);
  const K = new Float32Array(Sk * d);
  const V = new Float32Array(Sk * d);
  const Q = new Float32Array(Sq * d);
  const s = new Float32Array(Sk);
  const t = new Float32Array(Sk);
  const ps = new Float32Array(1);
  const z = new Float32Array(Sk); // dropout factors
  const acc = new Float32Array(d);
  walkRows(r, lse, f, {
    ...gathers(r, rd, q, k, v, Q, K, V),
    row: (w) => {
      scores32(Q, w.i * d, K, w.lo, w.n, d, scale, w.mods, s, t);
      lse[w.li] = softmax32(s, w.n, w.sink, ps);
      if (r.dropout !== null) {
        rowDropout(r.dropout, r.Hq, w, f(r.dropout.scale), z);
        for (let j = 0; j < w.n; j++) s[j] = f(s[j] * z[j]);
      }
      for (let j = 0; j < w.n; j++) s[j] = rd(s[j]);
      pv32(s, V, w.lo, w.n, d, acc);
      for (let c = 0; c < d; c++) out[w.ob + c] = rdOut(acc[c]);
    },
  });
  return { out, lse };
}

/**
 * Naive attention forward: `out = softmax(softmaxScale · q·kᵀ, masked) · v` and its log-sum-exp.
 *
 * @param q `[batch, seqlenQ, headsQ, headDim]`, flat row-major.
 * @param k `[batch, seqlenK, headsKV, headDim]`, flat row-major.
 * @param v `[batch, seqlenK, headsKV, headDim]`, flat row-major.
 * @param shape the sizes (validated: positive integers, `headsQ % headsKV === 0`, array lengths).
 * @param options causal mask, softmax scale, precision (see {@link ReferenceOptions}).
 * @returns `out` `[batch, seqlenQ, headsQ, headDim]` and `lse` `[batch, headsQ, seqlenQ]` (natural
 *   log; +Infinity and an all-zero output row for a query row that sees no key).
 * @throws RangeError / TypeError on an invalid shape, array length or option.
 */
export function referenceAttention(
  q: ReferenceInput,
  k: ReferenceInput,
  v: ReferenceInput,
  shape: ReferenceShape,
  options?: ReferenceOptions,
): ReferenceForwardResult {
  const r = resolve(shape, options);
  const [qDims, kDims] = layouts(r);
  checkLength('q', q, r.totalQ * r.Hq * r.d, qDims);
  checkLength('k', k, r.totalK * r.Hkv * r.d, kDims);
  checkLength('v', v, r.totalK * r.Hkv * r.d, kDims);
  return r.precision === 'float64' ? forward64(q, k, v, r) : forwardSame(q, k, v, r, r.precision);
}

// ---------------------------------------------------------------------------------------------
// Backward
// ---------------------------------------------------------------------------------------------

function backward64(
  dout: ReferenceInput,
  q: ReferenceInput,
  k: ReferenceInput,
  v: ReferenceInput,
  r: Resolved,
): ReferenceBackwardResult {
  const { Sq, Sk, Hq, Hkv, d, scale } = r;
  const { out, lse } = makeOutputs(r);
  const dq = new Float64Array(out.length);
  const dk = new Float64Array(r.totalK * Hkv * d);
  const dv = new Float64Array(dk.length);
  const K = new Float64Array(Sk * d);
  const V = new Float64Array(Sk * d);
  const Q = new Float64Array(Sq * d);
  const DO = new Float64Array(Sq * d);
  const dK = new Float64Array(Sk * d);
  const dV = new Float64Array(Sk * d);
  const p = new Float64Array(Sk);
  const t = new Float64Array(Sk);
  const z = new Float64Array(Sk).fill(1); // dropout factors (1: no dropout)
  const pz = new Float64Array(Sk); // P Z
  const dsinks = r.sinks === null ? null : new Float64Array(Hq);
  const orow = new Float64Array(d);
  const dqrow = new Float64Array(d);
  // A row that sees no key keeps out, dq = 0 and adds nothing to dk / dv; with a sink its weight is 1
  // but D = 0: dsinks gains 0.
  walkRows(r, lse, (x) => x, {
    ...gathers(r, null, q, k, v, Q, K, V, [dout, DO], [dK, dV]),
    row: (w) => {
      const { ob, lo, n } = w;
      const qo = w.i * d;
      // Forward recompute of the row.
      scores64(Q, qo, K, lo, n, d, scale, w.mods, p, t);
      lse[w.li] = softmax64(p, n, w.sink);
      if (r.dropout !== null) rowDropout(r.dropout, Hq, w, r.dropout.scale, z);
      for (let j = 0; j < n; j++) pz[j] = p[j] * z[j];
      pv64(pz, V, lo, n, d, orow);
      let D = 0;
      for (let c = 0; c < d; c++) {
        out[ob + c] = orow[c];
        D += DO[qo + c] * orow[c];
      }
      if (dsinks !== null) dsinks[w.h] -= exp(w.sink - lse[w.li]) * D;
      dqrow.fill(0);
      for (let j = 0; j < n; j++) {
        const o = (lo + j) * d;
        const pj = p[j];
        const pzj = pz[j];
        // dV_j += (P_ij Z_ij) · dO_i ; dP_ij = (dO_i · V_j) Z_ij (Z: dropout's factor, 1 without it)
        let dp = 0;
        for (let c = 0; c < d; c++) {
          dV[o + c] += pzj * DO[qo + c];
          dp += DO[qo + c] * V[o + c];
        }
        dp *= z[j];
        // dS_ij, through the softcap's tanh when there is one.
        const ds = r.softcap > 0 ? pj * (dp - D) * (1 - t[j] * t[j]) : pj * (dp - D);
        // dQ_i += dS_ij · K_j ; dK_j += dS_ij · Q_i   (scale applied at the end)
        for (let c = 0; c < d; c++) {
          dqrow[c] += ds * K[o + c];
          dK[o + c] += ds * Q[qo + c];
        }
      }
      for (let c = 0; c < d; c++) dq[ob + c] = dqrow[c] * scale;
    },
    kvHeadDone: (seq, kh) => {
      scatterHead(dK, seq.k0, seq.sk, kh, Hkv, d, dk, scale, null);
      scatterHead(dV, seq.k0, seq.sk, kh, Hkv, d, dv, 1, null);
    },
  });
  return dsinks === null ? { dq, dk, dv, out, lse } : { dq, dk, dv, out, lse, dsinks };
}

function backwardSame(
  dout: ReferenceInput,
  q: ReferenceInput,
  k: ReferenceInput,
  v: ReferenceInput,
  r: Resolved,
  precision: DType | 'tf32',
): ReferenceBackwardResult {
  const { Sq, Sk, Hq, Hkv, d } = r;
  const { input: rd, output: rdOut } = roundingOf(precision);
  const scale = f(r.scale);
  const { out, lse } = makeOutputs(r);
  const dq = new Float64Array(out.length);
  const dk = new Float64Array(r.totalK * Hkv * d);
  const dv = new Float64Array(dk.length);
  const K = new Float32Array(Sk * d);
  const V = new Float32Array(Sk * d);
  const Q = new Float32Array(Sq * d);
  const DO = new Float32Array(Sq * d);
  const dK = new Float32Array(Sk * d);
  const dV = new Float32Array(Sk * d);
  const p = new Float32Array(Sk); // float32 softmax
  const pr = new Float32Array(Sk); // rounded to the dtype (after dropout)
  const z = new Float32Array(Sk); // dropout factors
  const t = new Float32Array(Sk); // the softcap's tanh
  const cap = f(r.softcap);
  const ps = new Float32Array(1); // the sink's probability
  const dsinks = r.sinks === null ? null : new Float32Array(Hq);
  const acc = new Float32Array(d);
  const dqacc = new Float32Array(d);
  walkRows(r, lse, f, {
    ...gathers(r, rd, q, k, v, Q, K, V, [dout, DO], [dK, dV]),
    row: (w) => {
      const { ob, lo, n } = w;
      const qo = w.i * d;
      scores32(Q, qo, K, lo, n, d, scale, w.mods, p, t);
      lse[w.li] = softmax32(p, n, w.sink, ps);
      if (r.dropout !== null) {
        rowDropout(r.dropout, Hq, w, f(r.dropout.scale), z);
        for (let j = 0; j < n; j++) pr[j] = rd(f(p[j] * z[j]));
      } else {
        for (let j = 0; j < n; j++) pr[j] = rd(p[j]);
      }
      pv32(pr, V, lo, n, d, acc);
      let D = 0;
      for (let c = 0; c < d; c++) {
        const o = rdOut(acc[c]);
        out[ob + c] = o;
        D = f(D + f(DO[qo + c] * o));
      }
      if (dsinks !== null) dsinks[w.h] = f(dsinks[w.h] - f(ps[0] * D));
      dqacc.fill(0);
      for (let j = 0; j < n; j++) {
        const o = (lo + j) * d;
        const pj = pr[j];
        let dp = 0;
        for (let c = 0; c < d; c++) {
          dV[o + c] = f(dV[o + c] + f(pj * DO[qo + c]));
          dp = f(dp + f(DO[qo + c] * V[o + c]));
        }
        if (r.dropout !== null) dp = f(dp * z[j]);
        const dsp = f(p[j] * f(dp - D));
        const ds = rd(cap > 0 ? f(dsp * f(1 - f(t[j] * t[j]))) : dsp);
        for (let c = 0; c < d; c++) {
          dqacc[c] = f(dqacc[c] + f(ds * K[o + c]));
          dK[o + c] = f(dK[o + c] + f(ds * Q[qo + c]));
        }
      }
      for (let c = 0; c < d; c++) dq[ob + c] = rdOut(f(dqacc[c] * scale));
    },
    kvHeadDone: (seq, kh) => {
      scatterHead(dK, seq.k0, seq.sk, kh, Hkv, d, dk, scale, rdOut);
      scatterHead(dV, seq.k0, seq.sk, kh, Hkv, d, dv, 1, rdOut);
    },
  });
  return dsinks === null ? { dq, dk, dv, out, lse } : { dq, dk, dv, out, lse, dsinks: Float64Array.from(dsinks) };
}

/**
 * Naive attention backward from the standard gradient formulas (dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P∘(dP − D),
 * D = rowsum(dO∘O), dQ = dS·K·scale, dK = dSᵀ·Q·scale), for the loss gradient `dout` of `out`.
 * Recomputes the forward internally (its `out` and `lse` are returned too, identical to
 * {@link referenceAttention} with the same arguments).
 *
 * @param dout `[batch, seqlenQ, headsQ, headDim]`, gradient of the loss with respect to `out`.
 * @param q `[batch, seqlenQ, headsQ, headDim]`.
 * @param k `[batch, seqlenK, headsKV, headDim]`.
 * @param v `[batch, seqlenK, headsKV, headDim]`.
 * @param shape the sizes (validated as in {@link referenceAttention}).
 * @param options causal mask, softmax scale, precision (see {@link ReferenceOptions}).
 * @returns `dq` (layout of q), `dk`, `dv` (layout of k; summed over the query heads of each GQA
 *   group), and the forward's `out` and `lse`. Rows that see no key give `dq = 0` and add nothing
 *   to `dk`/`dv`.
 * @throws RangeError / TypeError on an invalid shape, array length or option.
 */
export function referenceAttentionBackward(
  dout: ReferenceInput,
  q: ReferenceInput,
  k: ReferenceInput,
  v: ReferenceInput,
  shape: ReferenceShape,
  options?: ReferenceOptions,
): ReferenceBackwardResult {
  const r = resolve(shape, options);
  const nq = r.totalQ * r.Hq * r.d;
  const nk = r.totalK * r.Hkv * r.d;
  const [qDims, kDims] = layouts(r);
  checkLength('dout', dout, nq, qDims);
  checkLength('q', q, nq, qDims);
  checkLength('k', k, nk, kDims);
  checkLength('v', v, nk, kDims);
  return r.precision === 'float64'
    ? backward64(dout, q, k, v, r)
    : backwardSame(dout, q, k, v, r, r.precision);
}
