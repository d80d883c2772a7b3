/**
 * Softcapping (`options.softcap`): the CPU backend's forward and backward against the float64
 * reference (lib/reference.ts, which defines the softcap) with the flash-attention rule
 * (helpers/tolerance.ts): max|kernel − f64 reference| ≤ factor · max|same-precision reference − f64
 * reference| + atol, factor 2 for out and lse, 3 for dq, dk, dv. The references take the values
 * actually stored (rounded to the dtype). Every output starts as NaN and is checked to be written.
 * Then the options' validation at the API and at the raw binding, and the refusal on CUDA tensors.
 */

import {
  DType, flashAttention, flashAttentionBackward, flashAttentionWithGrad, referenceAttentionBackward, ReferenceShape, Tensor,
} from '../lib';
import { binding, FLOAT32_PRECISION_CODE, KERNEL_CODE, NativeBuffer } from '../lib/native';
import { storageOf, wrapNative } from '../lib/tensor';
import { describeCuda, trackMemory, usePoisonedOutputs } from './helpers/backend';
import { outDifferenceSlack } from './helpers/backward';
import { randn, rngFor } from './helpers/random';
import { expectAllWritten, expectFlashRule } from './helpers/tolerance';

trackMemory();
usePoisonedOutputs();

/** One softcap case: [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim], the dtype, the cap. */
interface Case {
  name: string;
  dims: [number, number, number, number, number, number];
  dtype: DType;
  softcap: number;
  causal?: boolean;
  scale?: number;
  /** Standard deviation of q and k: large values saturate the tanh. */
  qkStd?: number;
}

// The CPU kernels tile by 64 rows and 64 keys: lengths on both sides of the tile edges, empty causal
// rows (seqlenQ > seqlenK), GQA, every dtype, caps from saturating (0.5 with scores of ~±20) to barely
// active (1e4).
const CASES: Case[] = [
  { name: 'cap 30, 97x97, d64, fp32, H2', dims: [1, 97, 97, 2, 2, 64], dtype: 'float32', softcap: 30 },
  { name: 'cap 5 causal, 129x127, d80, bf16', dims: [1, 129, 127, 1, 1, 80], dtype: 'bfloat16', softcap: 5, causal: true },
  { name: 'cap 2, 65x203, d128, fp16, B2', dims: [2, 65, 203, 1, 1, 128], dtype: 'float16', softcap: 2 },
  {
    name: 'cap 0.5 saturated (|s| ~ 20) causal, 203x113 (90 empty rows), d64, fp32, GQA 4:1',
    dims: [1, 203, 113, 4, 1, 64], dtype: 'float32', softcap: 0.5, causal: true, qkStd: 2.5,
  },
  { name: 'cap 1e4 (barely active), 17x33, d8, bf16, H3', dims: [1, 17, 33, 3, 3, 8], dtype: 'bfloat16', softcap: 1e4 },
  { name: 'cap 10, softmaxScale 0.5, 1x239, d256, fp32, B2', dims: [2, 1, 239, 1, 1, 256], dtype: 'float32', softcap: 10, scale: 0.5 },
];

const ATOL = 1e-5;
/** FA_TEST_REPORT=1 prints each output's error as a fraction of the rule's bound. */
const REPORT = process.env.FA_TEST_REPORT === '1';

function shapeOf(t: Case): ReferenceShape {
  const [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim] = t.dims;
  return { batch, seqlenQ, seqlenK, headsQ, headsKV, headDim };
}

