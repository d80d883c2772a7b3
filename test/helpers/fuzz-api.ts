/**
 * The public API's fuzz driver, run in a child process by test/fuzz.test.ts as fuzz-binding.ts is:
 * every function and class the package exports, and every method of a live Tensor, is called with
 * random argument lists (fast-check): real CPU tensors of every dtype (views, disposed ones),
 * objects that imitate tensors (Tensor's prototype, or plain objects with a tensor's keys), options
 * objects with known and unknown keys, typed arrays (detached ones too), Proxies whose traps throw,
 * getters that throw, numbers at and past the limits, strings, functions. Each call must return or
 * throw an Error with a message of its own: not a bare "internal" one, and not an engine error
 * (`Cannot read properties of undefined`, `x is not a function`...) that means a check was missing.
 * Once what the call returned is disposed, memory() must be what it was before it.
 *
 * Not fuzzed: `importTensor` (it takes a raw device address by contract, as DLPack does).
 */
import * as fc from 'fast-check';

import * as api from '../../lib';
import { binding } from '../../lib/native';
import { FuzzReport, judgeThrown } from './fuzz-common';

const SKIPPED = new Set(['importTensor', ...(process.env.FUZZ_SKIP ?? '').split(',').filter(Boolean)]);
/** Engine messages that mean an argument reached code that assumed a shape it did not check. */
const ENGINE_ERROR = /Cannot read propert|Cannot set propert|is not a function|is not iterable|is not a constructor|Cannot convert|undefined is not|null is not|Maximum call stack|Invalid array length|Invalid typed array length/;

type Spec =
  | { k: 'value'; v: unknown }
  | { k: 'tensor'; dtype: string; shape: number[]; view: boolean; disposed: boolean }
  | { k: 'imitation' }
  | { k: 'lying'; shape: number[] }
  | { k: 'options'; entries: [string, Spec][] }
  | { k: 'typed'; kind: string; n: number }
  | { k: 'detached' }
  | { k: 'throwingProxy' }
  | { k: 'throwingGetter' }
  | { k: 'array'; items: Spec[] };

const TYPED: Record<string, new (n: number) => ArrayBufferView> = {
  Float32Array, Float64Array, Int32Array, Uint16Array, Uint8Array, BigInt64Array,
};
const SHAPES = [[4], [2, 3], [2, 4, 2, 8], [1, 3, 2, 16], [3, 8], [2, 2, 4]];
const KEYS = ['causal', 'casual', 'scale', 'dtype', 'device', 'eps', 'bias', 'deterministic', 'algorithm', 'reduction',
  'ignoreIndex', 'lr', 'offset', 'length', 'alpha', 'grad', 'float32Precision', 'normal', 'shape', 'windowSize', 'x'];

const leaf: fc.Arbitrary<Spec> = fc.oneof(
  fc.integer({ min: -3, max: 40 }).map((v) => ({ k: 'value', v }) as Spec),
  fc.constantFrom(0, -1, 0.5, 1.5, NaN, Infinity, -Infinity, -0, 2 ** 31, 2 ** 53, Number.MAX_VALUE).map((v) => ({ k: 'value', v }) as Spec),
  fc.constantFrom('', 'cpu', 'cuda', 'float32', 'float16', 'bfloat16', 'int32', 'auto', 'mean', 'x'.repeat(40)).map((v) => ({ k: 'value', v }) as Spec),
  fc.constantFrom(true, false, null, undefined, 1n, {}, [], () => 1, Symbol('s')).map((v) => ({ k: 'value', v }) as Spec),
  fc.record({
    dtype: fc.constantFrom('float32', 'float16', 'bfloat16', 'int32'), shape: fc.constantFrom(...SHAPES),
    view: fc.boolean(), disposed: fc.boolean(),
  }).map((r) => ({ k: 'tensor', ...r }) as Spec),
  fc.constant({ k: 'imitation' } as Spec),
  fc.constantFrom(...SHAPES).map((shape) => ({ k: 'lying', shape }) as Spec),
  fc.record({ kind: fc.constantFrom(...Object.keys(TYPED)), n: fc.integer({ min: 0, max: 64 }) }).map((r) => ({ k: 'typed', ...r }) as Spec),
  fc.constant({ k: 'detached' } as Spec),
  fc.constant({ k: 'throwingProxy' } as Spec),
  fc.constant({ k: 'throwingGetter' } as Spec),
);
const optionsSpec: fc.Arbitrary<Spec> = fc.array(fc.tuple(fc.constantFrom(...KEYS), leaf), { maxLength: 4 })
  .map((entries) => ({ k: 'options', entries }) as Spec);
const argSpec: fc.Arbitrary<Spec> = fc.oneof(
  { weight: 6, arbitrary: leaf },
  { weight: 2, arbitrary: optionsSpec },
  { weight: 1, arbitrary: fc.array(leaf, { maxLength: 6 }).map((items) => ({ k: 'array', items }) as Spec) },
);

function describeSpec(s: Spec): string {
  switch (s.k) {
    case 'value':
      return typeof s.v === 'bigint' ? `${s.v}n` : typeof s.v === 'symbol' ? 'Symbol' : typeof s.v === 'function' ? 'function'
        : JSON.stringify(s.v) ?? String(s.v);
    case 'options': return `{ ${s.entries.map(([k, v]) => `${k}: ${describeSpec(v)}`).join(', ')} }`;
    case 'array': return `[${s.items.map(describeSpec).join(', ')}]`;
    default: return JSON.stringify(s);
  }
}

