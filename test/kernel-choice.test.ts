/**
 * Which implementation runs: results name it ('auto' resolved), and an explicit kernel that cannot
 * run the call is refused with the reason.
 *
 * - CPU: FlashAttention-2 for the forward and the backward ('naive' is refused there; its message is
 *   checked in test/validation.test.ts).
 * - CUDA (the suites run on sm_80 or newer, with the shared memory of an A100 or H100): 'auto' runs
 *   the FlashAttention-2 forward and backward for float16, bfloat16 and float32 (TF32) at every head
 *   dim (deterministic or not). The backward's algorithm 'auto' resolves to 'two-kernel' on Hopper
 *   for float16 / bfloat16 (every head dim; 'single-kernel' at head dims 65-128 from 512 queries and
 *   keys, causal or not, deterministic or not, and at 33-64 from 1024 without a causal mask (2048
 *   deterministic) and from 4096 causal (never deterministic), where it is the warp-specialized
 *   kernel), else to
 *   'single-kernel'; an explicit 'two-kernel' where it does not exist is refused with the reason
 *   (float32 here; the head dims in test/flash-backward.test.ts). 'naive' runs on request. The forward's only refusal ("needs
 *   a GPU of compute capability 8.0 (sm_80) or newer") cannot be reached on the GPUs the suites run on.
 * - Results also carry the plan that ran: the kernel family ('cpu' on the CPU; on CUDA 'sm90-wgmma' for
 *   fp16 / bf16 on Hopper where it exists, else 'sm80-mma', 'fp32-mma' for float32, 'naive') and, for
 *   FlashAttention-2 on CUDA, the compiled head dim and tile of its main kernel.
 */
import { backends, flashAttention, flashAttentionBackward, Tensor } from '../lib';
import type { AttentionKernel, BackwardAlgorithm, DType, KernelPlan } from '../lib';
import { describeEachDevice, HAS_CUDA, trackMemory } from './helpers/backend';
import { randn, rngFor } from './helpers/random';

trackMemory();

type Ran = Exclude<AttentionKernel, 'auto'>;
type RanAlgorithm = Exclude<BackwardAlgorithm, 'auto'>;

/** Whether the CUDA device is a Hopper GPU (compute capability 9.x), where the two-kernel backward exists. */
const HOPPER = HAS_CUDA && (backends().cuda.device?.computeCapability ?? '').startsWith('9.');

