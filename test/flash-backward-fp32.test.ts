/**
 * The CUDA FlashAttention-2 backward for float32 inputs (csrc/cuda/flash/flash_bwd_fp32*: one kernel on
 * TF32 tensor cores, dq accumulated with fp32 atomic adds; reached with `kernel: 'flash'`) in both of its
 * precisions, against the float64 reference with the flash-attention rule of helpers/tolerance.ts, for
 * dq, dk and dv:
 *
 *     max|flash − f64 reference| ≤ 3 · max|same-precision reference − f64 reference| + atol
 *
 * The same-precision reference (lib/reference.ts) is the one of the arithmetic the kernel does, as in
 * test/flash-forward-fp32.test.ts:
 * - `float32Precision: 'tf32'` (the default): `precision: 'tf32'`: the operands of the five products
 *   (q, k, v, dout, P and dS) rounded to TF32 as cvt.rna does, softmax, D, dS and every accumulation
 *   in float32. It rounds exactly what the kernel rounds (flash_bwd_fp32.h), and one thing more: it
 *   computes D = rowsum(dout∘out) from the TF32-rounded dout, where the kernel's preprocess uses the
 *   float32 dout (see `backwardFloors`);
 * - `float32Precision: 'highest'` (3xTF32): `precision: 'float32'`, i.e. full float32 accuracy.
 * As in training, out and lse come from the CUDA float32 FA2 forward in the same precision and are fed
 * to the backward; both references get the values stored on the device (read back) and recompute out
 * and lse themselves. atol is GRAD_ATOL (1e-5) plus, per gradient, floors that the same-precision
 * reference cannot show, each computed from the stored values (`ruleAtol`, `backwardFloors`): what a
 * same-precision implementation fed the kernel's inputs (the forward's out and lse, D from the float32
 * dout) would move by, times the rule's factor 3; FA2's recomputation of P from the float32 lse; and
 * helpers/backward.ts's float32 cancellation floor of dS on rows that see one key. In 'tf32' the 3× term
 * dominates all of them except on rows that see a single key (where the reference's dS is exactly 0);
 * in 'highest' they are the bound in practice (a float32 implementation's error is ~1e-7 relative).
 *
 * Inputs are fresh seeded random floats, never zeros (replay with the printed FA_TEST_SEED). Every
 * output starts as NaN (debug.poisonOutputs), so an element the kernel did not write has error
 * +Infinity and readGradients (expectAllWritten) names it.
 *
 * Coverage, designed instead of a cross product (each table says what it adds), every case in both
 * precisions:
 * - HEAD_DIM_CASES: the specialised head dims 32, 64, 96, 128, 192, 256 (csrc/cuda/flash/head_dims.h,
 *   one configuration each in flash_bwd_fp32.cu) and the zero-padded 8, 40, 200, on mid-size shapes
 *   (97-203 rows, seqlenQ ≠ seqlenK both ways, GQA 8:1 and 4:2, batch 2, causal or not, softmaxScale ≠
 *   1/√d). Full reference.
 * - SEQLEN_CASES: the seqlens 1, 17, 97 and (seqlenQ, seqlenK) = (113, 203), (203, 113), (1, 239),
 *   (239, 1), (3, 799), (799, 3), on d64 and d128; causal with seqlenQ > seqlenK leaves rows that see
 *   no key, and seqlenK 1 rows that see exactly one. Full reference.
 * - LONG_CASES: 1023 causal and 1025 with one head, so that the full float64 reference stays
 *   affordable (every dq row receives the atomic adds of 16-32 K/V tiles), and 1025 causal GQA 4:1, a
 *   long dK / dV accumulation (4100 query rows per key) that 'highest' must keep at float32 accuracy.
 * - Masking hazards, checked exactly: rows that see no key have dq exactly 0 (every case) and
 *   contribute nothing (dk, dv bit-identical when their q and dout change); the memory after a sequence
 *   is never used (batch 0's dk, dv bit-identical and dq finite when batch 1 holds NaN and ±Infinity).
 * - The option reaches the kernel ('highest' ≥ 10× closer to float64 than 'tf32' in dq, dk and dv; the
 *   default is 'tf32': dk, dv bit-identical), determinism (dk, dv bit-identical over 20 runs, dq within
 *   the rounding of its fp32 accumulator), and `deterministic: true` (20 runs bit-identical, within the
 *   rule, and within the accumulator's rounding of the atomic mode).
 *
 * CUDA only: without a usable GPU the suite is skipped and the reason printed. Run time on a GPU machine
 * is dominated by the JS references (float64, same-precision and the floors, one Jest worker): measured
 * on a 2-core development VM, ~21 s for the three case tables in both precisions and ~30 s for the file.
 * FA_TEST_REPORT=1 prints every case's errors next to its bound and the parts of its atol.
 */

