/**
 * The CUDA FlashAttention-2 forward for float32 inputs (csrc/cuda/flash/flash_fwd_fp32.cu, called
 * with `kernel: 'flash'`) in both of its precisions, against the float64 reference with the
 * flash-attention rule of helpers/tolerance.ts, for out and for lse:
 *
 *     max|flash − f64 reference| ≤ 2 · max|same-precision reference − f64 reference| + atol
 *
 * The same-precision reference is the one of the arithmetic the kernel does:
 * - `float32Precision: 'tf32'` (the default): `precision: 'tf32'` (q, k, v and P rounded to TF32
 *   before the two products, float32 accumulation; lib/reference.ts);
 * - `float32Precision: 'highest'` (3xTF32): `precision: 'float32'`, i.e. full float32 accuracy.
 * The references are computed from the values stored on the device (read back). Inputs are fresh
 * seeded random floats (replay with the printed FA_TEST_SEED). Every output starts as NaN
 * (debug.poisonOutputs), so an element the kernel did not write has error +Infinity and
 * expectAllWritten names the first one.
 *
 * Coverage: the awkward seqlens 1, 17, 97, 1025 and (seqlenQ, seqlenK) = (113, 203), (1, 239),
 * (3, 799) and reverses (causal: empty rows); head dims 32, 64, 96, 128, 192, 256 (specialised) and
 * 8, 40, 200 (zero-padded); GQA 8:1; causal and not; softmaxScale ≠ 1/√d; batch × heads above 65535
 * (the flat grid); integer inputs with scores ~±1e4 and exact ties; the option reaching the kernel
 * ('highest' ≫ closer than 'tf32'; the default is 'tf32'); bit-identical out and lse over 100 runs.
 *
 * CUDA only: without a usable GPU the suite is skipped and the reason printed. FA_TEST_REPORT=1
 * prints every case's errors next to its bound.
 */

import { flashAttention, Float32Precision, referenceAttention, ReferencePrecision, Tensor } from '../lib';
import { describeCuda, trackMemory, usePoisonedOutputs } from './helpers/backend';
import {
  caseName, Dims, expectEmptyRows, ForwardShape, kShapeOf, LSE_DIMS, lseRoundingSlack, lseShapeOf, maxFiniteAbs,
  optionsOf, Q_DIMS, qShapeOf, ruleChecker, scoreMagnitude, shapeOf,
} from './helpers/forward';
import { randn, rngFor } from './helpers/random';
import { expectAllWritten, maxAbsDiff } from './helpers/tolerance';

trackMemory();
usePoisonedOutputs();

// ------------------------------------------------------------------------------------------------
// Tolerances
// ------------------------------------------------------------------------------------------------

/**
 * Absolute slack of the rule for out: the float32 value of test/attention.test.ts (a few float32
 * ulps of the O(1) outputs). In 'tf32' the 2× term (≳ 1e-5 on every case with two keys or more)
 * dominates it; in 'highest' it is the bound in practice, since a float32 implementation's error is
 * ~1e-7 and 3xTF32's ~1.5× that (each product within ~3·2^-22 relative). A masking or tiling error
 * moves an output by a key's share of v (≳ 1e-3 even at 1k keys), far above it.
 */
const OUT_ATOL = 1e-5;

/**
 * Absolute slack of the rule for lse: 1e-5 plus helpers/forward.ts's lseRoundingSlack (4 float32 ulps
 * of |lse| and of the scores' partial sums). ~1.1e-5 for O(1) inputs; ~0.1 at scores ~1e4.
 */
function lseAtol(maxAbsLse: number, scoreMag: number): number {
  return 1e-5 + lseRoundingSlack(maxAbsLse, scoreMag);
}

/** The same-precision reference of each kernel precision. */
const SAME_PRECISION: Record<Float32Precision, ReferencePrecision> = { tf32: 'tf32', highest: 'float32' };
const PRECISIONS: Float32Precision[] = ['tf32', 'highest'];

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------

/** One problem: sizes, mask and scale, with a name that says all of them. */
interface Case extends ForwardShape {
  name: string;
}

/** A case named from its fields, e.g. "203x113 causal (90 empty rows), d64, B2, GQA 8:1 (Hq 8)". */
function c(dims: Dims, causal = false, scale?: number): Case {
  const [b, sq, sk, hq, hkv, d] = dims;
  return { name: caseName(dims, causal, scale), b, sq, sk, hq, hkv, d, causal, scale };
}