describeEachDevice('kernel choice', (device) => {
  /** q, k, v, dout of shape [1, 40, 2, headDim] (self attention), random. */
  const make = (dtype: DType, headDim: number, seqlen = 40): Tensor[] => {
    const shape = [1, seqlen, 2, headDim];
    const n = shape.reduce((a, b) => a * b, 1);
    return [0, 1, 2, 3].map((i) => Tensor.fromFloat32Array(randn(n, rngFor(`kernel/${device}/${dtype}/${headDim}/${i}`)), shape, { dtype, device }));
  };

  // [dtype, head dim, forward kernel of 'auto', backward kernel of 'auto', backward algorithm of 'auto'].
  // On CUDA: a specialised and a padded head dim per dtype (the padded ones run the next
  // specialisation); 'two-kernel' where it exists on Hopper.
  const two: RanAlgorithm = HOPPER ? 'two-kernel' : 'single-kernel';
  const cases: [DType, number, Ran, Ran, RanAlgorithm][] = device === 'cpu'
    ? [['float32', 64, 'flash', 'flash', 'single-kernel'], ['bfloat16', 40, 'flash', 'flash', 'single-kernel']]
    : [
      ['float16', 64, 'flash', 'flash', two], ['float16', 200, 'flash', 'flash', two],
      ['bfloat16', 128, 'flash', 'flash', two], ['bfloat16', 40, 'flash', 'flash', two],
      ['bfloat16', 96, 'flash', 'flash', two], ['bfloat16', 160, 'flash', 'flash', two],
      ['float32', 256, 'flash', 'flash', 'single-kernel'], ['float32', 8, 'flash', 'flash', 'single-kernel'],
    ];

  test.each(cases)('%s, head dim %d: auto runs %s forward and %s backward (%s)', (dtype, headDim, fwdKernel, bwdKernel, algorithm) => {
    const [q, k, v, dout] = make(dtype, headDim);
    const f = flashAttention(q, k, v);
    const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse);
    try {
      expect([f.kernel, g.kernel, g.algorithm]).toEqual([fwdKernel, bwdKernel, algorithm]);
    } finally {
      for (const t of [q, k, v, dout, f.out, f.lse, g.dq, g.dk, g.dv]) t.dispose();
    }
  });

  /** The head dims the CUDA kernels are compiled for; a call runs the next one up. */
  const padded = (headDim: number): number => [32, 64, 96, 128, 192, 256].find((d) => d >= headDim) as number;
  const families = (dtype: DType, algorithm: RanAlgorithm): [string, string] => {
    if (device === 'cpu') return ['cpu', 'cpu'];
    if (dtype === 'float32') return ['fp32-mma', 'fp32-mma'];
    return [HOPPER ? 'sm90-wgmma' : 'sm80-mma', algorithm === 'two-kernel' ? 'sm90-wgmma' : 'sm80-mma'];
  };
  const tileOf = (plan: KernelPlan): (number | null)[] => [plan.headDim, plan.blockM, plan.blockN, plan.warps, plan.stages];

  test.each(cases)('%s, head dim %d: the results carry the plan that ran', (dtype, headDim, _f, _b, algorithm) => {
    const [q, k, v, dout] = make(dtype, headDim);
    const f = flashAttention(q, k, v);
    const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse);
    try {
      expect([f.plan.family, g.plan.family]).toEqual(families(dtype, algorithm));
      // The Hopper backward's kernels have head dims 32, 64, 128, 192 and 256: the two kernels run the next one up.
      const hopperBwd = [32, 64, 128, 192, 256].find((d) => d >= headDim) as number;
      for (const plan of [f.plan, g.plan]) {
        if (device === 'cpu') {
          expect(tileOf(plan)).toEqual([null, null, null, null, null]);
        } else {
          expect(plan.headDim).toBe(plan === g.plan && g.plan.family === 'sm90-wgmma' ? hopperBwd : padded(headDim));
          for (const x of tileOf(plan).slice(1)) expect(Number.isInteger(x) && (x as number) > 0).toBe(true);
          expect((plan.blockN as number) % 16).toBe(0);
        }
      }
    } finally {
      for (const t of [q, k, v, dout, f.out, f.lse, g.dq, g.dk, g.dv]) t.dispose();
    }
  });

  if (device === 'cuda' && HOPPER) {
    // The example of lib/attention.ts KernelPlan: the warp-specialized forward (a producer and two
    // consumer warpgroups, 128-key tiles below 4096 keys), causal or not; the Hopper backward's 128-key
    // tile of two warpgroups (flash_configs.h).
    test('bfloat16, head dim 128 on Hopper: the plans are the wgmma rows of the tables', () => {
      const [q, k, v, dout] = make('bfloat16', 128);
      const f = flashAttention(q, k, v);
      const c = flashAttention(q, k, v, { causal: true });
      const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse);
      try {
        expect(f.plan).toEqual({ family: 'sm90-wgmma', headDim: 128, blockM: 128, blockN: 128, warps: 12, stages: 2 });
        expect(c.plan).toEqual({ family: 'sm90-wgmma', headDim: 128, blockM: 128, blockN: 128, warps: 12, stages: 2 });
        expect(g.plan).toEqual({ family: 'sm90-wgmma', headDim: 128, blockM: 64, blockN: 128, warps: 8, stages: 2 });
      } finally {
        for (const t of [q, k, v, dout, f.out, f.lse, c.out, c.lse, g.dq, g.dk, g.dv]) t.dispose();
      }
    });

    // Causal calls from a length per head dim on (flash_configs.h fwd_sm90_ws_causal_min_seqlen): the
    // warp-specialized kernel (query tiles handed out by a counter, heaviest first; at 64 three
    // consumer warpgroups, 192-row tiles), from 2048 at 64, at any length at 96 and 128, from 1024 at
    // 192 and 256; below, the two-warpgroup kernel (at 32 always).
    test.each([
      [128, 1, 128, 128, 12, 2], [128, 700, 128, 128, 12, 2], [64, 2047, 128, 64, 8, 3], [64, 2048, 192, 128, 16, 3],
      [96, 1, 128, 128, 12, 2], [192, 1023, 128, 64, 8, 3], [192, 1024, 128, 96, 12, 2],
      [256, 1023, 128, 32, 8, 3], [256, 1024, 128, 80, 12, 2], [32, 4096, 128, 64, 8, 3],
    ])('bfloat16, causal head dim %d at seqlen %d on Hopper: %d x %d tiles of %d warps', (headDim, seqlen, blockM, blockN, warps, stages) => {
      const [q, k, v, dout] = make('bfloat16', headDim, seqlen);
      const c = flashAttention(q, k, v, { causal: true });
      try {
        expect(c.plan).toEqual({ family: 'sm90-wgmma', headDim, blockM, blockN, warps, stages });
      } finally {
        for (const t of [q, k, v, dout, c.out, c.lse]) t.dispose();
      }
    });

    // Head dims 97-128 without a causal mask: 128-key tiles at every length (flash_configs.h
    // kFwdSm90WsConfigs).
    test.each([[128, 4095, 128], [128, 4096, 128], [112, 8192, 128]])(
      'bfloat16, head dim %d at seqlen %d on Hopper: the non-causal forward takes %d-key tiles', (headDim, seqlen, blockN) => {
        const [q, k, v, dout] = make('bfloat16', headDim, seqlen);
        const f = flashAttention(q, k, v);
        try {
          expect(f.plan).toEqual({ family: 'sm90-wgmma', headDim: 128, blockM: 128, blockN, warps: 12, stages: 2 });
        } finally {
          for (const t of [q, k, v, dout, f.out, f.lse]) t.dispose();
        }
      });

    // Head dims 33-64 without a causal mask: the warp-specialized forward of three consumer warpgroups
    // (192 query rows, 128-key tiles, 3 stages); head dims up to 32 the two-warpgroup d32 row.
    test.each([[64, 64, 192, 128, 16, 3], [40, 64, 192, 128, 16, 3], [32, 32, 128, 64, 8, 3]])(
      'bfloat16, head dim %d on Hopper: the non-causal forward runs d%d, %d x %d tiles of %d warps', (headDim, padded, blockM, blockN, warps, stages) => {
        const [q, k, v, dout] = make('bfloat16', headDim);
        const f = flashAttention(q, k, v);
        try {
          expect(f.plan).toEqual({ family: 'sm90-wgmma', headDim: padded, blockM, blockN, warps, stages });
        } finally {
          for (const t of [q, k, v, dout, f.out, f.lse]) t.dispose();
        }
      });

    // The backward's 'auto': the warp-specialized single kernel (12 warps; 128 query rows a step at
    // head dims 33-64, 64 at 65-128) from 512 queries and keys, causal or not, deterministic or not
    // (flash_configs.h kBwdWsMinSeqlen); the two kernels below that length and at head dim 32. The plan
    // names the kernel.
    const ws = (headDim: number): KernelPlan =>
      ({ family: 'sm90-wgmma', headDim, blockM: headDim === 64 ? 128 : 64, blockN: 128, warps: 12, stages: 2 });
    const main = (headDim: number): KernelPlan => ({ family: 'sm90-wgmma', headDim, blockM: 64, blockN: 128, warps: 8, stages: 2 });
    test.each([
      [128, 512, false, false, 'single-kernel', ws(128)], [104, 512, false, false, 'single-kernel', ws(128)],
      [128, 8192, false, false, 'single-kernel', ws(128)], [128, 511, false, false, 'two-kernel', main(128)],
      [128, 512, true, false, 'single-kernel', ws(128)], [128, 511, true, false, 'two-kernel', main(128)],
      [128, 512, true, true, 'single-kernel', ws(128)], [128, 511, true, true, 'two-kernel', main(128)],
      [128, 511, false, true, 'two-kernel', main(128)], [128, 512, false, true, 'single-kernel', ws(128)],
      [64, 512, false, false, 'single-kernel', ws(64)], [40, 1024, false, false, 'single-kernel', ws(64)],
      [64, 511, false, false, 'two-kernel', main(64)], [64, 512, true, false, 'single-kernel', ws(64)],
      [64, 511, true, false, 'two-kernel', main(64)], [64, 8192, true, true, 'single-kernel', ws(64)],
      [64, 512, false, true, 'single-kernel', ws(64)], [64, 511, false, true, 'two-kernel', main(64)],
      [64, 511, true, true, 'two-kernel', main(64)], [96, 512, false, false, 'single-kernel', ws(128)],
      [80, 512, true, true, 'single-kernel', ws(128)], [96, 511, true, false, 'two-kernel', main(128)],
      [32, 8192, false, false, 'two-kernel', main(32)],
    ] as const)('bfloat16, head dim %d, seqlen %d, causal %s, deterministic %s on Hopper: auto runs %s',
      (headDim, seqlen, causal, deterministic, algorithm, plan) => {
        const [q, k, v, dout] = make('bfloat16', headDim, seqlen);
        const f = flashAttention(q, k, v, { causal });
        const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse, { causal, deterministic });
        try {
          expect([g.kernel, g.algorithm]).toEqual(['flash', algorithm]);
          expect(g.plan).toEqual(plan);
        } finally {
          for (const t of [q, k, v, dout, f.out, f.lse, g.dq, g.dk, g.dv]) t.dispose();
        }
      });

    // Head dims 65-96, 129-192 and 193-256 without a causal mask: the warp-specialized forward at d96
    // (128-key tiles), d192 (112-key tiles) and d256 (80-key tiles); causal at 40 keys, the same kernel
    // at d96, the two-warpgroup rows above.
    test.each([[80, 96, 128, 128, 12, 2], [96, 96, 128, 128, 12, 2], [160, 192, 112, 64, 8, 3], [256, 256, 80, 32, 8, 3]])(
      'bfloat16, head dim %d on Hopper: the forward runs the d%d rows', (headDim, padded, wsBlockN, blockN, warps, stages) => {
        const [q, k, v, dout] = make('bfloat16', headDim);
        const f = flashAttention(q, k, v);
        const c = flashAttention(q, k, v, { causal: true });
        try {
          expect(f.plan).toEqual({ family: 'sm90-wgmma', headDim: padded, blockM: 128, blockN: wsBlockN, warps: 12, stages: 2 });
          expect(c.plan).toEqual({ family: 'sm90-wgmma', headDim: padded, blockM: 128, blockN, warps, stages });
        } finally {
          for (const t of [q, k, v, dout, f.out, f.lse, c.out, c.lse]) t.dispose();
        }
      });
  }

  if (device === 'cuda') {
    test.each([['float16', 96], ['bfloat16', 136], ['float32', 32]] as [DType, number][])(
      "%s, head dim %d: kernel 'flash' and kernel 'naive' each run the forward they name", (dtype, headDim) => {
        const [q, k, v, dout] = make(dtype, headDim);
        const f = flashAttention(q, k, v, { kernel: 'flash', causal: true });
        const n = flashAttention(q, k, v, { kernel: 'naive', causal: true });
        try {
          expect([f.kernel, n.kernel]).toEqual(['flash', 'naive']);
          expect(n.plan).toEqual({ family: 'naive', headDim: null, blockM: null, blockN: null, warps: null, stages: null });
        } finally {
          for (const t of [q, k, v, dout, f.out, f.lse, n.out, n.lse]) t.dispose();
        }
      });

    // The two-kernel backward has no float32 version: asking for it is refused with the reason, by
    // kernel 'flash' and by kernel 'auto' (whose message names the algorithm); 'auto' and
    // 'single-kernel' run the float32 FA2 backward.
    test("float32: algorithm 'two-kernel' is refused with the reason; 'auto' and 'single-kernel' run the FA2 backward", () => {
      const reason = 'the two-kernel backward takes float16 and bfloat16 inputs (float32 has the single-kernel one)';
      const [q, k, v, dout] = make('float32', 64);
      const f = flashAttention(q, k, v);
      try {
        expect(() => flashAttentionBackward(dout, q, k, v, f.out, f.lse, { kernel: 'flash', algorithm: 'two-kernel' })).toThrow(
          new RangeError(`Expected kernel to be 'auto' or 'naive' for this call but received 'flash': ${reason}`));
        expect(() => flashAttentionBackward(dout, q, k, v, f.out, f.lse, { algorithm: 'two-kernel' })).toThrow(
          new RangeError(`Expected algorithm to be 'auto' or 'single-kernel' for this call but received 'two-kernel': ${reason}`));
        for (const algorithm of ['auto', 'single-kernel'] as const) {
          const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse, { algorithm });
          try {
            expect([g.kernel, g.algorithm]).toEqual(['flash', 'single-kernel']);
          } finally {
            for (const t of [g.dq, g.dk, g.dv]) t.dispose();
          }
        }
      } finally {
        for (const t of [q, k, v, dout, f.out, f.lse]) t.dispose();
      }
    });

    test("bfloat16, head dim 64: algorithm 'single-kernel' and 'two-kernel' (Hopper) each run the backward they name", () => {
      const [q, k, v, dout] = make('bfloat16', 64);
      const f = flashAttention(q, k, v);
      const algorithms: RanAlgorithm[] = HOPPER ? ['single-kernel', 'two-kernel'] : ['single-kernel'];
      try {
        for (const algorithm of algorithms) {
          const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse, { algorithm });
          try {
            expect([g.kernel, g.algorithm]).toEqual(['flash', algorithm]);
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
      const [q, k, v, dout] = make('bfloat16', 136);
      const f = flashAttention(q, k, v, { causal: true });
      try {
        for (const kernel of ['flash', 'naive'] as const) {
          const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse, { kernel, causal: true });
          try {
            // Head dim 136: 'auto' runs the two kernels on Hopper, the mma.sync single kernel elsewhere; the
            // naive kernel has one structure.
            expect([g.kernel, g.algorithm]).toEqual([kernel, kernel === 'flash' && HOPPER ? 'two-kernel' : 'single-kernel']);
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