import {
  AttentionBackwardOptions, AttentionGradients, AttentionOptions, Float32Precision, referenceAttentionBackward,
  ReferenceBackwardResult, ReferencePrecision, roundToTf32,
} from '../lib';
import { describeCuda, trackMemory, usePoisonedOutputs } from './helpers/backend';
import {
  BackwardInputs, batchOf, DeviceProblem, disposeGradients, dqAccumulatorBounds, dqRunToRunViolations, emptyRows,
  expectEmptyRowGradients, expectFinite, firstDifference, GRAD_ATOL, gradientSlack, GradSlack, HostGradients,
  poisonBatch1, randomInputs, readGradients, References, StoredProblem, visibleKeys,
} from './helpers/backward';
import {
  caseName, Dims, ForwardShape, kShapeOf, maxFiniteAbs, optionsOf, Q_DIMS, qShapeOf, ruleChecker, scaleOf, shapeOf, U32,
} from './helpers/forward';
import { randn, rngFor } from './helpers/random';
import { expectAllWritten, FlashRuleInput, maxAbsDiff } from './helpers/tolerance';

trackMemory();
usePoisonedOutputs();

const expectRule = ruleChecker();

// Module-level aliases: a global lookup per call (`Math.x`) is slow inside Jest's vm context.
const { abs, exp, expm1, floor } = Math;

/** The same-precision reference of each kernel precision. */
const SAME_PRECISION: Record<Float32Precision, ReferencePrecision> = { tf32: 'tf32', highest: 'float32' };
const PRECISIONS: Float32Precision[] = ['tf32', 'highest'];

/** The flash-attention rule's factor for gradients. */
const GRAD_FACTOR = 3;

// ------------------------------------------------------------------------------------------------
// Cases
// ------------------------------------------------------------------------------------------------

/** One problem: sizes, mask and scale, with a name that says all of them (the precision is the describe's). */
interface Case extends ForwardShape {
  name: string;
}

/** A case named from its fields, e.g. "203x113 causal (90 empty rows), d64, B2, GQA 8:1 (Hq 8)". */
function c(dims: Dims, causal = false, scale?: number): Case {
  const [b, sq, sk, hq, hkv, d] = dims;
  return { name: caseName(dims, causal, scale), b, sq, sk, hq, hkv, d, causal, scale };
}

// [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim]. The kernel tiles 16 or 32 query rows per step and
// 64 or 32 keys per K/V tile (by head dim; flash_bwd_fp32.cu); none of the seqlens below is a multiple of
// 16, so every K/V tile and query tile has a tail. The shapes rotate through Sq < Sk, Sq > Sk (causal:
// empty rows), Sq = Sk, GQA 8:1 and 4:2 (two query heads per KV head: dk, dv summed in the kernel), 8:8,
// batch 2; the sizes keep each case's references below ~1e7 multiply-adds · d.
const HEAD_DIM_CASES: Case[] = [
  c([1, 113, 203, 2, 2, 8]), // padded to 32
  c([2, 203, 113, 8, 1, 8], true),
  c([1, 97, 97, 8, 8, 32], true),
  c([1, 113, 203, 4, 2, 32], false, 0.5),
  c([2, 203, 113, 4, 2, 40], true), // padded to 64
  c([1, 113, 113, 8, 1, 40]),
  c([1, 113, 203, 8, 1, 64], true),
  c([1, 97, 97, 4, 2, 64]),
  c([2, 113, 203, 2, 2, 96], false, 0.5),
  c([1, 97, 97, 8, 1, 96], true, 0.03),
  c([1, 203, 113, 8, 8, 128], true),
  c([1, 113, 203, 2, 2, 128]),
  c([1, 113, 113, 2, 2, 192], true),
  c([1, 203, 113, 8, 1, 192], true),
  c([1, 113, 203, 2, 2, 200]), // padded to 256
  c([1, 97, 97, 4, 2, 200], true, 0.03),
  c([2, 97, 97, 2, 2, 256], true),
  c([1, 113, 203, 2, 1, 256]),
];

