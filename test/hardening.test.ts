/**
 * Regression tests of the hardening classes of issue 16 that lib/ closes: options objects refuse
 * unknown keys and wrong types (a typo must not run with a default; the layer constructors' too), a
 * Tensor's identity cannot be reassigned, detached or hand-made calls get an error that says what to
 * do instead of a silent no-op or a misleading message, and the float64 reference refuses arrays of
 * non-float values. Every refused call leaves memory() as it was. The raw binding refuses handles of
 * the wrong kind (type tags) instead of crashing. CPU tensors (the checks are device-independent).
 */

import * as fs from 'fs';
import * as path from 'path';

import {
  Block, CausalSelfAttention, Embedding, flashAttention, flashAttentionWithGrad, GPT, LayerNorm, Linear, MLP,
  referenceAttention, RMSNorm, Tensor,
} from '../lib';
import type { TransformerOptions } from '../lib';
import { binding } from '../lib/native';
import { handleOf } from '../lib/tensor';
import { liveMemory, synchronizeAll, trackMemory } from './helpers/backend';
import { LIB_ENTRY, runNodeChild } from './helpers/child';

trackMemory();

/**
 * Runs fn, which must throw `name` with a message matching `message`, and leave memory() unchanged
 * (measured after the queued work of earlier calls has finished and freed what it held).
 */
async function refused(fn: () => unknown, name: 'TypeError' | 'RangeError', message: RegExp): Promise<void> {
  await synchronizeAll();
  const before = liveMemory();
  let thrown: unknown;
  try {
    fn();
  } catch (e) {
    thrown = e;
  }
  expect(thrown).toBeDefined();
  expect((thrown as Error).name).toBe(name);
  expect((thrown as Error).message).toMatch(message);
  await synchronizeAll();
  expect(liveMemory()).toEqual(before);
}

function qkv(): Tensor {
  const data = Float32Array.from({ length: 2 * 4 * 2 * 8 }, (_, i) => Math.sin(i));
  return Tensor.fromFloat32Array(data, [2, 4, 2, 8], { device: 'cpu' });
}

