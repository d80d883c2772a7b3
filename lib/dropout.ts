/**
 * Attention dropout's random mask: which elements of the attention probabilities `P` a call with
 * `dropout: p` keeps, as a pure function of (seed, offset, sequence, query head, row, column), so that
 * the backward regenerates the forward's mask without storing it and tests can check it exactly.
 *
 * The generator is Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11;
 * the counter-based generator of cuRAND and of FlashAttention's dropout), one call per four columns:
 * - key: `[seed mod 2³², floor(seed / 2³²)]` (`seed` an integer in [0, 2⁵³));
 * - counter: `[floor(col / 4), row, batch · headsQ + head, offset]` (`offset` an integer in [0, 2³²),
 *   advanced by the caller between calls that must not share a mask);
 * - the element's 32-bit word: output word `col % 4`;
 * - kept iff that word is `>= floor(p · 2³²)`, so that a fraction `1 − p` is kept (exactly, over the
 *   2³² words); a kept probability is scaled by `1 / (1 − p)`.
 * `batch` is the sequence index (the varlen sequence too), `head` the query head, `row` and `col` the
 * query row and key within the sequence, counted from 0 at the sequence's first row and key.
 *
 * @module dropout
 */

import { describeValue, rangeError, refuseUnknownKeys, typeError } from './errors';

const M0 = 0xd2511f53;
const M1 = 0xcd9e8d57;
const W0 = 0x9e3779b9;
const W1 = 0xbb67ae85;

/** The high 32 bits of the 64-bit product of two uint32 (exact: 16-bit halves in doubles). */
function mulhi(a: number, b: number): number {
  const al = a & 0xffff;
  const ah = a >>> 16;
  const bl = b & 0xffff;
  const bh = b >>> 16;
  const lh = al * bh;
  const hl = ah * bl;
  const mid = ((al * bl) >>> 16) + (lh & 0xffff) + (hl & 0xffff);
  return (ah * bh + (lh >>> 16) + (hl >>> 16) + (mid >>> 16)) >>> 0;
}

