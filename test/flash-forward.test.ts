/**
 * The CUDA FlashAttention-2 forward (csrc/cuda/flash, called with `kernel: 'flash'`) in float16 and
 * bfloat16 (float32/TF32 has its own suite), against the float64 reference with the flash-attention
 * rule of helpers/tolerance.ts, for out and for lse:
 *
 *     max|flash − f64 reference| ≤ 2 · max|same-precision reference − f64 reference| + atol
 *
 * The references are computed from the values stored on the device (read back, so already rounded to
 * the dtype). Inputs are fresh seeded random floats (replay with the printed FA_TEST_SEED). Every
 * output starts as NaN (debug.poisonOutputs), so an element the kernel did not write has error
 * +Infinity and expectAllWritten names the first one.
 *
 * Coverage, designed instead of a cross product (each table says what it adds):
 * - HEAD_DIM_CASES: every head dim, the specialised 32, 64, 96, 128, 192, 256 and the padded 8, 40,
 *   72, 136, 200, 248, each in float16 and bfloat16, on mid-size shapes (97-203 rows, seqlenQ ≠
 *   seqlenK both ways, GQA 8:1 and 8:8, causal or not, batch 2, softmaxScale ≠ 1/√d). Full reference.
 * - SEQLEN_CASES: the awkward seqlens 1, 17, 97, 113 and (seqlenQ, seqlenK) = (113, 203), (1, 239),
 *   (3, 799) and their reverses, on d64 and d128. Full reference.
 * - LONG_CASES: 1023, 1025, (1024, 1023), (1023, 1024), 4097 on d64 and d128, and causal (4097, 4097)
 *   and (4100, 4200) at d128 and d112 (on Hopper the warp-specialized kernel). A float64 reference of
 *   every row would take minutes, so the rule runs on sampled row blocks (helpers/rows.ts: the causal
 *   mask stays bottom-right aligned), and every element is compared with the naive CUDA kernel (fp32
 *   from the same stored inputs).
 * - Large-magnitude scores (~±1e4) from random floats, empty causal rows (seqlenQ > seqlenK: out
 *   exactly 0, lse +Infinity), and bit-identical out and lse over 100 runs.
 *
 * CUDA only: without a usable GPU the suite is skipped and the reason printed. Run time on a GPU
 * machine is dominated by the JS references (about 10-20 s for the file). FA_TEST_REPORT=1 prints
 * every case's errors next to its bound.
 */

import { dtypeRounder, flashAttention, HalfDType, referenceAttention, Tensor } from '../lib';
import { describeCuda, trackMemory, usePoisonedOutputs } from './helpers/backend';
import {
  caseName, Dims, expectEmptyRows, ForwardShape, kShapeOf, LSE_DIMS, lseRoundingSlack, lseShapeOf, maxFiniteAbs,
  optionsOf, Q_DIMS, qShapeOf, ruleChecker, scaleOf, scoreMagnitude, shapeOf,
} from './helpers/forward';
import { randn, Rng, rngFor, seedHint } from './helpers/random';
import {
  keysForBlock, referenceRows, ROW_LSE_DIMS, ROW_OUT_DIMS, RowBlock, sampleRowBlocks, takeRows,
} from './helpers/rows';
import {
  decodeIndex, elementError, expectAllWritten, maxAbsDiff,
} from './helpers/tolerance';

trackMemory();
usePoisonedOutputs();

// ------------------------------------------------------------------------------------------------
// Tolerances
// ------------------------------------------------------------------------------------------------

/**
 * Absolute slack of the rule for out. The outputs here are O(1) (|out| ≤ max|v| ≈ 4; ≈ 0.05 for
 * rows over thousands of keys). 2^-14 ≈ 6.1e-5 is 1/16 of a float16 ulp and 1/128 of a bfloat16 ulp
 * at 1, so it cannot absorb a one-ulp error of an O(1) output; it only covers cases whose same-
 * precision error is (nearly) 0 while the kernel's rounding sits elsewhere (single-key rows, Sk 1),
 * and about two float16 ulps of the ≈ 0.05 outputs of 4k-key rows. A masking or tiling error moves
 * an output by a key's share of v (≳ 1e-3 even at 4k keys), far above it.
 */
const OUT_ATOL = 2 ** -14;

