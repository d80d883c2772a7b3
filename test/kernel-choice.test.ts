/**
 * Which implementation runs: results name it ('auto' resolved), and an explicit kernel that cannot
 * run the call is refused with the reason.
 */
import { flashAttention, flashAttentionBackward, Tensor } from '../lib';
import type { DType } from '../lib';
import { describeEachDevice, trackMemory } from './helpers/backend';
import { randn, rngFor } from './helpers/random';

trackMemory();

describeEachDevice('kernel choice', (device) => {
  const make = (dtype: DType, headDim: number): Tensor[] => {
    const shape = [1, 40, 2, headDim];
    const n = shape.reduce((a, b) => a * b, 1);
    return [0, 1, 2, 3].map((i) => Tensor.fromFloat32Array(randn(n, rngFor(`kernel/${device}/${dtype}/${headDim}/${i}`)), shape, { dtype, device }));
  };

  const cases: [DType, number, 'flash' | 'naive', 'flash' | 'naive'][] = device === 'cpu'
    ? [['float32', 64, 'flash', 'flash'], ['bfloat16', 40, 'flash', 'flash']]
    // CUDA: 'auto' stays on the naive reference until the FA2 kernels meet the suite's rule.
    : [['bfloat16', 64, 'naive', 'naive'], ['float32', 64, 'naive', 'naive']];

  test.each(cases)('%s, head dim %d: auto runs %s forward and %s backward', (dtype, headDim, fwdKernel, bwdKernel) => {
    const [q, k, v, dout] = make(dtype, headDim);
    const f = flashAttention(q, k, v);
    const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse);
    try {
      expect([f.kernel, g.kernel]).toEqual([fwdKernel, bwdKernel]);
    } finally {
      for (const t of [q, k, v, dout, f.out, f.lse, g.dq, g.dk, g.dv]) t.dispose();
    }
  });

  if (device === 'cuda') {
    test.each([['bfloat16', 64], ['float16', 128]] as [DType, number][])(
      "kernel 'flash' opts into the CUDA FA2 forward (%s, head dim %d)", (dtype, headDim) => {
        const [q, k, v, dout] = make(dtype, headDim);
        const f = flashAttention(q, k, v, { kernel: 'flash' });
        try {
          expect(f.kernel).toBe('flash');
        } finally {
          for (const t of [q, k, v, dout, f.out, f.lse]) t.dispose();
        }
      });

    test("kernel 'flash' where no CUDA FA2 kernel exists says why", () => {
      const [q, k, v, dout] = make('float32', 64);
      try {
        expect(() => flashAttention(q, k, v, { kernel: 'flash' })).toThrow(new RangeError(
          "Expected kernel to be 'auto' or 'naive' for this call but received 'flash': the CUDA FlashAttention-2 forward "
          + 'supports float16 and bfloat16 with head dims 64 and 128 on sm_80 or newer for now'));
        const f = flashAttention(q, k, v);
        try {
          expect(() => flashAttentionBackward(dout, q, k, v, f.out, f.lse, { kernel: 'flash' })).toThrow(new RangeError(
            "Expected kernel to be 'auto' or 'naive' for this call but received 'flash': the CUDA FlashAttention-2 "
            + 'backward is not part of this build yet'));
        } finally {
          f.out.dispose();
          f.lse.dispose();
        }
      } finally {
        for (const t of [q, k, v, dout]) t.dispose();
      }
    });
  }
});