describe('options objects refuse unknown keys and wrong types', () => {
  test("the forward refuses a typo ({ casual: true }) instead of running non-causal", async () => {
    const q = qkv();
    try {
      await refused(() => flashAttention(q, q, q, { casual: true } as never), 'TypeError',
        /^Expected options to have only the keys 'causal', .* but received unknown key 'casual'$/);
    } finally {
      q.dispose();
    }
  });

  test('the forward checks the backward keys it accepts (one options object serves both passes)', async () => {
    const q = qkv();
    try {
      await refused(() => flashAttention(q, q, q, { deterministic: 'yes' } as never), 'TypeError',
        /^Expected options.deterministic to be a boolean but received/);
      await refused(() => flashAttention(q, q, q, { algorithm: 'fast' } as never), 'TypeError', /^Expected options.algorithm to be/);
      await refused(() => flashAttentionWithGrad(q, q, q, { causal: true, dropout: 0.1 } as never), 'TypeError',
        /unknown key 'dropout'/);
      const { out, lse } = flashAttention(q, q, q, { causal: true, deterministic: true, algorithm: 'auto' });
      out.dispose();
      lse.dispose();
    } finally {
      q.dispose();
    }
  });

  test('tensor factories refuse an Array or unknown keys where the options object belongs', async () => {
    const data = new Float32Array(4);
    await refused(() => Tensor.fromFloat32Array(data, [4], [] as never), 'TypeError',
      /^Expected options to be an object or undefined but received an Array/);
    await refused(() => Tensor.fromFloat32Array(data, [4], { dtyp: 'float16' } as never), 'TypeError',
      /^Expected options to have only the keys 'dtype' or 'device' but received unknown key 'dtyp'$/);
    await refused(() => Tensor.empty([4], { device: 'cpu', size: 4 } as never), 'TypeError', /unknown key 'size'/);
    await refused(() => Tensor.fromInt32Array(new Int32Array(4), [4], { devices: 'cpu' } as never), 'TypeError',
      /unknown key 'devices'/);
  });

  test('reads refuse a range with unknown keys or an Array', async () => {
    const t = Tensor.fromFloat32Array(new Float32Array(4), [4], { device: 'cpu' });
    try {
      const reads: ((r: unknown) => Promise<unknown>)[] = [(r) => t.toFloat32Array(r as never), (r) => t.toBits(r as never),
        (r) => t.readInto(new Float32Array(4), r as never)];
      for (const read of reads) {
        await expect(Promise.resolve().then(() => read({ offst: 1 }))).rejects.toThrow(
          /^Expected range to have only the keys 'offset' or 'length' but received unknown key 'offst'$/);
        await expect(Promise.resolve().then(() => read([0, 1]))).rejects.toThrow(/^Expected range to be an object/);
      }
      expect(Array.from(await t.toFloat32Array({ offset: 1, length: 2 }))).toEqual([0, 0]);
    } finally {
      t.dispose();
    }
  });

  test('the layer constructors refuse unknown keys, wrong types and bad sizes, and allocate nothing', async () => {
    const normal = (n: number): Float32Array => new Float32Array(n);
    const ok = { device: 'cpu' as const, normal };
    await refused(() => new Linear(4, 3, { ...ok, baias: false } as never),
      'TypeError', /^Expected Linear options to have only the keys 'dtype', .* but received unknown key 'baias'$/);
    await refused(() => new Linear(4, 3, [] as never), 'TypeError', /^Expected Linear options to be an object but received an Array/);
    await refused(() => new Linear(0, 3, ok), 'RangeError', /^Expected Linear inFeatures to be an integer >= 1 but received 0$/);
    await refused(() => new Linear(4, 2.5, ok), 'RangeError', /^Expected Linear outFeatures to be an integer >= 1 but received 2.5$/);
    await refused(() => new Linear(4, 3, { ...ok, device: 'gpu' } as never), 'TypeError', /^Expected Linear options.device to be 'cpu' or 'cuda'/);
    await refused(() => new Linear(4, 3, { device: 'cpu' } as never), 'TypeError', /^Expected Linear options.normal to be a function/);
    await refused(() => new Linear(4, 3, { ...ok, activation: 'relu' } as never), 'TypeError', /^Expected Linear options.activation/);
    await refused(() => new Embedding(8, 4, { ...ok, bias: true } as never), 'TypeError', /unknown key 'bias'$/);
    await refused(() => new LayerNorm(4, { device: 'cpu', eps: -1 }), 'RangeError', /^Expected LayerNorm options.eps to be a finite number > 0/);
    await refused(() => new RMSNorm(4, { device: 'cpu', bias: false } as never), 'TypeError', /^Expected RMSNorm options to have only .* unknown key 'bias'$/);
    const t: TransformerOptions = {
      device: 'cpu', normal, dModel: 8, heads: 2, layers: 1, norm: 'layernorm', mlp: 'gelu', mlpHidden: 32, bias: true, rope: false,
    };
    await refused(() => new CausalSelfAttention({ ...t, heads: 3 }), 'RangeError', /^Expected CausalSelfAttention options.dModel \(8\) to be a multiple/);
    await refused(() => new MLP({ ...t, mlp: 'relu' } as never), 'TypeError', /^Expected MLP options.mlp to be 'gelu' or 'swiglu'/);
    await refused(() => new Block({ ...t, dropout: 0.1 } as never), 'TypeError', /^Expected Block options to have only .* unknown key 'dropout'$/);
    new Block(t).dispose();
  });

  test('a layer reads each option once (a getter cannot answer the check and the use differently)', () => {
    let reads = 0;
    const options = {
      device: 'cpu' as const, normal: (n: number): Float32Array => new Float32Array(n),
      get bias(): boolean { reads += 1; return reads > 1; },
    };
    const layer = new Linear(4, 3, options);
    expect(reads).toBe(1);
    expect(layer.bias).toBeNull();
    layer.dispose();
  });

  test('a GPT config refuses unknown keys', async () => {
    const zeros = (n: number): Float32Array => new Float32Array(n);
    await refused(() => new GPT({ vocabSize: 8, blockSize: 4, layers: 1, heads: 1, dModel: 8, device: 'cpu', layer: 2 } as never, zeros),
      'TypeError', /^Expected config to have only the keys 'vocabSize', .* but received unknown key 'layer'$/);
  });
});

