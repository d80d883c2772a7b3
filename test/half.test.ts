/**
 * lib/half.ts: float32 <-> float16 / bfloat16 conversions, bit-identical to csrc/common/half.h.
 * Exhaustive over the 65536 patterns of each type, every rounding tie, the fp16 subnormal boundaries,
 * and a slow, obviously-correct rounding on many random floats.
 */

import {
  bf16BitsToF32,
  dtypeRounder,
  f16BitsToF32,
  f32ToBf16Bits,
  f32ToF16Bits,
  float32ToHalfBits,
  halfBitsToFloat32,
  HalfDType,
  roundToDtype,
} from '../lib/half';
import { rngFor, seedHint } from './helpers/random';

const ALL = new Uint16Array(65536).map((_, i) => i);

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
/** float32 from its bit pattern. */
function fromBits(u: number): number {
  u32[0] = u;
  return f32[0];
}
/** bit pattern of Math.fround(x). */
function toBits(x: number): number {
  f32[0] = x;
  return u32[0];
}

/** Independent decode, from the IEEE formulas (not from bit manipulation). */
function decodeSlow(h: number, dtype: HalfDType): number {
  const [eBits, mBits, bias] = dtype === 'float16' ? [5, 10, 15] : [8, 7, 127];
  const sign = h >> 15 ? -1 : 1;
  const e = (h >> mBits) & ((1 << eBits) - 1);
  const m = h & ((1 << mBits) - 1);
  if (e === (1 << eBits) - 1) return m === 0 ? sign * Infinity : NaN;
  if (e === 0) return sign * m * 2 ** (1 - bias - mBits);
  return sign * (1 + m / 2 ** mBits) * 2 ** (e - bias);
}

/**
 * Slow, obviously correct round-to-nearest-even of Math.fround(x) to the half type, as a value
 * (signed zeros kept). Finds the binade by counting, divides by the ulp (exact: powers of two),
 * rounds the quotient by hand.
 */
function roundSlow(x: number, dtype: HalfDType): number {
  const xf = Math.fround(x);
  if (Number.isNaN(xf)) return NaN;
  if (!Number.isFinite(xf)) return xf;
  const [mBits, minExp, maxFinite] = dtype === 'float16' ? [10, -14, 65504] : [7, -126, (2 - 2 ** -7) * 2 ** 127];
  const sign = xf < 0 || Object.is(xf, -0) ? -1 : 1;
  const a = Math.abs(xf);
  if (a === 0) return sign * 0;
  // binade: the e with 2^e <= a < 2^(e+1) (log2 as a first guess, then fixed up by comparison)
  let e = Math.floor(Math.log2(a));
  while (2 ** e > a) e--;
  while (2 ** (e + 1) <= a) e++;
  if (e < minExp) e = minExp; // subnormal range: fixed ulp
  const ulp = 2 ** (e - mBits);
  const quotient = a / ulp;
  let r = Math.floor(quotient);
  const frac = quotient - r;
  if (frac > 0.5 || (frac === 0.5 && r % 2 === 1)) r += 1;
  const val = r * ulp;
  return sign * (val > maxFinite ? Infinity : val);
}

const toBitsOf = (dtype: HalfDType) => (dtype === 'float16' ? f32ToF16Bits : f32ToBf16Bits);
const fromBitsOf = (dtype: HalfDType) => (dtype === 'float16' ? f16BitsToF32 : bf16BitsToF32);
const isNaNBits = (h: number, dtype: HalfDType) => (h & 0x7fff) > (dtype === 'float16' ? 0x7c00 : 0x7f80);
const quietBit = (dtype: HalfDType) => (dtype === 'float16' ? 0x0200 : 0x0040);
const hex = (h: number) => `0x${h.toString(16).padStart(4, '0')}`;