// Every awkward seqlen on d64 and d128, mask and heads alternating. Seqlen 1, the causal row
// seqlenQ − seqlenK and every row of seqlenK 1 see a single key: there P = 1 and dS is exactly 0 in
// both references, so only the floors of `ruleAtol` bound dq and those rows' share of dk.
const SEQLEN_CASES: Case[] = [
  c([2, 1, 1, 2, 2, 64]),
  c([1, 1, 1, 8, 1, 128], true),
  c([3, 17, 17, 2, 2, 64], true),
  c([1, 17, 17, 8, 8, 128]),
  c([1, 97, 97, 8, 1, 64], true),
  c([2, 97, 97, 2, 2, 128]),
  c([2, 113, 203, 2, 2, 64], true),
  c([1, 113, 203, 4, 2, 128], true),
  c([1, 203, 113, 8, 8, 64], true),
  c([1, 203, 113, 2, 2, 128]),
  c([1, 1, 239, 8, 8, 64]),
  c([2, 1, 239, 2, 2, 128], true),
  c([1, 239, 1, 8, 1, 64], true), // 238 rows see no key
  c([1, 239, 1, 2, 2, 128]), // every row sees the one key
  c([1, 3, 799, 8, 1, 64], true),
  c([2, 3, 799, 2, 2, 128]),
  c([1, 799, 3, 8, 1, 64], true), // 796 rows see no key
  c([2, 799, 3, 2, 2, 128]),
];

// Long sequences, full reference: one head keeps each to ~1 s of JS per precision.
const LONG_CASES: Case[] = [
  c([1, 1023, 1023, 1, 1, 64], true),
  c([1, 1025, 1025, 1, 1, 32]),
  // dK / dV summed over 4 x 1025 query rows, early rows (few keys, P ~ 1) first: the tensor cores'
  // truncating fp32 accumulation, left to run over the whole sum, missed 'highest' by 1.7e-4 on dv here
  // (scripts/flash-bwd-fp32-check.sh); the kernel now adds each query tile's part with a rounding add.
  c([1, 1025, 1025, 4, 1, 64], true),
];

// ------------------------------------------------------------------------------------------------
// Running the kernel
// ------------------------------------------------------------------------------------------------

/** The float32 FA2 forward's options for `t` in `precision`: it gives the backward its out and lse. */
function forwardOptions(t: ForwardShape, precision: Float32Precision): AttentionOptions {
  return { ...optionsOf(t), kernel: 'flash', float32Precision: precision };
}

/** q, k, v, dout of `x` as float32 on CUDA, with out and lse from the float32 FA2 forward in `precision`. */
function makeProblem(t: ForwardShape, x: BackwardInputs, precision: Float32Precision): DeviceProblem {
  return DeviceProblem.create(t, x, 'float32', 'cuda', forwardOptions(t, precision));
}

/** The backward's options: kernel 'flash', `precision` (undefined: the option left out), and `extra`. */
function backwardOptions(precision: Float32Precision | undefined, extra: AttentionBackwardOptions = {}): AttentionBackwardOptions {
  return { kernel: 'flash', ...(precision === undefined ? {} : { float32Precision: precision }), ...extra };
}

/**
 * Runs the float32 FA2 backward on `p`, expects it to report kernel 'flash' and algorithm
 * 'single-kernel', checks the gradients' shapes and that every element was written, and returns them
 * read back. Disposes the gradients.
 */
async function runFlash(
  p: DeviceProblem, t: Case, precision: Float32Precision | undefined, what: string, extra: AttentionBackwardOptions = {},
): Promise<HostGradients> {
  const g = p.backward(backwardOptions(precision, extra));
  try {
    expect([g.kernel, g.algorithm]).toEqual(['flash', 'single-kernel']);
    return await readGradients(t, 'float32', 'cuda', g, what);
  } finally {
    disposeGradients(g);
  }
}

/** The float32 bit patterns of a host array (a view; ±0 and every finite value keep their bits). */
function bitsOfHost(a: Float32Array): Uint32Array {
  return new Uint32Array(a.buffer, a.byteOffset, a.length);
}

// ------------------------------------------------------------------------------------------------
// The rule's atol
// ------------------------------------------------------------------------------------------------

