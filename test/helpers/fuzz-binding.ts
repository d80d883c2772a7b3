/**
 * The raw binding's fuzz driver, run in a child process by test/fuzz.test.ts (a crash then ends the
 * child, not the test runner, and is reported with its seed). Every function of the binding is
 * called with random argument lists: wrong counts, numbers at and past the limits, strings,
 * bigints, typed arrays of every kind (detached ones too), live, released and imitation buffers,
 * Proxies whose traps throw, objects with throwing getters. A share of the cases calls an attention
 * function with its one options object: every key, mostly with a value of the right kind (small
 * buffers, dims, booleans, codes, strides, gradient targets) so that calls reach the shape, view and
 * overlap checks, now and then a key left out or an unknown one added; the object plain, with a null
 * prototype, behind a Proxy, with a throwing getter or with a throwing ownKeys trap. Each call must
 * either return or throw an Error with a message (not a bare "internal" one), and once what it
 * created is released and the CPU executor has drained, memory() must be what it was before the call.
 *
 * Not fuzzed: `importPointer` (it takes a raw address by contract, as DLPack does: a random one is
 * undefined behaviour by design) and `injectCudaFault` (a test hook that breaks the CUDA context).
 */
import * as fc from 'fast-check';

import { binding } from '../../lib/native';
import { FuzzReport, judgeThrown } from './fuzz-common';

const SKIPPED = new Set(['importPointer', 'injectCudaFault', 'NativeBuffer']);
// The buffer class is called as a constructor (it takes only the addon's own tagged handle).
const CONSTRUCT = 'new NativeBuffer';

/** What a case's argument is, materialised fresh for each call. */
type Spec =
  | { k: 'value'; v: unknown }
  | { k: 'buffer'; n: number; dtype: number }
  | { k: 'bufferAt'; n: number; offset: number }
  | { k: 'released' }
  | { k: 'imitation' }
  | { k: 'typed'; kind: string; n: number }
  | { k: 'detached' }
  | { k: 'throwingProxy' }
  | { k: 'throwingGetter' }
  | { k: 'timer' }
  | { k: 'array'; items: Spec[] }
  | { k: 'object'; entries: [string, Spec][]; wrap: 'plain' | 'nullProto' | 'proxy' | 'throwingGetter' | 'throwingKeys' };

const TYPED: Record<string, new (n: number) => ArrayBufferView> = {
  Float32Array, Float64Array, Int32Array, Uint16Array, Uint8Array, Int8Array, BigInt64Array,
};

const leafSpec: fc.Arbitrary<Spec> = fc.oneof(
  fc.integer({ min: -3, max: 70 }).map((v) => ({ k: 'value', v }) as Spec),
  fc.constantFrom(0, -1, 1.5, NaN, Infinity, -Infinity, -0, 2 ** 31, 2 ** 32, 2 ** 53, Number.MAX_VALUE)
    .map((v) => ({ k: 'value', v }) as Spec),
  fc.constantFrom('', 'cpu', 'cuda', 'float32', 'auto', 'flash', 'x'.repeat(64)).map((v) => ({ k: 'value', v }) as Spec),
  fc.constantFrom(true, false, null, undefined, 0n, -1n, 2n ** 64n, {}, [], () => 1, Symbol('s'))
    .map((v) => ({ k: 'value', v }) as Spec),
  fc.record({ n: fc.integer({ min: 1, max: 64 }), dtype: fc.integer({ min: 0, max: 3 }) }).map((r) => ({ k: 'buffer', ...r }) as Spec),
  fc.record({ n: fc.integer({ min: 1, max: 64 }), offset: fc.integer({ min: -2, max: 70 }) }).map((r) => ({ k: 'bufferAt', ...r }) as Spec),
  fc.constant({ k: 'released' } as Spec),
  fc.constant({ k: 'imitation' } as Spec),
  fc.record({ kind: fc.constantFrom(...Object.keys(TYPED)), n: fc.integer({ min: 0, max: 64 }) }).map((r) => ({ k: 'typed', ...r }) as Spec),
  fc.constant({ k: 'detached' } as Spec),
  fc.constant({ k: 'throwingProxy' } as Spec),
  fc.constant({ k: 'throwingGetter' } as Spec),
  fc.constant({ k: 'timer' } as Spec),
);
const argSpec: fc.Arbitrary<Spec> = fc.oneof(
  { weight: 6, arbitrary: leafSpec },
  { weight: 1, arbitrary: fc.array(leafSpec, { maxLength: 16 }).map((items) => ({ k: 'array', items }) as Spec) },
);

