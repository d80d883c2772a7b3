/**
 * Property tests (fast-check) on the CPU backend (issue 6):
 *
 * 1. Random valid problems (batch 1-2, seqlenQ and seqlenK 1-70, 1-3 kv heads × GQA groups of 1-3,
 *    head dims 8-64, causal or not, softmaxScale default or 0.25-2 × 1/√headDim, every dtype, through
 *    flashAttention + flashAttentionBackward or flashAttentionWithGrad + ctx.backward): out, lse, dq,
 *    dk and dv against the float64 reference with the flash rule (helpers/tolerance.ts: 2× / 3× the
 *    same-precision error plus test/attention.test.ts's atol and helpers/backward.ts's one-key-row
 *    slack), every output written (outputs start as NaN), rows that see no key exact (out 0, lse
 *    +Infinity, dq 0), and memory() back where it started.
 * 2. Random invalid calls: one thing wrong in an otherwise valid call to flashAttention,
 *    flashAttentionBackward, flashAttentionWithGrad, AttentionContext.backward or the Tensor
 *    factories (wrong ranks, mismatched batch / seqlen / heads / head dim / dtype, bad head dims, a
 *    bad lse, bad option values or options, disposed tensors, non-tensors, extra backward() options,
 *    bad shapes and data): each throws a TypeError or RangeError whose message starts with
 *    "Expected " and names what is wrong, allocates nothing (live tensors and bytes unchanged), and a
 *    context whose backward() was refused in JS is still usable.
 *
 * Seeds: each property's fast-check seed comes from the file's seed (helpers/random.ts, printed on
 * failure): replay with `FA_TEST_SEED=<seed> npx jest test/property.test.ts`. fast-check's own
 * message adds the failing case's seed and path, and the shrunk counterexample.
 */

import * as fc from 'fast-check';

import {
  AttentionBackwardOptions, AttentionContext, DType, flashAttention, flashAttentionBackward, flashAttentionWithGrad,
  referenceAttentionBackward, resetPeakMemory, synchronize, Tensor,
} from '../lib';
import { debug } from '../lib/testing';
import { liveMemory, trackMemory } from './helpers/backend';
import { addSlack, GRAD_ATOL, gradientSlack, outDifferenceSlack } from './helpers/backward';
import { ForwardShape, kShapeOf, LSE_DIMS, lseShapeOf, maxFiniteAbs, Q_DIMS, qShapeOf, shapeOf } from './helpers/forward';
import { randn, Rng, rngFor, seedHint } from './helpers/random';
import { expectAllWritten, expectFlashRule } from './helpers/tolerance';

trackMemory();
afterAll(() => debug.poisonOutputs(false));

/** fast-check's seed for one property, derived from the file's seed. */
const seedOf = (label: string): number => rngFor(`property/${label}`).nextU32() | 0;

/** fc.assert with a derived seed; on failure the message also says how to replay the file. */
async function assertProperty(label: string, property: fc.IAsyncProperty<[unknown]>, numRuns: number): Promise<void> {
  const seed = seedOf(label);
  try {
    await fc.assert(property, { seed, numRuns });
  } catch (e) {
    throw new Error(`${(e as Error).message}\n\n${label}: fast-check seed ${seed}; replay with ${seedHint()} npx jest test/property.test.ts`);
  }
}

const DTYPE_LIST: readonly DType[] = ['float32', 'float16', 'bfloat16'];
type OutName = 'out' | 'lse' | 'dq' | 'dk' | 'dv';
const OUT_NAMES: readonly OutName[] = ['out', 'lse', 'dq', 'dk', 'dv'];

// ------------------------------------------------------------------------------------------------
// 1. Valid problems against the reference
// ------------------------------------------------------------------------------------------------

interface ValidCase {
  b: number;
  sq: number;
  sk: number;
  hkv: number;
  group: number;
  d: number;
  causal: boolean;
  /** softmaxScale = scaleFactor / √d, or the default when undefined. */
  scaleFactor: number | undefined;
  dtype: DType;
  withGrad: boolean;
  /** Seed of the input values. */
  dataSeed: number;
}