/**
 * Absolute slack of the rule for lse (float32 for every dtype): helpers/forward.ts's lseRoundingSlack,
 * 4 float32 ulps of |lse| and of the scores' partial sums. For O(1) inputs this is ~1e-5, under a
 * tenth of what one key more or less changes (≥ 1/4k); at scores ~1e4 it is ~0.06, against
 * |lse| ~1e4 (an ulp there is ~1e-3).
 */
const lseAtol = lseRoundingSlack;

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------

/** One problem: sizes, dtype, mask and scale, with a name that says all of them. */
interface Case extends ForwardShape {
  name: string;
  dtype: HalfDType;
}

/** A case named from its fields, e.g. "203x113 causal (90 empty rows), d64, bf16, B2, GQA 8:1 (Hq 8)". */
function c(dims: Dims, dtype: HalfDType, causal = false, scale?: number): Case {
  const [b, sq, sk, hq, hkv, d] = dims;
  const name = caseName(dims, causal, scale, dtype === 'float16' ? 'fp16' : 'bf16');
  return { name, b, sq, sk, hq, hkv, d, dtype, causal, scale };
}

// [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim]. Every head dim in both dtypes; the shapes
// rotate through Sq < Sk, Sq > Sk (causal: empty rows), Sq = Sk, GQA 8:1 and 8:8, batch 2.
const HEAD_DIM_CASES: Case[] = [
  c([1, 113, 203, 2, 2, 8], 'float16'),
  c([2, 203, 113, 8, 1, 8], 'bfloat16', true),
  c([1, 97, 97, 8, 8, 32], 'float16', true),
  c([1, 113, 203, 8, 1, 32], 'bfloat16'),
  c([2, 203, 113, 2, 2, 40], 'float16', true),
  c([1, 113, 113, 8, 1, 40], 'bfloat16'),
  c([1, 113, 203, 8, 1, 64], 'float16', true),
  c([1, 97, 97, 8, 8, 64], 'bfloat16'),
  c([1, 113, 113, 2, 2, 72], 'float16'),
  c([1, 203, 113, 8, 1, 72], 'bfloat16', true),
  c([2, 113, 203, 2, 2, 96], 'float16', false, 0.5),
  c([1, 97, 97, 8, 1, 96], 'bfloat16', true),
  c([1, 203, 113, 8, 8, 128], 'float16', true),
  c([1, 113, 203, 2, 2, 128], 'bfloat16'),
  c([1, 97, 97, 8, 1, 136], 'float16'),
  c([1, 113, 203, 2, 2, 136], 'bfloat16', true),
  c([1, 113, 113, 2, 2, 192], 'float16', true),
  c([1, 203, 113, 8, 1, 192], 'bfloat16'),
  c([1, 113, 203, 2, 2, 200], 'float16'),
  c([1, 97, 97, 8, 8, 200], 'bfloat16', true, 0.03),
  c([1, 203, 113, 2, 2, 248], 'float16', true),
  c([1, 113, 113, 8, 1, 248], 'bfloat16'),
  c([2, 97, 97, 2, 2, 256], 'float16', true),
  c([1, 113, 203, 8, 1, 256], 'bfloat16'),
];

// Every awkward seqlen on d64 and d128, dtype, mask and heads alternating.
const SEQLEN_CASES: Case[] = [
  c([2, 1, 1, 2, 2, 64], 'float16'),
  c([1, 1, 1, 8, 1, 128], 'bfloat16', true),
  c([3, 17, 17, 2, 2, 64], 'bfloat16', true),
  c([1, 17, 17, 8, 8, 128], 'float16'),
  c([1, 97, 97, 8, 1, 64], 'float16', true),
  c([2, 97, 97, 2, 2, 128], 'bfloat16'),
  c([1, 113, 113, 2, 2, 64], 'bfloat16'),
  c([1, 113, 113, 8, 1, 128], 'float16', true),
  c([2, 113, 203, 2, 2, 64], 'bfloat16', true),
  c([1, 113, 203, 8, 8, 128], 'float16'),
  c([1, 1, 239, 8, 8, 64], 'bfloat16'),
  c([2, 1, 239, 2, 2, 128], 'float16', true),
  c([1, 3, 799, 8, 1, 64], 'float16', true),
  c([2, 3, 799, 2, 2, 128], 'bfloat16'),
  c([1, 203, 113, 8, 8, 64], 'bfloat16', true),
  c([1, 203, 113, 2, 2, 128], 'float16'),
  c([1, 239, 1, 8, 1, 64], 'bfloat16'),
  c([1, 239, 1, 2, 2, 128], 'float16', true),
  c([1, 799, 3, 8, 1, 64], 'bfloat16', true),
  c([2, 799, 3, 2, 2, 128], 'float16'),
];