// Options objects: `entries` become the object's keys, `wrap` says how it is handed over.
const WRAPS = [...new Array<'plain'>(12).fill('plain'), 'nullProto', 'proxy', 'throwingGetter', 'throwingKeys'] as const;
const optionsOf = (entries: fc.Arbitrary<[string, Spec][]>): fc.Arbitrary<Spec> =>
  fc.record({ entries, wrap: fc.constantFrom(...WRAPS) }).map((r) => ({ k: 'object', ...r }) as Spec);
const value = (v: unknown): Spec => ({ k: 'value', v });
const ints = (list: number[]): Spec => ({ k: 'array', items: list.map(value) });
/** Mostly `plausible`, sometimes anything. */
const mostly = (plausible: fc.Arbitrary<Spec>): fc.Arbitrary<Spec> =>
  fc.oneof({ weight: 16, arbitrary: plausible }, { weight: 1, arbitrary: argSpec });
const tensorSpec = mostly(fc.oneof(
  fc.record({ n: fc.integer({ min: 8, max: 256 }), dtype: fc.constantFrom(0, 0, 0, 1, 2) }).map((r) => ({ k: 'buffer', ...r }) as Spec),
  fc.record({ n: fc.integer({ min: 8, max: 256 }), offset: fc.integer({ min: 0, max: 16 }) }).map((r) => ({ k: 'bufferAt', ...r }) as Spec),
));
const stridesSpec = (count: number): fc.Arbitrary<Spec> => fc.oneof(
  { weight: 4, arbitrary: fc.constant(value(undefined)) },
  { weight: 3, arbitrary: fc.array(fc.integer({ min: 0, max: 64 }), { minLength: 3 * count, maxLength: 3 * count }).map(ints) },
  { weight: 1, arbitrary: argSpec },
);
// The value of each key of the attention calls' options (strides: stridesSpec of the call's tensor
// count): mostly of the right kind and small sizes, so that calls get past the type checks to the
// shape, view and overlap checks (and some run).
const OPTION_VALUES: Record<string, fc.Arbitrary<Spec>> = {
  q: tensorSpec, k: tensorSpec, v: tensorSpec, dout: tensorSpec, out: tensorSpec, lse: tensorSpec,
  dims: mostly(fc.tuple(fc.integer({ min: 1, max: 2 }), fc.integer({ min: 1, max: 4 }), fc.integer({ min: 1, max: 4 }),
    fc.integer({ min: 1, max: 2 }), fc.integer({ min: 1, max: 2 }), fc.constantFrom(8, 16))
    .map(([b, sq, sk, group, hkv, d]) => ints([b, sq, sk, group * hkv, hkv, d]))),
  causal: mostly(fc.boolean().map(value)),
  deterministic: mostly(fc.boolean().map(value)),
  softmaxScale: mostly(fc.constantFrom(0.25, 0.25, 0.5, 1, 1, 1e-50, -1, NaN).map(value)),
  softcap: mostly(fc.constantFrom(0, 0, 2, 30, 1e-50, 1e39, -1, NaN).map(value)),
  alibiSlopes: mostly(fc.constantFrom([0.5], [0.5, 0.25], [0.5, 0.25, 0.125, 0.0625], [NaN], [1e39]).map(ints)),
  window: mostly(fc.tuple(fc.constantFrom(-1, -1, 0, 1, 3, -2, 0.5), fc.constantFrom(-1, -1, 0, 2, 1e300)).map(([l, r]) => ints([l, r]))),
  kernel: mostly(fc.constantFrom(0, 0, 0, 1, 1, 2, -1, 3).map(value)),
  algorithm: mostly(fc.constantFrom(0, 0, 0, 1, 1, 2, -1, 3).map(value)),
  float32Precision: mostly(fc.constantFrom(0, 0, 0, 1, 1, -1, 2).map(value)),
  grads: fc.oneof(
    { weight: 4, arbitrary: fc.constant(value(undefined)) },
    { weight: 3, arbitrary: fc.array(fc.oneof(fc.constant(value(null)), tensorSpec), { minLength: 3, maxLength: 3 }).map((items) => ({ k: 'array', items }) as Spec) },
    { weight: 1, arbitrary: argSpec },
  ),
  gradStrides: stridesSpec(3),
};
const FORWARD_KEYS = ['q', 'k', 'v', 'dims', 'causal', 'softmaxScale', 'softcap', 'window', 'alibiSlopes', 'kernel', 'float32Precision', 'strides'];
const BACKWARD_KEYS = ['dout', 'q', 'k', 'v', 'out', 'lse', 'dims', 'causal', 'softmaxScale', 'softcap', 'window', 'alibiSlopes', 'kernel', 'deterministic',
  'algorithm', 'float32Precision', 'strides', 'grads', 'gradStrides'];
