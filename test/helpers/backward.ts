/**
 * What the CUDA FlashAttention-2 backward suite (test/flash-backward.test.ts) needs beyond
 * helpers/forward.ts: problems with a dout, running the forward and then the backward on a device,
 * the rule's slack for gradients, the exact checks of the rows that see no key, the run-to-run bound
 * of a dq accumulated with fp32 atomic adds, and the finite-difference check of forward + backward.
 *
 * Layouts are those of lib/attention.ts: q, dout, out, dq [batch, seqlenQ, headsQ, headDim]; k, v,
 * dk, dv [batch, seqlenK, headsKV, headDim]; lse [batch, headsQ, seqlenQ].
 *
 * Typed arrays read back from the addon belong to Node's realm, not Jest's: whatever goes back into
 * `Tensor.fromFloat32Array` is copied into a new Float32Array of this realm first.
 */

import {
  AttentionBackwardOptions, AttentionGradients, AttentionKernel, AttentionOptions, Device, DType, flashAttention,
  flashAttentionBackward, HalfDType, referenceAttentionBackward, ReferenceBackwardResult, Tensor,
} from '../../lib';
import {
  caseName, Dims, ForwardShape, kShapeOf, lseShapeOf, maxFiniteAbs, optionsOf, Q_DIMS, qShapeOf, scaleOf,
  shapeOf, U32,
} from './forward';
import { randn, rngFor, seedHint } from './random';
import { decodeIndex, expectAllWritten, FlashRuleInput, NumArray } from './tolerance';

// Module-level aliases: a global lookup per call (`Math.x`) is slow inside Jest's vm context.
const { abs, exp, max, min, ceil, floor, log2, sqrt } = Math;

// ------------------------------------------------------------------------------------------------
// Problems and inputs
// ------------------------------------------------------------------------------------------------

/** One backward problem in float16 or bfloat16: sizes, mask, scale, dtype, and a name that says them. */
export interface BackwardCase extends ForwardShape {
  name: string;
  dtype: HalfDType;
}

/** A case named from its fields, e.g. "203x113 causal (90 empty rows), d64, bf16, B2, GQA 8:1 (Hq 8)". */
export function bwdCase(dims: Dims, dtype: HalfDType, causal = false, scale?: number): BackwardCase {
  const [b, sq, sk, hq, hkv, d] = dims;
  const name = caseName(dims, causal, scale, dtype === 'float16' ? 'fp16' : 'bf16');
  return { name, b, sq, sk, hq, hkv, d, dtype, causal, scale };
}

/** Host inputs (float32; rounded to the dtype when the tensors are made). */
export interface BackwardInputs {
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
  dout: Float32Array;
}

/**
 * Fresh seeded random inputs: q, k ~ N(0, qkStd²), v and dout ~ N(0, 1) (never exactly zero; see
 * helpers/random.ts). `label` picks the stream.
 */
export function randomInputs(t: ForwardShape, label: string, qkStd = 1): BackwardInputs {
  const rng = rngFor(label);
  const nq = t.b * t.sq * t.hq * t.d;
  const nk = t.b * t.sk * t.hkv * t.d;
  return { q: randn(nq, rng, qkStd), k: randn(nk, rng, qkStd), v: randn(nk, rng), dout: randn(nq, rng) };
}

/** Keys that query row i sees: all seqlenK, or with the bottom-right causal mask those with j <= i + seqlenK − seqlenQ. */
export function visibleKeys(t: ForwardShape, i: number): number {
  const right = t.causal ? 0 : (t.window?.[1] ?? -1);
  return right < 0 ? t.sk : max(0, min(t.sk, i + t.sk - t.sq + right + 1));
}

/** The first key row i sees: 0 unless a window bounds its left side (keys before it are hidden). */
export function firstVisibleKey(t: ForwardShape, i: number): number {
  const left = t.window?.[0] ?? -1;
  return left < 0 ? 0 : max(0, min(t.sk, i + t.sk - t.sq - left));
}

/** Query rows of each head that see no key: seqlenQ − seqlenK with the causal mask when positive, else 0. */
export function emptyRows(t: ForwardShape): number {
  return t.causal ? max(0, t.sq - t.sk) : 0;
}

/** The stored values of every input and forward output of a problem, read back to the host. */
export interface StoredProblem {
  q: Float32Array;
  k: Float32Array;
  v: Float32Array;
  dout: Float32Array;
  out: Float32Array;
  lse: Float32Array;
}

/** Options of the forward that computes out and lse for the backward: the FA2 forward, checked to have run. */
const FORWARD_KERNEL: AttentionKernel = 'flash';

/**
 * q, k, v, dout, out and lse on a device. {@link DeviceProblem.create} makes q, k, v and dout and
 * runs the forward (kernel 'flash' for the half types) to get out and lse, as training does;
 * {@link DeviceProblem.fromStored} takes all six from the host (to build inputs around a problem).
 * The caller disposes it.
 */
export class DeviceProblem implements Disposable {
  private constructor(
    readonly t: ForwardShape,
    readonly dtype: DType,
    readonly q: Tensor,
    readonly k: Tensor,
    readonly v: Tensor,
    readonly dout: Tensor,
    readonly out: Tensor,
    readonly lse: Tensor,
    /** The forward's kernel ('auto' resolved), or null for {@link DeviceProblem.fromStored}. */
    readonly forwardKernel: string | null,
  ) {}