// Long sequences: sampled rows against float64, every element against the naive kernel.
const LONG_CASES: Case[] = [
  c([1, 1023, 1023, 8, 1, 64], 'bfloat16', true),
  c([2, 1023, 1023, 2, 2, 128], 'float16'),
  c([2, 1025, 1025, 2, 2, 64], 'float16'),
  c([1, 1025, 1025, 8, 8, 128], 'bfloat16', true),
  c([1, 1024, 1023, 8, 1, 64], 'float16', true),
  c([1, 1024, 1023, 2, 2, 128], 'bfloat16'),
  c([1, 1023, 1024, 2, 2, 128], 'float16', true),
  c([1, 4097, 4097, 2, 2, 64], 'bfloat16', true),
  c([1, 4097, 4097, 8, 1, 128], 'float16'),
  c([1, 4097, 4097, 8, 1, 128], 'bfloat16', true), // causal from 4k: the warp-specialized kernel on Hopper
  c([1, 4100, 4200, 2, 2, 112], 'float16', true), // the same, padded head dim, seqlenQ < seqlenK
];

/** Rows per sampled block of a long case (6 blocks: see sampleRowBlocks). */
const ROWS_PER_BLOCK = 4;

// ------------------------------------------------------------------------------------------------
// Running the kernel
// ------------------------------------------------------------------------------------------------

/** Host inputs (float32, rounded to the dtype when the tensors are made). */
interface Inputs {
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
}

/** What one call gives back: the stored inputs and the outputs, read to the host. */
interface Run {
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
  out: Float32Array;
  lse: Float32Array;
  /** The naive CUDA kernel's out and lse for the same tensors, when asked for. */
  naive?: { out: Float32Array; lse: Float32Array };
}

function randomInputs(t: Case, label: string): Inputs {
  const rng = rngFor(label);
  return {
    q: randn(t.b * t.sq * t.hq * t.d, rng),
    k: randn(t.b * t.sk * t.hkv * t.d, rng),
    v: randn(t.b * t.sk * t.hkv * t.d, rng),
  };
}


/**
 * Makes q, k, v on CUDA, runs the FA2 forward (and, with `withNaive`, the naive kernel on the same
 * tensors), checks the kernel that ran, the output shapes and that every element was written, and
 * returns everything read back. Disposes every tensor it made.
 */
async function runFlash(t: Case, inputs: Inputs, withNaive = false): Promise<Run> {
  const owned: Tensor[] = [];
  const make = (data: Float32Array, shape: number[]): Tensor => {
    const x = Tensor.fromFloat32Array(data, shape, { dtype: t.dtype, device: 'cuda' });
    owned.push(x);
    return x;
  };
  try {
    const q = make(inputs.q, qShapeOf(t));
    const k = make(inputs.k, kShapeOf(t));
    const v = make(inputs.v, kShapeOf(t));
    const flash = flashAttention(q, k, v, { ...optionsOf(t), kernel: 'flash' });
    owned.push(flash.out, flash.lse);
    expect(flash.kernel).toBe('flash');
    expect([flash.out.shape, flash.out.dtype, flash.out.device]).toEqual([qShapeOf(t), t.dtype, 'cuda']);
    expect([flash.lse.shape, flash.lse.dtype, flash.lse.device]).toEqual([lseShapeOf(t), 'float32', 'cuda']);
    let naiveTensors: { out: Tensor; lse: Tensor } | undefined;
    if (withNaive) {
      const naive = flashAttention(q, k, v, { ...optionsOf(t), kernel: 'naive' });
      owned.push(naive.out, naive.lse);
      expect(naive.kernel).toBe('naive');
      naiveTensors = naive;
    }
    const [qv, kv, vv, out, lse] = await Promise.all([q, k, v, flash.out, flash.lse].map((x) => x.toFloat32Array()));
    expectAllWritten(out, `out (${t.name})`, { shape: qShapeOf(t), dims: Q_DIMS });
    expectAllWritten(lse, `lse (${t.name})`, { shape: lseShapeOf(t), dims: LSE_DIMS });
    const run: Run = { q: qv, k: kv, v: vv, out, lse };
    if (naiveTensors) {
      run.naive = { out: await naiveTensors.out.toFloat32Array(), lse: await naiveTensors.lse.toFloat32Array() };
      expectAllWritten(run.naive.out, `naive out (${t.name})`, { shape: qShapeOf(t), dims: Q_DIMS });
    }
    return run;
  } finally {
    for (const x of owned) x.dispose();
  }
}