function isClass(f: unknown): boolean {
  return typeof f === 'function' && /^class[\s{]/.test(Function.prototype.toString.call(f));
}

/** Runs `cases` random calls of the public API from `seed` (CPU tensors); resolves with what it found. */
export async function fuzzApi(seed: number, cases: number): Promise<FuzzReport> {
  const exported = api as unknown as Record<string, unknown>;
  const names = Object.keys(exported).filter((k) => typeof exported[k] === 'function' && !SKIPPED.has(k)).sort();
  const statics = ['fromFloat32Array', 'fromBits', 'fromInt32Array', 'zeros', 'empty', 'full'].map((m) => `Tensor.${m}`);
  const methods = ['view', 'reshape', 'narrow', 'select', 'contiguous', 'clone', 'to', 'cast', 'fill', 'copyFrom',
    'toFloat32Array', 'toBits', 'readInto', 'dispose'].map((m) => `tensor.${m}`);
  const targets = [...names, ...statics, ...methods];
  const samples = fc.sample(fc.tuple(fc.constantFrom(...targets), fc.array(argSpec, { maxLength: 8 })), { numRuns: cases, seed });
  const report: FuzzReport = { seed, cases: samples.length, threw: 0, returned: 0, findings: [] };
  const b = binding();
  const live = (): string => {
    const m = b.memory();
    return `${m.cpu.buffers}/${m.cpu.bytes}`;
  };

  for (const [fn, specs] of samples) {
    await api.synchronize('cpu');
    const before = live();
    const made: api.Tensor[] = [];
    const tensor = (dtype: string, shape: number[]): api.Tensor => {
      const n = shape.reduce((a, d) => a * d, 1);
      const t = dtype === 'int32'
        ? api.Tensor.fromInt32Array(Int32Array.from({ length: n }, (_, i) => i % 3), shape, { device: 'cpu' })
        : api.Tensor.fromFloat32Array(Float32Array.from({ length: n }, (_, i) => Math.sin(i)), shape,
          { device: 'cpu', dtype: dtype as api.DType });
      made.push(t);
      return t;
    };
    const materialise = (s: Spec): unknown => {
      switch (s.k) {
        case 'value': return s.v;
        case 'tensor': {
          let t = tensor(s.dtype, s.shape);
          if (s.view && s.shape[0] > 1) {
            t = t.narrow(0, 1, s.shape[0] - 1);
            made.push(t);
          }
          if (s.disposed) t.dispose();
          return t;
        }
        case 'imitation': return Object.create(api.Tensor.prototype);
        case 'lying': return { shape: s.shape, dtype: 'float32', device: 'cpu', numel: s.shape.reduce((a, d) => a * d, 1), strides: [] };
        case 'options': return Object.fromEntries(s.entries.map(([k, v]) => [k, materialise(v)]));
        case 'typed': return new TYPED[s.kind](s.n);
        case 'detached': {
          const a = new Float32Array(8);
          structuredClone(a.buffer, { transfer: [a.buffer] });
          return a;
        }
        case 'throwingProxy': return new Proxy({}, { get() { throw new Error('proxy trap'); }, has() { throw new Error('proxy trap'); }, ownKeys() { throw new Error('proxy trap'); } });
        case 'throwingGetter': return Object.defineProperty({}, 'shape', { get() { throw new Error('getter'); }, enumerable: true });
        case 'array': return s.items.map(materialise);
        default: return undefined;
      }
    };
    const args = specs.map(materialise);
    const shown = `${fn}(${specs.map(describeSpec).join(', ')})`;
    if (process.env.FUZZ_TRACE) process.stderr.write(`${shown}\n`);
    // A throwing Proxy or getter passed in may surface its own error ('proxy trap', 'getter'): the caller's.
    const check = (e: unknown): void => judgeThrown(report, e, fn, shown, (msg) => /^internal/i.test(msg) || ENGINE_ERROR.test(msg));
    let result: unknown;
    try {
      if (fn.startsWith('Tensor.')) {
        result = (api.Tensor as unknown as Record<string, (...a: unknown[]) => unknown>)[fn.slice(7)](...args);
      } else if (fn.startsWith('tensor.')) {
        const self = tensor('float32', [2, 4, 2, 8]);
        result = (self as unknown as Record<string, (...a: unknown[]) => unknown>)[fn.slice(7)](...args);
      } else {
        const f = exported[fn] as (...a: unknown[]) => unknown;
        result = isClass(f) ? new (f as unknown as new (...a: unknown[]) => unknown)(...args) : f(...args);
      }
      report.returned += 1;
    } catch (e) {
      check(e);
    }
    // Release what came back: tensors (also inside objects and arrays), modules; settle promises.
    const settle: Promise<unknown>[] = [];
    const seen = new Set<unknown>();
    const collect = (r: unknown, depth: number): void => {
      if (r === null || typeof r !== 'object' || seen.has(r) || depth > 3) return;
      seen.add(r);
      if (r instanceof Promise) {
        settle.push(r.then((v) => collect(v, depth + 1), (e) => { report.returned -= 1; check(e); }));
      } else if (typeof (r as { dispose?: unknown }).dispose === 'function') {
        // Tensors, modules, parameters, optimizers, attention contexts.
        try { (r as { dispose(): void }).dispose(); } catch { /* already disposed */ }
      } else if (typeof (r as { release?: unknown }).release === 'function') {
        (r as { release(): void }).release();  // an exported tensor (exportTensor)
      } else if (Array.isArray(r)) {
        r.forEach((v) => collect(v, depth + 1));
      } else if (Object.getPrototypeOf(r) === Object.prototype) {
        Object.values(r).forEach((v) => collect(v, depth + 1));
      }
    };
    collect(result, 0);
    await Promise.all(settle);
    for (const t of made) t.dispose();
    await api.synchronize('cpu');
    const after = live();
    if (after !== before) report.findings.push({ fn, args: shown, problem: `memory ${before} -> ${after} (buffers/bytes)` });
  }
  return report;
}
