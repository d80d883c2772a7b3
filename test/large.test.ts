/**
 * Sizes past 32 bits (issue 6): tensors of more than 2^31 elements must work, with no index
 * arithmetic wrapping around, or be refused with a clear error (test/validation.test.ts has the
 * refusals: seqlens and heads above 2^31 − 1, more than 2^60 elements).
 *
 * CUDA (the CPU backend would need minutes for these sizes): q is [1, 64, 2^22 + 8, 8] bf16 zeros
 * (2^31 + 4096 elements, 4 GiB, made on the device by Tensor.zeros), k and v are small random
 * [1, 64, 8, 8] (GQA (2^19 + 1):1), causal. With q = 0 every score is 0, so row i of head h is the
 * mean of v rows 0..i of kv head h / group, and lse = ln(i + 1): each output depends on where it is.
 * Rows are read with ranged reads at the first heads and at the last ones, whose elements lie past
 * 2^31; a wrapped offset would read or write another head's rows. The backward with dout = 0 must
 * give all-zero, finite gradients (the same offsets in the other direction, and no fault).
 */

import { flashAttention, flashAttentionBackward, Tensor } from '../lib';
import { describeCuda, synchronizeAll, trackMemory } from './helpers/backend';
import { randn, rngFor } from './helpers/random';

trackMemory();

const S = 64;
const D = 8;
const HQ = 2 ** 22 + 8;
const HKV = 8;
const GROUP = HQ / HKV;

describeCuda('more than 2^31 elements', () => {
  test(`q, out and dq of ${S * HQ * D} elements (> 2^31): rows past 2^31 are right`, async () => {
    expect(S * HQ * D).toBeGreaterThan(2 ** 31);
    expect(Number.isInteger(GROUP)).toBe(true);
    const kv = randn(S * HKV * D, rngFor('large/kv'));
    const v = randn(S * HKV * D, rngFor('large/v'));
    const made: Tensor[] = [];
    try {
      const q = Tensor.zeros([1, S, HQ, D], { device: 'cuda', dtype: 'bfloat16' });
      made.push(q);
      const k = Tensor.fromFloat32Array(kv, [1, S, HKV, D], { device: 'cuda', dtype: 'bfloat16' });
      made.push(k);
      const vt = Tensor.fromFloat32Array(v, [1, S, HKV, D], { device: 'cuda', dtype: 'bfloat16' });
      made.push(vt);
      const f = flashAttention(q, k, vt, { causal: true });
      made.push(f.out, f.lse);
      const vStored = await vt.toFloat32Array();

      const heads = [0, 1, GROUP - 1, GROUP, HQ - GROUP, HQ - 2, HQ - 1];
      const rows = [0, 1, 31, 63];
      const problems: string[] = [];
      for (const h of heads) {
        const hk = Math.floor(h / GROUP);
        for (const i of rows) {
          const at = (i * HQ + h) * D;  // element offset of out[0, i, h, 0]
          const got = await f.out.toFloat32Array({ offset: at, length: D });
          const lse = (await f.lse.toFloat32Array({ offset: h * S + i, length: 1 }))[0];
          for (let c = 0; c < D; c++) {
            let mean = 0;
            for (let j = 0; j <= i; j++) mean += vStored[(j * HKV + hk) * D + c];
            mean /= i + 1;
            // bf16 output: half an ulp of |mean| ≤ ~4 plus the kernel's fp32 rounding.
            if (!(Math.abs(got[c] - mean) <= 2 ** -8 * Math.max(1, Math.abs(mean)))) {
              problems.push(`out[0, ${i}, ${h}, ${c}] (element ${at + c}) = ${got[c]}, expected ${mean}`);
            }
          }
          if (!(Math.abs(lse - Math.log(i + 1)) <= 1e-5 * (1 + Math.log(i + 1)))) {
            problems.push(`lse[0, ${h}, ${i}] = ${lse}, expected ln(${i + 1})`);
          }
        }
      }
      expect(problems).toEqual([]);

      const dout = Tensor.zeros([1, S, HQ, D], { device: 'cuda', dtype: 'bfloat16' });
      made.push(dout);
      const g = flashAttentionBackward(dout, q, k, vt, f.out, f.lse, { causal: true });
      made.push(g.dq, g.dk, g.dv);
      // Exact zeros (either sign): 0 === -0.
      const allZero = (a: Float32Array): boolean => a.every((x) => x === 0);
      for (const h of [0, HQ - 1]) {
        expect(allZero(await g.dq.toFloat32Array({ offset: ((S - 1) * HQ + h) * D, length: D }))).toBe(true);
      }
      expect([allZero(await g.dk.toFloat32Array()), allZero(await g.dv.toFloat32Array())]).toEqual([true, true]);
    } finally {
      for (const t of made) t.dispose();
    }
    await synchronizeAll();
  });
});