// ------------------------------------------------------------------------------------------------
// Checks
// ------------------------------------------------------------------------------------------------

const expectRule = ruleChecker();

/** Runs `t` with the full float64 and same-precision references and applies the rule to out and lse. */
async function checkFull(t: Case, inputs: Inputs): Promise<Run> {
  const run = await runFlash(t, inputs);
  const shape = shapeOf(t);
  const ref = referenceAttention(run.q, run.k, run.v, shape, optionsOf(t));
  const same = referenceAttention(run.q, run.k, run.v, shape, { ...optionsOf(t), precision: t.dtype });
  expectRule({
    actual: run.out, reference: ref.out, samePrecision: same.out, factor: 2, atol: OUT_ATOL,
    name: `out (${t.name})`, shape: qShapeOf(t), dims: Q_DIMS,
  });
  expectRule({
    actual: run.lse, reference: ref.lse, samePrecision: same.lse, factor: 2,
    atol: lseAtol(maxFiniteAbs(ref.lse), scoreMagnitude(t, run.q, run.k)),
    name: `lse (${t.name})`, shape: lseShapeOf(t), dims: LSE_DIMS,
  });
  expectEmptyRows(t, run.out, run.lse);
  return run;
}

/** max |actual − expected| ≤ bound over every element (NaN or an infinity mismatch fails), with the worst element named. */
function expectClose(actual: Float32Array, expected: Float32Array, bound: number, name: string, shape: number[], dims: readonly string[]): void {
  let worst = 0;
  let at = -1;
  for (let i = 0; i < actual.length; i++) {
    const e = elementError(actual[i], expected[i]);
    if (e > worst || at < 0) {
      worst = e;
      at = i;
    }
  }
  if (!(worst <= bound)) {
    throw new Error(`${name}: max error ${worst.toExponential(4)} above ${bound.toExponential(4)} at ${decodeIndex(at, shape, dims)}:`
      + ` ${actual[at]} vs ${expected[at]}; ${seedHint()}`);
  }
}

/**
 * A long case: the rule on sampled row blocks against float64 (bottom-right causal alignment kept by
 * helpers/rows.ts), then every element against the naive kernel.
 *
 * The naive kernel computes in fp32 from the same stored inputs and rounds once to the dtype, so its
 * own error is within the same-precision error E (which has that rounding too, plus P's). Where the
 * FA2 kernel meets the rule (2E + atol), |flash − naive| ≤ 3E + atol; the bound below allows 4E + atol
 * (E measured on the sampled rows, a few thousand i.i.d. elements, stands for the whole tensor; the
 * extra E is for the rows the sample does not represent). Tiling, masking and unwritten-row errors
 * are a key's share of v or more, far above it.
 */
async function checkLong(t: Case, label: string): Promise<void> {
  const run = await runFlash(t, randomInputs(t, label), true);
  const shape = shapeOf(t);
  const blocks: RowBlock[] = sampleRowBlocks(t.sq, ROWS_PER_BLOCK, rngFor(`${label}/rows`));
  const ref = referenceRows(run.q, run.k, run.v, shape, blocks, optionsOf(t));
  const same = referenceRows(run.q, run.k, run.v, shape, blocks, { ...optionsOf(t), precision: t.dtype });
  const got = takeRows(run.out, run.lse, shape, blocks);
  const R = blocks[0].count;
  const where = `rows ${blocks.map((b) => b.start).join(', ')} (+${R})`;
  const lseBound = lseAtol(maxFiniteAbs(ref.lse), scoreMagnitude(t, run.q, run.k));
  expectRule({
    actual: got.out, reference: ref.out, samePrecision: same.out, factor: 2, atol: OUT_ATOL,
    name: `out (${t.name}, ${where})`, shape: [blocks.length, t.b, R, t.hq, t.d], dims: ROW_OUT_DIMS,
  });
  expectRule({
    actual: got.lse, reference: ref.lse, samePrecision: same.lse, factor: 2, atol: lseBound,
    name: `lse (${t.name}, ${where})`, shape: [blocks.length, t.b, t.hq, R], dims: ROW_LSE_DIMS,
  });
  const naive = run.naive!;
  expectClose(run.out, naive.out, 4 * maxAbsDiff(same.out, ref.out) + OUT_ATOL, `out vs naive (${t.name})`, qShapeOf(t), Q_DIMS);
  expectClose(run.lse, naive.lse, 4 * maxAbsDiff(same.lse, ref.lse) + 2 * lseBound, `lse vs naive (${t.name})`, lseShapeOf(t), LSE_DIMS);
  expectEmptyRows(t, run.out, run.lse);
}