const validCase: fc.Arbitrary<ValidCase> = fc.record({
  b: fc.integer({ min: 1, max: 2 }),
  sq: fc.integer({ min: 1, max: 70 }),
  sk: fc.integer({ min: 1, max: 70 }),
  hkv: fc.integer({ min: 1, max: 3 }),
  group: fc.integer({ min: 1, max: 3 }),
  d: fc.integer({ min: 1, max: 8 }).map((x) => 8 * x),
  causal: fc.boolean(),
  scaleFactor: fc.option(fc.double({ min: 0.25, max: 2, noNaN: true }), { nil: undefined }),
  dtype: fc.constantFrom(...DTYPE_LIST),
  withGrad: fc.boolean(),
  dataSeed: fc.integer({ min: 0, max: 0x7fffffff }),
});

async function checkValid(c: ValidCase): Promise<void> {
  const t: ForwardShape = {
    b: c.b, sq: c.sq, sk: c.sk, hq: c.hkv * c.group, hkv: c.hkv, d: c.d, causal: c.causal,
    scale: c.scaleFactor === undefined ? undefined : c.scaleFactor / Math.sqrt(c.d),
  };
  const what = JSON.stringify(c);
  const rng = new Rng(c.dataSeed);
  const nq = t.b * t.sq * t.hq * t.d;
  const nk = t.b * t.sk * t.hkv * t.d;
  const o = { dtype: c.dtype, device: 'cpu' as const };
  const opts: AttentionBackwardOptions = t.scale === undefined ? { causal: t.causal } : { causal: t.causal, softmaxScale: t.scale };

  await synchronize('cpu');
  const start = liveMemory();
  const made: Tensor[] = [];
  try {
    const q = Tensor.fromFloat32Array(randn(nq, rng), qShapeOf(t), o);
    const k = Tensor.fromFloat32Array(randn(nk, rng), kShapeOf(t), o);
    const v = Tensor.fromFloat32Array(randn(nk, rng), kShapeOf(t), o);
    const dout = Tensor.fromFloat32Array(randn(nq, rng), qShapeOf(t), o);
    made.push(q, k, v, dout);
    debug.poisonOutputs(true);
    let outs: Record<OutName, Tensor>;
    if (c.withGrad) {
      const ctx = flashAttentionWithGrad(q, k, v, opts);
      made.push(ctx.out, ctx.lse);
      const g = ctx.backward(dout);
      made.push(g.dq, g.dk, g.dv);
      expect([ctx.kernel, g.kernel, ctx.released]).toEqual(['flash', 'flash', true]);
      outs = { out: ctx.out, lse: ctx.lse, dq: g.dq, dk: g.dk, dv: g.dv };
    } else {
      const f = flashAttention(q, k, v, opts);
      made.push(f.out, f.lse);
      const g = flashAttentionBackward(dout, q, k, v, f.out, f.lse, opts);
      made.push(g.dq, g.dk, g.dv);
      expect([f.kernel, g.kernel]).toEqual(['flash', 'flash']);
      outs = { out: f.out, lse: f.lse, dq: g.dq, dk: g.dk, dv: g.dv };
    }
    debug.poisonOutputs(false);
    const read = async (x: Tensor): Promise<Float32Array> => new Float32Array(await x.toFloat32Array());
    const [sq, sk, sv, sd] = await Promise.all([q, k, v, dout].map(read));
    const got = {} as Record<OutName, Float32Array>;
    for (const n of OUT_NAMES) got[n] = await read(outs[n]);

    const shape = shapeOf(t);
    const ref = referenceAttentionBackward(sd, sq, sk, sv, shape, opts);
    const same = referenceAttentionBackward(sd, sq, sk, sv, shape, { ...opts, precision: c.dtype });
    const stored = { q: sq, k: sk, v: sv, dout: sd, out: got.out, lse: got.lse };
    const slack = addSlack(gradientSlack(t, stored, ref, false), outDifferenceSlack(t, stored, same.out));
    for (const n of OUT_NAMES) {
      const grad = n === 'dq' || n === 'dk' || n === 'dv';
      const layout = n === 'lse' ? { shape: lseShapeOf(t), dims: LSE_DIMS } : { shape: n === 'dk' || n === 'dv' ? kShapeOf(t) : qShapeOf(t), dims: Q_DIMS };
      expectAllWritten(got[n], `${n} of ${what}`, layout);
      expectFlashRule({
        actual: got[n], reference: ref[n], samePrecision: same[n], factor: grad ? 3 : 2,
        atol: n === 'lse' ? 1e-5 + 2 * 2 ** -24 * maxFiniteAbs(ref.lse) : grad ? GRAD_ATOL + slack[n] : 1e-5,
        name: `${n} of ${what}`, ...layout,
      });
    }
    // Rows that see no key (causal, seqlenQ > seqlenK): exactly out 0, lse +Infinity, dq 0.
    const empty = t.causal ? Math.max(0, t.sq - t.sk) : 0;
    const bad: string[] = [];
    for (let b = 0; b < t.b; b++) {
      for (let h = 0; h < t.hq; h++) {
        for (let i = 0; i < empty; i++) {
          if (got.lse[(b * t.hq + h) * t.sq + i] !== Infinity) bad.push(`lse[${b}, ${h}, ${i}]`);
          const base = ((b * t.sq + i) * t.hq + h) * t.d;
          for (let e = 0; e < t.d; e++) {
            if (got.out[base + e] !== 0 || got.dq[base + e] !== 0) bad.push(`out/dq[${b}, ${i}, ${h}, ${e}]`);
          }
        }
      }
    }
    expect(bad.slice(0, 5)).toEqual([]);
  } finally {
    debug.poisonOutputs(false);
    for (const x of made) x.dispose();
  }
  await synchronize('cpu');
  expect(liveMemory()).toEqual(start);
}

