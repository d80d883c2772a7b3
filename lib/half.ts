/**
 * Conversions between float32 and the two 16-bit floating-point storage types, bit-identical to the
 * C++ host conversions in `csrc/common/half.h`:
 *
 * - float32 -> half rounds to nearest, ties to even (IEEE 754 default) from the **float32** value:
 *   a JS number is first rounded to float32 (`Math.fround`), then to the 16-bit type. (Rounding a
 *   double directly to 16 bits can differ from this double rounding; the C++ side only ever sees
 *   float32, so this module does the same.)
 * - NaN stays NaN: it is made quiet (bfloat16: bit 0x0040 set; float16: bit 0x0200 set), its sign and
 *   its top payload bits are kept exactly as `half.h` does.
 * - ±Inf stays ±Inf; finite values beyond the range round to ±Inf (float16: |x| >= 65520;
 *   bfloat16: |x| >= 2^128 - 2^119, i.e. above the largest finite bfloat16 by half an ulp or more).
 * - float16 subnormals (m · 2^-24, m in [1, 1023]) are produced and decoded exactly; |x| <= 2^-25
 *   rounds to a signed zero (2^-25 itself is a tie and goes to the even value 0).
 *
 * Scalar functions take and return JS numbers; the bit patterns are unsigned integers in [0, 65535].
 * A JS number cannot carry a NaN payload reliably, so the scalar forms only promise "NaN in, some
 * quiet NaN out". The array forms read and write the float32 bit patterns through integer views, so
 * they reproduce `half.h` bit for bit, NaN payloads included.
 *
 * @module half
 */
import { describeValue, typeError } from './errors';

/**
 * Element types of the tensors that the attention kernels read and write. The 16-bit types are
 * stored as raw bit patterns (`Uint16Array`) on the JS side.
 */
export type DType = 'float32' | 'float16' | 'bfloat16';

/** The 16-bit storage types (those that {@link float32ToHalfBits} can produce). */
export type HalfDType = 'float16' | 'bfloat16';

// Module-level alias: global lookups are slow inside vm contexts (Jest), and this sits in hot loops.
const fround = Math.fround;

// One shared 4-byte scratch word, viewed as float32 and as uint32 (same platform byte order).
const scratchF32 = new Float32Array(1);
const scratchU32 = new Uint32Array(scratchF32.buffer);

/** float32 bit pattern (unsigned 32-bit) -> bfloat16 bit pattern; `fa::f32_to_bf16`. */
function bf16FromF32Bits(u: number): number {
  if ((u & 0x7fffffff) > 0x7f800000) return ((u >>> 16) | 0x0040) & 0xffff; // quiet NaN
  const lsb = (u >>> 16) & 1;
  // u <= 0xff800000 here, so u + 0x8000 < 2^32: exact in a double, and >>> takes it unsigned.
  return ((u + 0x7fff + lsb) >>> 16) & 0xffff;
}

/** float32 bit pattern (unsigned 32-bit) -> float16 bit pattern; `fa::f32_to_f16`. */
function f16FromF32Bits(u: number): number {
  const sign = (u >>> 16) & 0x8000;
  const abs = u & 0x7fffffff;
  if (abs > 0x7f800000) return sign | 0x7e00 | ((abs >>> 13) & 0x3ff); // NaN
  if (abs >= 0x477ff000) return sign | 0x7c00; // >= 65520 rounds to Inf
  if (abs >= 0x38800000) {
    // normal in fp16 (>= 2^-14): RNE on the 13 dropped bits
    const mant = abs + 0xfff + ((abs >>> 13) & 1);
    return sign | ((mant - 0x38000000) >>> 13);
  }
  if (abs < 0x33000000) return sign; // < 2^-25 rounds to 0 (2^-25 itself is handled below: tie to 0)
  // Subnormal in fp16: value = m * 2^-24 with m in [1, 1023] (1024 = smallest normal after rounding up).
  const e = abs >>> 23; // biased float32 exponent, 102..112
  const m = (abs & 0x7fffff) | 0x800000;
  const shift = 126 - e; // 14..24: bits of m to drop
  let r = m >>> shift;
  const rem = m & ((1 << shift) - 1);
  const half = 1 << (shift - 1);
  if (rem > half || (rem === half && (r & 1) !== 0)) ++r;
  return sign | r;
}

