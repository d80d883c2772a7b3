/**
 * Seeded random numbers for the tests.
 *
 * Every test file gets one 32-bit seed per run: `FA_TEST_SEED` when it is set (decimal or `0x` hex),
 * otherwise a fresh one from `crypto`. Failing assertions print it (see `seedHint()`), so a failure
 * can be replayed with `FA_TEST_SEED=<seed> npx jest <file>`.
 *
 * The generator is xoshiro128** (state seeded through splitmix32), one stream per label: `rngFor('x')`
 * always gives the same sequence for the same seed, independently of the order the tests run in.
 */

import { randomBytes } from 'crypto';

// Module-level aliases: a global lookup per call (`Math.x`) is slow inside Jest's vm context.
const { imul, floor, sqrt, log, cos, sin, fround, PI } = Math;

function parseSeed(text: string): number {
  const t = text.trim();
  const v = /^0x[0-9a-f]+$/i.test(t) ? parseInt(t.slice(2), 16) : /^\d+$/.test(t) ? Number(t) : NaN;
  if (!Number.isSafeInteger(v) || v < 0 || v > 0xffffffff) {
    throw new Error(`FA_TEST_SEED must be an unsigned 32-bit integer (decimal or 0x hex), got ${JSON.stringify(text)}`);
  }
  return v >>> 0;
}

const SEED: number =
  process.env.FA_TEST_SEED !== undefined && process.env.FA_TEST_SEED !== ''
    ? parseSeed(process.env.FA_TEST_SEED)
    : randomBytes(4).readUInt32LE(0);

/** The 32-bit seed of this run (from `FA_TEST_SEED`, or random). */
export function currentSeed(): number {
  return SEED;
}

/** A line to append to failure messages: how to replay this run. */
export function seedHint(): string {
  return `FA_TEST_SEED=0x${SEED.toString(16).padStart(8, '0')}`;
}

/** splitmix32 step: a well-mixed 32-bit value from a 32-bit state. */
function splitmix32(state: { s: number }): number {
  state.s = (state.s + 0x9e3779b9) >>> 0;
  let z = state.s;
  z = imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
  z = imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
  return (z ^ (z >>> 16)) >>> 0;
}

/** 32-bit FNV-1a hash of a string (to derive a stream from a label). */
function fnv1a(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = imul(h, 0x01000193) >>> 0;
  }
  return h >>> 0;
}

/** xoshiro128** pseudo-random generator (period 2^128 − 1). */
export class Rng {
  // State words as int32 in a typed array (no boxed numbers on the hot path).
  private readonly s = new Int32Array(4);

  /** @param seed any 32-bit integer; the 128-bit state is expanded from it with splitmix32. */
  constructor(seed: number) {
    const st = { s: seed >>> 0 };
    for (let i = 0; i < 4; i++) this.s[i] = splitmix32(st);
    if ((this.s[0] | this.s[1] | this.s[2] | this.s[3]) === 0) this.s[0] = 1; // all-zero state is a fixed point
  }

  /** Next unsigned 32-bit integer. */
  nextU32(): number {
    const s = this.s;
    const result = imul(rotl(imul(s[1], 5), 7), 9) >>> 0;
    const t = s[1] << 9;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 11);
    return result;
  }

  /** Uniform double in [0, 1) with 53 random bits. */
  next(): number {
    const hi = this.nextU32() >>> 5; // 27 bits
    const lo = this.nextU32() >>> 6; // 26 bits
    return (hi * 67108864 + lo) / 9007199254740992;
  }

  /** Uniform integer in [0, n), n a positive integer ≤ 2^32. */
  int(n: number): number {
    return floor(this.next() * n);
  }
}

/** 32-bit rotate left (int32 result). */
function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}

/**
 * A generator for one named stream of this run: seeded from `currentSeed()` and `label`.
 * @param label any string (e.g. the test's name); different labels give independent streams.
 */
export function rngFor(label: string): Rng {
  return new Rng((SEED ^ fnv1a(label)) >>> 0);
}

/**
 * `n` standard normal samples (Box–Muller), rounded to float32. Never exactly zero.
 * @param n number of samples.
 * @param rng the generator.
 * @param std standard deviation (default 1), > 0.
 */
export function randn(n: number, rng: Rng, std = 1): Float32Array {
  const out = new Float32Array(n);
  let i = 0;
  while (i < n) {
    const u1 = 1 - rng.next(); // (0, 1]
    const u2 = rng.next();
    const rad = sqrt(-2 * log(u1));
    const z0 = rad * cos(2 * PI * u2) * std;
    const z1 = rad * sin(2 * PI * u2) * std;
    if (fround(z0) !== 0) out[i++] = z0;
    if (i < n && fround(z1) !== 0) out[i++] = z1;
  }
  return out;
}

/**
 * `n` uniform samples in [lo, hi), rounded to float32. Never exactly zero (redrawn).
 * @param n number of samples.
 * @param lo lower bound.
 * @param hi upper bound, > lo.
 * @param rng the generator.
 */
export function randu(n: number, lo: number, hi: number, rng: Rng): Float32Array {
  if (!(hi > lo)) throw new RangeError(`randu needs hi > lo, got [${lo}, ${hi})`);
  const out = new Float32Array(n);
  let i = 0;
  let misses = 0;
  while (i < n) {
    const x = fround(lo + (hi - lo) * rng.next());
    if (x !== 0 && x >= lo && x < hi) {
      out[i++] = x;
      misses = 0;
    } else if (++misses > 1000) {
      throw new RangeError(`randu: [${lo}, ${hi}) holds (almost) no nonzero float32 value`);
    }
  }
  return out;
}
