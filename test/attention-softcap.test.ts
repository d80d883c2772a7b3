/**
 * Softcapping (`options.softcap`): the CPU backend's forward and backward against the float64
 * reference (lib/reference.ts, which defines the softcap) with the flash-attention rule
 * (helpers/feature.ts, helpers/tolerance.ts): max|kernel − f64 reference| ≤ factor · max|same-precision reference − f64
 * reference| + atol, factor 2 for out and lse, 3 for dq, dk, dv. The references take the values
 * actually stored (rounded to the dtype). Every output starts as NaN and is checked to be written.
 * Then the options' validation at the API and at the raw binding, and the refusal on CUDA tensors.
 */

import { flashAttention, flashAttentionBackward, Tensor } from '../lib';
import { describeCuda, trackMemory, usePoisonedOutputs } from './helpers/backend';
import {
  expectApiRefuses, expectBindingRefuses, expectContextKeepsFeature, expectFeatureMatchesReference, FeatureCase,
} from './helpers/feature';
import { randn, rngFor } from './helpers/random';

trackMemory();
usePoisonedOutputs();

/** One softcap case: the cap on top of the common case fields. */
interface Case extends FeatureCase {
  softcap: number;
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

describe('softcap: the CPU backend against the float64 reference', () => {
  test.each(CASES.map((t) => [t.name, t] as const))('%s', async (_name, t) => {
    const [, sq, sk, hq, , d] = t.dims;
    const got = await expectFeatureMatchesReference('softcap', t, { softcap: t.softcap });
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
    await expectContextKeepsFeature('softcap with grad', { causal: true, softcap: 3 }, { causal: true }, 2);
  });
});

describe('softcap: validation', () => {
  test.each([
    ['a string', '5', TypeError, /options\.softcap to be a number/],
    ['negative', -1, RangeError, /options\.softcap to be a finite number >= 0/],
    ['NaN', NaN, RangeError, /options\.softcap to be a finite number >= 0/],
    ['Infinity', Infinity, RangeError, /options\.softcap to be a finite number >= 0/],
    ['beyond float32', 1e39, RangeError, /that float32 holds/],
    ['below float32', 1e-50, RangeError, /that float32 holds/],
  ] as const)('the API refuses a softcap that is %s', (_what, value, type, message) => {
    expectApiRefuses('softcap', value, type, message);
  });

  test('the raw binding refuses a bad softcap, naming it, and runs a good one', () => {
    expectBindingRefuses('softcap', [
      ['5', /softcap/],
      [-2, /Expected softcap to be a finite number >= 0/],
      [NaN, /Expected softcap to be a finite number >= 0/],
    ], 3);
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