/** The Philox4x32 rounds on unchecked uint32 words, into `out`. */
function philoxInto(ctr: ArrayLike<number>, key: ArrayLike<number>, rounds: number, out: Uint32Array): Uint32Array {
  let c0 = ctr[0] >>> 0;
  let c1 = ctr[1] >>> 0;
  let c2 = ctr[2] >>> 0;
  let c3 = ctr[3] >>> 0;
  let k0 = key[0] >>> 0;
  let k1 = key[1] >>> 0;
  for (let r = 0; r < rounds; r++) {
    if (r > 0) {
      k0 = (k0 + W0) >>> 0;
      k1 = (k1 + W1) >>> 0;
    }
    const hi0 = mulhi(M0, c0);
    const lo0 = Math.imul(M0, c0) >>> 0;
    const hi1 = mulhi(M1, c2);
    const lo1 = Math.imul(M1, c2) >>> 0;
    c0 = (hi1 ^ c1 ^ k0) >>> 0;
    c1 = lo1;
    c2 = (hi0 ^ c3 ^ k1) >>> 0;
    c3 = lo0;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
  return out;
}

/** `n` uint32 words read once from `a` (an array or typed array of integers in [0, 2^32)). */
function uint32Words(name: string, a: unknown, n: number): number[] {
  const what = `${name} to be an array of ${n} integers in [0, 2^32)`;
  if (a === null || typeof a !== 'object') throw typeError(what, describeValue(a));
  const length: unknown = (a as ArrayLike<unknown>).length;
  if (length !== n) throw rangeError(what, typeof length === 'number' ? `${length} elements` : describeValue(length));
  const words: number[] = [];
  for (let i = 0; i < n; i++) {
    const x: unknown = (a as ArrayLike<unknown>)[i];
    if (typeof x !== 'number') throw typeError(`${name}[${i}] to be a number`, describeValue(x));
    if (!Number.isInteger(x) || x < 0 || x > 0xffffffff) throw rangeError(`${name}[${i}] to be an integer in [0, 2^32)`, String(x));
    words.push(x);
  }
  return words;
}

/**
 * Philox4x32 with `rounds` rounds (10 for the dropout mask) of `counter` (4 uint32 words) under `key`
 * (2 words): its 4 output words. Matches Random123's known-answer vectors (test/dropout.test.ts).
 *
 * ```ts
 * philox4x32([0, 0, 0, 0], [0, 0]); // Uint32Array [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
 * ```
 */
export function philox4x32(counter: ArrayLike<number>, key: ArrayLike<number>, rounds = 10): Uint32Array {
  const c = uint32Words('counter', counter, 4);
  const k = uint32Words('key', key, 2);
  if (typeof rounds !== 'number') throw typeError('rounds to be a number', describeValue(rounds));
  if (!Number.isInteger(rounds) || rounds < 1 || rounds > 16) {
    throw rangeError('rounds to be an integer from 1 to 16', String(rounds));
  }
  return philoxInto(c, k, rounds, new Uint32Array(4));
}

/** A call's dropout: the probability of dropping an element and the generator's seed and offset. */
export interface DropoutParams {
  /** Probability of dropping an element of P, in [0, 1). */
  p: number;
  /** Philox key, an integer in [0, 2⁵³). */
  seed: number;
  /** Philox counter word 3, an integer in [0, 2³²). Default 0. */
  offset?: number;
}

/** Where an element of P sits: sequence, query head (of `headsQ`), query row and key. */
export interface DropoutSite {
  /** The sequence (of the batch, or of a varlen pack), from 0. */
  batch: number;
  /** The query head, from 0 to `headsQ − 1`. */
  head: number;
  /** The call's query heads. */
  headsQ: number;
  /** The query row within the sequence, from 0. */
  row: number;
  /** The key within the sequence, from 0. */
  col: number;
}

/** A checked copy of `d` with its keep threshold: words >= threshold are kept. */
export interface ResolvedDropout {
  p: number;
  seed: number;
  offset: number;
  /** floor(p · 2³²). */
  threshold: number;
  /** 1 / (1 − p), the kept elements' factor. */
  scale: number;
  key0: number;
  key1: number;
}

/**
 * Checks a dropout probability, seed and offset (named `names.p`, `names.seed`, `names.offset` in
 * errors) and resolves them.
 */
export function resolveDropout(p: unknown, seed: unknown, offset: unknown,
  names = { p: 'dropout.p', seed: 'dropout.seed', offset: 'dropout.offset' }): ResolvedDropout {
  if (typeof p !== 'number') throw typeError(`${names.p} to be a number`, describeValue(p));
  if (!(p >= 0 && p < 1)) throw rangeError(`${names.p} to be a probability in [0, 1)`, String(p));
  if (typeof seed !== 'number') throw typeError(`${names.seed} to be a number`, describeValue(seed));
  if (!Number.isSafeInteger(seed) || seed < 0) throw rangeError(`${names.seed} to be an integer in [0, 2^53)`, String(seed));
  const off = offset ?? 0;
  if (typeof off !== 'number') throw typeError(`${names.offset} to be a number`, describeValue(off));
  if (!Number.isSafeInteger(off) || off < 0 || off > 0xffffffff) {
    throw rangeError(`${names.offset} to be an integer in [0, 2^32)`, String(off));
  }
  return {
    p, seed, offset: off, threshold: Math.floor(p * 4294967296), scale: 1 / (1 - p),
    key0: seed % 4294967296, key1: Math.floor(seed / 4294967296),
  };
}

const ctrScratch = new Uint32Array(4);
const keyScratch = new Uint32Array(2);
const outScratch = new Uint32Array(4);

/** The four Philox words of keys 4 · group .. 4 · group + 3 of a row, into `out` (see the module comment). */
export function dropoutWords(d: ResolvedDropout, batch: number, head: number, headsQ: number, row: number,
  group: number, out: Uint32Array): Uint32Array {
  ctrScratch[0] = group;
  ctrScratch[1] = row;
  ctrScratch[2] = batch * headsQ + head;
  ctrScratch[3] = d.offset;
  keyScratch[0] = d.key0;
  keyScratch[1] = d.key1;
  return philoxInto(ctrScratch, keyScratch, 10, out);
}

/** The 32-bit Philox word of an element of P (see the module comment for the mapping). */
export function dropoutWord(d: ResolvedDropout, batch: number, head: number, headsQ: number, row: number, col: number): number {
  return dropoutWords(d, batch, head, headsQ, row, Math.floor(col / 4), outScratch)[col % 4];
}

/**
 * Whether a call with dropout `params` keeps the element of P at `site`: the documented mask, which
 * every backend's dropout reproduces.
 *
 * ```ts
 * dropoutKeep({ p: 0.1, seed: 42 }, { batch: 0, head: 3, headsQ: 8, row: 17, col: 5 });
 * ```
 */
export function dropoutKeep(params: DropoutParams, site: DropoutSite): boolean {
  for (const [name, o, keys] of [['params', params, ['p', 'seed', 'offset']],
    ['site', site, ['batch', 'head', 'headsQ', 'row', 'col']]] as const) {
    if (o === null || typeof o !== 'object' || Array.isArray(o)) throw typeError(`${name} to be an object`, describeValue(o));
    refuseUnknownKeys(o, name, keys);
  }
  const d = resolveDropout(params.p, params.seed, params.offset);
  const { batch, head, headsQ, row, col } = site;
  const integer = (name: string, v: unknown, min: number, max: number): void => {
    if (typeof v !== 'number') throw typeError(`site.${name} to be a number`, describeValue(v));
    if (!Number.isSafeInteger(v) || v < min || v > max) {
      throw rangeError(`site.${name} to be an integer from ${min} to ${max}`, String(v));
    }
  };
  integer('headsQ', headsQ, 1, 0xffffffff);
  integer('head', head, 0, headsQ - 1);
  integer('batch', batch, 0, 0xffffffff);
  integer('row', row, 0, 0xffffffff);
  integer('col', col, 0, 0x3ffffffff);
  if (batch * headsQ + head > 0xffffffff) throw rangeError('site.batch · site.headsQ + site.head to fit 32 bits', String(batch * headsQ + head));
  return dropoutWord(d, batch, head, headsQ, row, col) >= d.threshold;
}
