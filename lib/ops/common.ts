/**
 * Validation shared by the training ops (lib/ops/*): one way to check a tensor argument, an options
 * object, a number, so that every op's errors read the same way ("Expected <arg> to <what> but
 * received <value>") and name the argument. Internal.
 * @packageDocumentation
 */
import { describeValue, formatShape, quoteList, rangeError, refuseUnknownKeys, typeError } from '../errors';
import type { DType } from '../half';
import type { NativeBuffer } from '../native';
import { Device, handleOf, storageOf, Tensor, TensorDType } from '../tensor';

/** What {@link checkTensor} requires of a tensor argument. */
export interface TensorSpec {
  /** A dtype, a list of allowed dtypes, or 'float' (float32, float16 or bfloat16). Default 'float'. */
  dtype?: TensorDType | readonly TensorDType[] | 'float';
  /** The device (usually the first tensor argument's). */
  device?: Device;
  /** Exact rank. */
  rank?: number;
  /** Minimum rank. */
  minRank?: number;
  /** Exact shape. */
  shape?: readonly number[];
  /** Require a row-major layout without gaps (an offset is allowed). Default true. */
  contiguous?: boolean;
}

const FLOATS: readonly DType[] = ['float32', 'float16', 'bfloat16'];


/**
 * Checks a tensor argument: a live Tensor with the dtype, device, rank, shape and layout of `spec`.
 * Throws a TypeError (wrong type, dtype, device, disposed) or RangeError (rank, shape) naming `arg`.
 */
export function checkTensor(t: unknown, arg: string, spec: TensorSpec = {}): Tensor {
  handleOf(t, arg);
  const T = t as Tensor;
  const want = spec.dtype ?? 'float';
  const allowed: readonly TensorDType[] = want === 'float' ? FLOATS : typeof want === 'string' ? [want] : want;
  if (!allowed.includes(T.dtype)) throw typeError(`${arg} to have dtype ${quoteList(allowed)}`, `'${T.dtype}'`);
  if (spec.device !== undefined && T.device !== spec.device) {
    throw typeError(`${arg} to be on device '${spec.device}'`, `'${T.device}'`);
  }
  if (spec.rank !== undefined && T.shape.length !== spec.rank) {
    throw rangeError(`${arg} to have ${spec.rank} dims`, formatShape(T.shape));
  }
  if (spec.minRank !== undefined && T.shape.length < spec.minRank) {
    throw rangeError(`${arg} to have at least ${spec.minRank} dims`, formatShape(T.shape));
  }
  if (spec.shape !== undefined && !sameShape(T.shape, spec.shape)) {
    throw rangeError(`${arg} to have shape ${formatShape(spec.shape)}`, formatShape(T.shape));
  }
  if ((spec.contiguous ?? true) && !T.isContiguous) {
    throw rangeError(`${arg} to be contiguous (call .contiguous() first)`, `strides ${formatShape(T.strides)}`);
  }
  return T;
}

/** Checks that `t` has the dtype, device and shape of `ref` (named `refArg` in the message). */
export function checkLike(t: unknown, arg: string, ref: Tensor, refArg: string, spec: TensorSpec = {}): Tensor {
  handleOf(t, arg);
  const T = t as Tensor;
  if (T.dtype !== ref.dtype) throw typeError(`${arg} to have dtype '${ref.dtype}' (like ${refArg})`, `'${T.dtype}'`);
  if (T.device !== ref.device) throw typeError(`${arg} to be on device '${ref.device}' (like ${refArg})`, `'${T.device}'`);
  if (!sameShape(T.shape, ref.shape)) {
    throw rangeError(`${arg} to have the shape of ${refArg} ${formatShape(ref.shape)}`, formatShape(T.shape));
  }
  return checkTensor(T, arg, { ...spec, dtype: ref.dtype });
}

/** Whether two shapes are equal. */
export function sameShape(a: readonly number[], b: readonly number[]): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

/** Rows and columns of a tensor seen as [rows, cols]: cols is the last dim, rows the product of the rest. */
export function rowsCols(t: Tensor): { rows: number; cols: number } {
  const cols = t.shape[t.shape.length - 1];
  return { rows: t.numel / cols, cols };
}

/**
 * Checks an options object: undefined, or a plain object whose keys are all in `allowed`. Unknown keys
 * are refused (a typo must not silently fall back to a default). Returns the object (or {}).
 */
export function checkOptions<T extends object>(options: unknown, arg: string, allowed: readonly (keyof T & string)[]): Partial<T> {
  if (options === undefined) return {};
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw typeError(`${arg} to be an object or undefined`, describeValue(options));
  }
  refuseUnknownKeys(options, arg, allowed);
  return options as Partial<T>;
}

/** What {@link checkNumber} requires of a number. */
export interface NumberSpec {
  /** Require an integer (a safe integer). */
  integer?: boolean;
  /** Inclusive lower bound. */
  min?: number;
  /** Inclusive upper bound. */
  max?: number;
  /** Exclusive lower bound. */
  above?: number;
}

/** Checks a finite number within `spec`; returns it. A TypeError for a non-number, a RangeError otherwise. */
export function checkNumber(value: unknown, arg: string, spec: NumberSpec = {}): number {
  if (typeof value !== 'number') throw typeError(`${arg} to be a number`, describeValue(value));
  const parts: string[] = [spec.integer ? 'an integer' : 'a finite number'];
  if (spec.min !== undefined) parts.push(`>= ${spec.min}`);
  if (spec.above !== undefined) parts.push(`> ${spec.above}`);
  if (spec.max !== undefined) parts.push(`<= ${spec.max}`);
  const ok = Number.isFinite(value) && (!spec.integer || Number.isSafeInteger(value)) &&
    (spec.min === undefined || value >= spec.min) && (spec.above === undefined || value > spec.above) &&
    (spec.max === undefined || value <= spec.max);
  if (!ok) throw rangeError(`${arg} to be ${parts.join(' ')}`, String(value));
  return value;
}

/** Checks a boolean option; returns it. */
export function checkBoolean(value: unknown, arg: string): boolean {
  if (typeof value !== 'boolean') throw typeError(`${arg} to be a boolean`, describeValue(value));
  return value;
}

/** Checks one of a list of string choices; returns it. */
export function checkChoice<T extends string>(value: unknown, arg: string, choices: readonly T[]): T {
  if (typeof value !== 'string' || !(choices as readonly string[]).includes(value)) {
    throw typeError(`${arg} to be ${quoteList(choices)}`, describeValue(value));
  }
  return value as T;
}

/** The `[buffer, offset]` pair the native ops take for a tensor (csrc/napi/dispatch.h). */
export function arg(t: Tensor, name: string): [NativeBuffer, number] {
  return storageOf(t, name);
}