  /**
   * Makes the inputs on `device` and runs the forward with `forwardOptions` (default: the case's
   * mask and scale, kernel 'flash'); expects the forward to report the kernel it was asked for.
   */
  static create(
    t: ForwardShape, x: BackwardInputs, dtype: DType, device: Device = 'cuda', forwardOptions?: AttentionOptions,
  ): DeviceProblem {
    const made: Tensor[] = [];
    const make = (data: Float32Array, shape: number[]): Tensor => {
      const y = Tensor.fromFloat32Array(data, shape, { dtype, device });
      made.push(y);
      return y;
    };
    try {
      const q = make(x.q, qShapeOf(t));
      const k = make(x.k, kShapeOf(t));
      const v = make(x.v, kShapeOf(t));
      const dout = make(x.dout, qShapeOf(t));
      const opts = forwardOptions ?? { ...optionsOf(t), kernel: FORWARD_KERNEL };
      const fwd = flashAttention(q, k, v, opts);
      made.push(fwd.out, fwd.lse);
      if (opts.kernel !== undefined && opts.kernel !== 'auto') expect(fwd.kernel).toBe(opts.kernel);
      return new DeviceProblem(t, dtype, q, k, v, dout, fwd.out, fwd.lse, fwd.kernel);
    } catch (e) {
      for (const y of made) y.dispose();
      throw e;
    }
  }

  /** All six tensors from host values (exact when the values are already in the dtype; lse is float32). */
  static fromStored(t: ForwardShape, s: StoredProblem, dtype: DType, device: Device = 'cuda'): DeviceProblem {
    const made: Tensor[] = [];
    const make = (data: Float32Array, shape: number[], dt: DType): Tensor => {
      const y = Tensor.fromFloat32Array(new Float32Array(data), shape, { dtype: dt, device });
      made.push(y);
      return y;
    };
    try {
      return new DeviceProblem(
        t, dtype,
        make(s.q, qShapeOf(t), dtype), make(s.k, kShapeOf(t), dtype), make(s.v, kShapeOf(t), dtype),
        make(s.dout, qShapeOf(t), dtype), make(s.out, qShapeOf(t), dtype), make(s.lse, lseShapeOf(t), 'float32'),
        null,
      );
    } catch (e) {
      for (const y of made) y.dispose();
      throw e;
    }
  }

  /** The backward with the case's mask and scale plus `options`. The caller disposes the gradients. */
  backward(options: AttentionBackwardOptions = {}): AttentionGradients {
    return flashAttentionBackward(this.dout, this.q, this.k, this.v, this.out, this.lse, { ...optionsOf(this.t), ...options });
  }

  /** The stored values of the inputs and of the forward's outputs (copied into this realm). */
  async read(): Promise<StoredProblem> {
    const [q, k, v, dout, out, lse] = await Promise.all(
      [this.q, this.k, this.v, this.dout, this.out, this.lse].map(async (y) => new Float32Array(await y.toFloat32Array())),
    );
    return { q, k, v, dout, out, lse };
  }

