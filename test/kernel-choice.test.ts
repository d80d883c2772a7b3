/**
 * Which implementation runs: results name it ('auto' resolved), and an explicit kernel that cannot
 * run the call is refused with the reason.
 *
 * - CPU: FlashAttention-2 for the forward and the backward ('naive' is refused there; its message is
 *   checked in test/validation.test.ts).
 * - CUDA (the suites run on sm_80 or newer, with the shared memory of an A100 or H100): 'auto' runs
 *   the FlashAttention-2 forward for float16, bfloat16 and float32 (TF32) at every head dim, and the
 *   FA2 backward for float16 and bfloat16 (deterministic or not); the float32 backward runs the naive
 *   kernel, and kernel 'flash' for it is refused with the reason. 'naive' runs on request. The
 *   forward's only refusal ("needs a GPU of compute capability 8.0 (sm_80) or newer") cannot be
 *   reached on the GPUs the suites run on.
 */
import { flashAttention, flashAttentionBackward, Tensor } from '../lib';
import type { AttentionKernel, DType } from '../lib';
import { describeEachDevice, trackMemory } from './helpers/backend';
import { randn, rngFor } from './helpers/random';

trackMemory();

type Ran = Exclude<AttentionKernel, 'auto'>;

describeEachDevice('kernel choice', (device) => {
  /** q, k, v, dout of shape [1, 40, 2, headDim] (self attention), random. */
  const make = (dtype: DType, headDim: number): Tensor[] => {
    const shape = [1, 40, 2, headDim];
    const n = shape.reduce((a, b) => a * b, 1);
    return [0, 1, 2, 3].map((i) => Tensor.fromFloat32Array(randn(n, rngFor(`kernel/${device}/${dtype}/${headDim}/${i}`)), shape, { dtype, device }));
  };

  // [dtype, head dim, forward kernel of 'auto', backward kernel of 'auto']. On CUDA: a specialised
  // and a padded head dim per dtype (the padded ones run the next specialisation).
  const cases: [DType, number, Ran, Ran][] = device === 'cpu'
    ? [['float32', 64, 'flash', 'flash'], ['bfloat16', 40, 'flash', 'flash']]
    : [
      ['float16', 64, 'flash', 'flash'], ['float16', 200, 'flash', 'flash'],
      ['bfloat16', 128, 'flash', 'flash'], ['bfloat16', 40, 'flash', 'flash'],
      ['float32', 256, 'flash', 'naive'], ['float32', 8, 'flash', 'naive'],
    ];

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
    test.each([['float16', 96], ['bfloat16', 136], ['float32', 32]] as [DType, number][])(
      "%s, head dim %d: kernel 'flash' and kernel 'naive' each run the forward they name", (dtype, headDim) => {
        const [q, k, v, dout] = make(dtype, headDim);
        const f = flashAttention(q, k, v, { kernel: 'flash', causal: true });
        const n = flashAttention(q, k, v, { kernel: 'naive', causal: true });
        try {
          expect([f.kernel, n.kernel]).toEqual(['flash', 'naive']);
        } finally {
          for (const t of [q, k, v, dout, f.out, f.lse, n.out, n.lse]) t.dispose();
        }
      });

    // The refusal names its reason; 'auto' and 'naive' run the same call on the naive kernel.
    test.each([
      ['float32', false, 'the CUDA FlashAttention-2 backward takes float16 and bfloat16 inputs (float32 runs on the naive kernel)'],
    ] as [DType, boolean, string][])("%s, deterministic %s: kernel 'flash' for the backward is refused, 'auto' and 'naive' run naive", (dtype, deterministic, reason) => {
      const [q, k, v, dout] = make(dtype, 64);
      const f = flashAttention(q, k, v);
      try {
        expect(() => flashAttentionBackward(dout, q, k, v, f.out, f.lse, { kernel: 'flash', deterministic })).toThrow(new RangeError(
          `Expected kernel to be 'auto' or 'naive' for this call but received 'flash': ${reason}`));
        for (const kernel of ['auto', 'naive'] as const) {
          const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse, { kernel, deterministic });
          try {
            expect(g.kernel).toBe('naive');
          } finally {
            for (const t of [g.dq, g.dk, g.dv]) t.dispose();
          }
        }
      } finally {
        for (const t of [q, k, v, dout, f.out, f.lse]) t.dispose();
      }
    });

    test("float16: deterministic: true runs the FA2 backward for 'auto' and 'flash'", () => {
      const [q, k, v, dout] = make('float16', 64);
      const f = flashAttention(q, k, v);
      try {
        for (const kernel of ['auto', 'flash'] as const) {
          const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse, { kernel, deterministic: true });
          try {
            expect(g.kernel).toBe('flash');
          } finally {
            for (const t of [g.dq, g.dk, g.dv]) t.dispose();
          }
        }
      } finally {
        for (const t of [q, k, v, dout, f.out, f.lse]) t.dispose();
      }
    });

    test("bfloat16: kernel 'flash' and kernel 'naive' each run the backward they name", () => {
      const [q, k, v, dout] = make('bfloat16', 72);
      const f = flashAttention(q, k, v, { causal: true });
      try {
        for (const kernel of ['flash', 'naive'] as const) {
          const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse, { kernel, causal: true });
          try {
            expect(g.kernel).toBe(kernel);
          } finally {
            for (const t of [g.dq, g.dk, g.dv]) t.dispose();
          }
        }
      } finally {
        for (const t of [q, k, v, dout, f.out, f.lse]) t.dispose();
      }
    });
  }
});