/**
 * Floors of the float32 FA2 backward that the same-precision reference cannot show, per gradient, from
 * the stored values `s` (the kernel's inputs, out and lse read back) and the same-precision result.
 *
 * `fed`: max |Δ| of the first-order change of a same-precision implementation's dq, dk, dv when it is
 * given what the kernel gets instead of what it computes itself. The reference recomputes out and lse
 * and forms D from its own out (and, in 'tf32', from the TF32-rounded dout: lib/reference.ts step 6);
 * the kernel takes out and lse from the FA2 forward, as in training, and its preprocess computes D in
 * float32 from the unrounded dout (flash_bwd_aux.cuh, flash_bwd_dot_do_o_kernel). Per query row i, with
 * float64 P, dP and dS = P∘(dP − D) from the stored q, k, v, dout:
 *   ε_i = Σ_c dout·out_kernel − Σ_c rd(dout)·out_same (rd = TF32 rounding in 'tf32', identity in
 *         'highest'): the kernel's D minus the reference's; it shifts dS_ij by −P_ij·ε_i;
 *   ρ_i = exp(lse_same − lse_kernel) − 1: the kernel's P_ij = P_ij·(1 + ρ_i) for the whole row;
 *   Δ(dS_ij) = ρ_i·dS_ij − P_ij·ε_i, Δ(P_ij) = ρ_i·P_ij, carried into dq = scale·ΔdS·K, dk = scale·ΔdSᵀ·Q,
 *   dv = ΔPᵀ·dout.
 * This matters most on a row that sees a single key: there out = v (rounded to TF32 in 'tf32'), both
 * references get dS = dP − D exactly 0, and the kernel gets −ε_i = Σ_c (rd(dout) − dout)·out, a TF32
 * rounding of dout (~2^-11 relative) that its float32 D does not share; without it the rule would allow
 * such rows ~1e-5 where the kernel is ~1e-3 away. Elsewhere it is of the order of the same-precision
 * error in 'tf32', and of the forward's 3xTF32 error in 'highest' (measured there at ~1.5× a float32
 * implementation's: lib/attention.ts; test/attention.test.ts saw a 3xTF32 forward's out and lse push a
 * float32 backward's dq to 3.0× the same-precision error at softmaxScale 1.5).
 *
 * `recompute`: FA2 recomputes P = exp2(S·scale·log2e − lse·log2e) from the float32 lse, a round trip
 * that is off by a few float32 ulps of |lse| (test/attention.test.ts, ATOL; helpers/backward.ts,
 * gradientSlack): every P of a row by at most δP = 4·u·(max|lse| + 1) relative (the + 1: ex2.approx's
 * own 2^-22), where a plain implementation normalises P directly. Its effect is bounded per element by
 * δP times the sums of |terms|: scale·Σ_j |dS_ij|·|k_j| (dq), scale·Σ_i |dS_ij|·|q_i| (dk), Σ_i P_ij·|dout_i|
 * (dv). ~1e-6 relative at |lse| ≲ 10: it matters for the larger scores of softmaxScale 0.5 in 'highest'.
 *
 * Costs ~8·Σ n·d multiply-adds (n: the keys a row sees), about one float64 reference.
 */
function backwardFloors(
  t: Case, precision: Float32Precision, s: StoredProblem, same: ReferenceBackwardResult,
): { fed: GradSlack; recompute: GradSlack } {
  const { d, sq, sk, hq, hkv } = t;
  const scale = scaleOf(t);
  const group = hq / hkv;
  const rd = precision === 'tf32' ? roundToTf32 : (x: number): number => x;
  const fed = { dq: new Float64Array(s.q.length), dk: new Float64Array(s.k.length), dv: new Float64Array(s.v.length) };
  const mag = { dq: new Float64Array(s.q.length), dk: new Float64Array(s.k.length), dv: new Float64Array(s.v.length) };
  const p = new Float64Array(sk);
  const dp = new Float64Array(sk);
  for (let b = 0; b < t.b; b++) {
    for (let h = 0; h < hq; h++) {
      const kh = floor(h / group);
      for (let i = 0; i < sq; i++) {
        const n = visibleKeys(t, i);
        if (n === 0) continue; // lse +Infinity in both: P = 0, nothing moves
        const qo = ((b * sq + i) * hq + h) * d;
        const li = (b * hq + h) * sq + i;
        let eps = 0;
        for (let c = 0; c < d; c++) {
          const g = s.dout[qo + c];
          eps += g * s.out[qo + c] - rd(g) * same.out[qo + c];
        }
        const rho = expm1(same.lse[li] - s.lse[li]);
        // float64 softmax of the row, dP and D = Σ_j P_j dP_j (= dout·out exactly).
        let m = -Infinity;
        for (let j = 0; j < n; j++) {
          const ko = ((b * sk + j) * hkv + kh) * d;
          let a = 0;
          for (let c = 0; c < d; c++) a += s.q[qo + c] * s.k[ko + c];
          p[j] = a * scale;
          if (p[j] > m) m = p[j];
        }
        let l = 0;
        for (let j = 0; j < n; j++) l += (p[j] = exp(p[j] - m));
        let D = 0;
        for (let j = 0; j < n; j++) {
          p[j] /= l;
          const vo = ((b * sk + j) * hkv + kh) * d;
          let a = 0;
          for (let c = 0; c < d; c++) a += s.dout[qo + c] * s.v[vo + c];
          dp[j] = a;
          D += p[j] * a;
        }
        for (let j = 0; j < n; j++) {
          const ko = ((b * sk + j) * hkv + kh) * d;
          const ds = p[j] * (dp[j] - D);
          const dds = rho * ds - p[j] * eps; // Δ(dS_ij)
          const dpj = rho * p[j]; // Δ(P_ij)
          const ads = abs(ds);
          for (let c = 0; c < d; c++) {
            const kc = s.k[ko + c];
            const qc = s.q[qo + c];
            const gc = s.dout[qo + c];
            fed.dq[qo + c] += dds * kc;
            fed.dk[ko + c] += dds * qc;
            fed.dv[ko + c] += dpj * gc;
            mag.dq[qo + c] += ads * abs(kc);
            mag.dk[ko + c] += ads * abs(qc);
            mag.dv[ko + c] += p[j] * abs(gc);
          }
        }
      }
    }
  }
  const dP = 4 * U32 * (maxFiniteAbs(same.lse) + 1);
  return {
    fed: { dq: scale * maxFiniteAbs(fed.dq), dk: scale * maxFiniteAbs(fed.dk), dv: maxFiniteAbs(fed.dv) },
    recompute: { dq: dP * scale * maxFiniteAbs(mag.dq), dk: dP * scale * maxFiniteAbs(mag.dk), dv: dP * maxFiniteAbs(mag.dv) },
  };
}

