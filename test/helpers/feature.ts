/**
 * One attention feature case (softcap, sliding window, ...) on the CPU backend against the float64
 * reference: random q, k, v, dout (fresh per case name), the forward and backward with the feature's
 * options, every output checked to be written (the outputs start poisoned: usePoisonedOutputs), then
 * the flash-attention rule (factor 2 for out and lse, 3 for dq, dk, dv, plus the slack of the
 * kernel's out in D: helpers/backward.ts outDifferenceSlack).
 */

import {
  DType, flashAttention, flashAttentionBackward, flashAttentionWithGrad, referenceAttentionBackward, ReferenceOptions, Tensor,
} from '../../lib';
import { binding, FLOAT32_PRECISION_CODE, KERNEL_CODE, NativeBuffer } from '../../lib/native';
import { storageOf, wrapNative } from '../../lib/tensor';
import { outDifferenceSlack } from './backward';
import { ForwardShape } from './forward';
import { randn, rngFor } from './random';
import { expectAllWritten, expectFlashRule } from './tolerance';

/** A case: [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim], its dtype, and q and k's spread. */
export interface FeatureCase {
  name: string;
  dims: [number, number, number, number, number, number];
  dtype: DType;
  causal?: boolean;
  scale?: number;
  /** Standard deviation of q and k (default 1). */
  qkStd?: number;
}

/** The outputs of a case's run, as float32 arrays. */
export interface FeatureOutputs {
  out: Float32Array;
  lse: Float32Array;
  dq: Float32Array;
  dk: Float32Array;
  dv: Float32Array;
}

const ATOL = 1e-5;
/** FA_TEST_REPORT=1 prints each output's error as a fraction of the rule's bound. */
const REPORT = process.env.FA_TEST_REPORT === '1';

/**
 * Runs case `t` with the feature's options `feature` (added to the case's causal mask and scale, for
 * the kernels and for the references) and checks it. `slackShape` adds what the slack's float64 rows
 * must know of the feature (the window; the softcap's factor 1 − t² ≤ 1 only shrinks dS, so the
 * uncapped rows bound it). Returns the outputs for the caller's own checks.
 */
export async function expectFeatureMatchesReference(
  seedPrefix: string, t: FeatureCase, feature: Record<string, unknown>, slackShape: Partial<ForwardShape> = {},
): Promise<FeatureOutputs> {
  const [b, sq, sk, hq, hkv, d] = t.dims;
  const causal = t.causal ?? false;
  const rng = rngFor(`${seedPrefix} ${t.name}`);
  const qShape = [b, sq, hq, d];
  const kShape = [b, sk, hkv, d];
  const owned: Tensor[] = [];
  const make = (data: Float32Array, shape: number[]): Tensor => {
    const x = Tensor.fromFloat32Array(data, shape, { dtype: t.dtype, device: 'cpu' });
    owned.push(x);
    return x;
  };
  try {
    const std = t.qkStd ?? 1;
    const q = make(randn(b * sq * hq * d, rng, std), qShape);
    const k = make(randn(b * sk * hkv * d, rng, std), kShape);
    const v = make(randn(b * sk * hkv * d, rng), kShape);
    const dout = make(randn(b * sq * hq * d, rng), qShape);
    const opts = { causal, ...feature, ...(t.scale === undefined ? {} : { softmaxScale: t.scale }) };
    const fwd = flashAttention(q, k, v, opts);
    owned.push(fwd.out, fwd.lse);
    const grads = flashAttentionBackward(dout, q, k, v, fwd.out, fwd.lse, opts);
    owned.push(grads.dq, grads.dk, grads.dv);

    const [qv, kv, vv, gv] = await Promise.all([q, k, v, dout].map((x) => x.toFloat32Array()));
    const got: FeatureOutputs = {
      out: await fwd.out.toFloat32Array(),
      lse: await fwd.lse.toFloat32Array(),
      dq: await grads.dq.toFloat32Array(),
      dk: await grads.dk.toFloat32Array(),
      dv: await grads.dv.toFloat32Array(),
    };
    const shapes = {
      out: { shape: qShape, dims: ['b', 's', 'h', 'd'] },
      lse: { shape: [b, hq, sq], dims: ['b', 'h', 's'] },
      dq: { shape: qShape, dims: ['b', 's', 'h', 'd'] },
      dk: { shape: kShape, dims: ['b', 's', 'h', 'd'] },
      dv: { shape: kShape, dims: ['b', 's', 'h', 'd'] },
    };
    const names = Object.keys(got) as (keyof FeatureOutputs)[];
    for (const n of names) expectAllWritten(got[n], n, shapes[n]);

    const scale = t.scale ?? 1 / Math.sqrt(d);
    const refOpts: ReferenceOptions = { causal, ...feature, softmaxScale: scale };
    const shape = { batch: b, seqlenQ: sq, seqlenK: sk, headsQ: hq, headsKV: hkv, headDim: d };
    const ref = referenceAttentionBackward(gv, qv, kv, vv, shape, refOpts);
    const same = referenceAttentionBackward(gv, qv, kv, vv, shape, { ...refOpts, precision: t.dtype });
    const slack = outDifferenceSlack(
      { b, sq, sk, hq, hkv, d, causal, scale, ...slackShape }, { q: qv, k: kv, v: vv, dout: gv, out: got.out }, same.out,
    );
    for (const n of names) {
      const report = expectFlashRule({
        actual: got[n],
        reference: ref[n],
        samePrecision: same[n],
        factor: n === 'out' || n === 'lse' ? 2 : 3,
        atol: ATOL + (n === 'dq' || n === 'dk' || n === 'dv' ? slack[n] : 0),
        name: `${n} (${t.name})`,
        ...shapes[n],
      });
      if (REPORT) console.log(`${n} (${t.name}): ${(report.maxErr / report.bound).toFixed(2)} of the bound`);
    }
    return got;
  } finally {
    for (const x of owned) x.dispose();
  }
}