  dispose(): void {
    for (const y of [this.q, this.k, this.v, this.dout, this.out, this.lse]) y.dispose();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** Gradients read back to the host, with the kernel and the algorithm that the call reported. */
export interface HostGradients {
  dq: Float32Array;
  dk: Float32Array;
  dv: Float32Array;
  kernel: string;
  algorithm: string;
}

/**
 * Checks the gradients' shapes, dtypes and devices, reads them back (copied into this realm) and
 * expects every element to have been written (no NaN: outputs start as NaN under
 * usePoisonedOutputs). Does not dispose them.
 */
export async function readGradients(t: ForwardShape, dtype: DType, device: Device, g: AttentionGradients, what: string): Promise<HostGradients> {
  expect([g.dq.shape, g.dq.dtype, g.dq.device]).toEqual([qShapeOf(t), dtype, device]);
  expect([g.dk.shape, g.dk.dtype, g.dk.device]).toEqual([kShapeOf(t), dtype, device]);
  expect([g.dv.shape, g.dv.dtype, g.dv.device]).toEqual([kShapeOf(t), dtype, device]);
  const [dq, dk, dv] = await Promise.all([g.dq, g.dk, g.dv].map(async (y) => new Float32Array(await y.toFloat32Array())));
  expectAllWritten(dq, `dq (${what})`, { shape: qShapeOf(t), dims: Q_DIMS });
  expectAllWritten(dk, `dk (${what})`, { shape: kShapeOf(t), dims: Q_DIMS });
  expectAllWritten(dv, `dv (${what})`, { shape: kShapeOf(t), dims: Q_DIMS });
  return { dq, dk, dv, kernel: g.kernel, algorithm: g.algorithm };
}

/** Disposes the three gradient tensors. */
export function disposeGradients(g: AttentionGradients): void {
  g.dq.dispose();
  g.dk.dispose();
  g.dv.dispose();
}

/**
 * What one forward + backward gives back: the stored inputs, out and lse, and the gradients (of the
 * algorithm 'auto' picked; `others`: the gradients of the other algorithm on the same inputs, where
 * 'auto' picked 'two-kernel').
 */
export interface BackwardRun extends StoredProblem, HostGradients {
  others: HostGradients[];
}

/**
 * Makes the inputs of `t` on CUDA, runs the FA2 forward (kernel 'flash') for out and lse, then the
 * backward with kernel 'flash' and algorithm 'auto'; where that ran the two-kernel backward (Hopper,
 * head dims 32 / 64 / 128), the single-kernel one runs too, so that both are checked on every case.
 * Expects the backward to report 'flash', checks the gradients' shapes and that every element was
 * written, and returns everything read back. Disposes every tensor it made.
 */
export async function runBackward(t: BackwardCase, x: BackwardInputs): Promise<BackwardRun> {
  const p = DeviceProblem.create(t, x, t.dtype);
  const read = async (options: AttentionBackwardOptions, what: string): Promise<HostGradients> => {
    const g = p.backward({ kernel: 'flash', ...options });
    try {
      expect(g.kernel).toBe('flash');
      return await readGradients(t, t.dtype, 'cuda', g, what);
    } finally {
      disposeGradients(g);
    }
  };
  try {
    const grads = await read({}, t.name);
    const others = grads.algorithm === 'two-kernel'
      ? [await read({ algorithm: 'single-kernel' }, `${t.name}, single-kernel`)] : [];
    return { ...(await p.read()), ...grads, others };
  } finally {
    p.dispose();
  }
}

// ------------------------------------------------------------------------------------------------
// Per-row float64 quantities (for the slack terms and the run-to-run bound)
// ------------------------------------------------------------------------------------------------

/**
 * Calls `fn(b, h, i, n, p, ds)` for every query row that sees a key (keys [lo, n): a window's left side
 * hides the first lo, whose p and ds are 0), with the row's float64 softmax p[0..n) (of the softcapped
 * scores with ALiBi where `t` has them) and
 * dS = p ∘ (dP − D) (dP_j = dO_i·v_j, D = dO_i·out_i with out_i = Σ_j p_j v_j),
 * computed from the stored values `s` (q, k, v, dout). Costs about 3·Σ n·d multiply-adds.
 */
function forEachRow(
  t: ForwardShape, s: Pick<StoredProblem, 'q' | 'k' | 'v' | 'dout'>,
  fn: (b: number, h: number, i: number, n: number, p: Float64Array, ds: Float64Array) => void,
): void {
  const { d } = t;
  const scale = scaleOf(t);
  const group = t.hq / t.hkv;
  const p = new Float64Array(t.sk);
  const ds = new Float64Array(t.sk);
  const o = new Float64Array(d);
  const cap = t.softcap ?? 0;
  const slopes = t.alibi;
  for (let b = 0; b < t.b; b++) {
    for (let h = 0; h < t.hq; h++) {
      const kh = floor(h / group);
      for (let i = 0; i < t.sq; i++) {
        const n = visibleKeys(t, i);
        const lo = firstVisibleKey(t, i);
        if (n <= lo) continue;
        const qo = ((b * t.sq + i) * t.hq + h) * d;
        // Keys before lo (a window's left side) are hidden: P and dS 0 there, so callers may sum from 0.
        p.fill(0, 0, lo);
        ds.fill(0, 0, lo);
        let m = -Infinity;
        for (let j = lo; j < n; j++) {
          const ko = ((b * t.sk + j) * t.hkv + kh) * d;
          let a = 0;
          for (let c = 0; c < d; c++) a += s.q[qo + c] * s.k[ko + c];
          p[j] = cap > 0 ? cap * Math.tanh((a * scale) / cap) : a * scale;
          if (slopes !== undefined) p[j] -= slopes[slopes.length === t.hq ? h : b * t.hq + h] * abs(i + t.sk - t.sq - j);
          if (p[j] > m) m = p[j];
        }
        let l = 0;
        for (let j = lo; j < n; j++) l += (p[j] = exp(p[j] - m));
        o.fill(0);
        for (let j = lo; j < n; j++) {
          p[j] /= l;
          const vo = ((b * t.sk + j) * t.hkv + kh) * d;
          for (let c = 0; c < d; c++) o[c] += p[j] * s.v[vo + c];
        }
        let D = 0;
        for (let c = 0; c < d; c++) D += s.dout[qo + c] * o[c];
        for (let j = lo; j < n; j++) {
          const vo = ((b * t.sk + j) * t.hkv + kh) * d;
          let dp = 0;
          for (let c = 0; c < d; c++) dp += s.dout[qo + c] * s.v[vo + c];
          ds[j] = p[j] * (dp - D);
        }
        fn(b, h, i, n, p, ds);
      }
    }
  }
}

/**
 * The largest probability mass one key receives: Σ over the query rows and the query heads of its
 * GQA group of P[i, j] (float64, from the stored q and k): how many rows' errors can pile up in one
 * row of dk or dv.
 */
export function maxKeyMass(t: ForwardShape, s: Pick<StoredProblem, 'q' | 'k' | 'v' | 'dout'>): number {
  const mass = new Float64Array(t.b * t.hkv * t.sk);
  const group = t.hq / t.hkv;
  forEachRow(t, s, (b, h, _i, n, p) => {
    const base = (b * t.hkv + floor(h / group)) * t.sk;
    for (let j = 0; j < n; j++) mass[base + j] += p[j];
  });
  return maxFiniteAbs(mass);
}

// ------------------------------------------------------------------------------------------------
// The rule for gradients
// ------------------------------------------------------------------------------------------------

/**
 * Absolute slack of the rule for dq, dk and dv (the "tiny atol"): the value test/attention.test.ts
 * uses for every dtype. For float16/bfloat16 the 3× term dominates wherever a gradient is not
 * exactly zero in exact arithmetic: the same-precision error includes the dtype's rounding of P, of
 * dS and of the stored gradient, of the order of 2^-12 (fp16) or 2^-9 (bf16) of the largest
 * gradient. 1e-5 is a sixth of an fp16 ulp at 0.1 (2^-14 ≈ 6.1e-5) and cannot absorb a masking,
 * scaling or tiling error (a key's share of a gradient, ≳ 1e-3 even over a thousand keys).
 */
export const GRAD_ATOL = 1e-5;

/**
 * δS: a bound on how far the kernel's dS = P ∘ (dP − D) may sit from zero where it is exactly zero in
 * exact arithmetic, as in test/attention.test.ts's backward floors: dP_ij = dO_i·v_j (a GEMM on the
 * tensor cores) and D_i = dO_i·out_i (the preprocess) are two d-term float32 dot products, each off by
 * up to d·u of the sum of |terms| (≤ d·max|dO|·max(|v|, |out|)), summed in different orders.
 *
 * This matters for the rows that see exactly one key: there P = 1, out = v of that key, and dS is
 * exactly 0, in the float64 reference and in the same-precision one alike (both compute dP and D by
 * the same loop), so their dq and their share of dk are exactly 0 and the same-precision error says
 * nothing about the kernel's float32 noise in dP − D. Rows with two keys or more have dS of the order
 * of dO·v, whose rounding to the dtype (2^-11 or 2^-8 relative) dwarfs this.
 */
export function dsCancellation(t: ForwardShape, s: Pick<StoredProblem, 'v' | 'dout' | 'out'>): number {
  return 2 * U32 * t.d * maxFiniteAbs(s.dout) * max(maxFiniteAbs(s.v), maxFiniteAbs(s.out));
}

/**
 * Query rows, per (batch, query head), that see exactly one key, and the largest number of such
 * (row, query head) pairs that one key receives. Without the mask a row sees one key iff seqlenK = 1
 * (then all seqlenQ rows see key 0); with the bottom-right causal mask, row seqlenQ − seqlenK sees
 * exactly key 0 when seqlenQ ≥ seqlenK (and no row sees one key when seqlenQ < seqlenK).
 */
export function oneKeyRows(t: ForwardShape): { perHead: number; perKey: number } {
  const perHead = t.causal ? (t.sq >= t.sk ? 1 : 0) : (t.sk === 1 ? t.sq : 0);
  return { perHead, perKey: perHead * (t.hq / t.hkv) };
}

/** Slack of the rule per gradient (added to GRAD_ATOL). */
export type GradSlack = Record<'dq' | 'dk' | 'dv', number>;

/**
 * The float32 floors of an FA2 backward where the same-precision implementation is exact (zero unless
 * some row sees exactly one key, or `largeMagnitude`):
 *
 * - one-key rows (see {@link dsCancellation}): dq gets scale·δS·max|k|, dk scale·δS·max|q| times the
 *   number of one-key (row, query head) pairs that fall on one key ({@link oneKeyRows}); dv nothing
 *   (P = 1 is exact once rounded to the dtype for P·dO).
 * - `largeMagnitude` (scores of ~±100 or more): test/attention.test.ts's floors for its large-score
 *   cases. With a near one-hot softmax every row behaves like a one-key row (dS ≈ 0 up to the
 *   cancellation above, for the mass of every key); and P is recomputed from the float32 lse, so
 *   every P of a row is off by the same relative δP ≈ 4·u·max|lse| (a few ulps of |lse|), which a
 *   plain implementation that normalises P directly does not see:
 *   dq: δP·max|dq| + scale·δS·max|k|; dk: δP·max|dk| + scale·δS·max|q|·mass; dv: δP·mass·max|dout|,
 *   with mass = {@link maxKeyMass}.
 */
export function gradientSlack(t: ForwardShape, s: StoredProblem, ref: ReferenceBackwardResult, largeMagnitude: boolean): GradSlack {
  const scale = scaleOf(t);
  const dS = dsCancellation(t, s);
  const maxQ = maxFiniteAbs(s.q);
  const maxK = maxFiniteAbs(s.k);
  if (largeMagnitude) {
    const dP = 4 * U32 * maxFiniteAbs(ref.lse);
    const mass = maxKeyMass(t, s);
    return {
      dq: dP * maxFiniteAbs(ref.dq) + scale * dS * maxK,
      dk: dP * maxFiniteAbs(ref.dk) + scale * dS * maxQ * mass,
      dv: dP * mass * maxFiniteAbs(s.dout),
    };
  }
  const one = oneKeyRows(t);
  if (one.perHead === 0) return { dq: 0, dk: 0, dv: 0 };
  return { dq: scale * dS * maxK, dk: scale * dS * maxQ * one.perKey, dv: 0 };
}

/**
 * Slack for the out that the backward is given (dq and dk): D_i = dO_i·out_i uses the forward kernel's
 * out, which may differ from the same-precision reference's own out by an ulp of the dtype in some
 * elements (each within the forward's rule, but not in the same rows). dS_ij = P_ij (dP_ij − D_i) then
 * moves by P_ij·δD_i, so dq_i by scale·δD_i·Σ_j P_ij k_j and dk_j by scale·Σ_i P_ij δD_i q_i, with
 * δD_i = |dO_i·(out_i − out'_i)| measured from the two outs (float64; rows with a non-finite value
 * skipped): zero when they agree. The 3× rule does not cover this: it is a max over all elements, and a
 * row whose D moved can be one where the same-precision error happens to be small (H100, 2026-11-21:
 * fp16 causal 799x3 d40, dq of a row with two keys at 1.05x its bound without this slack).
 */
export function outDifferenceSlack(
  t: ForwardShape, s: Pick<StoredProblem, 'q' | 'k' | 'v' | 'dout' | 'out'>, sameOut: NumArray,
): GradSlack {
  const { d } = t;
  const dD = new Float64Array(t.b * t.hq * t.sq);
  let maxDD = 0;
  for (let b = 0; b < t.b; b++) {
    for (let i = 0; i < t.sq; i++) {
      for (let h = 0; h < t.hq; h++) {
        const o = ((b * t.sq + i) * t.hq + h) * d;
        let x = 0;
        for (let c = 0; c < d; c++) x += s.dout[o + c] * (s.out[o + c] - sameOut[o + c]);
        if (!Number.isFinite(x)) continue;
        dD[(b * t.hq + h) * t.sq + i] = abs(x);
        maxDD = max(maxDD, abs(x));
      }
    }
  }
  if (maxDD === 0) return { dq: 0, dk: 0, dv: 0 };
  // Σ_i P_ij δD_i per key (over the query rows and the query heads of its GQA group).
  const weighted = new Float64Array(t.b * t.hkv * t.sk);
  const group = t.hq / t.hkv;
  forEachRow(t, s, (b, h, i, n, p) => {
    const w = dD[(b * t.hq + h) * t.sq + i];
    const base = (b * t.hkv + floor(h / group)) * t.sk;
    for (let j = 0; j < n; j++) weighted[base + j] += p[j] * w;
  });
  const scale = scaleOf(t);
  return { dq: scale * maxDD * maxFiniteAbs(s.k), dk: scale * maxFiniteAbs(s.q) * maxFiniteAbs(weighted), dv: 0 };
}

/** The sum of two slacks, per gradient. */
export function addSlack(a: GradSlack, b: GradSlack): GradSlack {
  return { dq: a.dq + b.dq, dk: a.dk + b.dk, dv: a.dv + b.dv };
}

/** The float64 reference and the same-precision one, from the stored values. */
export interface References {
  ref: ReferenceBackwardResult;
  same: ReferenceBackwardResult;
}

/** Both references of `t` (the case's mask and scale) from the stored q, k, v and dout. */
export function referencesOf(t: BackwardCase, s: Pick<StoredProblem, 'q' | 'k' | 'v' | 'dout'>): References {
  const shape = shapeOf(t);
  return {
    ref: referenceAttentionBackward(s.dout, s.q, s.k, s.v, shape, optionsOf(t)),
    same: referenceAttentionBackward(s.dout, s.q, s.k, s.v, shape, { ...optionsOf(t), precision: t.dtype }),
  };
}

/** The rule's input for one gradient: factor 3, GRAD_ATOL + slack. */
export function gradientRuleInput(
  t: BackwardCase, n: 'dq' | 'dk' | 'dv', actual: NumArray, refs: References, slack: GradSlack, what = t.name,
): FlashRuleInput {
  return {
    actual, reference: refs.ref[n], samePrecision: refs.same[n], factor: 3, atol: GRAD_ATOL + slack[n],
    name: `${n} (${what})`, shape: n === 'dq' ? qShapeOf(t) : kShapeOf(t), dims: Q_DIMS,
  };
}

/**
 * The flash rule on dq, dk and dv of `run` (factor 3, GRAD_ATOL plus {@link gradientSlack}), with
 * `expectRule` (helpers/forward.ts's ruleChecker); then the rows that see no key ({@link
 * expectEmptyRowGradients}) and finiteness. Returns the references for further checks.
 */
export function checkGradients(
  t: BackwardCase, run: StoredProblem & HostGradients, expectRule: (input: FlashRuleInput) => void, largeMagnitude = false,
  given?: References,
): References {
  const refs = given ?? referencesOf(t, run);
  const slack = addSlack(gradientSlack(t, run, refs.ref, largeMagnitude), outDifferenceSlack(t, run, refs.same.out));
  const what = run.algorithm === 'two-kernel' ? `${t.name}, two-kernel` : t.name;
  for (const n of ['dq', 'dk', 'dv'] as const) expectRule(gradientRuleInput(t, n, run[n], refs, slack, what));
  expectEmptyRowGradients(t, run.dq, run.lse);
  for (const n of ['dq', 'dk', 'dv'] as const) expectFinite(run[n], `${n} (${what})`, n === 'dq' ? qShapeOf(t) : kShapeOf(t));
  return refs;
}

// ------------------------------------------------------------------------------------------------
// Exact checks
// ------------------------------------------------------------------------------------------------

/**
 * A copy of `a` with the elements of batch 1 (of `perBatch` each) replaced by NaN, +Infinity, −Infinity
 * in turn: the memory right after batch 0 in every tensor, for the tests that a kernel never reads it.
 */
export function poisonBatch1(a: Float32Array, perBatch: number): Float32Array {
  const out = new Float32Array(a);
  const pattern = [NaN, Infinity, -Infinity];
  for (let i = perBatch; i < 2 * perBatch; i++) out[i] = pattern[i % 3];
  return out;
}

/** Expects no NaN and no ±Infinity, naming the first offender. */
export function expectFinite(a: NumArray, name: string, shape?: readonly number[]): void {
  let count = 0;
  let first = -1;
  for (let i = 0; i < a.length; i++) {
    if (!Number.isFinite(a[i])) {
      if (first < 0) first = i;
      count++;
    }
  }
  if (count > 0) {
    throw new Error(`${name}: ${count} of ${a.length} elements are not finite, the first ${a[first]} at flat index ${first}`
      + ` ${decodeIndex(first, shape, Q_DIMS)}; ${seedHint()}`);
  }
}

/**
 * Causal attention with seqlenQ > seqlenK: the first seqlenQ − seqlenK query rows see no key; their
 * dq must be exactly 0 (and their lse, the forward's, +Infinity, which the backward was fed). Checked
 * on every batch and head. Without such rows it only checks that lse is finite everywhere.
 */
export function expectEmptyRowGradients(t: ForwardShape, dq: NumArray, lse: NumArray): void {
  const empty = emptyRows(t);
  const bad: string[] = [];
  for (let b = 0; b < t.b && bad.length < 5; b++) {
    for (let h = 0; h < t.hq; h++) {
      for (let i = 0; i < t.sq; i++) {
        const l = lse[(b * t.hq + h) * t.sq + i];
        if (i < empty ? l !== Infinity : !Number.isFinite(l)) bad.push(`lse[b=${b}, h=${h}, s=${i}] = ${l}`);
        if (i >= empty) continue;
        const base = ((b * t.sq + i) * t.hq + h) * t.d;
        for (let e = 0; e < t.d; e++) {
          if (dq[base + e] !== 0) bad.push(`dq[b=${b}, s=${i}, h=${h}, d=${e}] = ${dq[base + e]}`);
        }
      }
    }
  }
  expect(bad.slice(0, 5)).toEqual([]);
}

/** The element bits of a read-back tensor (Uint16 for the half types, Uint32 for float32), copied into this realm. */
export async function bitsOf(x: Tensor): Promise<Uint16Array | Uint32Array> {
  const b = await x.toBits();
  // Typed arrays made by the addon belong to Node's realm, not Jest's: test the tag, not instanceof.
  return Object.prototype.toString.call(b) === '[object Float32Array]'
    ? new Uint32Array(new Uint32Array(b.buffer, b.byteOffset, b.length))
    : new Uint16Array(b as Uint16Array);
}

/** Index of the first element where the two differ (a length mismatch counts), or −1. */
export function firstDifference(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) return min(a.length, b.length);
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return -1;
}

/** The elements of batch `b` of a flat [batch, ...] array whose batch holds `perBatch` elements (a view). */
export function batchOf<A extends Float32Array | Uint16Array | Uint32Array>(a: A, perBatch: number, b: number): A {
  return a.subarray(b * perBatch, (b + 1) * perBatch) as A;
}

// ------------------------------------------------------------------------------------------------
// dq accumulated with fp32 atomic adds: how far two runs may differ
// ------------------------------------------------------------------------------------------------

/**
 * The smallest number of keys per K/V tile an FA2 backward plausibly uses (the tiles are 64 or 128
 * keys in practice): it bounds from above how many partial sums are atomically added into one
 * element of the dq accumulator (one per K/V tile that a row sees).
 */
export const MIN_KEY_TILE = 16;

/**
 * Per element of dq, a bound on |dq_run1 − dq_run2| before the rounding to the dtype, for a dq that
 * is accumulated in fp32 by atomic adds of per-K/V-tile partial sums in an order that varies between
 * runs, then scaled by softmaxScale (csrc/cuda/flash/flash_bwd.h).
 *
 * Row i receives m ≤ ceil(n_i / MIN_KEY_TILE) partial sums P_t = Σ_{j in tile t} dS_ij·k_j (the same
 * bits in every run: each comes from one thread block's deterministic GEMM). Any two summation orders
 * of m terms in fp32 differ by at most 2·(m − 1)·u·Σ_t |P_t| ≤ 2·(m − 1)·u·Σ_j |dS_ij|·|k_jc|, and the
 * final scaling adds one rounding more. The bound is that times scale, doubled for the rounding of
 * dS to the dtype before the GEMM, the fp32 GEMM's own rounding and the float64 dS used here. Σ_j
 * |dS_ij|·|k_jc| is computed in float64 from the stored inputs (about 4·Σ n·d multiply-adds).
 */
export function dqAccumulatorBounds(t: ForwardShape, s: Pick<StoredProblem, 'q' | 'k' | 'v' | 'dout'>): Float64Array {
  const { d } = t;
  const scale = scaleOf(t);
  const group = t.hq / t.hkv;
  const bounds = new Float64Array(t.b * t.sq * t.hq * d);
  forEachRow(t, s, (b, h, i, n, _p, ds) => {
    const m = ceil(n / MIN_KEY_TILE);
    const factor = 2 * 2 * m * U32 * scale; // (m − 1) + 1 for the scaling, doubled
    const qo = ((b * t.sq + i) * t.hq + h) * d;
    const kh = floor(h / group);
    for (let j = 0; j < n; j++) {
      const a = abs(ds[j]);
      const ko = ((b * t.sk + j) * t.hkv + kh) * d;
      for (let c = 0; c < d; c++) bounds[qo + c] += a * abs(s.k[ko + c]);
    }
    for (let c = 0; c < d; c++) bounds[qo + c] *= factor;
  });
  return bounds;
}

/**
 * The spacing of the dtype's values at |x| (one ulp): float16 2^(e − 10) (2^-24 below 2^-14),
 * bfloat16 2^(e − 7) (2^-133 below 2^-126), float32 2^(e − 23), with e = floor(log2 |x|). Never less
 * than the spacing at |x| (it may be twice it just below a power of two).
 */
export function ulpOf(dtype: DType, x: number): number {
  const a = abs(x);
  const [mant, minExp, sub] = dtype === 'float16' ? [10, -14, 2 ** -24] : dtype === 'bfloat16' ? [7, -126, 2 ** -133] : [23, -126, 2 ** -149];
  if (!(a >= 2 ** minExp)) return sub;
  return 2 ** (floor(log2(a)) - mant);
}

/**
 * Elements where two runs' dq differ by more than the rounding of the fp32 accumulator allows:
 * |a − b| > ulp(max(|a|, |b|)) + bound (the accumulator's reorder bound from {@link
 * dqAccumulatorBounds}, then one rounding to the dtype, which can move two close values to adjacent
 * dtype values). A lost or doubled atomic add moves an element by a whole partial sum, far more.
 * Returns up to `limit` descriptions.
 */
export function dqRunToRunViolations(
  a: NumArray, b: NumArray, bounds: Float64Array, dtype: DType, shape: readonly number[], limit = 5,
): string[] {
  const out: string[] = [];
  for (let i = 0; i < a.length && out.length < limit; i++) {
    const x = a[i];
    const y = b[i];
    if (x === y) continue;
    const allowed = ulpOf(dtype, max(abs(x), abs(y))) + bounds[i];
    if (!(abs(x - y) <= allowed)) {
      out.push(`${decodeIndex(i, shape, Q_DIMS)}: ${x} vs ${y} (|diff| ${abs(x - y).toExponential(3)} > ${allowed.toExponential(3)})`);
    }
  }
  return out;
}

// ------------------------------------------------------------------------------------------------
// Finite differences of forward + backward
// ------------------------------------------------------------------------------------------------

/** Step of the finite differences. */
export const FD_STEP = 2 ** -3;

/**
 * The inputs of the finite-difference check are rounded to multiples of 2^-12: then every x ± h and
 * x ± 2h with |x| < 2^11 is a float32 value (24 bits from 2^-12 to 2^11), so the perturbations
 * actually applied are exactly ±h and ±2h.
 */
const FD_GRID = 2 ** -12;

/**
 * Tolerance of the finite-difference check: |numeric − analytic| ≤ FD_ATOL + FD_RTOL·|analytic|.
 *
 * The numeric derivative is the fourth-order central difference
 * (8·(L(x+h) − L(x−h)) − (L(x+2h) − L(x−2h))) / 12h of L = Σ out·w (summed in float64 from the
 * float32 out). Its truncation error is h⁴/30·|L⁽⁵⁾| (~1e-5 here), its noise ~1.5·ε_L/h where ε_L is
 * the float32 rounding noise of L (≲ 1e-6 for these tiny shapes). Measured on the CPU backend
 * (float32 FMA arithmetic) against the float64 reference: ≤ 1.5e-5; with an extra, independent
 * 2e-6 relative noise on every element of out (a pessimistic model of a float32 tensor-core forward)
 * ≤ 8e-4 with |analytic| ≳ 0.05. A gradient with a wrong scale, sign, mask or GQA sum is off by a good
 * fraction of itself (≳ 0.1 · |analytic| for the entries sampled here), far above the bound.
 */
export const FD_ATOL = 1e-3;
export const FD_RTOL = 1e-2;

/** One sampled entry: the numeric and the analytic derivative of L with respect to it. */
export interface FdEntry {
  tensor: 'q' | 'k' | 'v';
  index: number;
  where: string;
  numeric: number;
  analytic: number;
}

/**
 * Samples `perTensor` entries of each of q, k and v (plus, with the causal mask and seqlenQ >
 * seqlenK, one q entry of a row that sees no key: both derivatives must be 0), and returns their
 * numeric derivative (see FD_ATOL) of L = Σ out·w and the analytic one from flashAttentionBackward
 * with dout = w, all in float32 on `device` with `options` for both calls.
 *
 * q, k, v, w ~ N(0, 1) (seeded by `label`; q, k, v rounded to multiples of 2^-12, see FD_GRID). Every
 * evaluation of L makes fresh tensors and disposes them.
 */
export async function finiteDifferences(
  t: ForwardShape, device: Device, options: AttentionBackwardOptions, label: string, perTensor: number,
): Promise<FdEntry[]> {
  const rng = rngFor(label);
  const x = randomInputs(t, `${label}/inputs`);
  // On the grid of FD_GRID (|x| < 8 in practice, far below 2^11), so that x ± h and x ± 2h are exact
  // float32 values and are the perturbations actually applied. Zeros (|x| < 2^-13) move to the grid's step.
  for (const a of [x.q, x.k, x.v]) {
    for (let i = 0; i < a.length; i++) a[i] = Math.round(a[i] / FD_GRID) * FD_GRID || FD_GRID;
  }
  const w = x.dout;
  const o = { dtype: 'float32' as const, device };
  const opts = { ...optionsOf(t), ...options };

  const loss = async (q: Float32Array, k: Float32Array, v: Float32Array): Promise<number> => {
    const Q = Tensor.fromFloat32Array(q, qShapeOf(t), o);
    const K = Tensor.fromFloat32Array(k, kShapeOf(t), o);
    const V = Tensor.fromFloat32Array(v, kShapeOf(t), o);
    const f = flashAttention(Q, K, V, opts);
    try {
      const out = await f.out.toFloat32Array();
      let sum = 0;
      for (let i = 0; i < out.length; i++) sum += out[i] * w[i];
      return sum;
    } finally {
      for (const y of [Q, K, V, f.out, f.lse]) y.dispose();
    }
  };

  // Analytic gradients: dL/d(out) = w.
  const p = DeviceProblem.create(t, x, 'float32', device, opts);
  let grads: HostGradients;
  try {
    const g = p.backward(opts);
    try {
      grads = await readGradients(t, 'float32', device, g, `finite differences ${label}`);
    } finally {
      disposeGradients(g);
    }
  } finally {
    p.dispose();
  }

  // Entries to perturb.
  const picks: { tensor: 'q' | 'k' | 'v'; index: number }[] = [];
  for (const tensor of ['q', 'k', 'v'] as const) {
    const n = x[tensor].length;
    const seen = new Set<number>();
    while (seen.size < min(perTensor, n)) seen.add(rng.int(n));
    for (const index of seen) picks.push({ tensor, index });
  }
  if (emptyRows(t) > 0) picks.push({ tensor: 'q', index: ((0 * t.sq + emptyRows(t) - 1) * t.hq + 0) * t.d + (t.d - 1) });

  const entries: FdEntry[] = [];
  for (const { tensor, index } of picks) {
    const at = async (delta: number): Promise<number> => {
      const y = { q: x.q, k: x.k, v: x.v };
      const changed = new Float32Array(x[tensor]);
      changed[index] = x[tensor][index] + delta; // exact: both on the FD_GRID grid, |sum| < 2^11
      if (changed[index] - x[tensor][index] !== delta) throw new Error(`finiteDifferences: ${tensor}[${index}] ± ${delta} is not exact`);
      y[tensor] = changed;
      return loss(y.q, y.k, y.v);
    };
    const h = FD_STEP;
    const [p1, m1, p2, m2] = [await at(h), await at(-h), await at(2 * h), await at(-2 * h)];
    const numeric = (8 * (p1 - m1) - (p2 - m2)) / (12 * h);
    const analytic = grads[tensor === 'q' ? 'dq' : tensor === 'k' ? 'dk' : 'dv'][index];
    const shape = tensor === 'q' ? qShapeOf(t) : kShapeOf(t);
    entries.push({ tensor, index, where: `${tensor}${decodeIndex(index, shape, Q_DIMS)}`, numeric, analytic });
  }
  return entries;
}

/** The entries whose numeric and analytic derivatives disagree beyond FD_ATOL + FD_RTOL·|analytic|, described. */
export function fdMismatches(entries: readonly FdEntry[]): string[] {
  return entries
    .filter((e) => !(abs(e.numeric - e.analytic) <= FD_ATOL + FD_RTOL * abs(e.analytic)))
    .map((e) => `${e.where}: numeric ${e.numeric.toExponential(5)} vs analytic ${e.analytic.toExponential(5)}`
      + ` (allowed ${(FD_ATOL + FD_RTOL * abs(e.analytic)).toExponential(2)})`);
}

/** Root mean square of the analytic derivatives (to show that a check compared something nonzero). */
export function rmsAnalytic(entries: readonly FdEntry[]): number {
  let s = 0;
  for (const e of entries) s += e.analytic * e.analytic;
  return sqrt(s / max(1, entries.length));
}