describe('softcap: the CPU backend against the float64 reference', () => {
  test.each(CASES.map((t) => [t.name, t] as const))('%s', async (_name, t) => {
    const [b, sq, sk, hq, hkv, d] = t.dims;
    const rng = rngFor(`softcap ${t.name}`);
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
      const opts = { causal: t.causal ?? false, softcap: t.softcap, ...(t.scale === undefined ? {} : { softmaxScale: t.scale }) };
      const fwd = flashAttention(q, k, v, opts);
      owned.push(fwd.out, fwd.lse);
      const grads = flashAttentionBackward(dout, q, k, v, fwd.out, fwd.lse, opts);
      owned.push(grads.dq, grads.dk, grads.dv);

      const [qv, kv, vv, gv] = await Promise.all([q, k, v, dout].map((x) => x.toFloat32Array()));
      const got = {
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
      const names = Object.keys(got) as (keyof typeof got)[];
      for (const n of names) expectAllWritten(got[n], n, shapes[n]);

      const refOpts = { causal: t.causal ?? false, softcap: t.softcap, softmaxScale: t.scale ?? 1 / Math.sqrt(d) };
      const ref = referenceAttentionBackward(gv, qv, kv, vv, shapeOf(t), refOpts);
      const same = referenceAttentionBackward(gv, qv, kv, vv, shapeOf(t), { ...refOpts, precision: t.dtype });
      // D = dout·out uses the kernel's out: its ulp differences from the same-precision out move dS
      // (helpers/backward.ts). The slack weighs them with the uncapped softmax, an upper bound here
      // up to the rows' different P: the tanh's factor 1 − t² ≤ 1 only shrinks dS.
      const slack = outDifferenceSlack(
        { b, sq, sk, hq, hkv, d, causal: t.causal ?? false, scale: refOpts.softmaxScale },
        { q: qv, k: kv, v: vv, dout: gv, out: got.out }, same.out,
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
      // The empty causal rows: out 0, lse +Infinity, dq 0.
      if (t.causal && sq > sk) {
        for (let h = 0; h < hq; h++) {
          for (let i = 0; i < sq - sk; i++) {
            expect(got.lse[h * sq + i]).toBe(Infinity);
            for (let c = 0; c < d; c++) {
              expect(got.out[(i * hq + h) * d + c]).toBe(0);
              expect(got.dq[(i * hq + h) * d + c]).toBe(0);
            }
          }
        }
      }
    } finally {
      for (const x of owned) x.dispose();
    }
  });

  test('softcap 0 is no softcap: the same bits as without the option', async () => {
    const rng = rngFor('softcap zero');
    const q = Tensor.fromFloat32Array(randn(2 * 70 * 2 * 32, rng), [2, 70, 2, 32], { device: 'cpu' });
    const k = Tensor.fromFloat32Array(randn(2 * 70 * 2 * 32, rng), [2, 70, 2, 32], { device: 'cpu' });
    const v = Tensor.fromFloat32Array(randn(2 * 70 * 2 * 32, rng), [2, 70, 2, 32], { device: 'cpu' });
    const plain = flashAttention(q, k, v, { causal: true });
    const zero = flashAttention(q, k, v, { causal: true, softcap: 0 });
    const capped = flashAttention(q, k, v, { causal: true, softcap: 1 });
    try {
      expect(await zero.out.toFloat32Array()).toEqual(await plain.out.toFloat32Array());
      expect(await zero.lse.toFloat32Array()).toEqual(await plain.lse.toFloat32Array());
      // A cap of 1 on unit-normal scores does change the result (the check above can fail).
      expect(await capped.out.toFloat32Array()).not.toEqual(await plain.out.toFloat32Array());
    } finally {
      for (const x of [q, k, v, plain.out, plain.lse, zero.out, zero.lse, capped.out, capped.lse]) x.dispose();
    }
  });
});

describe('softcap through flashAttentionWithGrad, on the CPU backend', () => {
  test('the context keeps the softcap: the same bits as flashAttention + flashAttentionBackward', async () => {
    const rng = rngFor('softcap with grad');
    const shape = [1, 77, 2, 24];
    const [q, k, v, dout] = [0, 1, 2, 3].map(() => Tensor.fromFloat32Array(randn(77 * 2 * 24, rng, 2), shape, { dtype: 'bfloat16', device: 'cpu' }));
    const opts = { causal: true, softcap: 3 };
    const fwd = flashAttention(q, k, v, opts);
    const grads = flashAttentionBackward(dout, q, k, v, fwd.out, fwd.lse, opts);
    const ctx = flashAttentionWithGrad(q, k, v, opts);
    const ctxGrads = ctx.backward(dout);
    const plain = flashAttentionBackward(dout, q, k, v, fwd.out, fwd.lse, { causal: true });
    try {
      expect(await ctx.out.toFloat32Array()).toEqual(await fwd.out.toFloat32Array());
      for (const n of ['dq', 'dk', 'dv'] as const) {
        expect(await ctxGrads[n].toFloat32Array()).toEqual(await grads[n].toFloat32Array());
      }
      // Without the softcap the gradients differ (the check above can fail).
      expect(await plain.dq.toFloat32Array()).not.toEqual(await grads.dq.toFloat32Array());
    } finally {
      ctx.dispose();
      for (const x of [q, k, v, dout, ctx.out, ctx.lse, fwd.out, fwd.lse, grads.dq, grads.dk, grads.dv, ctxGrads.dq, ctxGrads.dk, ctxGrads.dv,
        plain.dq, plain.dk, plain.dv]) x.dispose();
    }
  });
});

describe('softcap: validation', () => {
  const q = (): Tensor => Tensor.fromFloat32Array(new Float32Array(2 * 8).fill(0.5), [1, 2, 1, 8], { device: 'cpu' });

  test.each([
    ['a string', '5', TypeError, /options\.softcap to be a number/],
    ['negative', -1, RangeError, /options\.softcap to be a finite number >= 0/],
    ['NaN', NaN, RangeError, /options\.softcap to be a finite number >= 0/],
    ['Infinity', Infinity, RangeError, /options\.softcap to be a finite number >= 0/],
    ['beyond float32', 1e39, RangeError, /that float32 holds/],
    ['below float32', 1e-50, RangeError, /that float32 holds/],
  ] as const)('the API refuses a softcap that is %s', (_what, value, type, message) => {
    const x = q();
    try {
      const call = (): unknown => flashAttention(x, x, x, { softcap: value as unknown as number });
      expect(call).toThrow(type);
      expect(call).toThrow(message);
    } finally {
      x.dispose();
    }
  });

  test('the raw binding refuses a bad softcap, naming it, and runs a good one', () => {
    const x = q();
    const h = storageOf(x, 'x');
    const args = (softcap: unknown): Record<string, unknown> => ({
      q: h, k: h, v: h, dims: [1, 2, 2, 1, 1, 8], causal: false,
      softmaxScale: 0.25, softcap, kernel: KERNEL_CODE.auto, float32Precision: FLOAT32_PRECISION_CODE.tf32,
    });
    try {
      const forward = binding().attentionForward as unknown as (a: Record<string, unknown>) => unknown;
      expect(() => forward(args('5'))).toThrow(/softcap/);
      expect(() => forward(args(-2))).toThrow(/Expected softcap to be a finite number >= 0/);
      expect(() => forward(args(NaN))).toThrow(/Expected softcap to be a finite number >= 0/);
      const ok = forward(args(3)) as unknown[];
      expect(ok).toHaveLength(4);
      expect(ok[2]).toBe('flash');
      wrapNative(ok[0] as NativeBuffer, [1, 2, 1, 8], 'float32', 'cpu').dispose();
      wrapNative(ok[1] as NativeBuffer, [1, 1, 2], 'float32', 'cpu').dispose();
    } finally {
      x.dispose();
    }
  });
});

describeCuda('softcap: refused on CUDA tensors (the CUDA kernels do not take it yet)', () => {
  test('flashAttention and flashAttentionBackward refuse softcap > 0 on CUDA, naming it', () => {
    const x = Tensor.fromFloat32Array(new Float32Array(2 * 8).fill(0.5), [1, 2, 1, 8], { device: 'cuda' });
    try {
      expect(() => flashAttention(x, x, x, { softcap: 5 })).toThrow(RangeError);
      expect(() => flashAttention(x, x, x, { softcap: 5 })).toThrow(/options\.softcap to be 0 for cuda tensors/);
      const lse = Tensor.fromFloat32Array(new Float32Array(2), [1, 1, 2], { device: 'cuda' });
      try {
        expect(() => flashAttentionBackward(x, x, x, x, x, lse, { softcap: 5 })).toThrow(/options\.softcap/);
      } finally {
        lse.dispose();
      }
    } finally {
      x.dispose();
    }
  });
});