/** The element bits of a read-back tensor (Uint16 for the half types, Uint32 for float32). */
async function bitsOf(x: Tensor): Promise<Uint16Array | Uint32Array> {
  const b = await x.toBits();
  // Typed arrays made by the addon belong to Node's realm, not Jest's: test the tag, not instanceof.
  return Object.prototype.toString.call(b) === '[object Float32Array]'
    ? new Uint32Array(b.buffer, b.byteOffset, b.length)
    : (b as Uint16Array);
}

/** Index of the first element where the two differ, or −1. */
function firstDifference(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) return Math.min(a.length, b.length);
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return -1;
}

// ------------------------------------------------------------------------------------------------
// Large-magnitude inputs
// ------------------------------------------------------------------------------------------------

/**
 * Smallest gap, in softmax (natural-log) units, between a row's largest scaled score and its
 * second: below it two fp32 implementations may legitimately split the row's weight differently
 * (their scores at ~1e4 differ by ~1e-2), which no accuracy rule can judge; above it the runner-up
 * weighs e^-20 ≈ 2e-9 of the winner.
 */
const MIN_TOP_GAP = 20;

/**
 * Redraws (with `draw`) the q rows whose top two visible scores, computed in float64 from the values
 * rounded to the dtype, are closer than MIN_TOP_GAP, until none is. In place.
 */
function redrawNearTies(t: Case, x: Inputs, draw: (n: number) => Float32Array): void {
  const rd = dtypeRounder(t.dtype);
  const kr = x.k.map(rd);
  const scale = scaleOf(t);
  const group = t.hq / t.hkv;
  for (let b = 0; b < t.b; b++) {
    for (let i = 0; i < t.sq; i++) {
      const n = t.causal ? Math.max(0, Math.min(t.sk, i + t.sk - t.sq + 1)) : t.sk;
      if (n < 2) continue;
      for (let h = 0; h < t.hq; h++) {
        const qo = ((b * t.sq + i) * t.hq + h) * t.d;
        for (let attempt = 0; ; attempt++) {
          const qr = x.q.subarray(qo, qo + t.d).map(rd);
          let first = -Infinity;
          let second = -Infinity;
          for (let j = 0; j < n; j++) {
            const ko = ((b * t.sk + j) * t.hkv + Math.floor(h / group)) * t.d;
            let s = 0;
            for (let e = 0; e < t.d; e++) s += qr[e] * kr[ko + e];
            s *= scale;
            if (s > first) {
              second = first;
              first = s;
            } else if (s > second) {
              second = s;
            }
          }
          if (first - second >= MIN_TOP_GAP) break;
          if (attempt === 100) throw new Error(`redrawNearTies: row ${i} of head ${h} keeps near-ties (${t.name})`);
          x.q.set(draw(t.d), qo);
        }
      }
    }
  }
}

interface BigCase {
  name: string;
  t: Case;
  gen: (t: Case, rng: Rng) => Inputs;
}

/** q, k ~ N(0, σ²) with σ² = 1e4 / (softmaxScale·√d): scores ~ N(0, 1e8), |s| ~ 1e4 (σ = 100 at the default scale). */
const normalScores = (t: Case, rng: Rng): Inputs => {
  const sigma = Math.sqrt(1e4 / (scaleOf(t) * Math.sqrt(t.d)));
  const x = {
    q: randn(t.b * t.sq * t.hq * t.d, rng, sigma),
    k: randn(t.b * t.sk * t.hkv * t.d, rng, sigma),
    v: randn(t.b * t.sk * t.hkv * t.d, rng),
  };
  redrawNearTies(t, x, (n) => randn(n, rng, sigma));
  return x;
};