describe.each<HalfDType>(['float16', 'bfloat16'])('%s exhaustive', (dtype) => {
  const enc = toBitsOf(dtype);
  const dec = fromBitsOf(dtype);

  test('decode matches the IEEE formula for all 65536 patterns', () => {
    const bad: string[] = [];
    for (let h = 0; h < 65536; h++) {
      const got = dec(h);
      const want = decodeSlow(h, dtype);
      const ok = Number.isNaN(want) ? Number.isNaN(got) : Object.is(got, want);
      if (!ok && bad.length < 5) bad.push(`${hex(h)}: got ${got}, want ${want}`);
    }
    expect(bad).toEqual([]);
  });

  test('scalar bits -> f32 -> bits round trips (NaN stays NaN, quiet)', () => {
    const bad: string[] = [];
    let nanCount = 0;
    for (let h = 0; h < 65536; h++) {
      const back = enc(dec(h));
      if (isNaNBits(h, dtype)) {
        nanCount++;
        if (!isNaNBits(back, dtype) || (back & quietBit(dtype)) === 0) bad.push(`${hex(h)} -> ${hex(back)}`);
      } else if (back !== h) {
        bad.push(`${hex(h)} -> ${hex(back)}`);
      }
      if (bad.length >= 5) break;
    }
    expect(bad).toEqual([]);
    // 2 signs x (2^mantissaBits - 1) NaN payloads
    expect(nanCount).toBe(dtype === 'float16' ? 2 * 1023 : 2 * 127);
  });

  test('array round trip is bit-exact; NaN patterns are quieted with sign and payload kept (half.h)', () => {
    const f = halfBitsToFloat32(ALL, dtype);
    const back = float32ToHalfBits(f, dtype);
    const bad: string[] = [];
    for (let h = 0; h < 65536; h++) {
      const want = isNaNBits(h, dtype) ? h | quietBit(dtype) : h;
      if (back[h] !== want && bad.length < 5) bad.push(`${hex(h)} -> ${hex(back[h])} (want ${hex(want)})`);
      // the array decode agrees with the scalar decode
      const s = dec(h);
      if (!(Number.isNaN(s) ? Number.isNaN(f[h]) : Object.is(s, f[h])) && bad.length < 5) bad.push(`decode ${hex(h)}`);
    }
    expect(bad).toEqual([]);
  });

  test('decode is injective on non-NaN patterns (signed zeros distinct)', () => {
    const seen = new Set<string>();
    let count = 0;
    for (let h = 0; h < 65536; h++) {
      const x = dec(h);
      if (Number.isNaN(x)) continue;
      count++;
      seen.add(Object.is(x, -0) ? '-0' : String(x));
    }
    expect(seen.size).toBe(count);
  });

  test('every tie between neighbours rounds to even; one float32 ulp either side rounds to nearest', () => {
    const maxFinite = dtype === 'float16' ? 0x7bff : 0x7f7f;
    const bad: string[] = [];
    for (let h = 0; h <= maxFinite; h++) {
      const lo = dec(h);
      const hi = h === maxFinite ? (dtype === 'float16' ? 65536 : 2 ** 128) : dec(h + 1);
      const mid = (lo + hi) / 2;
      // exactly representable in float32: the test really probes the tie
      if (Math.fround(mid) !== mid && bad.length < 5) bad.push(`midpoint ${mid} is not a float32`);
      const even = (h & 1) === 0 ? h : h + 1; // h + 1 past the largest finite value is the Inf pattern
      const below = fromBits(toBits(mid) - 1);
      const above = fromBits(toBits(mid) + 1);
      const cases: Array<[number, number]> = [
        [mid, even],
        [below, h],
        [above, h + 1],
        [-mid, even | 0x8000],
        [-below, h | 0x8000],
      ];
      for (const [x, want] of cases) {
        const got = enc(x);
        if (got !== want && bad.length < 5) bad.push(`${x} -> ${hex(got)}, want ${hex(want)}`);
      }
    }
    expect(bad).toEqual([]);
  });
});