/** bfloat16 bit pattern -> float32 bit pattern (unsigned); `fa::bf16_to_f32`. */
function bf16ToF32Bits(h: number): number {
  return ((h & 0xffff) << 16) >>> 0;
}

/** float16 bit pattern -> float32 bit pattern (unsigned); `fa::f16_to_f32`. */
function f16ToF32Bits(h: number): number {
  const sign = ((h & 0x8000) << 16) >>> 0;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) {
    if (mant === 0) return sign;
    // Subnormal: mant * 2^-24, exactly representable in float32 (a normal float32).
    scratchF32[0] = mant * 5.9604644775390625e-8;
    return (sign | scratchU32[0]) >>> 0;
  }
  if (exp === 31) return (sign | 0x7f800000 | (mant << 13)) >>> 0;
  return (sign | ((exp + 112) << 23) | (mant << 13)) >>> 0;
}

/**
 * Rounds a number to bfloat16 (round to nearest even from its float32 value), as `fa::f32_to_bf16`.
 * @param x any JS number; it is first rounded to float32 with `Math.fround`.
 * @returns the bfloat16 bit pattern, an integer in [0, 65535]. NaN gives a quiet NaN pattern.
 */
export function f32ToBf16Bits(x: number): number {
  checkNumberArg(x, 'x');
  scratchF32[0] = x;
  return bf16FromF32Bits(scratchU32[0]);
}

/**
 * Decodes a bfloat16 bit pattern, as `fa::bf16_to_f32` (exact: every bfloat16 is a float32).
 * @param h bit pattern; only its low 16 bits are used.
 * @returns the value as a JS number (NaN patterns give NaN).
 */
export function bf16BitsToF32(h: number): number {
  checkNumberArg(h, 'h');
  scratchU32[0] = bf16ToF32Bits(h);
  return scratchF32[0];
}

/**
 * Rounds a number to IEEE binary16 (round to nearest even from its float32 value, subnormals
 * included, overflow to ±Inf), as `fa::f32_to_f16`.
 * @param x any JS number; it is first rounded to float32 with `Math.fround`.
 * @returns the float16 bit pattern, an integer in [0, 65535]. NaN gives a quiet NaN pattern.
 */
export function f32ToF16Bits(x: number): number {
  checkNumberArg(x, 'x');
  scratchF32[0] = x;
  return f16FromF32Bits(scratchU32[0]);
}

/**
 * Decodes an IEEE binary16 bit pattern, as `fa::f16_to_f32` (exact, subnormals included).
 * @param h bit pattern; only its low 16 bits are used.
 * @returns the value as a JS number (NaN patterns give NaN).
 */
export function f16BitsToF32(h: number): number {
  checkNumberArg(h, 'h');
  scratchU32[0] = f16ToF32Bits(h & 0xffff);
  return scratchF32[0];
}

/** @internal A JS number (a TypeError naming `arg` otherwise: no coercion of strings, objects, BigInts). */
export function checkNumberArg(x: unknown, arg: string): asserts x is number {
  if (typeof x !== 'number') throw typeError(`${arg} to be a number`, describeValue(x));
}

/** A typed array of the named kind, from any realm (ArrayBuffer.isView cannot be imitated). */
function isView(value: unknown, kind: string): boolean {
  return ArrayBuffer.isView(value) && Object.prototype.toString.call(value) === `[object ${kind}]`;
}

function checkHalfDType(dtype: string): asserts dtype is HalfDType {
  if (dtype !== 'float16' && dtype !== 'bfloat16') {
    throw new TypeError(`expected dtype 'float16' or 'bfloat16', got ${JSON.stringify(dtype)}`);
  }
}

