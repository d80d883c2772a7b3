/**
 * Argument checks of the float64 references of the training ops (./train.ts, ./nn.ts), which are
 * public: sizes, arrays of values of the right length, dims objects and options, each refused with
 * the package's "Expected ... but received ..." message before any work or allocation.
 * @packageDocumentation
 */
import { describeValue, rangeError, typeError } from '../../errors';
import { DTYPES, trueLength } from '../../tensor';
import { checkBoolean, checkChoice, checkNumber, checkOptions } from '../common';

/** A size: a safe integer >= 1. */
export function refSize(value: unknown, arg: string): number {
  return checkNumber(value, arg, { integer: true, min: 1 });
}

/**
 * An array of values: a Float32Array, a Float64Array or an Array of numbers (by tag, so arrays from
 * another realm pass; half-precision bits in a Uint16Array, say, are refused rather than read as
 * numbers), of `n` elements when `n` is given (typed arrays by their real length). With `ids`,
 * an Int32Array is accepted too (token ids, targets).
 */
export function refValues(value: unknown, arg: string, n?: number, ids = false): ArrayLike<number> {
  const tag = Object.prototype.toString.call(value);
  const typed = tag === '[object Float32Array]' || tag === '[object Float64Array]' || (ids && tag === '[object Int32Array]');
  if (!typed && !(Array.isArray(value) && value.every((x) => typeof x === 'number'))) {
    const kinds = ids ? 'an Int32Array, Float32Array, Float64Array or number[]' : 'a Float32Array, Float64Array or number[]';
    throw typeError(`${arg} to be ${kinds}`, Array.isArray(value) ? 'an Array with a non-number' : describeValue(value));
  }
  const length = typed ? trueLength(value as ArrayBufferView) : (value as number[]).length;
  if (n !== undefined && length !== n) throw rangeError(`${arg} to have ${n} elements`, `${length}`);
  return value as ArrayLike<number>;
}

/** The real number of elements of an array {@link refValues} accepts (typed arrays: not their `length` getter). */
export function refLength(value: unknown, arg: string, ids = false): number {
  const v = refValues(value, arg, undefined, ids);
  return ArrayBuffer.isView(v) ? trueLength(v) : v.length;
}

/** A dims object with exactly the size keys `keys`; returns a snapshot of them. */
export function refDims<K extends string>(dims: unknown, arg: string, keys: readonly K[]): Record<K, number> {
  const o = checkOptions<Record<K, number>>(dims, arg, keys);
  if (dims === undefined) throw typeError(`${arg} to be an object with ${keys.join(', ')}`, 'undefined');
  const out = {} as Record<K, number>;
  for (const k of keys) out[k] = refSize(o[k], `${arg}.${k}`);
  return out;
}

/** The precisions a reference takes: 'float64' or a dtype; `tf32` where the op has it. */
export function refPrecisions(tf32: boolean): readonly string[] {
  return ['float64', ...DTYPES.filter((d) => d !== 'int32'), ...(tf32 ? ['tf32'] : [])];
}

/**
 * An options object (or undefined) with only `keys`, whose `precision` (when present) is one of
 * `precisions` and whose `dtype` is a float dtype; returns it.
 */
export function refOptions<T extends object>(options: unknown, arg: string, keys: readonly (keyof T & string)[],
  precisions: readonly string[] = refPrecisions(false)): Partial<T> {
  const o = checkOptions<T>(options, arg, keys) as Record<string, unknown>;
  if (o.precision !== undefined) checkChoice(o.precision, `${arg}.precision`, precisions);
  if (o.dtype !== undefined) checkChoice(o.dtype, `${arg}.dtype`, refPrecisions(false).filter((p) => p !== 'float64'));
  return o as Partial<T>;
}

/** An optional boolean option. */
export function refFlag(value: unknown, arg: string): void {
  if (value !== undefined) checkBoolean(value, arg);
}