/** atol of the rule per gradient, and its parts (for the rule's messages). */
interface RuleAtol {
  atol: GradSlack;
  parts: Record<'dq' | 'dk' | 'dv', string>;
}

/**
 * The rule's atol for each gradient:
 *
 *     GRAD_ATOL + oneKey + 3·fed + recompute
 *
 * - GRAD_ATOL (1e-5, helpers/backward.ts): test/attention.test.ts's value for float32, "not less,
 *   because of the FlashAttention-2 backward itself" (P recomputed from the stored lse; a few 1e-6 at
 *   |lse| ≲ 10, e.g. dv at seqlenK 1 where a plain implementation gets P = 1 exactly). It is a few
 *   float32 ulps of the O(1) gradients, and far below what a masking, scaling or tiling error moves a
 *   gradient by (a key's share, ≳ 1e-3 even over a thousand keys).
 * - oneKey: helpers/backward.ts's gradientSlack (not largeMagnitude): on rows that see exactly one key,
 *   the float32 rounding of dP − D (two d-term float32 dot products summed in different orders), zero
 *   without such rows.
 * - fed, recompute: see {@link backwardFloors}. fed is multiplied by the rule's factor: the rule is
 *   then applied to the same-precision implementation fed the kernel's inputs, whose error is at most
 *   |same − ref| + |Δ|.
 *
 * In 'tf32' the 3× term (TF32's 2^-11 relative rounding of every operand, ≳ 1e-4 on every case with
 * rows of two keys or more) dominates everything but the one-key rows; in 'highest' (3× term ~1e-7
 * relative) the atol is the bound: ~1e-5 to a few 1e-5 on these O(1) inputs.
 */
function ruleAtol(t: Case, precision: Float32Precision, s: StoredProblem, refs: References): RuleAtol {
  const oneKey = gradientSlack(t, s, refs.ref, false);
  const { fed, recompute } = backwardFloors(t, precision, s, refs.same);
  const atol = {} as GradSlack;
  const parts = {} as Record<'dq' | 'dk' | 'dv', string>;
  for (const n of ['dq', 'dk', 'dv'] as const) {
    atol[n] = GRAD_ATOL + oneKey[n] + GRAD_FACTOR * fed[n] + recompute[n];
    parts[n] = `atol = ${GRAD_ATOL} + one-key ${oneKey[n].toExponential(2)} + 3·fed ${fed[n].toExponential(2)}`
      + ` + recompute ${recompute[n].toExponential(2)}`;
  }
  return { atol, parts };
}

/** Both references of `t` from the stored values: float64, and the same-precision one of `precision`. */
function referencesOf32(t: Case, precision: Float32Precision, s: StoredProblem): References {
  const shape = shapeOf(t);
  return {
    ref: referenceAttentionBackward(s.dout, s.q, s.k, s.v, shape, optionsOf(t)),
    same: referenceAttentionBackward(s.dout, s.q, s.k, s.v, shape, { ...optionsOf(t), precision: SAME_PRECISION[precision] }),
  };
}

/**
 * The rule on dq, dk and dv of `h` (factor 3, {@link ruleAtol}), then the rows that see no key (dq
 * exactly 0, lse +Infinity) and finiteness. Returns the references for further checks.
 */
