/**
 * Sliding window (`options.window`): the CPU backend's forward and backward against the float64
 * reference (lib/reference.ts defines the window) with the flash-attention rule
 * (helpers/feature.ts, helpers/tolerance.ts): max|kernel − f64 reference| ≤ factor · max|same-precision reference − f64
 * reference| + atol, factor 2 for out and lse, 3 for dq, dk, dv. The references take the values
 * actually stored (rounded to the dtype). Every output starts as NaN and is checked to be written;
 * rows whose window holds no key must give out 0, lse +Infinity and dq 0. Then the options'
 * validation at the API and at the raw binding, and the refusal on CUDA tensors.
 */

import { flashAttention, flashAttentionBackward, Tensor } from '../lib';
import { describeCuda, trackMemory, usePoisonedOutputs } from './helpers/backend';
import { firstVisibleKey, visibleKeys } from './helpers/backward';
import {
  expectApiRefuses, expectBindingRefuses, expectContextKeepsFeature, expectFeatureMatchesReference, FeatureCase,
  withFeatureRuns,
} from './helpers/feature';

trackMemory();
usePoisonedOutputs();

/** One window case: the window on top of the common case fields. */
interface Case extends FeatureCase {
  window: [number, number];
}

// The CPU kernels tile by 64 rows and 64 keys: windows narrower and wider than a tile, one-sided
// windows, a window of 0 (each row sees one key), windows past the ends (rows that see no key),
// windows wider than the sequence, causal (the right side bounded at 0), GQA, every dtype.
const CASES: Case[] = [
  { name: '[16, 8], 97x203, d64, fp32, H2', dims: [1, 97, 203, 2, 2, 64], dtype: 'float32', window: [16, 8] },
  { name: '[40, -1] causal, 300x250 (50 empty rows), d64, bf16, GQA 2:1', dims: [1, 300, 250, 4, 2, 64], dtype: 'bfloat16', window: [40, -1], causal: true },
  { name: '[0, 0] (one key a row), 130x130, d32, fp16', dims: [1, 130, 130, 1, 1, 32], dtype: 'float16', window: [0, 0] },
  { name: '[-1, 5], 70x300, d128, fp32, B2', dims: [2, 70, 300, 1, 1, 128], dtype: 'float32', window: [-1, 5] },
  { name: '[3, 7] causal, 300x70 (the rows before 227 see no key), d16, bf16', dims: [1, 300, 70, 2, 2, 16], dtype: 'bfloat16', window: [3, 7], causal: true },
  { name: '[0, -1] (keys from the diagonal on), 129x127, d80, bf16', dims: [1, 129, 127, 1, 1, 80], dtype: 'bfloat16', window: [0, -1] },
  { name: '[-1, 2], 100x20 (78 empty rows), d8, fp16, H3', dims: [1, 100, 20, 3, 3, 8], dtype: 'float16', window: [-1, 2] },
  { name: '[200, 64], 257x257, d256, fp32', dims: [1, 257, 257, 1, 1, 256], dtype: 'float32', window: [200, 64] },
];

describe('sliding window: the CPU backend against the float64 reference', () => {
  test.each(CASES.map((t) => [t.name, t] as const))('%s', async (_name, t) => {
    const [b, sq, sk, hq, hkv, d] = t.dims;
    // The slack's float64 rows take the window too (a row's softmax renormalizes over its window).
    const fs = { b, sq, sk, hq, hkv, d, causal: t.causal ?? false, window: t.window };
    const got = await expectFeatureMatchesReference('window', t, { window: t.window }, { window: t.window });
    // Rows whose window holds no key: out 0, lse +Infinity, dq 0. The cases named so have some.
    let empty = 0;
    for (let i = 0; i < sq; i++) {
      if (firstVisibleKey(fs, i) < visibleKeys(fs, i)) continue;
      ++empty;
      for (let bb = 0; bb < b; bb++) {
        for (let h = 0; h < hq; h++) {
          expect(got.lse[(bb * hq + h) * sq + i]).toBe(Infinity);
          for (let c = 0; c < d; c++) {
            expect(got.out[((bb * sq + i) * hq + h) * d + c]).toBe(0);
            expect(got.dq[((bb * sq + i) * hq + h) * d + c]).toBe(0);
          }
        }
      }
    }
    if (t.name.includes('empty') || t.name.includes('see no key')) expect(empty).toBeGreaterThan(0);
  });

  test('a window wider than the sequence, or [-1, -1], is no window: the same bits as without it', async () => {
    await withFeatureRuns('window wide', [2, 150, 2, 32], async (run) => {
      for (const causal of [false, true]) {
        const plain = await run({ causal });
        expect(await run({ causal, window: [-1, -1] })).toEqual(plain);
        expect(await run({ causal, window: [150, 150] })).toEqual(plain);
        // A window one key narrower does change the result (the checks above can fail).
        expect((await run({ causal, window: [148, 148] }))[0]).not.toEqual(plain[0]);
      }
    });
  });
});

describe('sliding window through flashAttentionWithGrad, on the CPU backend', () => {
  test('the context keeps the window: the same bits as flashAttention + flashAttentionBackward', async () => {
    await expectContextKeepsFeature('window with grad', { window: [9, 3] }, {});
  });
});

describe('sliding window: validation', () => {
  test.each([
    ['not an array', 5, TypeError, /options\.window to be \[left, right\]/],
    ['of 3 elements', [1, 2, 3], TypeError, /options\.window to be \[left, right\]/],
    ['with a string', ['1', 2], TypeError, /an element '1'|an element "1"|an element a string/],
    ['below -1', [-2, 0], RangeError, /integers >= -1.*\[-2, 0\]/],
    ['fractional', [1.5, 0], RangeError, /integers >= -1/],
    ['NaN', [0, NaN], RangeError, /integers >= -1/],
    ['beyond 2^53', [0, 2 ** 53], RangeError, /integers >= -1/],
  ] as const)('the API refuses a window %s', (_what, value, type, message) => {
    expectApiRefuses('window', value, type, message);
  });

  test('the raw binding refuses a bad window, naming it, and runs a good one', () => {
    expectBindingRefuses('window', [
      [3, /Expected window to be an Array of 2 \[left, right\]/],
      [[0], /Expected window to be an Array of 2/],
      [[-2, 0], /Expected window\[0\] \(left\) to be an integer in \[-1, /],
      [[0, 0.5], /Expected window\[1\] \(right\) to be an integer/],
      [[0, 'a'], /Expected window\[1\] \(right\) to be an integer/],
    ], [0, 0]);
  });
});

describeCuda('sliding window: refused on CUDA tensors (the CUDA kernels do not take it yet)', () => {
  test('flashAttention and flashAttentionBackward refuse a bounded window on CUDA, naming it, and take [-1, -1]', () => {
    const x = Tensor.fromFloat32Array(new Float32Array(2 * 8).fill(0.5), [1, 2, 1, 8], { device: 'cuda' });
    const lse = Tensor.fromFloat32Array(new Float32Array(2), [1, 1, 2], { device: 'cuda' });
    try {
      expect(() => flashAttention(x, x, x, { window: [4, -1] })).toThrow(RangeError);
      expect(() => flashAttention(x, x, x, { window: [4, -1] })).toThrow(/options\.window to be \[-1, -1\] for cuda tensors/);
      expect(() => flashAttentionBackward(x, x, x, x, x, lse, { window: [-1, 0] })).toThrow(/options\.window/);
      const r = flashAttention(x, x, x, { window: [-1, -1] });
      r.out.dispose();
      r.lse.dispose();
    } finally {
      lse.dispose();
      x.dispose();
    }
  });
});