describe("a Tensor's identity is read-only", () => {
  test('shape, dtype, device, numel, strides and offset cannot be reassigned; shape cannot grow', async () => {
    const t = Tensor.fromFloat32Array(new Float32Array(6), [2, 3], { device: 'cpu' });
    try {
      const w = t as unknown as Record<string, unknown>;
      for (const [key, value] of [['shape', [6]], ['dtype', 'float16'], ['device', 'cuda'], ['numel', 1],
        ['strides', [1]], ['offset', 3]] as const) {
        expect(() => { w[key] = value; }).toThrow(TypeError);
      }
      expect(() => (t.shape as number[]).push(4)).toThrow(TypeError);
      expect(t.shape).toEqual([2, 3]);
      expect(t.dtype).toBe('float32');
      expect(t.device).toBe('cpu');
      expect(t.numel).toBe(6);
      expect(t.toString()).toBe('Tensor(float32 [2, 3] on cpu)');
    } finally {
      t.dispose();
    }
  });

  test("a view's shape does not alias the array it was given", async () => {
    const t = Tensor.fromFloat32Array(new Float32Array(6), [2, 3], { device: 'cpu' });
    const dims = [3, 2];
    const v = t.view(dims);
    dims[0] = 6;
    expect(v.shape).toEqual([3, 2]);
    v.dispose();
    t.dispose();
  });
});