// [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim]. Each runs in both precisions. The kernel tiles
// 64 query rows per block and 64, 32 or 16 keys per K/V tile (by head dim and precision).
const CASES: Case[] = [
  // awkward seqlens
  c([2, 1, 1, 2, 2, 64]),
  c([1, 1, 1, 8, 1, 128], true),
  c([3, 17, 17, 2, 2, 32], true),
  c([1, 17, 17, 8, 8, 128]),
  c([2, 97, 97, 2, 2, 96]),
  c([1, 97, 97, 8, 1, 64], true),
  c([1, 1025, 1025, 1, 1, 64], true),
  c([1, 1025, 1025, 2, 2, 128]),
  // seqlenQ ≠ seqlenK both ways (causal with seqlenQ > seqlenK: empty rows)
  c([2, 113, 203, 2, 2, 64], true),
  c([1, 113, 203, 8, 1, 128]),
  c([1, 203, 113, 8, 1, 64], true),
  c([1, 203, 113, 2, 2, 256]),
  c([1, 1, 239, 8, 8, 256]),
  c([2, 1, 239, 2, 2, 64], true),
  c([1, 3, 799, 8, 1, 64], true),
  c([2, 3, 799, 2, 2, 128]),
  c([1, 239, 1, 2, 2, 32], true),
  c([1, 799, 3, 8, 1, 96], true),
  // every specialised head dim and the padded 8, 40, 200; GQA 8:1; softmaxScale ≠ 1/√d
  c([1, 113, 113, 8, 1, 8], true),
  c([1, 113, 203, 2, 2, 32], false, 0.5),
  c([2, 203, 113, 2, 2, 40], true),
  c([1, 113, 113, 8, 1, 40]),
  c([1, 97, 97, 8, 1, 96], true, 0.03),
  c([1, 113, 113, 2, 2, 192], true),
  c([1, 203, 113, 8, 1, 192]),
  c([1, 113, 203, 2, 2, 200]),
  c([1, 97, 97, 8, 8, 200], true),
  c([2, 97, 97, 2, 2, 256], true, 0.2),
];

// ------------------------------------------------------------------------------------------------
// Running the kernel
// ------------------------------------------------------------------------------------------------

interface Inputs {
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
}

/** The stored inputs and the outputs, read back to the host. */
interface Run extends Inputs {
  out: Float32Array;
  lse: Float32Array;
}

function randomInputs(t: Case, label: string): Inputs {
  const rng = rngFor(label);
  return {
    q: randn(t.b * t.sq * t.hq * t.d, rng),
    k: randn(t.b * t.sk * t.hkv * t.d, rng),
    v: randn(t.b * t.sk * t.hkv * t.d, rng),
  };
}

/** Makes float32 q, k, v on CUDA. The caller disposes them. */
function makeTensors(t: Case, inputs: Inputs): Tensor[] {
  return [
    Tensor.fromFloat32Array(inputs.q, qShapeOf(t), { dtype: 'float32', device: 'cuda' }),
    Tensor.fromFloat32Array(inputs.k, kShapeOf(t), { dtype: 'float32', device: 'cuda' }),
    Tensor.fromFloat32Array(inputs.v, kShapeOf(t), { dtype: 'float32', device: 'cuda' }),
  ];
}

/**
 * Runs the float32 FA2 forward in `precision` (undefined: the option left out), checks the kernel
 * that ran, the output shapes and that every element was written, and returns everything read back.
 */
async function runFlash(t: Case, inputs: Inputs, precision: Float32Precision | undefined): Promise<Run> {
  const owned = makeTensors(t, inputs);
  try {
    const [q, k, v] = owned;
    const opts = precision === undefined ? optionsOf(t) : { ...optionsOf(t), float32Precision: precision };
    const r = flashAttention(q, k, v, { ...opts, kernel: 'flash' });
    owned.push(r.out, r.lse);
    expect(r.kernel).toBe('flash');
    expect([r.out.shape, r.out.dtype, r.out.device]).toEqual([qShapeOf(t), 'float32', 'cuda']);
    expect([r.lse.shape, r.lse.dtype, r.lse.device]).toEqual([lseShapeOf(t), 'float32', 'cuda']);
    const [qv, kv, vv, out, lse] = await Promise.all([q, k, v, r.out, r.lse].map((x) => x.toFloat32Array()));
    expectAllWritten(out, `out (${t.name}, ${precision})`, { shape: qShapeOf(t), dims: Q_DIMS });
    expectAllWritten(lse, `lse (${t.name}, ${precision})`, { shape: lseShapeOf(t), dims: LSE_DIMS });
    return { q: qv, k: kv, v: vv, out, lse };
  } finally {
    for (const x of owned) x.dispose();
  }
}

// ------------------------------------------------------------------------------------------------
// Checks
// ------------------------------------------------------------------------------------------------

const expectRule = ruleChecker();

/** Runs `t` in `precision` and applies the rule to out and lse against the float64 and same-precision references. */
async function checkCase(t: Case, inputs: Inputs, precision: Float32Precision): Promise<Run> {
  const run = await runFlash(t, inputs, precision);
  const shape = shapeOf(t);
  const ref = referenceAttention(run.q, run.k, run.v, shape, optionsOf(t));
  const same = referenceAttention(run.q, run.k, run.v, shape, { ...optionsOf(t), precision: SAME_PRECISION[precision] });
  const name = `${t.name}, ${precision}`;
  expectRule({
    actual: run.out, reference: ref.out, samePrecision: same.out, factor: 2, atol: OUT_ATOL,
    name: `out (${name})`, shape: qShapeOf(t), dims: Q_DIMS,
  });
  expectRule({
    actual: run.lse, reference: ref.lse, samePrecision: same.lse, factor: 2,
    atol: lseAtol(maxFiniteAbs(ref.lse), scoreMagnitude(t, run.q, run.k)),
    name: `lse (${name})`, shape: lseShapeOf(t), dims: LSE_DIMS,
  });
  expectEmptyRows(t, run.out, run.lse);
  return run;
}