const BIG_CASES: BigCase[] = [
  { name: 'q, k ~ N(0, 100²): scores ~±1e4', t: c([1, 97, 113, 2, 2, 64], 'float16'), gen: normalScores },
  { name: 'q, k ~ N(0, 100²): scores ~±1e4', t: c([1, 113, 97, 4, 1, 128], 'bfloat16', true), gen: normalScores },
  {
    // q, k ~ N(0, 1) and softmaxScale 1250 (scale·log2e ≈ 1.8e3 in the kernel): scores ~±1e4.
    name: 'softmaxScale 1250: scores ~±1e4',
    t: c([1, 80, 90, 2, 2, 64], 'bfloat16', true, 1250),
    gen: (t, rng) => {
      const x = { q: randn(t.b * t.sq * t.hq * t.d, rng), k: randn(t.b * t.sk * t.hkv * t.d, rng), v: randn(t.b * t.sk * t.hkv * t.d, rng) };
      redrawNearTies(t, x, (n) => randn(n, rng));
      return x;
    },
  },
  {
    // q > 0 and k < 0 elementwise: every score ≈ −scale·d·(2/π)·40² ≈ −1e4 (a kernel that starts its
    // running max at 0, or exponentiates without subtracting it, gets 0/0).
    name: 'q > 0, k < 0: every score ≈ −1e4',
    t: c([1, 65, 200, 2, 2, 96], 'float16'),
    gen: (t, rng) => {
      const pos = (n: number): Float32Array => randn(n, rng, 40).map(Math.abs);
      const x = { q: pos(t.b * t.sq * t.hq * t.d), k: pos(t.b * t.sk * t.hkv * t.d).map((y) => -y), v: randn(t.b * t.sk * t.hkv * t.d, rng) };
      redrawNearTies(t, x, pos);
      return x;
    },
  },
];

// ------------------------------------------------------------------------------------------------
// The sampled-row helper, checked against the full reference (runs without a GPU too)
// ------------------------------------------------------------------------------------------------

describe('sampled-row reference (helpers/rows.ts)', () => {
  test.each([
    { what: 'causal, seqlenQ < seqlenK, GQA 2:1, B2', dims: [2, 70, 93, 4, 2, 16] as Dims, causal: true, precision: 'float64' },
    { what: 'causal, seqlenQ > seqlenK (blocks of empty rows), B2', dims: [2, 93, 70, 2, 2, 8] as Dims, causal: true, precision: 'bfloat16' },
    { what: 'causal, seqlenQ = seqlenK', dims: [1, 130, 130, 1, 1, 8] as Dims, causal: true, precision: 'float16' },
    { what: 'not causal, GQA 4:1', dims: [1, 67, 29, 4, 1, 24] as Dims, causal: false, precision: 'float64' },
  ] as const)('$what: the rows equal the full reference\'s rows bit for bit (precision $precision)', ({ dims, causal, precision }) => {
    const t = c(dims, 'float16', causal);
    const x = randomInputs(t, `rows-helper/${t.name}/${precision}`);
    const shape = shapeOf(t);
    const blocks = sampleRowBlocks(t.sq, ROWS_PER_BLOCK, rngFor(`rows-helper/${t.name}/blocks`));
    expect(blocks.length).toBeGreaterThanOrEqual(4);
    if (causal && t.sq > t.sk) expect(keysForBlock(shape, blocks[0], true)).toBeLessThanOrEqual(0);
    const full = referenceAttention(x.q, x.k, x.v, shape, { causal, precision });
    const rows = referenceRows(x.q, x.k, x.v, shape, blocks, { causal, precision });
    const want = takeRows(full.out, full.lse, shape, blocks);
    expect(firstDifference(rows.out, want.out)).toBe(-1);
    expect(firstDifference(rows.lse, want.lse)).toBe(-1);
  });
});

// ------------------------------------------------------------------------------------------------
// The CUDA suite
// ------------------------------------------------------------------------------------------------

