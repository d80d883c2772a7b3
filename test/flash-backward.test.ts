/**
 * The CUDA FlashAttention-2 backward for float16 / bfloat16 (csrc/cuda/flash/flash_bwd*: one kernel
 * with dq accumulated by fp32 atomic adds, or on Hopper at head dims 32 / 64 / 128 two kernels, which
 * algorithm 'auto' picks there; reached with `kernel: 'flash'` and by 'auto') against the float64
 * reference with the flash-attention rule of helpers/tolerance.ts, for dq, dk and dv (where 'auto'
 * runs two kernels, the case tables check the single kernel on the same inputs too):
 *
 *     max|flash − f64 reference| ≤ 3 · max|same-precision reference − f64 reference| + atol
 *
 * where the same-precision reference is a plain implementation storing the dtype and accumulating
 * in fp32 (lib/reference.ts, `precision: dtype`) and atol is 1e-5 plus, only where the same-precision
 * result is exact, float32 floors of the FA2 algorithm (helpers/backward.ts: gradientSlack). As in
 * training, out and lse come from the CUDA FA2 forward and are fed to the backward; both references
 * get the values stored on the device (read back, so already rounded to the dtype). Inputs are fresh
 * seeded random floats, never zeros (replay with the printed FA_TEST_SEED). Every output starts as
 * NaN (debug.poisonOutputs), so an element the kernel did not write has error +Infinity and
 * expectAllWritten names it.
 *
 * Coverage, designed instead of a cross product (each table says what it adds):
 * - HEAD_DIM_CASES: the specialised head dims 32, 64, 96, 128, 192, 256 and the padded 8, 40, 72,
 *   136, 200, 248, each in float16 and bfloat16, on mid-size shapes (97-203 rows, seqlenQ ≠ seqlenK
 *   both ways, GQA 8:1 with one and with two KV heads, 8:8, causal or not, batch 2, softmaxScale ≠
 *   1/√d). Full reference.
 * - SEQLEN_CASES: the seqlens 1, 17, 97, 113 and (seqlenQ, seqlenK) = (113, 203), (203, 113),
 *   (1, 239), (3, 799) and the reverses (239, 1), (799, 3), on d64 and d128. Full reference.
 * - LONG_CASES: 1023, 1025 and (1024, 1023) with one or two heads, so that the full float64
 *   reference stays affordable (a few seconds each); 1023 causal is the race test's case.
 * - Masking hazards, checked exactly: rows that see no key have dq exactly 0 and contribute nothing
 *   (dk, dv bit-identical when their q and dout change); the memory after a sequence (padded query
 *   rows, keys beyond seqlen_k, padded head-dim columns) is never used (dk, dv bit-identical and dq
 *   finite when the next sequence holds NaN and ±Infinity).
 * - Large-magnitude inputs (q, k × 10: scores ~±100s), the `kernel` field of 'flash' and 'auto',
 *   determinism (dk, dv bit-identical over 100 runs; dq within the rounding of its fp32 accumulator),
 *   `deterministic: true` (the FA2 kernels with ordered accumulator slices: 50 runs bit-identical), and a
 *   finite-difference check of forward + backward in float32 with kernel 'auto'.
 *
 * CUDA only: without a usable GPU the suite is skipped and the reason printed; only the calibration
 * of the finite-difference check on the CPU backend runs. Run time on a GPU machine is dominated by
 * the JS references (about 30 s for the file). FA_TEST_REPORT=1 prints every case's errors next to
 * its bound.
 */

import { AttentionBackwardOptions, AttentionGradients, backends, flashAttentionWithGrad, HalfDType, Tensor } from '../lib';
import { describeCuda, HAS_CUDA, liveMemory, trackMemory, usePoisonedOutputs } from './helpers/backend';
import {
  BackwardCase, BackwardRun, batchOf, bitsOf, bwdCase, checkGradients, DeviceProblem, disposeGradients,
  dqAccumulatorBounds, dqRunToRunViolations, emptyRows, expectEmptyRowGradients, expectFinite, fdMismatches,
  finiteDifferences, firstDifference, gradientRuleInput, gradientSlack, HostGradients, poisonBatch1, randomInputs,
  readGradients, References, rmsAnalytic, runBackward, StoredProblem,
} from './helpers/backward';
import { ForwardShape, kShapeOf, maxFiniteAbs, Q_DIMS, qShapeOf, ruleChecker } from './helpers/forward';
import { randn, rngFor } from './helpers/random';
import { checkFlashRule, expectAllWritten, formatFlashReport } from './helpers/tolerance';

trackMemory();
usePoisonedOutputs();

const expectRule = ruleChecker();
const REPORT = process.env.FA_TEST_REPORT === '1';

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------

const c = bwdCase;