/** The float32 bit patterns of a read-back tensor. */
async function bitsOf(x: Tensor): Promise<Uint32Array> {
  const b = (await x.toBits()) as Float32Array;
  return new Uint32Array(b.buffer, b.byteOffset, b.length);
}

// ------------------------------------------------------------------------------------------------
// The suite
// ------------------------------------------------------------------------------------------------

describeCuda('float32 FlashAttention-2 forward (TF32 tensor cores)', () => {
  describe.each(PRECISIONS)("float32Precision '%s' vs float64, same-precision rule", (precision) => {
    test.each(CASES)('$name', async (t) => {
      await checkCase(t, randomInputs(t, `fp32/${precision}/${t.name}`), precision);
    });

    test('batch × heads above 65535 (one flat grid): 2 × 40000 heads, GQA 5000:1', async () => {
      const t = c([2, 3, 5, 40000, 8, 8], true);
      await checkCase(t, randomInputs(t, `fp32/${precision}/grid`), precision);
    });

    test('integer inputs, scores ~±1e4 with exact ties: exact scores in both precisions, finite everywhere', async () => {
      // Integers in [-4, 4] are exact in TF32, so every q·k is an exact integer in both precisions
      // and the test is about the large magnitudes (max subtraction, exp under/overflow, lse ~1e4)
      // and about ties: with 2 values per element over d 64, many keys of a row share its max score,
      // and equal scores must give bit-equal probabilities (the scale is applied by one rounded
      // multiply before the max, never folded into an fma with the max).
      const t = c([1, 97, 113, 4, 2, 64], true, 128);
      const rng = rngFor(`fp32/${precision}/ints`);
      const ints = (n: number): Float32Array => Float32Array.from({ length: n }, () => (rng.int(2) === 0 ? -1 : 1) * (1 + rng.int(4)));
      const run = await checkCase(t, { q: ints(97 * 4 * 64), k: ints(113 * 2 * 64), v: ints(113 * 2 * 64) }, precision);
      expect(run.out.findIndex((x) => !Number.isFinite(x))).toBe(-1);
      expect(maxFiniteAbs(run.lse)).toBeGreaterThan(1000);
    });
  });

  test("the option reaches the kernel: 'highest' is far closer to float64 than 'tf32', and 'tf32' is the default", async () => {
    const t = c([1, 203, 203, 2, 2, 64], true);
    const inputs = randomInputs(t, 'fp32/option');
    const tf32 = await runFlash(t, inputs, 'tf32');
    const highest = await runFlash(t, inputs, 'highest');
    const byDefault = await runFlash(t, inputs, undefined);
    const ref = referenceAttention(tf32.q, tf32.k, tf32.v, shapeOf(t), optionsOf(t));
    const [eTf32, eHighest] = [maxAbsDiff(tf32.out, ref.out), maxAbsDiff(highest.out, ref.out)];
    // TF32 has a 10-bit mantissa: ~5e-4 relative; 3xTF32 ~1e-6.
    expect(eTf32).toBeGreaterThan(1e-5);
    expect(eHighest).toBeLessThan(eTf32 / 30);
    expect(Array.from(byDefault.out)).toEqual(Array.from(tf32.out));
    expect(Array.from(byDefault.lse)).toEqual(Array.from(tf32.lse));
  });

  test.each(PRECISIONS)("'%s': out and lse are bit-identical over 100 runs", async (precision) => {
    const t = c([2, 203, 113, 8, 1, 96], true);
    const owned = makeTensors(t, randomInputs(t, `fp32/${precision}/repeat`));
    try {
      const [q, k, v] = owned;
      const opts = { ...optionsOf(t), kernel: 'flash' as const, float32Precision: precision };
      const first = flashAttention(q, k, v, opts);
      owned.push(first.out, first.lse);
      const [out0, lse0] = [await bitsOf(first.out), await bitsOf(first.lse)];
      expectAllWritten(await first.out.toFloat32Array(), 'out');
      let differing = 0;
      for (let run = 1; run < 100; run++) {
        const r = flashAttention(q, k, v, opts);
        try {
          const [out, lse] = [await bitsOf(r.out), await bitsOf(r.lse)];
          if (maxBitDiff(out, out0) || maxBitDiff(lse, lse0)) differing++;
        } finally {
          r.out.dispose();
          r.lse.dispose();
        }
      }
      expect(differing).toBe(0);
    } finally {
      for (const x of owned) x.dispose();
    }
  });
});

/** Whether two bit arrays differ anywhere. */
function maxBitDiff(a: Uint32Array, b: Uint32Array): boolean {
  if (a.length !== b.length) return true;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return true;
  return false;
}
