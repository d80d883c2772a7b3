/**
 * ALiBi (`options.alibiSlopes`): the CPU backend's forward and backward against the float64 reference
 * (lib/reference.ts defines the bias: −slope · |i + seqlenK − seqlenQ − j| after the softcap) with the
 * flash-attention rule (helpers/feature.ts, helpers/tolerance.ts): max|kernel − f64 reference| ≤
 * factor · max|same-precision reference − f64 reference| + atol, factor 2 for out and lse, 3 for dq,
 * dk, dv. Every output starts as NaN and is checked to be written. Then the options' validation at
 * the API and at the raw binding, and the refusal on CUDA tensors.
 */

import { flashAttention, flashAttentionBackward, Tensor } from '../lib';
import { describeCuda, trackMemory, usePoisonedOutputs } from './helpers/backend';
import {
  expectApiRefuses, expectBindingRefuses, expectContextKeepsFeature, expectFeatureMatchesReference, FeatureCase,
  withFeatureRuns,
} from './helpers/feature';
import { randn, rngFor } from './helpers/random';

trackMemory();
usePoisonedOutputs();

/** ALiBi's usual slopes for `heads` heads: 2^(−8 (h + 1) / heads). */
function geometricSlopes(heads: number): number[] {
  return Array.from({ length: heads }, (_, h) => 2 ** ((-8 * (h + 1)) / heads));
}

/** One ALiBi case: the slopes (and the window and softcap it composes with) on top of the common fields. */
interface Case extends FeatureCase {
  slopes: number[];
  window?: [number, number];
  softcap?: number;
}

// Per-head and per-batch-and-head slopes, tile edges (64 rows and keys), cross lengths, empty causal
// rows, GQA, every dtype, slopes that dominate the scores (4 per key) and negative ones, composed
// with the window and the softcap.
const CASES: Case[] = [
  { name: 'per head, 97x203, d64, fp32, H4', dims: [1, 97, 203, 4, 4, 64], dtype: 'float32', slopes: geometricSlopes(4) },
  {
    name: 'per batch and head, causal, 129x127, d80, bf16, B2 H2', dims: [2, 129, 127, 2, 2, 80], dtype: 'bfloat16',
    slopes: [0.5, 0.25, 0.125, 0.0625], causal: true,
  },
  {
    name: 'with window [32, 16] and softcap 5, 200x200, d32, fp16, GQA 4:1', dims: [1, 200, 200, 4, 1, 32], dtype: 'float16',
    slopes: geometricSlopes(4), window: [32, 16], softcap: 5,
  },
  { name: 'slope 4 (the bias dominates), 65x65, d16, fp32', dims: [1, 65, 65, 1, 1, 16], dtype: 'float32', slopes: [4] },
  { name: 'negative and zero slopes, 70x300, d128, bf16, H3', dims: [1, 70, 300, 3, 3, 128], dtype: 'bfloat16', slopes: [-0.05, 0, 0.3] },
  {
    name: 'causal, 203x113 (90 empty rows), d64, fp32, GQA 2:1, B2', dims: [2, 203, 113, 2, 1, 64], dtype: 'float32',
    slopes: geometricSlopes(2), causal: true,
  },
];