/** A [1, 2, 1, 8] float32 tensor of 0.5s on the CPU, for the validation tests. */
function tinyCpuTensor(): Tensor {
  return Tensor.fromFloat32Array(new Float32Array(2 * 8).fill(0.5), [1, 2, 1, 8], { device: 'cpu' });
}

/** flashAttention with options { [key]: value } on a tiny CPU tensor throws `type` with `message`. */
export function expectApiRefuses(key: string, value: unknown, type: ErrorConstructor, message: RegExp): void {
  const x = tinyCpuTensor();
  try {
    const call = (): unknown => flashAttention(x, x, x, { [key]: value });
    expect(call).toThrow(type);
    expect(call).toThrow(message);
  } finally {
    x.dispose();
  }
}

/**
 * The raw binding's attentionForward on a tiny CPU tensor refuses each of `bad` ([value of `key`, the
 * message it must throw]) and runs with `good` (the flash kernel).
 */
export function expectBindingRefuses(key: string, bad: readonly (readonly [unknown, RegExp])[], good: unknown): void {
  const x = tinyCpuTensor();
  const h = storageOf(x, 'x');
  const args = (value: unknown): Record<string, unknown> => ({
    q: h, k: h, v: h, dims: [1, 2, 2, 1, 1, 8], causal: false,
    softmaxScale: 0.25, [key]: value, kernel: KERNEL_CODE.auto, float32Precision: FLOAT32_PRECISION_CODE.tf32,
  });
  try {
    const forward = binding().attentionForward as unknown as (a: Record<string, unknown>) => unknown;
    for (const [value, message] of bad) expect(() => forward(args(value))).toThrow(message);
    const ok = forward(args(good)) as unknown[];
    expect(ok).toHaveLength(4);
    expect(ok[2]).toBe('flash');
    wrapNative(ok[0] as NativeBuffer, [1, 2, 1, 8], 'float32', 'cpu').dispose();
    wrapNative(ok[1] as NativeBuffer, [1, 1, 2], 'float32', 'cpu').dispose();
  } finally {
    x.dispose();
  }
}

/**
 * flashAttentionWithGrad with `opts` gives the bits of flashAttention + flashAttentionBackward with
 * them, and the backward without the feature (`plainOpts`) gives other gradients, so that the check
 * can fail. bf16 CPU tensors [1, 77, 2, 24] of spread `std`.
 */
export async function expectContextKeepsFeature(seed: string, opts: object, plainOpts: object, std = 1): Promise<void> {
  const rng = rngFor(seed);
  const shape = [1, 77, 2, 24];
  const [q, k, v, dout] = [0, 1, 2, 3].map(() =>
    Tensor.fromFloat32Array(randn(77 * 2 * 24, rng, std), shape, { dtype: 'bfloat16', device: 'cpu' }));
  const fwd = flashAttention(q, k, v, opts);
  const grads = flashAttentionBackward(dout, q, k, v, fwd.out, fwd.lse, opts);
  const ctx = flashAttentionWithGrad(q, k, v, opts);
  const ctxGrads = ctx.backward(dout);
  const plain = flashAttentionBackward(dout, q, k, v, fwd.out, fwd.lse, plainOpts);
  try {
    expect(await ctx.out.toFloat32Array()).toEqual(await fwd.out.toFloat32Array());
    for (const n of ['dq', 'dk', 'dv'] as const) {
      expect(await ctxGrads[n].toFloat32Array()).toEqual(await grads[n].toFloat32Array());
    }
    expect(await plain.dq.toFloat32Array()).not.toEqual(await grads.dq.toFloat32Array());
  } finally {
    ctx.dispose();
    for (const x of [q, k, v, dout, ctx.out, ctx.lse, fwd.out, fwd.lse, grads.dq, grads.dk, grads.dv, ctxGrads.dq, ctxGrads.dk,
      ctxGrads.dv, plain.dq, plain.dk, plain.dv]) x.dispose();
  }
}

/** What `withFeatureRuns` hands its body: [out, lse, dq, dk, dv] of one call with `opts`. */
export type FeatureRun = (opts: object) => Promise<Float32Array[]>;

/**
 * Runs `body` with a `run(opts)` that calls flashAttention and flashAttentionBackward on fixed random
 * float32 CPU tensors of `shape` ([batch, seqlen, heads, headDim] for q, k, v and dout) and returns
 * their outputs; every tensor is disposed afterwards. For bit-identity checks between options.
 */
export async function withFeatureRuns(seed: string, shape: number[], body: (run: FeatureRun) => Promise<void>): Promise<void> {
  const rng = rngFor(seed);
  const n = shape.reduce((a, x) => a * x, 1);
  const [q, k, v, dout] = [0, 1, 2, 3].map(() => Tensor.fromFloat32Array(randn(n, rng), shape, { device: 'cpu' }));
  const owned: Tensor[] = [q, k, v, dout];
  try {
    await body(async (opts) => {
      const f = flashAttention(q, k, v, opts);
      const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse, opts);
      owned.push(f.out, f.lse, g.dq, g.dk, g.dv);
      return Promise.all([f.out, f.lse, g.dq, g.dk, g.dv].map((x) => x.toFloat32Array()));
    });
  } finally {
    for (const x of owned) x.dispose();
  }
}