describe('detached and hand-made calls say what to do', () => {
  test('dispose() called without its tensor throws and frees nothing; bound, it frees', async () => {
    const t = Tensor.fromFloat32Array(new Float32Array(4), [4], { device: 'cpu' });
    const detached = t.dispose;
    await refused(() => detached(), 'TypeError', /^dispose\(\) was called without its tensor: call t\.dispose\(\)/);
    expect(t.disposed).toBe(false);
    const bound = t.dispose.bind(t);
    bound();
    expect(t.disposed).toBe(true);
  });

  test("the constructor points to the factories; an object with Tensor's prototype is not a tensor", async () => {
    await refused(() => new (Tensor as unknown as new () => Tensor)(), 'TypeError',
      /^Tensor has no public constructor: create tensors with Tensor\.fromFloat32Array/);
    const fake = { bytes: 16, release: () => undefined, share: () => fake };
    await refused(() => new (Tensor as unknown as new (...a: unknown[]) => Tensor)(fake, [4], 'float32', 'cpu'), 'TypeError',
      /no public constructor/);
    const imitation = Object.create(Tensor.prototype) as Tensor;
    await refused(() => flashAttention(imitation, imitation, imitation), 'TypeError',
      /^Expected q to be a Tensor made by this library but received an object with Tensor's prototype and no storage$/);
  });

  test('a disposed tensor is called disposed', async () => {
    const q = qkv();
    q.dispose();
    await refused(() => flashAttention(q, q, q), 'TypeError', /^Expected q to be a live Tensor but received a disposed Tensor$/);
  });
});

describe('the float64 reference takes float values only', () => {
  const shape = { batch: 1, seqlenQ: 2, seqlenK: 2, headsQ: 1, headsKV: 1, headDim: 8 };

  test.each([
    ['Uint16Array (half-precision bits)', () => new Uint16Array(16), /received a Uint16Array$/],
    ['Int32Array', () => new Int32Array(16), /received an Int32Array$/],
    ['an Array holding a string', () => [...new Array(15).fill(0), '1'], /received an Array with a non-number$/],
  ])('refuses %s', async (_, make, message) => {
    const good = new Float32Array(16);
    await refused(() => referenceAttention(make() as never, good, good, shape), 'TypeError', message as RegExp);
    await refused(() => referenceAttention(good, good, make() as never, shape), 'TypeError', message as RegExp);
  });

  test('takes Float32Array, Float64Array and number[]', async () => {
    const values = Array.from({ length: 16 }, (_, i) => Math.cos(i));
    const a = referenceAttention(Float32Array.from(values), Float64Array.from(values), values, shape);
    expect(a.out.length).toBe(16);
    expect(Number.isFinite(a.out[0])).toBe(true);
  });
});

describe('the raw binding refuses handles of the wrong kind (in a child process: a crash fails the test)', () => {
  // Each case calls the raw binding with an object or External of another kind; the child prints the
  // error's name and message. Before the type tags, 'timer as buffer handle' ended the process with
  // SIGSEGV (exit 139).
  const cases: [string, string, RegExp][] = [
    ['timer handle as a buffer handle', 'new b.NativeBuffer(b.timerStart(0))',
      /^TypeError: NativeBuffer cannot be constructed from JS; use the Tensor factories$/],
    ['an object with NativeBuffer.prototype as a tensor argument', 'b.transfer(Object.create(b.NativeBuffer.prototype), 1, 0)',
      /^TypeError: Expected src to be a native buffer made by the addon but received an object with its prototype only$/],
    ['an object with NativeBuffer.prototype adopted by a Tensor', "new lib.Tensor(Object.create(b.NativeBuffer.prototype), [1], 'float32', 'cpu')",
      /^TypeError: Tensor has no public constructor/],
    ['a plain object as a timer handle', 'b.timerStop({})', /^TypeError: Expected timer to be a handle from timerStart but received an object$/],
    ['a buffer as a timer handle', "b.timerStop(b.createEmpty(0, 0, 4))", /^TypeError: Expected timer to be a handle from timerStart/],
  ];

  test.each(cases)('%s', (_, call, expected) => {
    const script = `
      const lib = require(${JSON.stringify(LIB_ENTRY)});
      const b = require(${JSON.stringify(LIB_ENTRY.replace(/index\.ts$/, 'native.ts'))}).binding();
      try { ${call}; console.log('no error'); } catch (e) { console.log(e.name + ': ' + e.message); }
      global.gc && global.gc();
    `;
    const run = runNodeChild(script, { cwd: process.cwd(), nodeArgs: ['--expose-gc'] });
    expect(run.signal).toBeNull();
    expect(run.status).toBe(0);
    expect(run.stdout.trim()).toMatch(expected);
  });

  test('isNativeBuffer tells the addon\'s buffers from imitations', () => {
    const b = binding();
    const t = Tensor.fromFloat32Array(new Float32Array(2), [2], { device: 'cpu' });
    try {
      expect(b.isNativeBuffer(handleOf(t, 't'))).toBe(true);
      expect(b.isNativeBuffer(Object.create((b.NativeBuffer as { prototype: object }).prototype))).toBe(false);
      expect(b.isNativeBuffer({ bytes: 8, released: false })).toBe(false);
      expect(b.isNativeBuffer(undefined)).toBe(false);
    } finally {
      t.dispose();
    }
  });
});

describe('inputs are read once, validated, then used (nothing is allocated before validation)', () => {
  test('a typed array whose length getter lies is measured by its real length', async () => {
    class Lying extends Float32Array {
      override get length(): number {
        return 8;
      }
    }
    await refused(() => Tensor.fromFloat32Array(new Lying(4), [8], { device: 'cpu' }), 'RangeError',
      /^Expected data to have 8 elements for shape \[8\] but received 4$/);
    class LyingInt extends Int32Array {
      override get length(): number {
        return 2;
      }
    }
    await refused(() => Tensor.fromInt32Array(new LyingInt(4), [2], { device: 'cpu' }), 'RangeError',
      /^Expected data to have 2 elements for shape \[2\] but received 4$/);
    const t = Tensor.fromFloat32Array(new Float32Array(4), [4], { device: 'cpu' });
    try {
      await expect(Promise.resolve().then(() => t.readInto(new Lying(2) as Float32Array))).rejects.toThrow(
        /^Expected target to have 4 elements \(the elements read\) but received 2$/);
    } finally {
      t.dispose();
    }
  });

  test('a shape whose elements change between reads is read once', () => {
    let reads = 0;
    const shape = [2, 2];
    Object.defineProperty(shape, 1, { get: () => (++reads > 1 ? 3 : 2), enumerable: true });
    const t = Tensor.fromFloat32Array(new Float32Array(4), shape, { device: 'cpu' });
    try {
      expect(t.shape).toEqual([2, 2]);
      expect(t.numel).toBe(4);
      expect(reads).toBe(1);
    } finally {
      t.dispose();
    }
  });
});

describe('a refused call changes nothing', () => {
  test('ctx.backward refused by the native layer keeps the saved tensors; a corrected retry runs', async () => {
    const q = qkv();
    const dout = qkv();
    const ctx = flashAttentionWithGrad(q, q, q, { causal: true });
    try {
      // The CPU backend has one backward algorithm: only C++ knows, after lib/ validated everything.
      await refused(() => ctx.backward(dout, { algorithm: 'two-kernel' }), 'RangeError',
        /^Expected algorithm to be 'auto' or 'single-kernel' for this call but received 'two-kernel': the CPU backend has one backward algorithm$/);
      expect(ctx.released).toBe(false);
      const g = ctx.backward(dout);
      expect(ctx.released).toBe(true);
      const fresh = flashAttentionWithGrad(q, q, q, { causal: true });
      const h = fresh.backward(dout);
      for (const key of ['dq', 'dk', 'dv'] as const) {
        expect(Array.from(await g[key].toFloat32Array())).toEqual(Array.from(await h[key].toFloat32Array()));
      }
      for (const t of [g.dq, g.dk, g.dv, h.dq, h.dk, h.dv, fresh.out, fresh.lse]) t.dispose();
    } finally {
      for (const t of [ctx.out, ctx.lse, q, dout]) t.dispose();
      ctx.dispose();
    }
  });
});

// The entry points of package.json resolve to the compiled dist/ (npm install builds it; CI has it).
const ROOT = path.resolve(__dirname, '..');
const BUILT = fs.existsSync(path.join(ROOT, 'dist', 'lib', 'index.js')) && fs.existsSync(path.join(ROOT, 'dist', 'lib', 'testing.js'));

describe('the package entry points', () => {
  if (!BUILT) {
    test.skip('entry points: skipped because dist/lib has no build (run `npm run build:ts`)', () => undefined);
    return;
  }
  test('the test hooks are at flash-attn-node/testing, not on the main entry; deep imports are closed', () => {
    // The package refers to itself by name (its "exports"), as an installed copy would be required.
    const child = runNodeChild(`
      const out = { mainDebug: typeof require('flash-attn-node').debug };
      out.testing = typeof require('flash-attn-node/testing').debug.poisonOutputs;
      try { require('flash-attn-node/dist/lib/tensor'); out.deep = 'loaded'; } catch (e) { out.deep = e.code; }
      process.stdout.write(JSON.stringify(out));
    `, { cwd: ROOT });
    expect(child.stderr).toBe('');
    expect(JSON.parse(child.stdout)).toEqual({ mainDebug: 'undefined', testing: 'function', deep: 'ERR_PACKAGE_PATH_NOT_EXPORTED' });
  });
});

describe('the raw binding refuses extra arguments', () => {
  test('every function throws a TypeError for more arguments than its signature has', () => {
    const b = binding() as unknown as Record<string, unknown>;
    const names = Object.keys(b).filter((k) => typeof b[k] === 'function' && k !== 'NativeBuffer');
    expect(names.length).toBeGreaterThan(30);
    for (const name of names) {
      let thrown: unknown;
      try {
        (b[name] as (...a: unknown[]) => unknown)(...new Array(20).fill(undefined));
      } catch (e) {
        thrown = e;
      }
      expect({ name, message: (thrown as Error | undefined)?.message }).toEqual({
        name, message: expect.stringMatching(/^Expected at most \d+ arguments? but received 20$/),
      });
    }
    expect(() => (b.timerStart as (...a: unknown[]) => unknown)(0, 'extra')).toThrow(
      /^Expected at most 1 argument but received 2$/);
  });
});
