/**
 * The flash-attention accuracy rule and a few array checks for the tests.
 *
 * The rule (as in the FlashAttention test suite): with `reference` computed in float64 and
 * `samePrecision` computed by a plain implementation in the tested dtype (fp32 accumulation; see
 * `ReferenceOptions.precision` in lib/reference.ts), an implementation's `actual` result passes iff
 *
 *     max |actual − reference|  ≤  factor · max |samePrecision − reference|  +  atol
 *
 * with `factor` 2 for outputs and 3 for gradients. Element errors: equal values (including +Inf vs
 * +Inf, −Inf vs −Inf) are 0; a NaN on either side, or an infinity facing a different value, is +Inf
 * (always a failure).
 */

import type { HalfDType } from '../../lib/half';
import { seedHint } from './random';

// Module-level aliases: a global lookup per call (`Math.x`) is slow inside Jest's vm context.
const abs = Math.abs;
const isNaNNumber = Number.isNaN;

/** Any flat numeric array (typed array or number[]). */
export type NumArray = ArrayLike<number>;

/** Arguments of {@link checkFlashRule} / {@link expectFlashRule}. */
export interface FlashRuleInput {
  /** Result of the implementation under test (float values, not half bits). */
  actual: NumArray;
  /** The float64 reference result, same length and layout. */
  reference: NumArray;
  /** The same-precision implementation's result, same length and layout. */
  samePrecision: NumArray;
  /** Multiplier of the same-precision error: 2 for outputs, 3 for gradients. */
  factor: number;
  /** Absolute slack added to the bound (≥ 0). */
  atol: number;
  /** Name of the checked tensor, for messages (e.g. `'dq'`). */
  name: string;
  /** Optional logical shape of the flat arrays (row-major), to decode the worst index in messages. */
  shape?: readonly number[];
  /** Optional names of the dimensions of `shape` (e.g. `['b', 's', 'h', 'd']`). */
  dims?: readonly string[];
}

/** Outcome of {@link checkFlashRule}. */
export interface FlashRuleReport {
  /** Name of the checked tensor. */
  name: string;
  /** max |actual − reference| (Infinity for a NaN or an infinity mismatch). */
  maxErr: number;
  /** max |samePrecision − reference|. */
  refErr: number;
  /** factor · refErr + atol. */
  bound: number;
  /** Flat index of the first element with the largest error of `actual` (−1 for empty arrays). */
  worstIndex: number;
  /** True iff maxErr ≤ bound and both errors are finite. */
  pass: boolean;
  /** Why it failed, in words (empty when it passes). */
  reason: string;
}

/** Error of one element as the rule counts it: 0 if equal (Inf == Inf), +Inf for NaN or an infinity mismatch. */
export function elementError(x: number, ref: number): number {
  if (x === ref) return 0;
  const e = abs(x - ref);
  return isNaNNumber(e) ? Infinity : e;
}

/**
 * Largest element error between two arrays of the same length (see {@link elementError}).
 * @returns 0 for empty arrays.
 * @throws Error if the lengths differ.
 */
export function maxAbsDiff(a: NumArray, b: NumArray): number {
  if (a.length !== b.length) throw new Error(`maxAbsDiff: lengths differ (${a.length} vs ${b.length})`);
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    const e = elementError(a[i], b[i]);
    if (e > m) m = e;
  }
  return m;
}

/**
 * Decodes a flat row-major index into named coordinates, e.g. `[b=0, s=3, h=1, d=17]`.
 * @param index flat index.
 * @param shape logical shape; when absent the flat index is returned as `[17]`.
 * @param dims names of the dimensions (default `i0, i1, …`).
 */
export function decodeIndex(index: number, shape?: readonly number[], dims?: readonly string[]): string {
  if (!shape || shape.length === 0 || index < 0) return `[${index}]`;
  const coords: number[] = new Array<number>(shape.length);
  let rest = index;
  for (let a = shape.length - 1; a >= 0; a--) {
    coords[a] = rest % shape[a];
    rest = Math.floor(rest / shape[a]);
  }
  return `[${coords.map((c, a) => `${dims?.[a] ?? `i${a}`}=${c}`).join(', ')}]`;
}

/**
 * Applies the flash-attention rule (see the module notes) and reports; never throws on a failed
 * rule (see {@link expectFlashRule} for that).
 * @throws Error if the three arrays do not have the same length, or factor/atol are invalid.
 */