describe('ALiBi: the CPU backend against the float64 reference', () => {
  test.each(CASES.map((t) => [t.name, t] as const))('%s', async (_name, t) => {
    const [, sq, sk, hq, , d] = t.dims;
    const feature = {
      alibiSlopes: t.slopes,
      ...(t.window === undefined ? {} : { window: t.window }),
      ...(t.softcap === undefined ? {} : { softcap: t.softcap }),
    };
    const got = await expectFeatureMatchesReference('alibi', t, feature, { alibi: t.slopes, window: t.window, softcap: t.softcap });
    // Empty causal rows stay empty: out 0, lse +Infinity.
    if (t.causal && sq > sk) {
      for (let h = 0; h < hq; h++) {
        for (let i = 0; i < sq - sk; i++) {
          expect(got.lse[h * sq + i]).toBe(Infinity);
          for (let c = 0; c < d; c++) expect(got.out[(i * hq + h) * d + c]).toBe(0);
        }
      }
    }
  });

  test('all-zero slopes are no ALiBi: the same bits as without the option', async () => {
    await withFeatureRuns('alibi zero', [2, 90, 2, 32], async (run) => {
      const plain = await run({ causal: true });
      expect(await run({ causal: true, alibiSlopes: [0, 0] })).toEqual(plain);
      expect(await run({ causal: true, alibiSlopes: new Float32Array(4) })).toEqual(plain);
      // A small slope does change the result (the checks above can fail).
      expect((await run({ causal: true, alibiSlopes: [0, 1e-3] }))[0]).not.toEqual(plain[0]);
    });
  });

  test('per-head slopes equal the same slopes given per batch and head', async () => {
    const rng = rngFor('alibi broadcast');
    const shape = [3, 40, 2, 16];
    const [q, k, v] = [0, 1, 2].map(() => Tensor.fromFloat32Array(randn(3 * 40 * 2 * 16, rng), shape, { device: 'cpu' }));
    const a = flashAttention(q, k, v, { alibiSlopes: [0.3, 0.1] });
    const b = flashAttention(q, k, v, { alibiSlopes: [0.3, 0.1, 0.3, 0.1, 0.3, 0.1] });
    const c = flashAttention(q, k, v, { alibiSlopes: [0.3, 0.1, 0.3, 0.1, 0.1, 0.3] });
    try {
      expect(await b.out.toFloat32Array()).toEqual(await a.out.toFloat32Array());
      // The third batch's slopes swapped: its rows differ (the check above can fail).
      expect(await c.out.toFloat32Array()).not.toEqual(await a.out.toFloat32Array());
    } finally {
      for (const x of [q, k, v, a.out, a.lse, b.out, b.lse, c.out, c.lse]) x.dispose();
    }
  });
});

describe('ALiBi through flashAttentionWithGrad, on the CPU backend', () => {
  test('the context keeps the slopes: the same bits as flashAttention + flashAttentionBackward', async () => {
    await expectContextKeepsFeature('alibi with grad', { alibiSlopes: [0.5, 0.125] }, {});
  });
});

describe('ALiBi: validation', () => {
  test.each([
    ['not an array', 0.5, TypeError, /options\.alibiSlopes to be a Float32Array or an Array of finite numbers/],
    ['a Float64Array', new Float64Array(1), TypeError, /options\.alibiSlopes to be a Float32Array/],
    ['with a string', ['0.5'], TypeError, /element 0/],
    ['with NaN', [NaN], RangeError, /element 0 NaN/],
    ['beyond float32', [1e39], RangeError, /that float32 holds/],
    ['of the wrong length', [0.5, 0.5, 0.5], RangeError, /options\.alibiSlopes to hold headsQ \(1\) or batch \* headsQ \(1\) slopes but received 3/],
  ] as const)('the API refuses slopes %s', (_what, value, type, message) => {
    expectApiRefuses('alibiSlopes', value, type, message);
  });

  test('the raw binding refuses bad slopes, naming them, and runs good ones', () => {
    expectBindingRefuses('alibiSlopes', [
      [0.5, /Expected alibiSlopes to be a Float32Array or an Array/],
      [[0.5, 0.5], /headsQ or batch \* headsQ finite numbers \(1 or 1\) but received 2 of them/],
      [['a'], /but element 0 is/],
      [[Infinity], /but element 0 is inf/],
      [new Float32Array(2), /received 2 of them/],
    ], new Float32Array([0.25]));
  });
});

describeCuda('ALiBi: refused on CUDA tensors (the CUDA kernels do not take it yet)', () => {
  test('flashAttention and flashAttentionBackward refuse slopes on CUDA, naming them', () => {
    const x = Tensor.fromFloat32Array(new Float32Array(2 * 8).fill(0.5), [1, 2, 1, 8], { device: 'cuda' });
    const lse = Tensor.fromFloat32Array(new Float32Array(2), [1, 1, 2], { device: 'cuda' });
    try {
      expect(() => flashAttention(x, x, x, { alibiSlopes: [0.5] })).toThrow(RangeError);
      expect(() => flashAttention(x, x, x, { alibiSlopes: [0.5] })).toThrow(/options\.alibiSlopes to be undefined for cuda tensors/);
      expect(() => flashAttentionBackward(x, x, x, x, x, lse, { alibiSlopes: [0.5] })).toThrow(/options\.alibiSlopes/);
    } finally {
      lse.dispose();
      x.dispose();
    }
  });
});