// [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim]. Every head dim in both dtypes; the shapes
// rotate through Sq < Sk, Sq > Sk (causal: empty rows), Sq = Sk, GQA 8:1 (Hkv 1 and Hkv 2) and 8:8,
// batch 2. None of the seqlens is a multiple of 64, so every K/V tile and query tile has a tail.
const HEAD_DIM_CASES: BackwardCase[] = [
  c([1, 113, 203, 2, 2, 8], 'float16'),
  c([2, 203, 113, 8, 1, 8], 'bfloat16', true),
  c([1, 97, 97, 8, 8, 32], 'float16', true),
  c([1, 113, 203, 16, 2, 32], 'bfloat16'),
  c([2, 203, 113, 2, 2, 40], 'float16', true),
  c([1, 113, 113, 8, 1, 40], 'bfloat16'),
  c([1, 113, 203, 8, 1, 64], 'float16', true),
  c([1, 97, 97, 8, 8, 64], 'bfloat16'),
  c([1, 113, 113, 2, 2, 72], 'float16'),
  c([1, 203, 113, 16, 2, 72], 'bfloat16', true),
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

// Every awkward seqlen on d64 and d128, dtype, mask and heads alternating. Seqlen 1 and seqlenK 1
// have rows that see a single key (dS exactly 0: see helpers/backward.ts, gradientSlack).
const SEQLEN_CASES: BackwardCase[] = [
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

// Long sequences, full reference (one or two heads keep it to a few seconds each).
const LONG_CASES: BackwardCase[] = [
  c([1, 1023, 1023, 1, 1, 64], 'bfloat16'),
  c([1, 1025, 1025, 1, 1, 128], 'float16', true),
  c([1, 1025, 1025, 1, 1, 64], 'bfloat16'),
  c([1, 1024, 1023, 2, 1, 64], 'float16', true),
  c([1, 1024, 1023, 1, 1, 64], 'bfloat16'),
];

/** The race test's case: many K/V tiles add into every dq row at once. */
const RACE_CASE = c([2, 1023, 1023, 1, 1, 64], 'float16', true);
const RACE_RUNS = 100;

// ------------------------------------------------------------------------------------------------
// Helpers of this file
// ------------------------------------------------------------------------------------------------

/**
 * Runs `t` with kernel 'flash' and applies the rule (and the exact empty-row and finiteness checks)
 * to every algorithm runBackward ran (on Hopper at head dims 32 / 64 / 128: two-kernel and single-kernel).
 */
async function checkCase(t: BackwardCase, label: string, largeMagnitude = false): Promise<{ run: BackwardRun; refs: References }> {
  const run = await runBackward(t, randomInputs(t, label, largeMagnitude ? 10 : 1));
  const refs = checkGradients(t, run, expectRule, largeMagnitude);
  for (const other of run.others) checkGradients(t, { ...run, ...other }, expectRule, largeMagnitude, refs);
  return { run, refs };
}

/** The thrown value's name and message (errors from the addon come from another realm: no instanceof). */
function thrownBy(fn: () => AttentionGradients): { name: string; message: string } | 'did not throw' {
  try {
    disposeGradients(fn());
    return 'did not throw';
  } catch (e) {
    const err = e as Error;
    return { name: err?.name, message: err?.message };
  }
}

// ------------------------------------------------------------------------------------------------
// The finite-difference check, calibrated on the CPU backend (runs without a GPU too)
// ------------------------------------------------------------------------------------------------

/** Tiny float32 problems: GQA, causal with empty rows, MQA with a softmaxScale of its own. */
const FD_CASES: ForwardShape[] = [
  { b: 1, sq: 5, sk: 7, hq: 2, hkv: 1, d: 8, causal: false },
  { b: 2, sq: 6, sk: 4, hq: 2, hkv: 2, d: 16, causal: true },
  { b: 1, sq: 9, sk: 9, hq: 4, hkv: 1, d: 32, causal: true, scale: 0.3 },
];
const fdName = (t: ForwardShape): string => `${t.sq}x${t.sk}${t.causal ? ' causal' : ''}, d${t.d}, B${t.b}, Hq ${t.hq}, Hkv ${t.hkv}`
  + (t.scale === undefined ? '' : `, softmaxScale ${t.scale}`);
const FD_PER_TENSOR = 4;

describe('finite-difference check of forward + backward (helpers/backward.ts), calibrated on the CPU backend', () => {
  test(`${fdName(FD_CASES[1])}: float32 derivatives agree; corrupted gradients are caught`, async () => {
    const t = FD_CASES[1];
    const entries = await finiteDifferences(t, 'cpu', {}, `fd-calibration/${fdName(t)}`, FD_PER_TENSOR);
    expect(fdMismatches(entries)).toEqual([]);
    // The check compared real derivatives: O(0.1) on average, and the empty-row entry exactly 0.
    expect(rmsAnalytic(entries)).toBeGreaterThan(0.05);
    const emptyEntry = entries[entries.length - 1];
    expect([emptyEntry.numeric, emptyEntry.analytic]).toEqual([0, 0]);
    // And it fails where it should: a sign error, a 10% scale error, and dk and dv swapped.
    const nonTrivial = entries.filter((e) => Math.abs(e.analytic) > 0.05);
    expect(nonTrivial.length).toBeGreaterThan(0);
    expect(fdMismatches(nonTrivial.map((e) => ({ ...e, analytic: -e.analytic })))).toHaveLength(nonTrivial.length);
    expect(fdMismatches(nonTrivial.map((e) => ({ ...e, analytic: 1.1 * e.analytic }))).length).toBeGreaterThan(0);
    const kv = entries.filter((e) => e.tensor !== 'q');
    const swapped = kv.map((e, i) => ({ ...e, analytic: kv[(i + kv.length / 2) % kv.length].analytic }));
    expect(fdMismatches(swapped).length).toBeGreaterThan(0);
  });
});

// ------------------------------------------------------------------------------------------------
// The CUDA suite
// ------------------------------------------------------------------------------------------------

describeCuda('FlashAttention-2 backward, fp16 and bf16', () => {
  describe('every head dim: dq, dk, dv within the rule of the float64 reference', () => {
    test.each(HEAD_DIM_CASES)('$name', async (t) => {
      await checkCase(t, `flash-bwd/headdim/${t.name}`);
    });
  });

  describe('awkward seqlens, d64 and d128: dq, dk, dv within the rule of the float64 reference', () => {
    test.each(SEQLEN_CASES)('$name', async (t) => {
      await checkCase(t, `flash-bwd/seqlen/${t.name}`);
    });
  });

  describe('long sequences: dq, dk, dv within the rule of the float64 reference', () => {
    test.each(LONG_CASES)('$name', async (t) => {
      await checkCase(t, `flash-bwd/long/${t.name}`);
    });
  });

  describe('rows that see no key (causal, seqlenQ > seqlenK): dq exactly 0, and they contribute nothing', () => {
    // Every causal case above with seqlenQ > seqlenK checks dq = 0 on those rows and dk, dv against
    // the reference. Here the contribution is checked exactly: replacing the q and dout of the empty
    // rows by other values must leave dk and dv bit-identical (and dq of the other rows within the
    // rounding of its fp32 accumulator). The forward of both variants is the same to the bit (rows
    // are independent; the empty ones get out 0 and lse +Infinity), which is checked first.
    test.each([
      c([1, 203, 113, 2, 2, 64], 'float16', true),
      c([2, 150, 7, 8, 2, 128], 'bfloat16', true),
      c([1, 300, 129, 4, 1, 96], 'float16', true),
    ])('$name', async (t) => {
      const label = `flash-bwd/empty/${t.name}`;
      const x = randomInputs(t, label);
      const rng = rngFor(`${label}/other`);
      const y = { ...x, q: new Float32Array(x.q), dout: new Float32Array(x.dout) };
      const empty = emptyRows(t);
      for (let b = 0; b < t.b; b++) {
        const from = b * t.sq * t.hq * t.d;
        const n = empty * t.hq * t.d;
        y.q.set(randn(n, rng, 3), from);
        y.dout.set(randn(n, rng, 3), from);
      }
      const A = DeviceProblem.create(t, x, t.dtype);
      const B = DeviceProblem.create(t, y, t.dtype);
      const grads: AttentionGradients[] = [];
      try {
        for (const n of ['out', 'lse'] as const) {
          expect(`${n}: first difference at ${firstDifference(await bitsOf(A[n]), await bitsOf(B[n]))}`).toBe(`${n}: first difference at -1`);
        }
        const ga = A.backward({ kernel: 'flash' });
        grads.push(ga);
        const gb = B.backward({ kernel: 'flash' });
        grads.push(gb);
        expect([ga.kernel, gb.kernel]).toEqual(['flash', 'flash']);
        const sa = await A.read();
        const ha = await readGradients(t, t.dtype, 'cuda', ga, `${t.name}, variant A`);
        const hb = await readGradients(t, t.dtype, 'cuda', gb, `${t.name}, variant B`);
        const sb = await B.read();
        expectEmptyRowGradients(t, ha.dq, sa.lse);
        expectEmptyRowGradients(t, hb.dq, sb.lse);
        for (const n of ['dk', 'dv'] as const) {
          const i = firstDifference(await bitsOf(ga[n]), await bitsOf(gb[n]));
          expect(`${n}: first difference at ${i} ${i >= 0 ? `(${ha[n][i]} vs ${hb[n][i]})` : ''}`.trim()).toBe(`${n}: first difference at -1`);
        }
        expect(dqRunToRunViolations(ha.dq, hb.dq, dqAccumulatorBounds(t, sa), t.dtype, qShapeOf(t))).toEqual([]);
        checkGradients(t, { ...sa, ...ha }, expectRule);
      } finally {
        for (const g of grads) disposeGradients(g);
        A.dispose();
        B.dispose();
      }
    });
  });

  describe('memory after a sequence is never used (padded query rows, keys beyond seqlen_k, padded head dims)', () => {
    // Batch 0 of a batch of 2, run twice: once as is, once with every input of batch 1 (q, k, v, dout,
    // out, lse: the memory right after batch 0's rows in every tensor) replaced by NaN, +Infinity and
    // −Infinity. A kernel that reads rows past seqlenQ or seqlenK (or columns past headDim) without
    // zero-filling them, or that masks by multiplying by 0 (Inf·0 = NaN), changes batch 0's gradients or
    // makes them NaN. Batch 0's dk and dv must be bit-identical across the two runs, its dq within the
    // rounding of the fp32 accumulator and finite, and the clean run within the rule.
    test.each([
      c([2, 113, 203, 2, 2, 64], 'float16'),
      c([2, 203, 113, 8, 2, 128], 'bfloat16', true),
      c([2, 17, 97, 2, 1, 40], 'float16', true),
      c([2, 1, 239, 2, 2, 200], 'bfloat16'),
      c([2, 97, 1, 2, 2, 96], 'float16'),
      c([2, 65, 129, 1, 1, 256], 'bfloat16', true),
    ])('$name', async (t) => {
      const clean = DeviceProblem.create(t, randomInputs(t, `flash-bwd/neighbour/${t.name}`), t.dtype);
      let poisoned: DeviceProblem | undefined;
      const grads: AttentionGradients[] = [];
      try {
        const s = await clean.read();
        const perQ = t.sq * t.hq * t.d;
        const perK = t.sk * t.hkv * t.d;
        const bad: StoredProblem = {
          q: poisonBatch1(s.q, perQ), k: poisonBatch1(s.k, perK), v: poisonBatch1(s.v, perK),
          dout: poisonBatch1(s.dout, perQ), out: poisonBatch1(s.out, perQ), lse: poisonBatch1(s.lse, t.hq * t.sq),
        };
        poisoned = DeviceProblem.fromStored(t, bad, t.dtype);
        const gc = clean.backward({ kernel: 'flash' });
        grads.push(gc);
        const gp = poisoned.backward({ kernel: 'flash' });
        grads.push(gp);
        expect([gc.kernel, gp.kernel]).toEqual(['flash', 'flash']);
        const hc = await readGradients(t, t.dtype, 'cuda', gc, `${t.name}, clean`);
        checkGradients(t, { ...s, ...hc }, expectRule);

        // Batch 0 of the poisoned run (batch 1 of it is NaN by construction and not checked).
        const t0 = { ...t, b: 1 };
        const dq0 = batchOf(new Float32Array(await gp.dq.toFloat32Array()), perQ, 0);
        const dk0 = batchOf(new Float32Array(await gp.dk.toFloat32Array()), perK, 0);
        const dv0 = batchOf(new Float32Array(await gp.dv.toFloat32Array()), perK, 0);
        expectAllWritten(dq0, `dq of batch 0 (${t.name}, poisoned batch 1)`, { shape: qShapeOf(t0), dims: Q_DIMS });
        expectFinite(dq0, `dq of batch 0 (${t.name}, poisoned batch 1)`, qShapeOf(t0));
        expectFinite(dk0, `dk of batch 0 (${t.name}, poisoned batch 1)`, kShapeOf(t0));
        expectFinite(dv0, `dv of batch 0 (${t.name}, poisoned batch 1)`, kShapeOf(t0));
        for (const n of ['dk', 'dv'] as const) {
          const i = firstDifference(batchOf(await bitsOf(gc[n]), perK, 0), batchOf(await bitsOf(gp[n]), perK, 0));
          expect(`${n} of batch 0: first difference at ${i}`).toBe(`${n} of batch 0: first difference at -1`);
        }
        const bounds = dqAccumulatorBounds(t0, { q: batchOf(s.q, perQ, 0), k: batchOf(s.k, perK, 0), v: batchOf(s.v, perK, 0), dout: batchOf(s.dout, perQ, 0) });
        expect(dqRunToRunViolations(batchOf(hc.dq, perQ, 0), dq0, bounds, t.dtype, qShapeOf(t0))).toEqual([]);
      } finally {
        for (const g of grads) disposeGradients(g);
        clean.dispose();
        poisoned?.dispose();
      }
    });
  });

  describe('large-magnitude inputs (q, k × 10: scores ~±100s): finite, and within the rule', () => {
    // The softmax is nearly one-hot, so the float32 floors of the FA2 backward (P recomputed from an lse
    // of ~1e2, dS = P·(dP − D) cancelling where P ≈ 1) are added to the slack, as test/attention.test.ts
    // does for its large-score cases (helpers/backward.ts: gradientSlack).
    test.each([
      c([1, 97, 113, 2, 2, 64], 'float16'),
      c([1, 113, 97, 4, 1, 128], 'bfloat16', true),
      c([1, 65, 70, 2, 2, 256], 'float16', true),
      c([2, 80, 90, 8, 8, 32], 'bfloat16'),
    ])('$name', async (t) => {
      const { run } = await checkCase(t, `flash-bwd/big/${t.name}`, true);
      // checkGradients checked finiteness; the scores really were large.
      expect(maxFiniteAbs(run.lse)).toBeGreaterThan(100);
    });
  });

  describe('determinism', () => {
    test(`${RACE_CASE.name}: ${RACE_RUNS} runs: dk, dv bit-identical; dq within the fp32 accumulator's rounding of run 0 and within the rule`, async () => {
      const t = RACE_CASE;
      const p = DeviceProblem.create(t, randomInputs(t, `flash-bwd/race/${t.name}`), t.dtype);
      try {
        const s = await p.read();
        let first: { dq: Float32Array; dk: Uint16Array | Uint32Array; dv: Uint16Array | Uint32Array } | undefined;
        let refs: References | undefined;
        let bounds: Float64Array | undefined;
        let slack: ReturnType<typeof gradientSlack> | undefined;
        const problems: string[] = [];
        let runsWithOtherDq = 0;
        for (let run = 0; run < RACE_RUNS; run++) {
          const g = p.backward({ kernel: 'flash', algorithm: 'single-kernel' });
          try {
            expect(g.kernel).toBe('flash');
            const dk = await bitsOf(g.dk);
            const dv = await bitsOf(g.dv);
            if (!first) {
              const h: HostGradients = await readGradients(t, t.dtype, 'cuda', g, `${t.name}, run 0`);
              refs = checkGradients(t, { ...s, ...h }, expectRule);
              slack = gradientSlack(t, s, refs.ref, false);
              bounds = dqAccumulatorBounds(t, s);
              first = { dq: h.dq, dk, dv };
              continue;
            }
            const dq = new Float32Array(await g.dq.toFloat32Array());
            for (const [n, a, b] of [['dk', dk, first.dk], ['dv', dv, first.dv]] as const) {
              const i = firstDifference(a, b);
              if (i >= 0) problems.push(`run ${run}: ${n} differs from run 0 first at flat index ${i}`);
            }
            if (firstDifference(dq, first.dq) >= 0) runsWithOtherDq++;
            for (const v of dqRunToRunViolations(dq, first.dq, bounds!, t.dtype, qShapeOf(t), 2)) problems.push(`run ${run}: dq ${v}`);
            const input = gradientRuleInput(t, 'dq', dq, refs!, slack!, `${t.name}, run ${run}`);
            const rep = checkFlashRule(input);
            if (!rep.pass) problems.push(formatFlashReport(input, rep));
          } finally {
            disposeGradients(g);
          }
          if (problems.length >= 8) break;
        }
        if (REPORT) console.log(`${t.name}: dq differed from run 0 in ${runsWithOtherDq} of ${RACE_RUNS - 1} runs`);
        expect(problems).toEqual([]);
      } finally {
        p.dispose();
      }
    });

    test.each([
      c([1, 257, 300, 8, 2, 128], 'bfloat16'),
      c([2, 200, 333, 8, 1, 64], 'float16', true),
    ])('$name: 20 runs: dk, dv bit-identical (GQA sums in the kernel); dq within the fp32 accumulator\'s rounding', async (t) => {
      const p = DeviceProblem.create(t, randomInputs(t, `flash-bwd/determinism/${t.name}`), t.dtype);
      try {
        const s = await p.read();
        const bounds = dqAccumulatorBounds(t, s);
        let first: { dq: Float32Array; dk: Uint16Array | Uint32Array; dv: Uint16Array | Uint32Array } | undefined;
        const problems: string[] = [];
        for (let run = 0; run < 20 && problems.length < 8; run++) {
          const g = p.backward({ kernel: 'flash', algorithm: 'single-kernel' });
          try {
            expect(g.kernel).toBe('flash');
            const cur = { dq: new Float32Array(await g.dq.toFloat32Array()), dk: await bitsOf(g.dk), dv: await bitsOf(g.dv) };
            if (!first) {
              await readGradients(t, t.dtype, 'cuda', g, `${t.name}, run 0`); // every element written
              first = cur;
              continue;
            }
            for (const n of ['dk', 'dv'] as const) {
              const i = firstDifference(cur[n], first[n]);
              if (i >= 0) problems.push(`run ${run}: ${n} differs from run 0 first at flat index ${i}`);
            }
            for (const v of dqRunToRunViolations(cur.dq, first.dq, bounds, t.dtype, qShapeOf(t), 2)) problems.push(`run ${run}: dq ${v}`);
          } finally {
            disposeGradients(g);
          }
        }
        expect(problems).toEqual([]);
      } finally {
        p.dispose();
      }
    });

    // deterministic: true adds dq's terms in a fixed order: 50 runs bit-identical. On Hopper the single
    // kernel is the warp-specialized one at these head dims (96 padded to 128): one fp32 accumulator,
    // the K/V tiles adding to each query tile in turn (causal: descending from its diagonal tile;
    // otherwise in the order their rotated walks reach it; at head dim 64 both consumers' pieces summed
    // in shared memory first). Elsewhere the mma.sync kernel keeps one
    // accumulator slice per block of a KV head, summed in order; one KV head (B * Hkv = 1) gives the
    // most slices (flash_bwd_check's 'sm80-mma-det' path runs them on Hopper too).
    test.each([
      c([1, 1023, 1023, 2, 1, 64], 'float16', true),
      c([1, 1100, 1300, 2, 1, 64], 'bfloat16'),
      c([1, 1025, 777, 2, 1, 128], 'bfloat16'),
      c([2, 150, 300, 4, 2, 96], 'float16', true),
    ])("deterministic: true, kernel 'flash', single-kernel and auto algorithm: 50 runs give bit-identical dq, dk, dv within the rule ($name)", async (t) => {
      const p = DeviceProblem.create(t, randomInputs(t, `flash-bwd/deterministic/${t.name}`), t.dtype);
      try {
        const s = await p.read();
        const atomic = p.backward({ kernel: 'flash', algorithm: 'single-kernel' });
        let atomicDq: HostGradients['dq'];
        let atomicKv: (Uint16Array | Uint32Array)[];
        try {
          atomicDq = (await readGradients(t, t.dtype, 'cuda', atomic, `${t.name}, atomic`)).dq;
          atomicKv = [await bitsOf(atomic.dk), await bitsOf(atomic.dv)];
        } finally {
          disposeGradients(atomic);
        }
        for (const algorithm of ['single-kernel', 'auto'] as const) {
          let first: (Uint16Array | Uint32Array)[] | undefined;
          for (let run = 0; run < 50; run++) {
            const g = p.backward({ kernel: 'flash', deterministic: true, algorithm });
            try {
              expect(g.kernel).toBe('flash');
              const bits = [await bitsOf(g.dq), await bitsOf(g.dk), await bitsOf(g.dv)];
              if (!first) {
                const h = await readGradients(t, t.dtype, 'cuda', g, `${t.name}, deterministic`);
                checkGradients(t, { ...s, ...h }, expectRule);
                if (h.algorithm === 'single-kernel') {
                  // The same sums as the atomic mode, dq's in another order: within the accumulator's
                  // rounding. With a causal mask dk and dv are the same products in the same order, bit
                  // for bit; without one the deterministic walk over the query tiles is rotated where a
                  // KV head's K/V tiles fit on half of the SMs (tile_scheduler.cuh), which sums
                  // them in another order (held to the rule above).
                  expect(dqRunToRunViolations(h.dq, atomicDq, dqAccumulatorBounds(t, s), t.dtype, qShapeOf(t))).toEqual([]);
                  if (t.causal) {
                    const kv = [await bitsOf(g.dk), await bitsOf(g.dv)].map((b, i) => firstDifference(b, atomicKv[i]));
                    expect(`dk, dv vs the atomic single kernel: first differences at ${kv.join(', ')}`).toBe('dk, dv vs the atomic single kernel: first differences at -1, -1');
                  }
                }
                // 'auto' ran the two kernels (Hopper): held to the rule above. (The atomic single kernel at
                // these head dims is the warp-specialized one, whose P rounds otherwise than in the two
                // kernels' dK/dV code: no bit identity between them.)
                first = bits;
                continue;
              }
              const diffs = bits.map((b, i) => firstDifference(b, first![i]));
              expect(`${algorithm} run ${run}: first differences of dq, dk, dv at ${diffs.join(', ')}`).toBe(`${algorithm} run ${run}: first differences of dq, dk, dv at -1, -1, -1`);
            } finally {
              disposeGradients(g);
            }
          }
        }
      } finally {
        p.dispose();
      }
    });
  });

  describe("algorithm 'two-kernel' (Hopper, every head dim): a dK/dV kernel, then a dQ kernel without atomics", () => {
    // At head dims that round to 32, dk and dv come from the same kernel as the single-kernel backward's
    // (without its dQ part): bit-identical to them. At 33-128 the single kernel is the
    // warp-specialized one, whose S^T and dP^T accumulate onto -lse2 / scale and -D (P rounds otherwise
    // than in the main kernel's S^T scale - lse2); 65-96 run both on the d128 kernels. Above 128 the two
    // kernels run the wide dK/dV kernel (136-192 on d192, 200-256 on d256) and the single kernel mma.sync. dq
    // is written directly by the dQ kernel. All within the rule, and bit-identical run to run, with
    // `deterministic` or without.
    const cases = [
      c([2, 97, 203, 4, 2, 64], 'float16', true),
      c([1, 203, 113, 8, 1, 128], 'bfloat16', true), // 90 rows see no key; MQA
      c([2, 1025, 1023, 2, 2, 128], 'bfloat16'),
      c([1, 113, 203, 2, 2, 40], 'float16'), // padded to 64
      c([2, 17, 239, 2, 1, 32], 'bfloat16', true),
      c([1, 70, 90, 4, 4, 96], 'float16', true), // on the d128 kernels
      c([1, 97, 130, 2, 1, 192], 'bfloat16', true), // the wide dK/dV kernel
      c([2, 113, 203, 2, 2, 256], 'float16'),
      c([1, 90, 70, 2, 2, 136], 'bfloat16', true), // padded to 192
    ];
    /** Whether the two kernels' dK/dV kernel is the single kernel's (head dims that round to 32). */
    const sameMainKernel = (d: number): boolean => d <= 32;
    const cc = HAS_CUDA ? backends().cuda.device?.computeCapability ?? 'unknown' : 'none';
    const hopperTest = cc.startsWith('9.') ? test.each(cases) : test.skip.each([cases[0]]);
    if (!cc.startsWith('9.')) {
      test.skip(`skipped: the two-kernel backward runs on Hopper GPUs; this one has compute capability ${cc}`, () => undefined);
    }
    hopperTest('$name', async (t: BackwardCase) => {
      const p = DeviceProblem.create(t, randomInputs(t, `flash-bwd/two-kernel/${t.name}`), t.dtype);
      const grads: AttentionGradients[] = [];
      try {
        const s = await p.read();
        grads.push(p.backward({ kernel: 'flash', algorithm: 'single-kernel' }));
        // The third run also asks for deterministic dq, which the two kernels give anyway: same bits.
        for (let run = 0; run < 3; run++) grads.push(p.backward({ kernel: 'flash', algorithm: 'two-kernel', deterministic: run === 2 }));
        expect(grads.map((g) => g.kernel)).toEqual(['flash', 'flash', 'flash', 'flash']);
        const h = await readGradients(t, t.dtype, 'cuda', grads[1], `${t.name}, two-kernel`);
        checkGradients(t, { ...s, ...h }, expectRule);
        if (t.sq > t.sk && t.causal) expectEmptyRowGradients(t, h.dq, s.lse);
        for (const n of sameMainKernel(t.d) ? (['dk', 'dv'] as const) : []) {
          const at = firstDifference(await bitsOf(grads[1][n]), await bitsOf(grads[0][n]));
          expect(`${n} vs single-kernel: first difference at ${at}`).toBe(`${n} vs single-kernel: first difference at -1`);
        }
        for (let run = 2; run < grads.length; run++) {
          const diffs = [];
          for (const n of ['dq', 'dk', 'dv'] as const) diffs.push(firstDifference(await bitsOf(grads[run][n]), await bitsOf(grads[1][n])));
          expect(`run ${run}: first differences of dq, dk, dv at ${diffs.join(', ')}`).toBe(`run ${run}: first differences of dq, dk, dv at -1, -1, -1`);
        }
      } finally {
        for (const g of grads) disposeGradients(g);
        p.dispose();
      }
    });

    // Off Hopper the two kernels do not exist: asked for, they are refused with the reason. On Hopper every
    // fp16 / bf16 head dim has them (float32's refusal: test/kernel-choice.test.ts).
    const refusedTest = HAS_CUDA && !cc.startsWith('9.') ? test : test.skip;
    refusedTest("where it does not exist (off Hopper) 'two-kernel' is refused with the reason", () => {
      const t = c([1, 40, 40, 2, 2, 136], 'bfloat16', true);
      const p = DeviceProblem.create(t, randomInputs(t, 'flash-bwd/two-kernel/refused'), t.dtype);
      try {
        const before = liveMemory();
        expect(thrownBy(() => p.backward({ kernel: 'flash', algorithm: 'two-kernel' }))).toEqual({
          name: 'RangeError',
          message: "Expected kernel to be 'auto' or 'naive' for this call but received 'flash': the two-kernel backward exists "
            + 'for Hopper GPUs (compute capability 9.0, sm_90a builds)',
        });
        expect(thrownBy(() => p.backward({ algorithm: 'two-kernel' }))).toEqual({
          name: 'RangeError',
          message: "Expected algorithm to be 'auto' or 'single-kernel' for this call but received 'two-kernel': the two-kernel "
            + 'backward exists for Hopper GPUs (compute capability 9.0, sm_90a builds)',
        });
        expect(liveMemory()).toEqual(before);
      } finally {
        p.dispose();
      }
    });
    if (cc.startsWith('9.')) {
      test.skip('skipped: on Hopper every float16 / bfloat16 head dim has the two-kernel backward (nothing to refuse)', () => undefined);
    }
  });

  describe("the result's kernel field: 'flash' for kernel 'flash', and for 'auto' (explicit or default) on fp16/bf16", () => {
    // 'auto' must run the same kernel: dk and dv bit-identical to kernel 'flash', dq within the
    // rounding of its fp32 accumulator, and within the rule.
    test.each([
      c([2, 77, 90, 4, 2, 64], 'float16', true),
      c([1, 77, 90, 4, 4, 200], 'float16'),
      c([1, 90, 77, 4, 1, 128], 'bfloat16', true),
      c([2, 77, 90, 2, 2, 40], 'bfloat16'),
    ])('$name', async (t) => {
      const p = DeviceProblem.create(t, randomInputs(t, `flash-bwd/kernel/${t.name}`), t.dtype);
      const grads: AttentionGradients[] = [];
      try {
        const options: AttentionBackwardOptions[] = [{ kernel: 'flash' }, { kernel: 'auto' }, {}];
        for (const o of options) grads.push(p.backward(o));
        expect(grads.map((g) => g.kernel)).toEqual(['flash', 'flash', 'flash']);
        const s = await p.read();
        const bounds = dqAccumulatorBounds(t, s);
        const flash = await readGradients(t, t.dtype, 'cuda', grads[0], `${t.name}, 'flash'`);
        for (let i = 1; i < grads.length; i++) {
          const what = `${t.name}, ${i === 1 ? "'auto'" : 'default kernel'}`;
          const h = await readGradients(t, t.dtype, 'cuda', grads[i], what);
          for (const n of ['dk', 'dv'] as const) {
            const at = firstDifference(await bitsOf(grads[i][n]), await bitsOf(grads[0][n]));
            expect(`${n} (${what}) vs 'flash': first difference at ${at}`).toBe(`${n} (${what}) vs 'flash': first difference at -1`);
          }
          expect(dqRunToRunViolations(h.dq, flash.dq, bounds, t.dtype, qShapeOf(t))).toEqual([]);
          checkGradients(t, { ...s, ...h }, expectRule);
        }
      } finally {
        for (const g of grads) disposeGradients(g);
        p.dispose();
      }
    });
  });

  describe('deterministic through a training context', () => {
    test.each(['float16', 'bfloat16'] as HalfDType[])(
      "%s: ctx.backward(dout, { deterministic: true }) after a 'flash' forward runs the FA2 backward, twice alike", async (dtype) => {
        const t = c([1, 40, 40, 2, 2, 64], dtype, true);
        const p = DeviceProblem.create(t, randomInputs(t, `flash-bwd/context/${dtype}`), dtype);
        const owned: Tensor[] = [];
        try {
          const bits: (Uint16Array | Uint32Array)[][] = [];
          for (let run = 0; run < 2; run++) {
            const ctx = flashAttentionWithGrad(p.q, p.k, p.v, { causal: true, kernel: 'flash' });
            owned.push(ctx.out, ctx.lse);
            const g = ctx.backward(p.dout, { deterministic: true });
            try {
              expect(g.kernel).toBe('flash');
              bits.push([await bitsOf(g.dq), await bitsOf(g.dk), await bitsOf(g.dv)]);
            } finally {
              disposeGradients(g);
            }
          }
          expect(bits[1].map((b, i) => firstDifference(b, bits[0][i]))).toEqual([-1, -1, -1]);
        } finally {
          for (const y of owned) y.dispose();
          p.dispose();
        }
      });
  });

  describe("finite differences of forward + backward, float32, kernel 'auto'", () => {
    // L = Σ out·w; the analytic gradient is the backward's with dout = w. float32Precision 'highest':
    // with TF32 (the default) the forward rounds q, k, v to a 10-bit mantissa, so x ± h would not be
    // the perturbation applied and L would carry ~5e-4 relative noise.
    test.each(FD_CASES.map((t) => ({ name: fdName(t), t })))('$name', async ({ name, t }) => {
      const entries = await finiteDifferences(t, 'cuda', { kernel: 'auto', float32Precision: 'highest' }, `flash-bwd/fd/${name}`, FD_PER_TENSOR);
      expect(fdMismatches(entries)).toEqual([]);
      expect(rmsAnalytic(entries)).toBeGreaterThan(0.05);
    });
  });
});