/** null 7 times out of 8, else a value of `arb`. */
const rarely = <T>(arb: fc.Arbitrary<T>): fc.Arbitrary<T | null> =>
  fc.oneof({ weight: 7, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: arb });
/** Every key of `keys` with a value, now and then one left out or an unknown one added. */
const optionsFor = (keys: string[], strideCount: number): fc.Arbitrary<Spec> => optionsOf(
  fc.tuple(
    fc.tuple(...keys.map((key) => (key === 'strides' ? stridesSpec(strideCount) : OPTION_VALUES[key]))),
    rarely(fc.constantFrom(...keys)),
    rarely(fc.constantFrom('casual', 'dq', '0', 'kernel ')),
    argSpec,
  ).map(([values, dropped, unknown, extra]) => {
    const entries = keys.map((key, i) => [key, values[i]] as [string, Spec]).filter(([key]) => key !== dropped);
    return unknown === null ? entries : [...entries, [unknown, extra] as [string, Spec]];
  }),
);
// Mostly random argument lists for any function; the rest, one options object for an attention call.
const caseSpec: fc.Arbitrary<[string | null, Spec[]]> = fc.oneof(
  { weight: 3, arbitrary: fc.tuple(fc.constant(null), fc.array(argSpec, { maxLength: 16 })) },
  { weight: 1, arbitrary: fc.tuple(fc.constant('attentionForward'), optionsFor(FORWARD_KEYS, 3).map((o) => [o])) },
  { weight: 1, arbitrary: fc.tuple(fc.constant('attentionBackward'), optionsFor(BACKWARD_KEYS, 5).map((o) => [o])) },
);

function describeSpec(s: Spec): string {
  if (s.k === 'value') return typeof s.v === 'bigint' ? `${s.v}n` : typeof s.v === 'symbol' ? 'Symbol' : typeof s.v === 'function' ? 'function' : JSON.stringify(s.v) ?? String(s.v);
  if (s.k === 'array') return `[${s.items.map(describeSpec).join(', ')}]`;
  if (s.k === 'object') return `${s.wrap}{${s.entries.map(([key, v]) => `${key}: ${describeSpec(v)}`).join(', ')}}`;
  return JSON.stringify(s);
}