export function checkFlashRule(input: FlashRuleInput): FlashRuleReport {
  const { actual, reference, samePrecision, factor, atol, name } = input;
  if (actual.length !== reference.length || samePrecision.length !== reference.length) {
    throw new Error(
      `${name}: lengths differ (actual ${actual.length}, reference ${reference.length}, samePrecision ${samePrecision.length})`,
    );
  }
  if (!(factor > 0) || !(atol >= 0)) throw new Error(`${name}: need factor > 0 and atol >= 0`);
  let maxErr = 0;
  let worstIndex = reference.length > 0 ? 0 : -1;
  let refErr = 0;
  let refWorst = -1;
  for (let i = 0; i < reference.length; i++) {
    const e = elementError(actual[i], reference[i]);
    if (e > maxErr) {
      maxErr = e;
      worstIndex = i;
    }
    const r = elementError(samePrecision[i], reference[i]);
    if (r > refErr) {
      refErr = r;
      refWorst = i;
    }
  }
  const bound = factor * refErr + atol;
  let reason = '';
  if (!Number.isFinite(refErr)) {
    reason = `the same-precision result is NaN or mismatches an infinity at index ${refWorst}`;
  } else if (!Number.isFinite(maxErr)) {
    reason = 'actual is NaN or mismatches an infinity';
  } else if (!(maxErr <= bound)) {
    reason = 'error above the bound';
  }
  return { name, maxErr, refErr, bound, worstIndex, pass: reason === '', reason };
}

/** Formats a report as a readable multi-line message. */
export function formatFlashReport(input: FlashRuleInput, rep: FlashRuleReport): string {
  const i = rep.worstIndex;
  const at = (a: NumArray): string => (i >= 0 ? String(a[i]) : 'n/a');
  return [
    `flash rule ${rep.pass ? 'passed' : 'FAILED'} for ${rep.name}: ${rep.reason || 'ok'}`,
    `  maxErr ${rep.maxErr.toExponential(4)} vs bound ${rep.bound.toExponential(4)}` +
      ` (= ${input.factor} × refErr ${rep.refErr.toExponential(4)} + atol ${input.atol})`,
    `  worst at flat index ${i} ${decodeIndex(i, input.shape, input.dims)}:` +
      ` actual ${at(input.actual)}, reference ${at(input.reference)}, samePrecision ${at(input.samePrecision)}`,
    `  replay with ${seedHint()}`,
  ].join('\n');
}

/**
 * {@link checkFlashRule}, throwing an `Error` with a readable message (name, maxErr, bound, the
 * worst element with its decoded coordinates, and the seed) when the rule fails.
 * @returns the report when it passes.
 */
export function expectFlashRule(input: FlashRuleInput): FlashRuleReport {
  const rep = checkFlashRule(input);
  if (!rep.pass) throw new Error(formatFlashReport(input, rep));
  return rep;
}

/** Options of {@link expectAllWritten}. */
export interface AllWrittenOptions {
  /**
   * The poison value written before the computation. Float arrays: default NaN (any NaN counts as
   * unwritten). `Uint16Array`: a bit pattern; by default any NaN pattern of `dtype` counts.
   */
  poison?: number;
  /** For a `Uint16Array` of half bits: their type (needed to recognise NaN patterns). */
  dtype?: HalfDType;
  /** Optional logical shape of the flat array (row-major), to decode the first unwritten index. */
  shape?: readonly number[];
  /** Optional names of the dimensions of `shape` (e.g. `['b', 's', 'h', 'd']`). */
  dims?: readonly string[];
}

/**
 * Asserts that every element of an output was written, i.e. none still holds the poison value that
 * the test wrote before the computation (by default: no NaN).
 * @throws Error naming the array, how many elements still hold the poison and where the first is.
 */
export function expectAllWritten(arr: NumArray, name: string, options: AllWrittenOptions = {}): void {
  const { poison } = options;
  let isPoison: (x: number) => boolean;
  if (arr instanceof Uint16Array && poison === undefined) {
    if (options.dtype === undefined) throw new Error(`${name}: expectAllWritten on half bits needs options.dtype`);
    const infBits = options.dtype === 'float16' ? 0x7c00 : 0x7f80;
    isPoison = (x) => (x & 0x7fff) > infBits;
  } else if (poison === undefined || Number.isNaN(poison)) {
    isPoison = isNaNNumber;
  } else {
    isPoison = (x) => x === poison;
  }
  let count = 0;
  let first = -1;
  for (let i = 0; i < arr.length; i++) {
    if (isPoison(arr[i])) {
      if (first < 0) first = i;
      count++;
    }
  }
  if (count > 0) {
    throw new Error(
      `${name}: ${count} of ${arr.length} elements still hold the poison value` +
        ` (first at flat index ${first} ${decodeIndex(first, options.shape, options.dims)}); ${seedHint()}`,
    );
  }
}