function checkGradients32(
  t: Case, precision: Float32Precision, s: StoredProblem, h: HostGradients, what = `${t.name}, ${precision}`,
): References {
  const refs = referencesOf32(t, precision, s);
  const { atol, parts } = ruleAtol(t, precision, s, refs);
  for (const n of ['dq', 'dk', 'dv'] as const) {
    const input: FlashRuleInput = {
      actual: h[n], reference: refs.ref[n], samePrecision: refs.same[n], factor: GRAD_FACTOR, atol: atol[n],
      name: `${n} (${what}; ${parts[n]})`, shape: n === 'dq' ? qShapeOf(t) : kShapeOf(t), dims: Q_DIMS,
    };
    expectRule(input);
  }
  expectEmptyRowGradients(t, h.dq, s.lse);
  for (const n of ['dq', 'dk', 'dv'] as const) expectFinite(h[n], `${n} (${what})`, n === 'dq' ? qShapeOf(t) : kShapeOf(t));
  return refs;
}

/** Makes `t`'s problem in `precision` (forward and backward), runs the backward and applies the rule. */
async function checkCase(t: Case, precision: Float32Precision, label: string): Promise<void> {
  const p = makeProblem(t, randomInputs(t, label), precision);
  try {
    const h = await runFlash(p, t, precision, `${t.name}, ${precision}`);
    checkGradients32(t, precision, await p.read(), h);
  } finally {
    p.dispose();
  }
}

/** `first difference at -1` for bit-identical arrays, else the first differing index and values. */
function differenceMessage(what: string, a: Float32Array, b: Float32Array): string {
  const i = firstDifference(bitsOfHost(a), bitsOfHost(b));
  return `${what}: first difference at ${i}${i >= 0 ? ` (${a[i]} vs ${b[i]})` : ''}`;
}

// ------------------------------------------------------------------------------------------------
// The suite
// ------------------------------------------------------------------------------------------------