test('random valid problems: the CPU backend matches the float64 reference (out, lse, dq, dk, dv)', async () => {
  await assertProperty('valid', fc.asyncProperty(validCase, checkValid) as fc.IAsyncProperty<[unknown]>, 60);
});

// ------------------------------------------------------------------------------------------------
// 2. Invalid calls
// ------------------------------------------------------------------------------------------------

type Entry = 'forward' | 'withGrad' | 'backward' | 'ctxBackward';
type TArg = 'q' | 'k' | 'v' | 'dout' | 'out' | 'lse';

/** The base of an invalid call: a small valid problem. */
interface Base {
  b: number;
  sq: number;
  sk: number;
  hkv: number;
  group: number;
  d: number;
  dtype: DType;
  causal: boolean;
}

/** What is wrong, as data (so fast-check prints and shrinks it). */
type Mutation =
  | { kind: 'rank'; arg: TArg; rank: number }
  | { kind: 'batch'; arg: 'k' | 'v' }
  | { kind: 'seqlen'; arg: 'v' | 'dout' | 'out' }
  | { kind: 'heads'; arg: 'k' | 'v' }
  | { kind: 'headDim'; value: number }
  | { kind: 'headDimK' }
  | { kind: 'dtype'; arg: 'k' | 'v' | 'dout' | 'out' | 'lse'; pick: number }
  | { kind: 'lseShape'; variant: number }
  | { kind: 'option'; key: string; value: unknown }
  | { kind: 'options'; value: unknown }
  | { kind: 'disposed'; arg: TArg }
  | { kind: 'notTensor'; arg: TArg; value: unknown }
  | { kind: 'extraKey'; key: string }
  | { kind: 'factory'; variant: number };

const TENSOR_ARGS: Record<Entry, readonly TArg[]> = {
  forward: ['q', 'k', 'v'],
  withGrad: ['q', 'k', 'v'],
  backward: ['dout', 'q', 'k', 'v', 'out', 'lse'],
  ctxBackward: ['dout'],
};