/** Runs `cases` random calls from `seed`; resolves with what it found. */
export async function fuzzBinding(seed: number, cases: number): Promise<FuzzReport> {
  const b = binding() as unknown as Record<string, (...a: unknown[]) => unknown> & { NativeBuffer: { prototype: object } };
  const names = [...Object.keys(b).filter((k) => typeof b[k] === 'function' && !SKIPPED.has(k)).sort(), CONSTRUCT];
  const samples = fc.sample(fc.tuple(fc.constantFrom(...names), caseSpec), { numRuns: cases, seed })
    .map(([name, [fixed, specs]]) => [fixed ?? name, specs] as const);
  const report: FuzzReport = { seed, cases: samples.length, threw: 0, returned: 0, findings: [] };
  const live = (): string => {
    const m = b.memory() as { cpu: { buffers: number; bytes: number } };
    return `${m.cpu.buffers}/${m.cpu.bytes}`;
  };
  const sync = (): Promise<unknown> => b.synchronize(0) as Promise<unknown>;

  for (const [fn, specs] of samples) {
    await sync();
    const before = live();
    const made: { release(): void }[] = [];
    const materialise = (s: Spec): unknown => {
      switch (s.k) {
        case 'value': return s.v;
        case 'buffer': {
          const buf = b.createEmpty(0, s.dtype, s.n) as { release(): void };
          made.push(buf);
          return buf;
        }
        case 'bufferAt': {
          const buf = b.createEmpty(0, 0, s.n) as { release(): void };
          made.push(buf);
          return [buf, s.offset];
        }
        case 'released': {
          const buf = b.createEmpty(0, 0, 4) as { release(): void };
          buf.release();
          return buf;
        }
        case 'imitation': return Object.create(b.NativeBuffer.prototype);
        case 'typed': return new TYPED[s.kind](s.n);
        case 'detached': {
          const a = new Float32Array(8);
          structuredClone(a.buffer, { transfer: [a.buffer] });
          return a;
        }
        case 'throwingProxy': return new Proxy([], { get() { throw new Error('proxy trap'); }, has() { throw new Error('proxy trap'); } });
        case 'throwingGetter': return Object.defineProperty([1, 2], 0, { get() { throw new Error('getter'); } });
        case 'timer': return b.timerStart(0);  // an External of another kind than a buffer handle
        case 'array': return s.items.map(materialise);
        case 'object': {
          const o: Record<string, unknown> = s.wrap === 'nullProto' ? Object.create(null) : {};
          for (const [key, v] of s.entries) o[key] = materialise(v);
          if (s.wrap === 'proxy') return new Proxy(o, {});
          if (s.wrap === 'throwingGetter') {
            Object.defineProperty(o, 'causal', { enumerable: true, get() { throw new Error('getter'); } });
          }
          if (s.wrap === 'throwingKeys') return new Proxy(o, { ownKeys() { throw new Error('proxy trap'); } });
          return o;
        }
        default: return undefined;
      }
    };
    const args = specs.map(materialise);
    const shown = `${fn}(${specs.map(describeSpec).join(', ')})`;
    const check = (e: unknown): void =>
      judgeThrown(report, e, fn, shown, (msg) => /^internal/i.test(msg) || msg === 'Invalid argument');
    let result: unknown;
    try {
      result = fn === CONSTRUCT ? new (b.NativeBuffer as unknown as new (...a: unknown[]) => unknown)(...args) : b[fn](...args);
      report.returned += 1;
    } catch (e) {
      check(e);
    }
    // Results: release returned buffers, settle returned promises.
    const settle: Promise<unknown>[] = [];
    const collect = (r: unknown): void => {
      if (r instanceof Promise) settle.push(r.then(collect, (e) => { report.returned -= 1; check(e); }));
      else if (Array.isArray(r)) r.forEach(collect);
      else if (r !== null && typeof r === 'object' && b.isNativeBuffer(r)) (r as { release(): void }).release();
    };
    collect(result);
    await Promise.all(settle);
    for (const m of made) m.release();
    if (fn === 'setPoison') b.setPoison(false);
    await sync();
    const after = live();
    if (after !== before) report.findings.push({ fn, args: shown, problem: `memory ${before} -> ${after} (buffers/bytes)` });
  }
  return report;
}