describe('specific values', () => {
  test('float16 subnormal boundaries', () => {
    expect(f32ToF16Bits(2 ** -24)).toBe(0x0001); // smallest subnormal
    expect(f32ToF16Bits(2 ** -25)).toBe(0x0000); // tie between 0 and 2^-24: even is 0
    expect(f32ToF16Bits(-(2 ** -25))).toBe(0x8000);
    expect(f32ToF16Bits(fromBits(0x33000001))).toBe(0x0001); // just above 2^-25
    expect(f32ToF16Bits(fromBits(0x32ffffff))).toBe(0x0000); // just below 2^-25
    expect(f32ToF16Bits(1.5 * 2 ** -24)).toBe(0x0002); // tie between 1 and 2 ulps: even is 2
    expect(f32ToF16Bits(2.5 * 2 ** -24)).toBe(0x0002); // tie between 2 and 3 ulps: even is 2
    expect(f32ToF16Bits(1023 * 2 ** -24)).toBe(0x03ff); // largest subnormal
    expect(f32ToF16Bits(1023.5 * 2 ** -24)).toBe(0x0400); // tie: rounds up into the normals (even)
    expect(f32ToF16Bits(2 ** -14)).toBe(0x0400); // smallest normal
    expect(f32ToF16Bits(fromBits(0x387fffff))).toBe(0x0400); // just below 2^-14
    expect(f16BitsToF32(0x0001)).toBe(2 ** -24);
    expect(f16BitsToF32(0x03ff)).toBe(1023 * 2 ** -24);
    expect(f16BitsToF32(0x8001)).toBe(-(2 ** -24));
    expect(f32ToF16Bits(1e-10)).toBe(0x0000);
    expect(f32ToF16Bits(-0)).toBe(0x8000);
  });

  test('float16 overflow and infinities', () => {
    expect(f32ToF16Bits(65504)).toBe(0x7bff);
    expect(f32ToF16Bits(65519.99)).toBe(0x7bff);
    expect(f32ToF16Bits(65520)).toBe(0x7c00); // tie between 65504 (odd) and 65536: Inf
    expect(f32ToF16Bits(-65520)).toBe(0xfc00);
    expect(f32ToF16Bits(1e10)).toBe(0x7c00);
    expect(f32ToF16Bits(Infinity)).toBe(0x7c00);
    expect(f32ToF16Bits(-Infinity)).toBe(0xfc00);
    expect(f16BitsToF32(0x7c00)).toBe(Infinity);
    expect(f16BitsToF32(0xfc00)).toBe(-Infinity);
    expect(f32ToF16Bits(1)).toBe(0x3c00);
    expect(f32ToF16Bits(-2)).toBe(0xc000);
  });

  test('bfloat16 ties, overflow and infinities', () => {
    expect(f32ToBf16Bits(1)).toBe(0x3f80);
    expect(f32ToBf16Bits(1 + 2 ** -8)).toBe(0x3f80); // tie, 0x3f80 even
    expect(f32ToBf16Bits(1 + 3 * 2 ** -8)).toBe(0x3f82); // tie between 0x3f81 (odd) and 0x3f82
    expect(f32ToBf16Bits(1 + 2 ** -8 + 2 ** -20)).toBe(0x3f81); // above the tie
    expect(f32ToBf16Bits(fromBits(0x7f7f7fff))).toBe(0x7f7f); // below the tie: largest finite
    expect(f32ToBf16Bits(fromBits(0x7f7f8000))).toBe(0x7f80); // tie with odd 0x7f7f: Inf
    expect(f32ToBf16Bits(fromBits(0x7f7fffff))).toBe(0x7f80); // float32 max rounds to Inf
    expect(f32ToBf16Bits(-Infinity)).toBe(0xff80);
    expect(f32ToBf16Bits(1e39)).toBe(0x7f80); // beyond float32: fround gives Inf first
    expect(f32ToBf16Bits(fromBits(0x00000001))).toBe(0x0000); // smallest f32 subnormal rounds to 0
    expect(f32ToBf16Bits(fromBits(0x00008000))).toBe(0x0000); // tie, even
    expect(f32ToBf16Bits(fromBits(0x00018000))).toBe(0x0002); // tie, odd -> up
    expect(bf16BitsToF32(0x0001)).toBe(2 ** -133);
  });

  test('the input is rounded to float32 first (double rounding, as the C++ side sees float32)', () => {
    // 1 + 2^-8 + 2^-40 is above the bf16 tie as a double, but Math.fround makes it the exact tie.
    expect(f32ToBf16Bits(1 + 2 ** -8 + 2 ** -40)).toBe(0x3f80);
    expect(f32ToF16Bits(1 + 2 ** -11 + 2 ** -40)).toBe(0x3c00); // same for fp16 (tie at 1 + 2^-11)
    expect(roundToDtype(1 + 2 ** -11 + 2 ** -40, 'float16')).toBe(1);
  });

  test('NaN: quiet NaN out, sign and top payload bits kept (array form reads the bits)', () => {
    expect(Number.isNaN(f16BitsToF32(f32ToF16Bits(NaN)))).toBe(true);
    expect(Number.isNaN(bf16BitsToF32(f32ToBf16Bits(NaN)))).toBe(true);
    const pats = new Uint32Array([0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7f802000, 0x7fbfffff]);
    const src = new Float32Array(pats.buffer);
    const h16 = float32ToHalfBits(src, 'float16');
    const hb = float32ToHalfBits(src, 'bfloat16');
    expect(Array.from(h16).map(hex)).toEqual(['0x7e00', '0xfe00', '0x7e00', '0xfe00', '0x7e01', '0x7fff']);
    expect(Array.from(hb).map(hex)).toEqual(['0x7fc0', '0xffc0', '0x7fc0', '0xffc0', '0x7fc0', '0x7fff']);
  });

  test('array forms honour a subarray byte offset and validate the dtype', () => {
    const base = new Float32Array([7, 1, 2, 3]);
    const sub = base.subarray(1);
    expect(Array.from(float32ToHalfBits(sub, 'float16')).map(hex)).toEqual(['0x3c00', '0x4000', '0x4200']);
    const bits = new Uint16Array([0, 0x3f80, 0x4000]).subarray(1);
    expect(Array.from(halfBitsToFloat32(bits, 'bfloat16'))).toEqual([1, 2]);
    expect(() => float32ToHalfBits(base, 'float32' as unknown as HalfDType)).toThrow(TypeError);
    expect(() => halfBitsToFloat32(bits, 'int8' as unknown as HalfDType)).toThrow(TypeError);
  });
});