const NOT_TENSORS: readonly unknown[] = [
  null, undefined, 0, 1.5, 'q', {}, [], new Float32Array(8), () => 0, Symbol('t'), BigInt(3), Object.create(Tensor.prototype),
];

/** Bad option values per key (all refused in JS, except the two that only the addon knows are wrong on the CPU). */
const BAD_OPTIONS: Record<string, readonly unknown[]> = {
  causal: [1, 0, 'true', null],
  softmaxScale: [NaN, Infinity, -Infinity, 0, -0.5, 1e-50, 1e39, '0.5', null, true],
  softcap: [NaN, Infinity, -1, 1e-50, 1e39, '2', null, true],
  window: [5, [1], [1, 2, 3], [-2, 0], [0.5, 0], [0, NaN], ['1', 2], null, {}],
  alibiSlopes: [0.5, [NaN], [1e39], ['0.5'], new Float64Array(1), null, {}],
  kernel: ['fast', '', 'FLASH', 1, null, 'naive'],
  float32Precision: ['fp32', 'TF32', 1, null],
  deterministic: [1, 'yes', null],
  algorithm: ['fast', 3, null, 'two-kernel'],
};
/** Option keys each entry validates (the forward ignores the backward's). */
const OPTION_KEYS: Record<Entry, readonly string[]> = {
  forward: ['causal', 'softmaxScale', 'softcap', 'window', 'alibiSlopes', 'kernel', 'float32Precision'],
  // 'two-kernel' is accepted by flashAttentionWithGrad (the CPU refuses it in backward()): left out there.
  withGrad: ['causal', 'softmaxScale', 'softcap', 'window', 'alibiSlopes', 'kernel', 'float32Precision', 'deterministic', 'algorithm'],
  backward: ['causal', 'softmaxScale', 'softcap', 'window', 'alibiSlopes', 'kernel', 'float32Precision', 'deterministic', 'algorithm'],
  ctxBackward: ['deterministic', 'algorithm'],
};
const BAD_HEAD_DIMS: readonly number[] = [1, 4, 7, 12, 20, 36, 100, 264, 512];
const FACTORY_VARIANTS = 15;

function mutationsFor(entry: Entry): fc.Arbitrary<Mutation> {
  const args = TENSOR_ARGS[entry];
  const arg = fc.constantFrom(...args);
  const optionKey = fc.constantFrom(...OPTION_KEYS[entry]);
  const list: fc.Arbitrary<Mutation>[] = [
    arg.chain((a) => fc.constantFrom(...(a === 'lse' ? [1, 2, 4] : [1, 2, 3, 5])).map((rank): Mutation => ({ kind: 'rank', arg: a, rank }))),
    fc.record({ kind: fc.constant('disposed' as const), arg }),
    fc.record({ kind: fc.constant('notTensor' as const), arg, value: fc.constantFrom(...NOT_TENSORS) }),
    optionKey.chain((key) => fc.constantFrom(...BAD_OPTIONS[key].filter((v) => !(entry === 'withGrad' && v === 'two-kernel')))
      .map((value): Mutation => ({ kind: 'option', key, value }))),
    fc.record({ kind: fc.constant('options' as const), value: fc.constantFrom<unknown>(null, 5, 'causal', [], true, () => 0) }),
    fc.record({ kind: fc.constant('factory' as const), variant: fc.integer({ min: 0, max: FACTORY_VARIANTS - 1 }) }),
  ];
  if (entry === 'ctxBackward') {
    list.push(fc.record({ kind: fc.constant('seqlen' as const), arg: fc.constant('dout' as const) }));
    list.push(fc.record({ kind: fc.constant('dtype' as const), arg: fc.constant('dout' as const), pick: fc.integer({ min: 0, max: 1 }) }));
    list.push(fc.record({ kind: fc.constant('extraKey' as const), key: fc.constantFrom('causal', 'softmaxScale', 'kernel', 'float32Precision', 'foo') }));
  } else {
    list.push(
      fc.record({ kind: fc.constant('batch' as const), arg: fc.constantFrom('k' as const, 'v' as const) }),
      fc.record({ kind: fc.constant('heads' as const), arg: fc.constantFrom('k' as const, 'v' as const) }),
      fc.record({ kind: fc.constant('headDim' as const), value: fc.constantFrom(...BAD_HEAD_DIMS) }),
      fc.record({ kind: fc.constant('headDimK' as const) }),
      fc.record({ kind: fc.constant('seqlen' as const), arg: fc.constantFrom(...(entry === 'backward' ? ['v', 'dout', 'out'] as const : ['v'] as const)) }),
      fc.record({
        kind: fc.constant('dtype' as const),
        arg: fc.constantFrom(...(entry === 'backward' ? ['k', 'v', 'dout', 'out', 'lse'] as const : ['k', 'v'] as const)),
        pick: fc.integer({ min: 0, max: 1 }),
      }),
    );
    if (entry === 'backward') list.push(fc.record({ kind: fc.constant('lseShape' as const), variant: fc.integer({ min: 0, max: 2 }) }));
  }
  return fc.oneof(...list);
}