/**
 * Converts a float32 array to 16-bit bit patterns, element by element, bit-identical to
 * `fa::f32_to_f16` / `fa::f32_to_bf16` (NaN payloads included: the float32 bits are read through an
 * integer view, never through a JS number).
 * @param src float32 values, any length (a subarray with a byte offset is fine).
 * @param dtype target 16-bit type.
 * @returns a new `Uint16Array` of `src.length` bit patterns, same element order.
 */
export function float32ToHalfBits(src: Float32Array, dtype: HalfDType): Uint16Array {
  if (!isView(src, 'Float32Array')) throw typeError('src to be a Float32Array', describeValue(src));
  checkHalfDType(dtype);
  const n = src.length;
  const bits = new Uint32Array(src.buffer, src.byteOffset, n);
  const dst = new Uint16Array(n);
  if (dtype === 'bfloat16') {
    for (let i = 0; i < n; i++) dst[i] = bf16FromF32Bits(bits[i]);
  } else {
    for (let i = 0; i < n; i++) dst[i] = f16FromF32Bits(bits[i]);
  }
  return dst;
}

/**
 * Decodes an array of 16-bit bit patterns to float32, element by element, bit-identical to
 * `fa::f16_to_f32` / `fa::bf16_to_f32` (the float32 bit patterns are written through an integer
 * view, so NaN payloads survive).
 * @param src bit patterns.
 * @param dtype their 16-bit type.
 * @returns a new `Float32Array` of `src.length` values, same element order.
 */
export function halfBitsToFloat32(src: Uint16Array, dtype: HalfDType): Float32Array {
  if (!isView(src, 'Uint16Array')) throw typeError('src to be a Uint16Array', describeValue(src));
  checkHalfDType(dtype);
  const n = src.length;
  const dst = new Float32Array(n);
  const bits = new Uint32Array(dst.buffer);
  if (dtype === 'bfloat16') {
    for (let i = 0; i < n; i++) bits[i] = src[i] << 16;
  } else {
    for (let i = 0; i < n; i++) bits[i] = f16ToF32Bits(src[i]);
  }
  return dst;
}

/** Round trip through bfloat16: `bf16BitsToF32(f32ToBf16Bits(x))`, without the calls. */
function roundBf16(x: number): number {
  scratchF32[0] = x;
  scratchU32[0] = bf16FromF32Bits(scratchU32[0]) << 16;
  return scratchF32[0];
}

/** Round trip through float16: `f16BitsToF32(f32ToF16Bits(x))`. */
function roundF16(x: number): number {
  scratchF32[0] = x;
  scratchU32[0] = f16ToF32Bits(f16FromF32Bits(scratchU32[0]));
  return scratchF32[0];
}

/**
 * The value of `x` after a round trip through `dtype`: `Math.fround(x)` for float32, and for the
 * 16-bit types the decoded result of rounding `Math.fround(x)` to nearest even (see the module notes).
 * @param x any JS number.
 * @param dtype the storage type.
 * @returns a number exactly representable in `dtype` (or NaN, ±Inf).
 */
export function roundToDtype(x: number, dtype: DType): number {
  checkNumberArg(x, 'x');
  switch (dtype) {
    case 'float32':
      return fround(x);
    case 'bfloat16':
      return roundBf16(x);
    case 'float16':
      return roundF16(x);
    default:
      throw new TypeError(`unknown dtype ${JSON.stringify(dtype)}`);
  }
}

/**
 * Returns the round-trip function of one dtype, `x => roundToDtype(x, dtype)` without the dispatch on
 * every call (for hot loops).
 * @param dtype the storage type.
 * @returns a function from any number to the nearest value of `dtype` (as {@link roundToDtype}).
 */
export function dtypeRounder(dtype: DType): (x: number) => number {
  switch (dtype) {
    case 'float32':
      return fround;
    case 'bfloat16':
      return roundBf16;
    case 'float16':
      return roundF16;
    default:
      throw new TypeError(`unknown dtype ${JSON.stringify(dtype)}`);
  }
}