describeCuda('FlashAttention-2 forward', () => {
  describe('every head dim, fp16 and bf16: out and lse within the rule of the float64 reference', () => {
    test.each(HEAD_DIM_CASES)('$name', async (t) => {
      await checkFull(t, randomInputs(t, `flash-fwd/headdim/${t.name}`));
    });
  });

  describe('awkward seqlens, d64 and d128: out and lse within the rule of the float64 reference', () => {
    test.each(SEQLEN_CASES)('$name', async (t) => {
      await checkFull(t, randomInputs(t, `flash-fwd/seqlen/${t.name}`));
    });
  });

  describe('long sequences: sampled rows within the rule of float64, every element close to the naive kernel', () => {
    test.each(LONG_CASES)('$name', async (t) => {
      await checkLong(t, `flash-fwd/long/${t.name}`);
    });
  });

  describe('empty causal rows (seqlenQ > seqlenK): out exactly 0, lse +Infinity, the other rows finite', () => {
    // expectEmptyRows also runs in every causal case above; these isolate it, with few visible keys.
    test.each([
      c([2, 150, 7, 4, 2, 64], 'float16', true),
      c([1, 300, 129, 8, 1, 128], 'bfloat16', true),
    ])('$name', async (t) => {
      const run = await runFlash(t, randomInputs(t, `flash-fwd/empty/${t.name}`));
      expectEmptyRows(t, run.out, run.lse);
      // The first row that sees a key sees exactly one: out = v of key 0 (P = 1), to the last bit.
      const row = t.sq - t.sk;
      const got = run.out.subarray(((0 * t.sq + row) * t.hq + 0) * t.d, ((0 * t.sq + row) * t.hq + 1) * t.d);
      expect(Array.from(got)).toEqual(Array.from(run.v.subarray(0, t.d)));
    });
  });

  describe('large-magnitude scores (~±1e4, random floats): finite, and within the rule', () => {
    // Near-ties are redrawn (MIN_TOP_GAP), so every row's softmax is one-hot: the same-precision
    // implementation gets out = v of the winning key exactly, and so must the kernel, with no extra
    // slack. It does when the scores are scaled before the max is taken (fragment_softmax.cuh: P_max =
    // 2^(x − max x) = 2^0 = 1, the others ≤ 2^-28, l = 1). A kernel that folds the scale into the
    // exponent, 2^(fma(s, c, −max·c)), leaves max·c's rounding (~3e-4 relative at 1e4) in P_max, which
    // is rounded to the dtype for P·V while l keeps it in fp32: out lands an ulp of v away, and fails.
    test.each(BIG_CASES)('$name, $t.name', async ({ t, gen }) => {
      const run = await checkFull(t, gen(t, rngFor(`flash-fwd/big/${t.name}`)));
      expect(run.out.findIndex((y) => !Number.isFinite(y))).toBe(-1);
      expect(run.lse.findIndex((y) => Number.isNaN(y) || y === -Infinity)).toBe(-1);
      // The scores really were that large.
      expect(maxFiniteAbs(run.lse)).toBeGreaterThan(3000);
    });
  });

  describe('determinism: 100 runs give bit-identical out and lse', () => {
    test.each([
      c([2, 1025, 1023, 4, 4, 128], 'bfloat16', true),
      c([1, 777, 1100, 8, 1, 64], 'float16'),
    ])('$name', async (t) => {
      const x = randomInputs(t, `flash-fwd/determinism/${t.name}`);
      const o = { dtype: t.dtype, device: 'cuda' as const };
      const q = Tensor.fromFloat32Array(x.q, qShapeOf(t), o);
      const k = Tensor.fromFloat32Array(x.k, kShapeOf(t), o);
      const v = Tensor.fromFloat32Array(x.v, kShapeOf(t), o);
      try {
        let first: { out: Uint16Array | Uint32Array; lse: Uint16Array | Uint32Array } | undefined;
        const differing: string[] = [];
        for (let run = 0; run < 100; run++) {
          const r = flashAttention(q, k, v, { ...optionsOf(t), kernel: 'flash' });
          try {
            expect(r.kernel).toBe('flash');
            const bits = { out: await bitsOf(r.out), lse: await bitsOf(r.lse) };
            if (!first) {
              expectAllWritten(await r.out.toFloat32Array(), 'out', { shape: qShapeOf(t), dims: Q_DIMS });
              first = bits;
              continue;
            }
            for (const n of ['out', 'lse'] as const) {
              const i = firstDifference(bits[n], first[n]);
              if (i >= 0) differing.push(`run ${run}: ${n} first differs at flat index ${i}`);
            }
          } finally {
            r.out.dispose();
            r.lse.dispose();
          }
        }
        expect(differing.slice(0, 5)).toEqual([]);
      } finally {
        for (const y of [q, k, v]) y.dispose();
      }
    });
  });
});