const baseArb: fc.Arbitrary<Base> = fc.record({
  b: fc.integer({ min: 1, max: 2 }),
  sq: fc.integer({ min: 1, max: 6 }),
  sk: fc.integer({ min: 1, max: 6 }),
  hkv: fc.integer({ min: 1, max: 2 }),
  group: fc.integer({ min: 1, max: 2 }),
  d: fc.constantFrom(8, 16),
  dtype: fc.constantFrom(...DTYPE_LIST),
  causal: fc.boolean(),
});

const invalidCall = fc.record({
  base: baseArb,
  entry: fc.constantFrom<Entry>('forward', 'withGrad', 'backward', 'ctxBackward'),
}).chain(({ base, entry }) => mutationsFor(entry).map((mutation) => ({ base, entry, mutation })));

const numel = (shape: readonly number[]): number => shape.reduce((a, x) => a * x, 1);

/**
 * Builds the call: creates every tensor it needs (and, for ctx.backward, a valid context) up front,
 * so that the call itself should allocate nothing. Returns the call, the words its error message must
 * contain, whether the refusal happens in JS (then a context stays usable), and a cleanup.
 */
function build(base: Base, entry: Entry, m: Mutation): { call: () => unknown; mention: string; inJs: boolean; ctx?: AttentionContext; cleanup: () => void } {
  const owned: Tensor[] = [];
  const hq = base.hkv * base.group;
  const make = (shape: number[], dtype: DType = base.dtype): Tensor => {
    const t = Tensor.fromFloat32Array(new Float32Array(numel(shape)).map((_, i) => Math.sin(i + 1)), shape, { dtype, device: 'cpu' });
    owned.push(t);
    return t;
  };
  const qs = [base.b, base.sq, hq, base.d];
  const ks = [base.b, base.sk, base.hkv, base.d];
  const args: Record<TArg, unknown> = {
    q: make(qs), k: make(ks), v: make(ks), dout: make(qs), out: make(qs), lse: make([base.b, hq, base.sq], 'float32'),
  };
  // ctx.backward() takes only the backward's own options; the mask belongs to the forward.
  let opts: unknown = entry === 'ctxBackward' ? undefined : { causal: base.causal };
  let mention = '';
  let inJs = true;
  let factory: (() => unknown) | undefined;
  const shapeOfArg = (a: TArg): number[] => (a === 'lse' ? [base.b, hq, base.sq] : a === 'k' || a === 'v' ? ks : qs);
  const otherDtype = (pick: number): DType => DTYPE_LIST.filter((x) => x !== base.dtype)[pick];

  switch (m.kind) {
    case 'rank': {
      const s = shapeOfArg(m.arg);
      const flat = numel(s);
      // One dim more than the right rank (a trailing 1), or the same elements in fewer dims.
      const shape = m.rank === 1 ? [flat] : m.rank === 2 ? [s[0], flat / s[0]] : m.rank === 3 && s.length === 4
        ? [s[0], s[1], flat / (s[0] * s[1])] : [...s, 1];
      args[m.arg] = make(shape, m.arg === 'lse' ? 'float32' : base.dtype);
      mention = `Expected ${m.arg} `;
      break;
    }
    case 'batch': {
      const s = [base.b + 1, ...ks.slice(1)];
      args[m.arg] = make(s);
      mention = `Expected ${m.arg} `;
      break;
    }
    case 'seqlen': {
      const s = shapeOfArg(m.arg).slice();
      s[1] += 1;
      args[m.arg] = make(s);
      mention = `Expected ${m.arg} `;
      break;
    }
    case 'heads': {
      if (m.arg === 'k') {
        const s = [base.b, base.sk, hq + 1, base.d]; // hq is never a multiple of hq + 1
        args.k = make(s);
        args.v = make(s);
        mention = 'heads of k';
      } else {
        args.v = make([base.b, base.sk, base.hkv + 1, base.d]);
        mention = 'Expected v to have the shape of k';
      }
      break;
    }
    case 'headDim': {
      const dq = [base.b, base.sq, hq, m.value];
      const dk = [base.b, base.sk, base.hkv, m.value];
      Object.assign(args, { q: make(dq), k: make(dk), v: make(dk), dout: make(dq), out: make(dq) });
      mention = 'Expected headDim of q ';
      break;
    }
    case 'headDimK': {
      const s = [base.b, base.sk, base.hkv, base.d + 8];
      args.k = make(s);
      args.v = make(s);
      mention = 'Expected k to have headDim';
      break;
    }
    case 'dtype': {
      const dt = m.arg === 'lse' ? (['float16', 'bfloat16'] as const)[m.pick] : otherDtype(m.pick);
      args[m.arg] = make(shapeOfArg(m.arg), dt);
      mention = `Expected ${m.arg} to have dtype`;
      break;
    }
    case 'lseShape': {
      const s = [[base.b, hq, base.sq + 1], [base.b, hq + 1, base.sq], [base.b + 1, hq, base.sq]][m.variant];
      args.lse = make(s, 'float32');
      mention = 'Expected lse to have shape';
      break;
    }
    case 'option': {
      opts = entry === 'ctxBackward' ? { [m.key]: m.value } : { causal: base.causal, [m.key]: m.value };
      mention = m.key;
      // Only the addon knows that the CPU has no naive kernel and one backward algorithm.
      inJs = !(m.value === 'naive' || m.value === 'two-kernel');
      break;
    }
    case 'options': {
      opts = m.value;
      mention = 'Expected options to be an object or undefined';
      break;
    }
    case 'disposed': {
      const t = make(shapeOfArg(m.arg), m.arg === 'lse' ? 'float32' : base.dtype);
      t.dispose();
      args[m.arg] = t;
      mention = `Expected ${m.arg} to be a live Tensor`;
      break;
    }
    case 'notTensor': {
      args[m.arg] = m.value;
      mention = `Expected ${m.arg} to be a `;
      break;
    }
    case 'extraKey': {
      opts = { deterministic: false, [m.key]: m.key === 'causal' ? base.causal : m.key === 'softmaxScale' ? 0.5 : 'x' };
      mention = 'Expected options of backward() to hold only';
      break;
    }
    case 'factory': {
      const data = new Float32Array(6);
      const half = new Uint16Array(6);
      const variants: [() => unknown, string][] = [
        [() => Tensor.fromFloat32Array(data, [0, 6]), 'every dim of shape'],
        [() => Tensor.fromFloat32Array(data, []), 'Expected shape '],
        [() => Tensor.fromFloat32Array(data, [2.5, 2]), 'every dim of shape'],
        [() => Tensor.fromFloat32Array(data, [-6]), 'every dim of shape'],
        [() => Tensor.fromFloat32Array(data, [NaN]), 'every dim of shape'],
        [() => Tensor.fromFloat32Array(data, [7]), 'Expected data to have 7 elements'],
        [() => Tensor.fromFloat32Array([1, 2, 3, 4, 5, 6] as unknown as Float32Array, [6]), 'Expected data to be a Float32Array'],
        [() => Tensor.fromFloat32Array(data, [6], { dtype: 'float64' as DType }), 'options.dtype'],
        [() => Tensor.fromFloat32Array(data, [6], { device: 'gpu' as 'cpu' }), 'options.device'],
        [() => Tensor.fromFloat32Array(data, [6], 'cpu' as unknown as { device: 'cpu' }), 'Expected options '],
        [() => Tensor.fromBits(half, [6], {}), 'options.dtype'],
        [() => Tensor.fromBits(data, [6], { dtype: 'bfloat16', device: 'cpu' }), 'Expected bits to be a Uint16Array'],
        [() => Tensor.fromBits(half, [2, 4], { dtype: 'float16', device: 'cpu' }), 'Expected bits to have 8 elements'],
        [() => Tensor.fromFloat32Array(data, [2 ** 31, 2 ** 31, 2 ** 31]), 'fewer than 2^53'],
        [() => resetPeakMemory('gpu' as 'cpu'), 'Expected device '],
      ];
      [factory, mention] = variants[m.variant];
      break;
    }
  }

  let ctx: AttentionContext | undefined;
  if (entry === 'ctxBackward') {
    ctx = flashAttentionWithGrad(args.q as Tensor, args.k as Tensor, args.v as Tensor, { causal: base.causal });
    owned.push(ctx.out, ctx.lse);
  }
  const c = ctx;
  const A = args as Record<TArg, Tensor>;
  const O = opts as AttentionBackwardOptions;
  const call = factory ?? {
    forward: () => flashAttention(A.q, A.k, A.v, O),
    withGrad: () => flashAttentionWithGrad(A.q, A.k, A.v, O),
    backward: () => flashAttentionBackward(A.dout, A.q, A.k, A.v, A.out, A.lse, O),
    ctxBackward: () => c!.backward(A.dout, O as { deterministic?: boolean }),
  }[entry];
  return {
    call, mention, inJs, ctx,
    cleanup: () => {
      ctx?.dispose();
      for (const t of owned) t.dispose();
    },
  };
}