describeCuda('float32 FlashAttention-2 backward (TF32 tensor cores)', () => {
  describe.each(PRECISIONS)("float32Precision '%s'", (precision) => {
    describe('every head dim: dq, dk, dv within the rule of the float64 reference', () => {
      test.each(HEAD_DIM_CASES)('$name', async (t) => {
        await checkCase(t, precision, `flash-bwd-fp32/${precision}/headdim/${t.name}`);
      });
    });

    describe('awkward seqlens, d64 and d128: dq, dk, dv within the rule of the float64 reference', () => {
      test.each(SEQLEN_CASES)('$name', async (t) => {
        await checkCase(t, precision, `flash-bwd-fp32/${precision}/seqlen/${t.name}`);
      });
    });

    describe('long sequences: dq, dk, dv within the rule of the float64 reference', () => {
      test.each(LONG_CASES)('$name', async (t) => {
        await checkCase(t, precision, `flash-bwd-fp32/${precision}/long/${t.name}`);
      });
    });

    describe('rows that see no key (causal, seqlenQ > seqlenK): dq exactly 0, and they contribute nothing', () => {
      // Every causal case above with seqlenQ > seqlenK checks dq = 0 on those rows. Here their
      // contribution is checked exactly: replacing the q and dout of the empty rows by other values
      // must leave dk and dv bit-identical (their P is exactly 0, from lse = +Infinity, and so is their
      // dS), and dq of the other rows within the rounding of its fp32 accumulator. The forward of both
      // variants is the same to the bit (rows are independent; the empty ones get out 0 and lse
      // +Infinity), which is checked first.
      test.each([
        c([2, 150, 7, 8, 2, 128], true),
        c([1, 300, 129, 4, 1, 96], true),
      ])('$name', async (t) => {
        const label = `flash-bwd-fp32/${precision}/empty/${t.name}`;
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
        const A = makeProblem(t, x, precision);
        let B: DeviceProblem | undefined;
        try {
          B = makeProblem(t, y, precision);
          const [sa, sb] = [await A.read(), await B.read()];
          for (const n of ['out', 'lse'] as const) {
            expect(differenceMessage(n, sa[n], sb[n])).toBe(`${n}: first difference at -1`);
          }
          const ha = await runFlash(A, t, precision, `${t.name}, ${precision}, variant A`);
          const hb = await runFlash(B, t, precision, `${t.name}, ${precision}, variant B`);
          expectEmptyRowGradients(t, ha.dq, sa.lse);
          expectEmptyRowGradients(t, hb.dq, sb.lse);
          for (const n of ['dk', 'dv'] as const) {
            expect(differenceMessage(n, ha[n], hb[n])).toBe(`${n}: first difference at -1`);
          }
          // Rows past the empty ones have the same inputs in both variants.
          const bounds = dqAccumulatorBounds(t, sa);
          expect(dqRunToRunViolations(ha.dq, hb.dq, bounds, 'float32', qShapeOf(t))).toEqual([]);
          checkGradients32(t, precision, sa, ha);
        } finally {
          A.dispose();
          B?.dispose();
        }
      });
    });

    describe('memory after a sequence is never used (padded query rows, keys beyond seqlen_k, padded head dims)', () => {
      // Batch 0 of a batch of 2, run twice: once as is, once with every input of batch 1 (q, k, v, dout,
      // out, lse: the memory right after batch 0's rows in every tensor) replaced by NaN, +Infinity and
      // −Infinity. A kernel that reads rows past seqlenQ or seqlenK (or columns past headDim) without
      // zero-filling them, or that masks by multiplying by 0 (Inf·0 = NaN), changes batch 0's gradients
      // or makes them NaN. Batch 0's dk and dv must be bit-identical across the two runs, its dq within
      // the rounding of the fp32 accumulator and finite, and the clean run within the rule. The shapes:
      // 97 query rows (a partial query step), 70 keys (a partial K/V tile), head dim 96, causal with 27
      // empty rows, GQA 4:1; and 17 rows against 239 keys at head dim 200 (zero-padded to 256).
      test.each([
        c([2, 97, 70, 4, 1, 96], true),
        c([2, 17, 239, 2, 2, 200]),
      ])('$name', async (t) => {
        const clean = makeProblem(t, randomInputs(t, `flash-bwd-fp32/${precision}/neighbour/${t.name}`), precision);
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
          poisoned = DeviceProblem.fromStored(t, bad, 'float32');
          const hc = await runFlash(clean, t, precision, `${t.name}, ${precision}, clean`);
          checkGradients32(t, precision, s, hc);

          // Batch 0 of the poisoned run (batch 1 of it is NaN by construction and not checked).
          const gp = poisoned.backward(backwardOptions(precision));
          grads.push(gp);
          expect([gp.kernel, gp.algorithm]).toEqual(['flash', 'single-kernel']);
          const t0 = { ...t, b: 1 };
          const dq0 = batchOf(new Float32Array(await gp.dq.toFloat32Array()), perQ, 0);
          const dk0 = batchOf(new Float32Array(await gp.dk.toFloat32Array()), perK, 0);
          const dv0 = batchOf(new Float32Array(await gp.dv.toFloat32Array()), perK, 0);
          const what = `of batch 0 (${t.name}, ${precision}, poisoned batch 1)`;
          expectAllWritten(dq0, `dq ${what}`, { shape: qShapeOf(t0), dims: Q_DIMS });
          expectFinite(dq0, `dq ${what}`, qShapeOf(t0));
          expectFinite(dk0, `dk ${what}`, kShapeOf(t0));
          expectFinite(dv0, `dv ${what}`, kShapeOf(t0));
          expect(differenceMessage('dk of batch 0', batchOf(hc.dk, perK, 0), dk0)).toBe('dk of batch 0: first difference at -1');
          expect(differenceMessage('dv of batch 0', batchOf(hc.dv, perK, 0), dv0)).toBe('dv of batch 0: first difference at -1');
          const bounds = dqAccumulatorBounds(t0, {
            q: batchOf(s.q, perQ, 0), k: batchOf(s.k, perK, 0), v: batchOf(s.v, perK, 0), dout: batchOf(s.dout, perQ, 0),
          });
          expect(dqRunToRunViolations(batchOf(hc.dq, perQ, 0), dq0, bounds, 'float32', qShapeOf(t0))).toEqual([]);
        } finally {
          for (const g of grads) disposeGradients(g);
          clean.dispose();
          poisoned?.dispose();
        }
      });
    });

    describe('determinism', () => {
      // dq is accumulated with fp32 atomic adds of per-K/V-tile partial sums (the same bits in every run:
      // each comes from one thread block's fixed sequence of mma), so two runs may differ by the
      // reordering of those adds: helpers/backward.ts's dqAccumulatorBounds applies to float32 as it is
      // (at most one add per K/V tile of ≥ 16 keys per dq element, then one rounding of the scaling, whose
      // float32 ulp dqRunToRunViolations adds). dk and dv are reduced in registers in a fixed order.
      test.each([
        c([2, 200, 333, 8, 2, 64], true),
        c([1, 257, 300, 8, 2, 128]),
      ])("$name: 20 runs: dk, dv bit-identical (GQA sums in the kernel); dq within the fp32 accumulator's rounding", async (t) => {
        const p = makeProblem(t, randomInputs(t, `flash-bwd-fp32/${precision}/determinism/${t.name}`), precision);
        try {
          const bounds = dqAccumulatorBounds(t, await p.read());
          let first: HostGradients | undefined;
          const problems: string[] = [];
          for (let run = 0; run < 20 && problems.length < 8; run++) {
            const h = await runFlash(p, t, precision, `${t.name}, ${precision}, run ${run}`);
            if (!first) {
              first = h;
              continue;
            }
            for (const n of ['dk', 'dv'] as const) {
              const i = firstDifference(bitsOfHost(h[n]), bitsOfHost(first[n]));
              if (i >= 0) problems.push(`run ${run}: ${n} differs from run 0 first at flat index ${i}`);
            }
            for (const v of dqRunToRunViolations(h.dq, first.dq, bounds, 'float32', qShapeOf(t), 2)) problems.push(`run ${run}: dq ${v}`);
          }
          expect(problems).toEqual([]);
        } finally {
          p.dispose();
        }
      });

      // deterministic: true: each block of a KV head adds into its own fp32 accumulator slice (up to 8),
      // summed in order: bit-identical dq. One KV head (B · Hkv = 1) gives the most slices. The sums are
      // those of the atomic mode in another order: within the accumulator's rounding of it.
      test.each([
        c([1, 400, 520, 2, 1, 64], true),
        c([2, 150, 200, 4, 2, 96], true),
      ])('deterministic: true: 20 runs give bit-identical dq, dk, dv within the rule ($name)', async (t) => {
        const p = makeProblem(t, randomInputs(t, `flash-bwd-fp32/${precision}/deterministic/${t.name}`), precision);
        try {
          const s = await p.read();
          const atomic = await runFlash(p, t, precision, `${t.name}, ${precision}, atomic`);
          let first: HostGradients | undefined;
          for (let run = 0; run < 20; run++) {
            const h = await runFlash(p, t, precision, `${t.name}, ${precision}, deterministic run ${run}`, { deterministic: true });
            if (!first) {
              checkGradients32(t, precision, s, h, `${t.name}, ${precision}, deterministic`);
              expect(dqRunToRunViolations(h.dq, atomic.dq, dqAccumulatorBounds(t, s), 'float32', qShapeOf(t))).toEqual([]);
              first = h;
              continue;
            }
            const f0 = first;
            const diffs = (['dq', 'dk', 'dv'] as const).map((n) => firstDifference(bitsOfHost(h[n]), bitsOfHost(f0[n])));
            expect(`run ${run}: first differences of dq, dk, dv at ${diffs.join(', ')}`)
              .toBe(`run ${run}: first differences of dq, dk, dv at -1, -1, -1`);
          }
        } finally {
          p.dispose();
        }
      });
    });
  });

  test("the option reaches the kernel: 'highest' is ≥ 10× closer to float64 than 'tf32', and 'tf32' is the default", async () => {
    // One forward ('highest': out and lse at float32 accuracy), three backwards on it, so that only the
    // backward's option differs. TF32 rounds every operand to a 10-bit mantissa (2^-11 relative): on
    // these O(1) gradients its max error is ~1e-3 (above 1e-4 with a wide margin), 3xTF32's ~1e-6.
    const t = c([1, 203, 203, 2, 2, 64], true);
    const p = makeProblem(t, randomInputs(t, 'flash-bwd-fp32/option'), 'highest');
    try {
      const s = await p.read();
      const tf32 = await runFlash(p, t, 'tf32', `${t.name}, tf32`);
      const highest = await runFlash(p, t, 'highest', `${t.name}, highest`);
      const byDefault = await runFlash(p, t, undefined, `${t.name}, default precision`);
      const ref = referenceAttentionBackward(s.dout, s.q, s.k, s.v, shapeOf(t), optionsOf(t));
      for (const n of ['dq', 'dk', 'dv'] as const) {
        const [eTf32, eHighest] = [maxAbsDiff(tf32[n], ref[n]), maxAbsDiff(highest[n], ref[n])];
        expect(`${n}: tf32 error ${eTf32 > 1e-4 ? '> 1e-4' : eTf32}`).toBe(`${n}: tf32 error > 1e-4`);
        expect(`${n}: highest error ${eHighest < eTf32 / 10 ? '< tf32 error / 10' : `${eHighest} vs tf32 ${eTf32}`}`)
          .toBe(`${n}: highest error < tf32 error / 10`);
      }
      for (const n of ['dk', 'dv'] as const) {
        expect(differenceMessage(`${n} (default vs 'tf32')`, byDefault[n], tf32[n])).toBe(`${n} (default vs 'tf32'): first difference at -1`);
      }
      expect(dqRunToRunViolations(byDefault.dq, tf32.dq, dqAccumulatorBounds(t, s), 'float32', qShapeOf(t))).toEqual([]);
    } finally {
      p.dispose();
    }
  });
});