describe('random floats against the slow implementation', () => {
  const N = 200000;
  function sample(dtype: HalfDType): Float32Array {
    const rng = rngFor(`half-random-${dtype}`);
    const out = new Float32Array(N);
    const ou = new Uint32Array(out.buffer);
    for (let i = 0; i < N; i++) {
      const r = rng.nextU32();
      if (i % 2 === 0) {
        ou[i] = r; // any float32 bit pattern (all exponents, NaNs included)
      } else {
        // exponents around the fp16 range (2^-27 .. 2^18), random mantissa and sign
        const e = 100 + (rng.nextU32() % 45);
        ou[i] = ((r & 0x807fffff) | (e << 23)) >>> 0;
      }
    }
    return out;
  }

  test.each<HalfDType>(['float16', 'bfloat16'])('%s: scalar, array, roundToDtype and the slow rounding agree', (dtype) => {
    const xs = sample(dtype);
    const enc = toBitsOf(dtype);
    const dec = fromBitsOf(dtype);
    const arr = float32ToHalfBits(xs, dtype);
    const rounder = dtypeRounder(dtype);
    const bad: string[] = [];
    let checked = 0;
    for (let i = 0; i < N && bad.length < 5; i++) {
      const x = xs[i];
      const want = roundSlow(x, dtype);
      if (Number.isNaN(x)) {
        if (!isNaNBits(arr[i], dtype)) bad.push(`NaN ${toBits(x).toString(16)} -> ${hex(arr[i])}`);
        continue;
      }
      checked++;
      const bits = enc(x);
      if (bits !== arr[i]) bad.push(`${x}: scalar ${hex(bits)} vs array ${hex(arr[i])}`);
      if (!Object.is(dec(bits), want)) bad.push(`${x}: ${hex(bits)} = ${dec(bits)}, slow ${want}`);
      if (!Object.is(roundToDtype(x, dtype), want)) bad.push(`${x}: roundToDtype ${roundToDtype(x, dtype)}`);
      if (!Object.is(rounder(x), want)) bad.push(`${x}: dtypeRounder ${rounder(x)}`);
    }
    if (bad.length > 0) bad.push(seedHint());
    expect(bad).toEqual([]);
    expect(checked).toBeGreaterThan(N * 0.9);
  });

  test('doubles (not float32) go through Math.fround first', () => {
    const rng = rngFor('half-doubles');
    const bad: string[] = [];
    for (let i = 0; i < 50000 && bad.length < 5; i++) {
      const x = (rng.next() - 0.5) * 2 ** (rng.int(40) - 20);
      for (const dtype of ['float16', 'bfloat16'] as const) {
        const got = fromBitsOf(dtype)(toBitsOf(dtype)(x));
        const want = roundSlow(x, dtype);
        if (!Object.is(got, want)) bad.push(`${dtype} ${x}: ${got} vs ${want}`);
      }
      if (roundToDtype(x, 'float32') !== Math.fround(x)) bad.push(`float32 ${x}`);
    }
    if (bad.length > 0) bad.push(seedHint());
    expect(bad).toEqual([]);
  });

  test('roundToDtype rejects an unknown dtype', () => {
    expect(() => roundToDtype(1, 'float8' as unknown as HalfDType)).toThrow(TypeError);
    expect(() => dtypeRounder('int32' as unknown as HalfDType)).toThrow(TypeError);
  });
});