/** Disposes whatever an unexpectedly successful call returned. */
function disposeResult(r: unknown): void {
  if (r instanceof Tensor) r.dispose();
  else if (r instanceof AttentionContext) {
    r.dispose();
    r.out.dispose();
    r.lse.dispose();
  } else if (r && typeof r === 'object') {
    for (const x of Object.values(r)) if (x instanceof Tensor) x.dispose();
  }
}

test('random invalid calls throw a TypeError or RangeError "Expected ..." naming the problem, and allocate nothing', async () => {
  await synchronize('cpu');
  const start = liveMemory();
  const property = fc.asyncProperty(invalidCall, async ({ base, entry, mutation }) => {
    const { call, mention, inJs, ctx, cleanup } = build(base, entry, mutation);
    try {
      // Nothing queued (the last case's cleanup, this one's context) may free memory during the call.
      await synchronize('cpu');
      const before = liveMemory();
      let thrown: unknown;
      try {
        disposeResult(call());
      } catch (e) {
        thrown = e;
      }
      const after = liveMemory();
      // Errors from the addon come from another realm: compare names, not classes.
      const err = thrown as { name?: string; message?: string } | undefined;
      expect(err === undefined ? 'did not throw' : ['TypeError', 'RangeError'].includes(String(err.name))).toBe(true);
      expect(String(err!.message)).toMatch(/^Expected /);
      expect(String(err!.message)).toContain(mention);
      expect(after).toEqual(before);
      // A backward() refused before it reached the addon leaves the context usable.
      if (ctx && inJs) expect(ctx.released).toBe(false);
    } finally {
      cleanup();
    }
  });
  await assertProperty('invalid', property as unknown as fc.IAsyncProperty<[unknown]>, 500);
  await synchronize('cpu');
  expect(liveMemory()).toEqual(start);
});
