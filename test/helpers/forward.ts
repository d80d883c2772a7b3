/**
 * What the CUDA forward suites (test/flash-forward.test.ts for fp16/bf16, test/flash-forward-fp32.test.ts
 * for float32) share: the problem description and its shapes, the score magnitude that bounds the
 * tensor cores' accumulation error, the rule check with its FA_TEST_REPORT listing, and the check of
 * the rows that see no key.
 */

import type { ReferenceShape } from '../../lib';
import { checkFlashRule, formatFlashReport, FlashRuleInput, NumArray } from './tolerance';

/** Unit roundoff of float32: half an ulp of 1. */
export const U32 = 2 ** -24;

/** The sizes, mask and scale of one forward problem. */
export interface ForwardShape {
  b: number;
  sq: number;
  sk: number;
  hq: number;
  hkv: number;
  d: number;
  causal: boolean;
  /** softmaxScale; default 1/√d. */
  scale?: number;
  /** options.window ([left, right], −1 unbounded); default none. */
  window?: readonly [number, number];
  /** options.softcap (0 or undefined: none). */
  softcap?: number;
  /** options.alibiSlopes (hq or b·hq slopes); default none. */
  alibi?: ArrayLike<number>;
}

/** [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim]. */
export type Dims = [batch: number, seqlenQ: number, seqlenK: number, headsQ: number, headsKV: number, headDim: number];

/**
 * A case's name from its fields, e.g. "203x113 causal (90 empty rows), d64, bf16, B2, GQA 8:1 (Hq 8)";
 * `label` (the dtype, or nothing) follows the head dim.
 */
export function caseName([b, sq, sk, hq, hkv, d]: Dims, causal: boolean, scale: number | undefined, label?: string): string {
  const empty = sq - sk;
  const mask = causal ? ` causal${empty > 0 ? ` (${empty} empty row${empty > 1 ? 's' : ''})` : ''}` : '';
  const heads = hq === hkv ? `H${hq}` : `GQA ${hq / hkv}:1 (Hq ${hq})`;
  const s = scale === undefined ? '' : `, softmaxScale ${scale}`;
  return `${sq}x${sk}${mask}, d${d}${label ? `, ${label}` : ''}, B${b}, ${heads}${s}`;
}

export const scaleOf = (t: ForwardShape): number => t.scale ?? 1 / Math.sqrt(t.d);
export const shapeOf = (t: ForwardShape): ReferenceShape =>
  ({ batch: t.b, seqlenQ: t.sq, seqlenK: t.sk, headsQ: t.hq, headsKV: t.hkv, headDim: t.d });
export const qShapeOf = (t: ForwardShape): number[] => [t.b, t.sq, t.hq, t.d];
export const kShapeOf = (t: ForwardShape): number[] => [t.b, t.sk, t.hkv, t.d];
export const lseShapeOf = (t: ForwardShape): number[] => [t.b, t.hq, t.sq];
export const Q_DIMS = ['b', 's', 'h', 'd'] as const;
export const LSE_DIMS = ['b', 'h', 's'] as const;
export const optionsOf = (t: ForwardShape): { causal: boolean; softmaxScale?: number } =>
  (t.scale === undefined ? { causal: t.causal } : { causal: t.causal, softmaxScale: t.scale });

/** softmaxScale · max_i ‖q_i‖ · max_j ‖k_j‖: a bound on every |partial sum| of every score. */
export function scoreMagnitude(t: ForwardShape, q: Float32Array, k: Float32Array): number {
  const maxNorm = (a: Float32Array): number => {
    let m = 0;
    for (let o = 0; o < a.length; o += t.d) {
      let s = 0;
      for (let c = 0; c < t.d; c++) s += a[o + c] * a[o + c];
      if (s > m) m = s;
    }
    return Math.sqrt(m);
  };
  return scaleOf(t) * maxNorm(q) * maxNorm(k);
}

/**
 * 4 float32 ulps (8·U32 relative) of the magnitudes that a kernel rounds differently from a plain
 * implementation on the way to lse: |lse| itself (the base-2 max and sum go to natural log as
 * (m + log2 l)·ln 2, three roundings) and the scores' partial sums, bounded by `scoreMagnitude`
 * (tensor-core fp32 accumulation aligns and truncates instead of rounding each sum; Fasi et al.,
 * "Numerical behavior of NVIDIA tensor cores", PeerJ CS 2021).
 */
export function lseRoundingSlack(maxAbsLse: number, scoreMag: number): number {
  return 8 * U32 * (maxAbsLse + scoreMag);
}

/** Largest |x| over the finite elements (lse holds +Infinity on empty rows). */
export function maxFiniteAbs(a: NumArray): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    const x = Math.abs(a[i]);
    if (x > m && x !== Infinity) m = x;
  }
  return m;
}

/**
 * The flash rule as a throwing check for a suite. With FA_TEST_REPORT=1 every check's errors are
 * listed after the suite (maxErr / same-precision error, and the share of the bound used).
 * Call once at a suite's top level (it registers an afterAll).
 */
export function ruleChecker(): (input: FlashRuleInput) => void {
  const report = process.env.FA_TEST_REPORT === '1';
  const lines: string[] = [];
  afterAll(() => {
    if (report && lines.length > 0) console.log(`flash rule: maxErr / same-precision error (share of the bound)\n${lines.join('\n')}`);
  });
  return (input: FlashRuleInput): void => {
    const rep = checkFlashRule(input);
    if (report) {
      lines.push(`${input.name}: ${rep.maxErr.toExponential(2)} / ${rep.refErr.toExponential(2)}`
        + ` (${(rep.maxErr / rep.bound).toFixed(2)})`);
    }
    if (!rep.pass) throw new Error(formatFlashReport(input, rep));
  };
}

/**
 * Causal attention with seqlenQ > seqlenK: the first seqlenQ − seqlenK rows see no key, so their out
 * is exactly 0 and their lse +Infinity; every other row's lse is finite. Checked on the full arrays.
 */
export function expectEmptyRows(t: ForwardShape, out: Float32Array, lse: Float32Array): void {
  const empty = t.causal ? Math.max(0, t.sq - t.sk) : 0;
  const bad: string[] = [];
  for (let b = 0; b < t.b && bad.length < 5; b++) {
    for (let h = 0; h < t.hq; h++) {
      for (let i = 0; i < t.sq; i++) {
        const l = lse[(b * t.hq + h) * t.sq + i];
        if (i < empty ? l !== Infinity : !Number.isFinite(l)) bad.push(`lse[b=${b}, h=${h}, s=${i}] = ${l}`);
        if (i >= empty) continue;
        const base = ((b * t.sq + i) * t.hq + h) * t.d;
        for (let e = 0; e < t.d; e++) {
          if (out[base + e] !== 0) bad.push(`out[b=${b}, s=${i}, h=${h}, d=${e}] = ${out[base + e]}`);
        }
      }
    }
  }
  expect(bad.slice(0, 5)).toEqual([]);
}
