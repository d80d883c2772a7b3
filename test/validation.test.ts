/**
 * Bad input: every public entry point throws the exact TypeError / RangeError that lib/ (or, for
 * what only C++ checks, csrc/napi) documents, before anything is allocated (memory() unchanged).
 * The raw native binding is fed garbage too: it must throw, never crash the process.
 *
 * CPU tensors only (validation is device-independent); the device-mismatch cases run when CUDA is
 * usable.
 */

import {
  flashAttention,
  flashAttentionBackward,
  flashAttentionWithGrad,
  resetPeakMemory,
  synchronize,
  Tensor,
} from '../lib';
import { debug } from '../lib/testing';
import { binding, NativeBuffer } from '../lib/native';
import { cudaSkipReason, HAS_CUDA, liveMemory, synchronizeAll, trackMemory } from './helpers/backend';
import { randn, rngFor } from './helpers/random';

trackMemory();

type ErrorName = 'TypeError' | 'RangeError' | 'Error';

/** The thrown value's name and message (errors from the addon come from another realm: no instanceof). */
function thrownBy(fn: () => unknown): { name: string; message: string } | 'did not throw' {
  try {
    const r = fn();
    // A call that unexpectedly succeeded must not leak what it allocated.
    if (r && typeof r === 'object' && 'release' in r) (r as NativeBuffer).release();
    if (Array.isArray(r)) for (const x of r) if (x && typeof x.release === 'function') x.release();
    return 'did not throw';
  } catch (e) {
    const err = e as Error;
    return { name: err?.name, message: err?.message };
  }
}

/** Expects `fn` to throw exactly `name: message` and to allocate nothing. */
function expectThrows(fn: () => unknown, name: ErrorName, message: string): void {
  const before = liveMemory();
  expect(thrownBy(fn)).toEqual({ name, message });
  expect(liveMemory()).toEqual(before);
}

const cpu = { device: 'cpu' as const };
const f32 = (shape: number[], dtype: 'float32' | 'float16' | 'bfloat16' = 'float32'): Tensor =>
  Tensor.fromFloat32Array(randn(shape.reduce((a, b) => a * b, 1), rngFor(`validation/${shape.join('x')}/${dtype}`)), shape, { dtype, device: 'cpu' });

// Fixtures, created before the memory snapshot of each test and disposed after the file.
let q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, dout: Tensor;
let fixtures: Tensor[] = [];

/** Creates the fixtures for the enclosing describe (nested hooks run inside trackMemory's window). */
function useFixtures(): void {
  beforeAll(() => {
    q = f32([2, 16, 4, 16]);
    k = f32([2, 24, 2, 16]);
    v = f32([2, 24, 2, 16]);
    out = f32([2, 16, 4, 16]);
    lse = f32([2, 4, 16]);
    dout = f32([2, 16, 4, 16]);
    fixtures = [q, k, v, out, lse, dout];
  });
  afterAll(() => {
    for (const t of fixtures) t.dispose();
  });
}
// Nothing queued may free memory in the background while a test compares memory() snapshots.
beforeEach(() => synchronizeAll());

/** A tensor of `shape` created for one test and disposed at its end. */
const temps: Tensor[] = [];
function temp(shape: number[], dtype: 'float32' | 'float16' | 'bfloat16' = 'float32'): Tensor {
  const t = f32(shape, dtype);
  temps.push(t);
  return t;
}
afterEach(async () => {
  for (const t of temps.splice(0)) t.dispose();
  await synchronize('cpu');
});

describe('flashAttention: q, k, v', () => {
  useFixtures();
  test.each<[string, unknown, string]>([
    ['null', null, 'null'],
    ['a number', 5, '5 of type number'],
    ['a plain Array', [1, 2, 3], 'an Array of length 3'],
    ['a Float32Array', new Float32Array(4), 'a Float32Array'],
    ['undefined', undefined, 'undefined'],
    ['a plain object', { shape: [2, 16, 4, 16] }, 'an object'],
    ['a string', 'q', '"q" of type string'],
  ])('q is %s', (_label, bad, received) => {
    expectThrows(() => flashAttention(bad as Tensor, k, v), 'TypeError', `Expected q to be a Tensor but received ${received}`);
  });

  test('k and v are Tensors too', () => {
    expectThrows(() => flashAttention(q, null as unknown as Tensor, v), 'TypeError', 'Expected k to be a Tensor but received null');
    expectThrows(() => flashAttention(q, k, 1.5 as unknown as Tensor), 'TypeError', 'Expected v to be a Tensor but received 1.5 of type number');
  });

  test('wrong rank', () => {
    const t1 = temp([2, 128, 64]);
    expectThrows(() => flashAttention(t1, k, v), 'RangeError',
      'Expected q to have 4 dims [batch, seqlen, heads, headDim] but received [2, 128, 64]');
    const t2 = temp([2, 24, 2, 4, 4]);
    expectThrows(() => flashAttention(q, t2, v), 'RangeError',
      'Expected k to have 4 dims [batch, seqlen, heads, headDim] but received [2, 24, 2, 4, 4]');
    const t3 = temp([768]);
    expectThrows(() => flashAttention(q, k, t3), 'RangeError',
      'Expected v to have 4 dims [batch, seqlen, heads, headDim] but received [768]');
  });

  test('k batch or headDim differs from q', () => {
    const kb = temp([3, 24, 2, 16]);
    expectThrows(() => flashAttention(q, kb, kb), 'RangeError', 'Expected k to have batch 2 (like q) but received 3 (k is [3, 24, 2, 16])');
    const kd = temp([2, 24, 2, 32]);
    expectThrows(() => flashAttention(q, kd, kd), 'RangeError', 'Expected k to have headDim 16 (like q) but received 32 (k is [2, 24, 2, 32])');
  });

  test('v shape differs from k', () => {
    const t4 = temp([2, 23, 2, 16]);
    expectThrows(() => flashAttention(q, k, t4), 'RangeError',
      'Expected v to have the shape of k [2, 24, 2, 16] but received [2, 23, 2, 16]');
    const t5 = temp([2, 24, 1, 16]);
    expectThrows(() => flashAttention(q, k, t5), 'RangeError',
      'Expected v to have the shape of k [2, 24, 2, 16] but received [2, 24, 1, 16]');
  });

  test('head dim not a multiple of 8, or above 256', () => {
    const q12 = temp([1, 16, 2, 12]);
    expectThrows(() => flashAttention(q12, q12, q12), 'RangeError',
      'Expected headDim of q to be a multiple of 8 in [8, 256] but received 12 (q is [1, 16, 2, 12])');
    const q264 = temp([1, 2, 1, 264]);
    expectThrows(() => flashAttention(q264, q264, q264), 'RangeError',
      'Expected headDim of q to be a multiple of 8 in [8, 256] but received 264 (q is [1, 2, 1, 264])');
  });

  test('GQA: heads of k must divide heads of q', () => {
    const q6 = temp([1, 8, 6, 16]);
    const k4 = temp([1, 8, 4, 16]);
    expectThrows(() => flashAttention(q6, k4, k4), 'RangeError',
      'Expected heads of q (6) to be a multiple of heads of k but received 4 (k is [1, 8, 4, 16])');
    const k8 = temp([1, 8, 8, 16]); // more kv heads than q heads
    expectThrows(() => flashAttention(q6, k8, k8), 'RangeError',
      'Expected heads of q (6) to be a multiple of heads of k but received 8 (k is [1, 8, 8, 16])');
  });

  test('dtype mismatch', () => {
    const kb = temp([2, 24, 2, 16], 'bfloat16');
    expectThrows(() => flashAttention(q, kb, v), 'TypeError', 'Expected k to have dtype float32 (like q) but received bfloat16');
    expectThrows(() => flashAttention(q, k, kb), 'TypeError', 'Expected v to have dtype float32 (like q) but received bfloat16');
  });

  (HAS_CUDA ? test : test.skip)(`device mismatch${HAS_CUDA ? '' : ` (skipped: ${cudaSkipReason()})`}`, () => {
    const kc = Tensor.fromFloat32Array(randn(2 * 24 * 2 * 16, rngFor('kc')), [2, 24, 2, 16], { device: 'cuda' });
    try {
      expectThrows(() => flashAttention(q, kc, v), 'TypeError', 'Expected k to be on device cpu (like q) but received cuda');
      expectThrows(() => flashAttention(q, k, kc), 'TypeError', 'Expected v to be on device cpu (like q) but received cuda');
      const lc = Tensor.fromFloat32Array(randn(128, rngFor('lc')), [2, 4, 16], { device: 'cuda' });
      try {
        expectThrows(() => flashAttentionBackward(dout, q, k, v, out, lc), 'TypeError', 'Expected lse to be on device cpu (like q) but received cuda');
      } finally {
        lc.dispose();
      }
    } finally {
      kc.dispose();
    }
  });

  test('a disposed tensor', async () => {
    const d = f32([2, 16, 4, 16]);
    d.dispose();
    const dk = f32([2, 24, 2, 16]);
    dk.dispose();
    await synchronize('cpu');
    const msg = (n: string): string => `Expected ${n} to be a live Tensor but received a disposed Tensor`;
    expectThrows(() => flashAttention(d, k, v), 'TypeError', msg('q'));
    expectThrows(() => flashAttention(q, dk, v), 'TypeError', msg('k'));
    expectThrows(() => flashAttention(q, k, dk), 'TypeError', msg('v'));
    expectThrows(() => flashAttentionBackward(d, q, k, v, out, lse), 'TypeError', msg('dout'));
  });
});

describe('flashAttention: options', () => {
  useFixtures();
  test.each<[string, unknown, ErrorName, string]>([
    ['NaN', NaN, 'RangeError', 'NaN'],
    ['Infinity', Infinity, 'RangeError', 'Infinity'],
    ['-Infinity', -Infinity, 'RangeError', '-Infinity'],
    ['-1', -1, 'RangeError', '-1'],
    ['0', 0, 'RangeError', '0'],
    ['1e-50 (0 in float32)', 1e-50, 'RangeError', '1e-50'],
    ['1e39 (Infinity in float32)', 1e39, 'RangeError', '1e+39'],
  ])('softmaxScale %s', (_label, bad, name, received) => {
    expectThrows(() => flashAttention(q, k, v, { softmaxScale: bad as number }), name,
      `Expected options.softmaxScale to be a finite number > 0 and < 2.3e38 but received ${received}`);
  });

  test('softmaxScale of the wrong type', () => {
    expectThrows(() => flashAttention(q, k, v, { softmaxScale: '0.1' as unknown as number }), 'TypeError',
      'Expected options.softmaxScale to be a number but received "0.1" of type string');
    expectThrows(() => flashAttention(q, k, v, { softmaxScale: null as unknown as number }), 'TypeError',
      'Expected options.softmaxScale to be a number but received null');
  });

  test('softmaxScale just inside the float32 range is accepted (the other side of the boundary)', async () => {
    for (const softmaxScale of [1e-30, 1e30]) {
      let r: ReturnType<typeof flashAttention> | undefined;
      expect(() => {
        r = flashAttention(q, k, v, { softmaxScale });
      }).not.toThrow();
      temps.push(r!.out, r!.lse);
    }
    await synchronize('cpu');
  });

  test.each<[string, unknown, string]>([
    ['1', 1, '1 of type number'],
    ["'true'", 'true', '"true" of type string'],
    ['null', null, 'null'],
  ])('causal %s is not a boolean', (_label, bad, received) => {
    expectThrows(() => flashAttention(q, k, v, { causal: bad as boolean }), 'TypeError',
      `Expected options.causal to be a boolean but received ${received}`);
  });

  test.each<[string, unknown, string]>([
    ['null', null, 'null'],
    ['a number', 5, '5 of type number'],
    ['a string', 'causal', '"causal" of type string'],
    ['an Array', [], 'an Array of length 0'],
    ['true', true, 'true of type boolean'],
    ['a function', () => 0, 'a function'],
  ])('options is %s', (_label, bad, received) => {
    expectThrows(() => flashAttention(q, k, v, bad as object), 'TypeError',
      `Expected options to be an object or undefined but received ${received}`);
  });

  test.each<[string, unknown, string]>([
    ["'fp32'", 'fp32', '"fp32" of type string'],
    ["'TF32'", 'TF32', '"TF32" of type string'],
    ['null', null, 'null'],
    ['1', 1, '1 of type number'],
    ['true', true, 'true of type boolean'],
  ])('float32Precision %s', (_label, bad, received) => {
    const msg = `Expected options.float32Precision to be 'tf32' or 'highest' but received ${received}`;
    const opts = { float32Precision: bad as 'tf32' };
    expectThrows(() => flashAttention(q, k, v, opts), 'TypeError', msg);
    // The backward options take it too (one options object serves both passes).
    expectThrows(() => flashAttentionBackward(dout, q, k, v, out, lse, opts), 'TypeError', msg);
    expectThrows(() => flashAttentionWithGrad(q, k, v, opts), 'TypeError', msg);
  });

  test("float32Precision 'tf32' and 'highest' are accepted by every entry point (the CPU computes in fp32 either way)", async () => {
    for (const float32Precision of ['tf32', 'highest'] as const) {
      const r = flashAttention(q, k, v, { float32Precision });
      temps.push(r.out, r.lse);
      const g = flashAttentionBackward(dout, q, k, v, out, lse, { float32Precision });
      temps.push(g.dq, g.dk, g.dv);
      const ctx = flashAttentionWithGrad(q, k, v, { float32Precision });
      temps.push(ctx.out, ctx.lse);
      ctx.dispose();
    }
    await synchronize('cpu');
  });

  test('kernel', () => {
    expectThrows(() => flashAttention(q, k, v, { kernel: 'fast' as 'auto' }), 'TypeError',
      "Expected options.kernel to be 'auto', 'flash' or 'naive' but received \"fast\" of type string");
    // Only the addon knows which kernels a device has: it refuses before allocating the outputs.
    expectThrows(() => flashAttention(q, k, v, { kernel: 'naive' }), 'RangeError',
      "Expected kernel to be 'auto' or 'flash' on device 'cpu' but received 'naive' (the naive kernel runs on " +
        'CUDA; on the CPU the float64 reference is referenceAttention)');
  });
});

describe('flashAttentionBackward', () => {
  useFixtures();
  test('dout and out must have the shape and dtype of q', () => {
    const t6 = temp([2, 16, 4, 8]);
    expectThrows(() => flashAttentionBackward(t6, q, k, v, out, lse), 'RangeError',
      'Expected dout to have the shape of q [2, 16, 4, 16] but received [2, 16, 4, 8]');
    const t7 = temp([2, 16, 64]);
    expectThrows(() => flashAttentionBackward(t7, q, k, v, out, lse), 'RangeError',
      'Expected dout to have the shape of q [2, 16, 4, 16] but received [2, 16, 64]');
    const t8 = temp([2, 16, 2, 16]);
    expectThrows(() => flashAttentionBackward(dout, q, k, v, t8, lse), 'RangeError',
      'Expected out to have the shape of q [2, 16, 4, 16] but received [2, 16, 2, 16]');
    const t9 = temp([2, 16, 4, 16], 'float16');
    expectThrows(() => flashAttentionBackward(t9, q, k, v, out, lse), 'TypeError',
      'Expected dout to have dtype float32 (like q) but received float16');
    const t10 = temp([2, 16, 4, 16], 'bfloat16');
    expectThrows(() => flashAttentionBackward(dout, q, k, v, t10, lse), 'TypeError',
      'Expected out to have dtype float32 (like q) but received bfloat16');
    expectThrows(() => flashAttentionBackward(dout, q, k, v, 'out' as unknown as Tensor, lse), 'TypeError',
      'Expected out to be a Tensor but received "out" of type string');
  });

  test('lse must be float32 [batch, headsQ, seqlenQ]', () => {
    const t11 = temp([2, 16, 4]);
    expectThrows(() => flashAttentionBackward(dout, q, k, v, out, t11), 'RangeError',
      'Expected lse to have shape [batch, headsQ, seqlenQ] = [2, 4, 16] but received [2, 16, 4]');
    const t12 = temp([2, 4, 16, 1]);
    expectThrows(() => flashAttentionBackward(dout, q, k, v, out, t12), 'RangeError',
      'Expected lse to have shape [batch, headsQ, seqlenQ] = [2, 4, 16] but received [2, 4, 16, 1]');
    const t13 = temp([2, 4, 16], 'bfloat16');
    expectThrows(() => flashAttentionBackward(dout, q, k, v, out, t13), 'TypeError',
      'Expected lse to have dtype float32 but received bfloat16');
    expectThrows(() => flashAttentionBackward(dout, q, k, v, out, null as unknown as Tensor), 'TypeError',
      'Expected lse to be a Tensor but received null');
  });

  test('q, k, v and the options are validated as in the forward', () => {
    const t14 = temp([2, 23, 2, 16]);
    expectThrows(() => flashAttentionBackward(dout, q, k, t14, out, lse), 'RangeError',
      'Expected v to have the shape of k [2, 24, 2, 16] but received [2, 23, 2, 16]');
    expectThrows(() => flashAttentionBackward(dout, q, k, v, out, lse, { deterministic: 'yes' as unknown as boolean }), 'TypeError',
      'Expected options.deterministic to be a boolean but received "yes" of type string');
    expectThrows(() => flashAttentionBackward(dout, q, k, v, out, lse, { softmaxScale: -2 }), 'RangeError',
      'Expected options.softmaxScale to be a finite number > 0 and < 2.3e38 but received -2');
  });

  test("options.algorithm: one of 'auto', 'single-kernel', 'two-kernel'; the CPU backend refuses 'two-kernel', allocating nothing", () => {
    expectThrows(() => flashAttentionBackward(dout, q, k, v, out, lse, { algorithm: 'atomic' as never }), 'TypeError',
      'Expected options.algorithm to be \'auto\', \'single-kernel\' or \'two-kernel\' but received "atomic" of type string');
    const before = liveMemory();
    expectThrows(() => flashAttentionBackward(dout, q, k, v, out, lse, { algorithm: 'two-kernel' }), 'RangeError',
      "Expected algorithm to be 'auto' or 'single-kernel' for this call but received 'two-kernel': the CPU backend has one backward algorithm");
    expect(liveMemory()).toEqual(before);
    for (const algorithm of ['auto', 'single-kernel'] as const) {
      const g = flashAttentionBackward(dout, q, k, v, out, lse, { algorithm });
      temps.push(g.dq, g.dk, g.dv);
      expect(g.kernel).toBe('flash');
    }
  });

  test('flashAttentionWithGrad: validation, and ctx.backward(dout) with a bad dout throws without releasing the context', async () => {
    expectThrows(() => flashAttentionWithGrad(q, k, v, { deterministic: 0 as unknown as boolean }), 'TypeError',
      'Expected options.deterministic to be a boolean but received 0 of type number');
    const t15 = temp([2, 128, 64]);
    expectThrows(() => flashAttentionWithGrad(t15, k, v), 'RangeError',
      'Expected q to have 4 dims [batch, seqlen, heads, headDim] but received [2, 128, 64]');

    const ctx = flashAttentionWithGrad(q, k, v);
    temps.push(ctx.out, ctx.lse);
    try {
      const t16 = temp([2, 16, 4, 8]);
      expectThrows(() => ctx.backward(t16), 'RangeError',
        'Expected dout to have the shape of out [2, 16, 4, 16] but received [2, 16, 4, 8]');
      const t17 = temp([2, 16, 4, 16], 'float16');
      expectThrows(() => ctx.backward(t17), 'TypeError',
        'Expected dout to have dtype float32 (like q) but received float16');
      expectThrows(() => ctx.backward(null as unknown as Tensor), 'TypeError', 'Expected dout to be a Tensor but received null');
      expectThrows(() => ctx.backward(dout, { deterministic: 'no' as unknown as boolean }), 'TypeError',
        'Expected options.deterministic to be a boolean but received "no" of type string');
      expectThrows(() => ctx.backward(dout, 7 as unknown as object), 'TypeError',
        'Expected options to be an object or undefined but received 7 of type number');
      expectThrows(() => ctx.backward(dout, { algorithm: 2 as never }), 'TypeError',
        "Expected options.algorithm to be 'auto', 'single-kernel' or 'two-kernel' but received 2 of type number");
      expect(ctx.released).toBe(false);
      const g = ctx.backward(dout);
      temps.push(g.dq, g.dk, g.dv);
      expect(ctx.released).toBe(true);
    } finally {
      ctx.dispose();
    }
  });
});

describe('Tensor factories', () => {
  test('data length differs from the shape product', () => {
    expectThrows(() => Tensor.fromFloat32Array(new Float32Array(5), [2, 3], cpu), 'RangeError',
      'Expected data to have 6 elements for shape [2, 3] but received 5');
    expectThrows(() => Tensor.fromBits(new Uint16Array(4), [2, 3], { dtype: 'float16', device: 'cpu' }), 'RangeError',
      'Expected bits to have 6 elements for shape [2, 3] but received 4');
  });

  test.each<[string, unknown[], ErrorName, string]>([
    ['a 0 dim', [2, 0], 'RangeError', 'Expected every dim of shape to be a positive integer (empty tensors are not supported) but received [2, 0]'],
    ['a negative dim', [-1, 6], 'RangeError', 'Expected every dim of shape to be a positive integer (empty tensors are not supported) but received [-1, 6]'],
    ['a 1.5 dim', [1.5, 4], 'RangeError', 'Expected every dim of shape to be a positive integer (empty tensors are not supported) but received [1.5, 4]'],
    ['a NaN dim', [6, NaN], 'RangeError', 'Expected every dim of shape to be a positive integer (empty tensors are not supported) but received [6, NaN]'],
    ['a string dim', ['6'], 'RangeError', 'Expected every dim of shape to be a positive integer (empty tensors are not supported) but received "6" of type string'],
    ['no dims', [], 'TypeError', 'Expected shape to be a non-empty Array of positive integers but received an Array of length 0'],
    ['2^60 elements', [2 ** 40, 2 ** 20], 'RangeError', 'Expected shape to have fewer than 2^53 elements but received [1099511627776, 1048576]'],
  ])('shape with %s', (_label, shape, name, message) => {
    expectThrows(() => Tensor.fromFloat32Array(new Float32Array(6), shape as number[], cpu), name, message);
    expectThrows(() => Tensor.fromBits(new Uint16Array(6), shape as number[], { dtype: 'bfloat16', device: 'cpu' }), name, message);
  });

  test('shape that is not an Array', () => {
    expectThrows(() => Tensor.fromFloat32Array(new Float32Array(6), '2x3' as unknown as number[], cpu), 'TypeError',
      'Expected shape to be a non-empty Array of positive integers but received "2x3" of type string');
    expectThrows(() => Tensor.fromFloat32Array(new Float32Array(6), null as unknown as number[], cpu), 'TypeError',
      'Expected shape to be a non-empty Array of positive integers but received null');
  });

  test('unknown dtype or device strings, options not an object', () => {
    expectThrows(() => Tensor.fromFloat32Array(new Float32Array(2), [2], { dtype: 'float64' as 'float32' }), 'TypeError',
      "Expected options.dtype to be one of 'float32', 'float16', 'bfloat16' but received \"float64\" of type string");
    expectThrows(() => Tensor.fromFloat32Array(new Float32Array(2), [2], { dtype: 1 as unknown as 'float32' }), 'TypeError',
      "Expected options.dtype to be one of 'float32', 'float16', 'bfloat16' but received 1 of type number");
    expectThrows(() => Tensor.fromFloat32Array(new Float32Array(2), [2], { device: 'gpu' as 'cpu' }), 'TypeError',
      "Expected options.device to be 'cpu' or 'cuda' but received \"gpu\" of type string");
    expectThrows(() => Tensor.fromBits(new Uint16Array(2), [2], { dtype: 'half' as 'float16', device: 'cpu' }), 'TypeError',
      "Expected options.dtype to be one of 'float32', 'float16', 'bfloat16', 'int32' but received \"half\" of type string");
    expectThrows(() => Tensor.fromFloat32Array(new Float32Array(2), [2], 5 as unknown as object), 'TypeError',
      'Expected options to be an object or undefined but received 5 of type number');
    expectThrows(() => Tensor.fromFloat32Array(new Float32Array(2), [2], null as unknown as object), 'TypeError',
      'Expected options to be an object or undefined but received null');
  });

  test('data of the wrong type', () => {
    expectThrows(() => Tensor.fromFloat32Array([1, 2] as unknown as Float32Array, [2], cpu), 'TypeError',
      'Expected data to be a Float32Array but received an Array of length 2');
    expectThrows(() => Tensor.fromFloat32Array(new Float64Array(2) as unknown as Float32Array, [2], cpu), 'TypeError',
      'Expected data to be a Float32Array but received a Float64Array');
  });

  test('fromBits with the wrong typed array, or without a dtype', () => {
    expectThrows(() => Tensor.fromBits(new Float32Array(2), [2], { dtype: 'bfloat16', device: 'cpu' }), 'TypeError',
      'Expected bits to be a Uint16Array for dtype bfloat16 but received a Float32Array');
    expectThrows(() => Tensor.fromBits(new Uint16Array(2), [2], { dtype: 'float32', device: 'cpu' }), 'TypeError',
      'Expected bits to be a Float32Array for dtype float32 but received a Uint16Array');
    expectThrows(() => Tensor.fromBits(new Uint32Array(2) as unknown as Uint16Array, [2], { dtype: 'float16', device: 'cpu' }), 'TypeError',
      'Expected bits to be a Uint16Array for dtype float16 but received a Uint32Array');
    const none = "Expected options.dtype to be given for fromBits ('float32', 'float16', 'bfloat16' or 'int32') but received none";
    expectThrows(() => Tensor.fromBits(new Uint16Array(2), [2], {}), 'TypeError', none);
    expectThrows(() => Tensor.fromBits(new Uint16Array(2), [2], undefined as unknown as object), 'TypeError', none);
  });

  (HAS_CUDA ? test.skip : test)("device 'cuda' without a usable CUDA device says why, before allocating", () => {
    const before = liveMemory();
    const r = thrownBy(() => Tensor.fromFloat32Array(new Float32Array(2), [2], { device: 'cuda' }));
    expect(r).toEqual({ name: 'Error', message: expect.stringMatching(/^Expected device 'cuda' to be available but it is not: .+/) });
    expect(liveMemory()).toEqual(before);
  });
});

describe('other entry points', () => {
  test('synchronize, resetPeakMemory and debug.poisonOutputs validate their argument', () => {
    expectThrows(() => synchronize('gpu' as 'cpu'), 'TypeError', "Expected device to be 'cpu' or 'cuda' but received \"gpu\" of type string");
    expectThrows(() => resetPeakMemory(0 as unknown as 'cpu'), 'TypeError', "Expected device to be 'cpu' or 'cuda' but received 0 of type number");
    expectThrows(() => debug.poisonOutputs('yes' as unknown as boolean), 'TypeError', 'Expected enabled to be a boolean but received "yes" of type string');
    expectThrows(() => debug.injectCudaFault('oops' as 'illegal-address'), 'TypeError', "Expected kind to be 'illegal-address' but received \"oops\" of type string");
  });

  test('ranged reads: offset and length must lie inside the tensor', async () => {
    const t = Tensor.fromFloat32Array(new Float32Array(24), [2, 3, 4], { device: 'cpu' });
    try {
      const cases: [unknown, string, string][] = [
        [null, 'TypeError', 'Expected range to be an object { offset, length } but received null'],
        [5, 'TypeError', 'Expected range to be an object { offset, length } but received 5 of type number'],
        [{ offset: 24 }, 'RangeError', 'Expected range.offset to be an integer in [0, 23] but received 24 of type number'],
        [{ offset: -1 }, 'RangeError', 'Expected range.offset to be an integer in [0, 23] but received -1 of type number'],
        [{ offset: 0.5 }, 'RangeError', 'Expected range.offset to be an integer in [0, 23] but received 0.5 of type number'],
        [{ offset: '2' }, 'RangeError', 'Expected range.offset to be an integer in [0, 23] but received "2" of type string'],
        [{ length: 0 }, 'RangeError', 'Expected range.length to be an integer in [1, 24] but received 0 of type number'],
        [{ offset: 20, length: 5 }, 'RangeError', 'Expected range.length to be an integer in [1, 4] but received 5 of type number'],
      ];
      for (const [range, name, message] of cases) {
        expectThrows(() => t.toFloat32Array(range as { offset: number }), name as ErrorName, message);
        expectThrows(() => t.toBits(range as { offset: number }), name as ErrorName, message);
      }
      expect(Array.from(await t.toFloat32Array({ offset: 20 }))).toEqual([0, 0, 0, 0]);
    } finally {
      t.dispose();
    }
  });
});

// ---------------------------------------------------------------------------------------------
// The raw native binding: C++ re-validates everything and must throw, never crash.
// ---------------------------------------------------------------------------------------------

/** A native buffer argument named in a collection-time table, looked up when the call runs. */
class Named {
  constructor(readonly name: 'nq' | 'nk' | 'nlse' | 'released' | 'nkb' | 'nlseb') {}
}

describe('raw native binding (lib/native.ts binding())', () => {
  const b = binding();
  // Native buffers for q [2, 16, 4, 16], k = v [2, 24, 2, 16], out, dout like q, lse [2, 4, 16]; float32.
  let nq: NativeBuffer, nk: NativeBuffer, nv: NativeBuffer, nout: NativeBuffer, ndout: NativeBuffer, nlse: NativeBuffer;
  let nkb: NativeBuffer, nlseb: NativeBuffer, released: NativeBuffer;
  const dims = (): number[] => [2, 16, 24, 4, 2, 16];
  beforeAll(() => {
    const mk = (n: number, dtype = 0): NativeBuffer => b.createFromFloat32(0, dtype, randn(n, rngFor(`native/${n}/${dtype}`)));
    nq = mk(2048);
    nk = mk(1536);
    nv = mk(1536);
    nout = mk(2048);
    ndout = mk(2048);
    nlse = mk(128);
    nkb = mk(1536, 2);
    nlseb = mk(128, 2);
    released = mk(16);
    released.release();
  });
  afterAll(() => {
    for (const x of [nq, nk, nv, nout, ndout, nlse, nkb, nlseb]) x.release();
  });

  // The table below is built at collection time, before beforeAll creates the buffers: buffer
  // arguments are named (resolved when the call runs), everything else is literal.
  const named = { nq: () => nq, nk: () => nk, nlse: () => nlse, released: () => released, nkb: () => nkb, nlseb: () => nlseb };
  const resolveArg = (x: unknown): unknown => (x instanceof Named ? named[x.name]()
    : Array.isArray(x) && x[0] instanceof Named ? [named[x[0].name](), x[1]] : x);
  // The valid options objects of the attention calls; `over` replaces (or, with undefined, blanks) keys.
  const fwdArgs = (): Record<string, unknown> =>
    ({ q: nq, k: nk, v: nv, dims: dims(), causal: false, softmaxScale: 0.25, kernel: 0, float32Precision: 0 });
  const bwdArgs = (): Record<string, unknown> => ({
    dout: ndout, q: nq, k: nk, v: nv, out: nout, lse: nlse, dims: dims(), causal: false, softmaxScale: 0.25, kernel: 0,
    deterministic: false, algorithm: 0, float32Precision: 0,
  });
  const FWD_KEYS = "'q', 'k', 'v', 'dims', 'causal', 'softmaxScale', 'softcap', 'window', 'alibiSlopes', 'kernel', 'float32Precision' or " +
    "'strides'";
  const BWD_KEYS = "'dout', 'q', 'k', 'v', 'out', 'lse', 'dims', 'causal', 'softmaxScale', 'softcap', 'window', " +
    "'alibiSlopes', 'kernel', 'deterministic', 'algorithm', 'float32Precision', 'strides', 'grads' or 'gradStrides'";
  const withKeys = (base: Record<string, unknown>, over: Record<string, unknown>): Record<string, unknown> => {
    const o = { ...base };
    for (const [key, x] of Object.entries(over)) o[key] = resolveArg(x);
    return o;
  };
  const fwd = (over: Record<string, unknown> = {}): (() => unknown) => () =>
    (b.attentionForward as (...a: unknown[]) => unknown)(withKeys(fwdArgs(), over));
  const bwd = (over: Record<string, unknown> = {}): (() => unknown) => () =>
    (b.attentionBackward as (...a: unknown[]) => unknown)(withKeys(bwdArgs(), over));
  /** The options object without `keys`. */
  const without = (base: Record<string, unknown>, ...keys: string[]): Record<string, unknown> =>
    Object.fromEntries(Object.entries(base).filter(([key]) => !keys.includes(key)));
  const call = (name: keyof typeof b, ...args: unknown[]): (() => unknown) => () =>
    (b[name] as (...a: unknown[]) => unknown)(...args);

  test('the valid calls used as the base of the garbage below do work', async () => {
    const before = liveMemory();
    // [out, lse, kernel, plan] and [dq, dk, dv, kernel, algorithm, plan]: what ran.
    const rAll = fwd()() as unknown[];
    const gAll = bwd()() as unknown[];
    expect([rAll.length, gAll.length]).toEqual([4, 6]);
    const cpuPlan = { family: 'cpu', headDim: null, blockM: null, blockN: null, warps: null, stages: null };
    expect([rAll[2], gAll[3], gAll[4], rAll[3], gAll[5]]).toEqual(['flash', 'flash', 'single-kernel', cpuPlan, cpuPlan]);
    const r = rAll.slice(0, 2) as NativeBuffer[];
    const g = gAll.slice(0, 3) as NativeBuffer[];
    expect(liveMemory().cpu.tensors).toBe(before.cpu.tensors + 5);
    for (const x of [...r, ...g]) x.release();
    await synchronize('cpu');
    expect(liveMemory()).toEqual(before);
  });

  /** `base` with each key an enumerable getter that counts its reads into `reads`. */
  const counting = (base: Record<string, unknown>, reads: Record<string, number>): Record<string, unknown> => {
    const o: Record<string, unknown> = {};
    for (const [key, value] of Object.entries(base)) {
      reads[key] = 0;
      Object.defineProperty(o, key, { enumerable: true, get: () => { reads[key]++; return value; } });
    }
    return o;
  };
  const releaseAll = (r: unknown): void => {
    // The buffers of a result, not its kernel name or plan object.
    for (const x of r as unknown[]) if (typeof (x as NativeBuffer | null)?.release === 'function') (x as NativeBuffer).release();
  };

  test('options objects: each key is read exactly once, getters and Proxies included', async () => {
    const before = liveMemory();
    const fwdReads: Record<string, number> = {};
    releaseAll(b.attentionForward(counting({ ...fwdArgs(), strides: undefined }, fwdReads) as never));
    expect(fwdReads).toEqual(Object.fromEntries(Object.keys({ ...fwdArgs(), strides: 0 }).map((key) => [key, 1])));
    const bwdReads: Record<string, number> = {};
    releaseAll(b.attentionBackward(counting({ ...bwdArgs(), strides: undefined, grads: undefined, gradStrides: undefined }, bwdReads) as never));
    expect(Object.values(bwdReads)).toEqual(new Array(16).fill(1));
    // A Proxy: its get trap runs once per key; its keys are listed once.
    const traps: string[] = [];
    const proxy = new Proxy(fwdArgs(), {
      get(target, key, receiver) { traps.push(`get ${String(key)}`); return Reflect.get(target, key, receiver); },
      ownKeys(target) { traps.push('ownKeys'); return Reflect.ownKeys(target); },
    });
    releaseAll(b.attentionForward(proxy as never));
    expect(traps.sort()).toEqual(['ownKeys', ...Object.keys(fwdArgs()).map((key) => `get ${key}`)].sort());
    // Inside the values too: a tensor's offset, a stride and a dim are read once each.
    const elementReads = { offset: 0, stride: 0, dim: 0 };
    const q: unknown[] = [nq, 0];
    Object.defineProperty(q, 1, { get: () => { elementReads.offset++; return 0; } });
    const strides = [1024, 64, 16, 768, 32, 16, 768, 32, 16];  // contiguous q, k, v
    Object.defineProperty(strides, 0, { get: () => { elementReads.stride++; return 1024; } });
    const d = dims();
    Object.defineProperty(d, 5, { get: () => { elementReads.dim++; return 16; } });
    releaseAll(b.attentionForward({ ...fwdArgs(), q, strides, dims: d } as never));
    expect(elementReads).toEqual({ offset: 1, stride: 1, dim: 1 });
    await synchronize('cpu');
    expect(liveMemory()).toEqual(before);
  });

  test('options objects: a getter that changes its answer cannot slip a second value past the checks', async () => {
    const before = liveMemory();
    // dims: valid on its first read, 2^20 times larger after. The call uses the first answer throughout.
    let dimsReads = 0;
    const changing = fwdArgs();
    Object.defineProperty(changing, 'dims', {
      enumerable: true,
      get: () => (dimsReads++ === 0 ? dims() : [2, 16 << 20, 24 << 20, 4, 2, 16]),
    });
    const [out, lse, kernel] = b.attentionForward(changing as never);
    expect([dimsReads, out.bytes, lse.bytes, kernel]).toEqual([1, 2048 * 4, 128 * 4, 'flash']);
    releaseAll([out, lse]);
    // Released buffers leave the ledger once the queued CPU work that reads them has run: settle it
    // before expectThrows compares the ledger around a call.
    await synchronize('cpu');
    // The other way round: refused on the first answer, whatever later reads would say.
    let scaleReads = 0;
    const refusedFirst = fwdArgs();
    Object.defineProperty(refusedFirst, 'softmaxScale', { enumerable: true, get: () => (scaleReads++ === 0 ? -1 : 0.25) });
    expectThrows(() => b.attentionForward(refusedFirst as never), 'RangeError',
      'Expected softmaxScale to be a finite number > 0 and < 2.3e38 but received -1');
    expect(scaleReads).toBe(1);
    // A getter that throws: its error comes through, nothing is allocated.
    const throwing = bwdArgs();
    Object.defineProperty(throwing, 'causal', { enumerable: true, get: () => { throw new Error('causal getter'); } });
    expectThrows(() => b.attentionBackward(throwing as never), 'Error', 'causal getter');
    await synchronize('cpu');
    expect(liveMemory()).toEqual(before);
  });

  test('options objects: a null prototype works; inherited, symbol and non-enumerable keys are not read', async () => {
    const before = liveMemory();
    releaseAll(b.attentionForward(Object.assign(Object.create(null) as object, fwdArgs()) as never));
    // Released buffers leave the ledger when the queued CPU work that reads them has run: settle it
    // before the refusals below compare the ledger around each call.
    await synchronize('cpu');
    // An object with a prototype of its own is refused, whatever keys it has.
    const inherited = Object.assign(Object.create({ causal: true }) as object, without(fwdArgs(), 'causal'));
    expectThrows(() => b.attentionForward(inherited as never), 'TypeError', 'Expected options to be a plain object ' +
      'of named arguments but received an object whose prototype is neither Object.prototype nor null');
    // An enumerable key on Object.prototype (a polluted prototype) is not an argument: causal stays missing.
    Object.defineProperty(Object.prototype, 'causal', { value: true, enumerable: true, configurable: true });
    let polluted: ReturnType<typeof thrownBy>;
    try {
      polluted = thrownBy(() => b.attentionForward(without(fwdArgs(), 'causal') as never));
    } finally {
      delete (Object.prototype as Record<string, unknown>).causal;
    }
    expect(polluted).toEqual({ name: 'TypeError', message: "Expected options to have the required key 'causal' but it is missing" });
    const hidden = fwdArgs();
    let hiddenReads = 0;
    Object.defineProperty(hidden, 'extra', { enumerable: false, get: () => { hiddenReads++; return 1; } });
    (hidden as Record<symbol, unknown>)[Symbol('tag')] = 'x';
    releaseAll(b.attentionForward(hidden as never));
    expect(hiddenReads).toBe(0);
    await synchronize('cpu');
    expect(liveMemory()).toEqual(before);
  });

  test('a refused options object changes nothing: the same call corrected then runs', async () => {
    const before = liveMemory();
    for (const fn of [fwd({ casual: true }), fwd({ q: undefined }), bwd({ grads: [null, null] }), bwd({ strides: [0] })]) {
      expect(thrownBy(fn)).not.toBe('did not throw');
      expect(liveMemory()).toEqual(before);
    }
    const r = bwd({ strides: undefined, grads: [null, null, null], gradStrides: undefined })() as unknown[];
    expect(r.slice(3, 5)).toEqual(['flash', 'single-kernel']);
    releaseAll(r.slice(0, 3));
    await synchronize('cpu');
    expect(liveMemory()).toEqual(before);
  });

  test.each<[string, () => unknown, ErrorName, string]>([
    // tensor creation
    ['createFromFloat32: device a string', call('createFromFloat32', '0', 0, new Float32Array(2)), 'TypeError', 'Expected device to be an integer but received "0" of type string'],
    ['createFromFloat32: device 2', call('createFromFloat32', 2, 0, new Float32Array(2)), 'RangeError', 'Expected device to be an integer in [0, 1] but received 2 of type number'],
    ['createFromFloat32: device 0.5', call('createFromFloat32', 0.5, 0, new Float32Array(2)), 'RangeError', 'Expected device to be an integer in [0, 1] but received 0.5 of type number'],
    ['createFromFloat32: dtype 4', call('createFromFloat32', 0, 4, new Float32Array(2)), 'RangeError', 'Expected dtype to be an integer in [0, 3] but received 4 of type number'],
    ['createFromFloat32: dtype 3 (int32)', call('createFromFloat32', 0, 3, new Float32Array(2)), 'TypeError', 'Expected dtype to be float32, float16 or bfloat16 for data from a Float32Array but received int32'],
    ['createFromBits: int32 from a Float32Array', call('createFromBits', 0, 3, new Float32Array(2)), 'TypeError', 'Expected data to be an Int32Array for dtype int32 but received a Float32Array'],
    ['createFromFloat32: data a plain Array', call('createFromFloat32', 0, 0, [1, 2]), 'TypeError', 'Expected data to be a Float32Array but received an Array of length 2'],
    ['createFromFloat32: data a Uint16Array', call('createFromFloat32', 0, 1, new Uint16Array(2)), 'TypeError', 'Expected data to be a Float32Array but received a Uint16Array'],
    ['createFromFloat32: data missing', call('createFromFloat32', 0, 0), 'TypeError', 'Expected data to be a Float32Array but received undefined'],
    ['createFromFloat32: empty data', call('createFromFloat32', 0, 0, new Float32Array(0)), 'RangeError', 'Expected data to have at least 1 element but received 0'],
    ['createFromBits: Float32Array for float16', call('createFromBits', 0, 1, new Float32Array(2)), 'TypeError', 'Expected data to be a Uint16Array for dtype float16 but received a Float32Array'],
    ['createFromBits: Uint16Array for float32', call('createFromBits', 0, 0, new Uint16Array(2)), 'TypeError', 'Expected data to be a Float32Array for dtype float32 but received a Uint16Array'],
    ['createFromBits: Int16Array for bfloat16', call('createFromBits', 0, 2, new Int16Array(2)), 'TypeError', 'Expected data to be a Uint16Array for dtype bfloat16 but received an Int16Array'],
    ['createFromBits: empty', call('createFromBits', 0, 2, new Uint16Array(0)), 'RangeError', 'Expected data to have at least 1 element but received 0'],
    ['createZeros: numel 0', call('createZeros', 0, 0, 0), 'RangeError', 'Expected numel to be an integer in [1, 9007199254740991] but received 0 of type number'],
    ['createZeros: numel 2^53', call('createZeros', 0, 1, 2 ** 53), 'RangeError', 'Expected numel to be an integer in [1, 9007199254740991] but received 9007199254740992 of type number'],
    ['createZeros: numel 2.5', call('createZeros', 0, 2, 2.5), 'RangeError', 'Expected numel to be an integer in [1, 9007199254740991] but received 2.5 of type number'],
    ['injectCudaFault: another kind', call('injectCudaFault', 'segfault'), 'TypeError', "Expected kind to be 'illegal-address' but received \"segfault\" of type string"],
    // reads, synchronize, memory
    ['readFloat32: null', call('readFloat32', null), 'TypeError', 'Expected tensor to be a native buffer but received null'],
    ['readBits: a plain object', call('readBits', { bytes: 4 }), 'TypeError', 'Expected tensor to be a native buffer but received an object'],
    ['readFloat32: a released buffer', () => b.readFloat32(released), 'TypeError', 'Expected tensor to be a live tensor but it was disposed'],
    ['readFloat32: offset past the end', () => b.readFloat32(nq, 2048, 1), 'RangeError', 'Expected offset to be an integer in [0, 2047] but received 2048 of type number'],
    ['readBits: count past the end', () => b.readBits(nq, 2000, 49), 'RangeError', 'Expected count to be an integer in [1, 48] but received 49 of type number'],
    ['readBits: offset without count', () => b.readBits(nq, 3), 'TypeError', 'Expected count to be an integer but received undefined'],
    ['synchronize: 5', call('synchronize', 5), 'RangeError', 'Expected device to be an integer in [0, 1] but received 5 of type number'],
    ['synchronize: a string', call('synchronize', 'cpu'), 'TypeError', 'Expected device to be an integer but received "cpu" of type string'],
    ['resetPeakMemory: -1', call('resetPeakMemory', -1), 'RangeError', 'Expected device to be an integer in [0, 1] but received -1 of type number'],
    ['setPoison: 1', call('setPoison', 1), 'TypeError', 'Expected enabled to be a boolean but received 1 of type number'],
    // attentionForward
    ['forward: q null', fwd({ q: null }), 'TypeError', 'Expected q to be a native buffer but received null'],
    ['forward: k a Float32Array', fwd({ k: new Float32Array(1536) }), 'TypeError', 'Expected k to be a native buffer but received a Float32Array'],
    ['forward: v released', fwd({ v: new Named('released') }), 'TypeError', 'Expected v to be a live tensor but it was disposed'],
    ['forward: dims of length 5', fwd({ dims: [2, 16, 24, 4, 2] }), 'TypeError', 'Expected dims to be an Array of 6 [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim] but received an Array of length 5'],
    ['forward: dims not an Array', fwd({ dims: '2,16,24,4,2,16' }), 'TypeError', 'Expected dims to be an Array of 6 [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim] but received "2,16,24,4,2,16" of type string'],
    ['forward: head dim 7', fwd({ dims: [2, 16, 24, 4, 2, 7] }), 'RangeError', 'Expected headDim to be an integer in [8, 256] but received 7 of type number'],
    ['forward: head dim 12', fwd({ dims: [2, 16, 24, 4, 2, 12] }), 'RangeError', 'Expected headDim to be a multiple of 8 in [8, 256] but received 12'],
    ['forward: head dim 264', fwd({ dims: [2, 16, 24, 4, 2, 264] }), 'RangeError', 'Expected headDim to be an integer in [8, 256] but received 264 of type number'],
    ['forward: batch 0', fwd({ dims: [0, 16, 24, 4, 2, 16] }), 'RangeError', 'Expected batch to be an integer in [1, 2147483647] but received 0 of type number'],
    ['forward: seqlenQ 1.5', fwd({ dims: [2, 1.5, 24, 4, 2, 16] }), 'RangeError', 'Expected seqlenQ to be an integer in [1, 2147483647] but received 1.5 of type number'],
    ['forward: seqlenK a string', fwd({ dims: [2, 16, '24', 4, 2, 16] }), 'TypeError', 'Expected seqlenK to be an integer but received "24" of type string'],
    ['forward: heads 6 and 4', fwd({ dims: [2, 16, 24, 6, 4, 16] }), 'RangeError', 'Expected headsQ to be a multiple of headsKV (4) but received 6'],
    ['forward: q holds fewer elements than dims say', fwd({ dims: [2, 17, 24, 4, 2, 16] }), 'RangeError', 'Expected q to reach 2176 elements from offset 0 inside its storage of 2048 elements but it does not'],
    ['forward: k holds fewer elements than dims say', fwd({ dims: [2, 16, 25, 4, 2, 16] }), 'RangeError', 'Expected k to reach 1600 elements from offset 0 inside its storage of 1536 elements but it does not'],
    ['forward: dims beyond 2^60 elements', fwd({ dims: [2147483647, 2147483647, 24, 4, 2, 16] }), 'RangeError', 'Expected q to have fewer than 2^60 elements but received [2147483647, 2147483647, 4, 16]'],
    ['forward: k bfloat16, q float32', fwd({ k: new Named('nkb') }), 'TypeError', 'Expected k to have dtype float32 but received bfloat16'],
    ['forward: causal 1', fwd({ causal: 1 }), 'TypeError', 'Expected causal to be a boolean but received 1 of type number'],
    ['forward: softmaxScale NaN', fwd({ softmaxScale: NaN }), 'RangeError', 'Expected softmaxScale to be a finite number > 0 and < 2.3e38 but received NaN'],
    ['forward: softmaxScale -1', fwd({ softmaxScale: -1 }), 'RangeError', 'Expected softmaxScale to be a finite number > 0 and < 2.3e38 but received -1'],
    ['forward: softmaxScale 1e-50', fwd({ softmaxScale: 1e-50 }), 'RangeError', 'Expected softmaxScale to be a finite number > 0 and < 2.3e38 but received 1e-50'],
    ['forward: softmaxScale a string', fwd({ softmaxScale: '0.25' }), 'TypeError', 'Expected softmaxScale to be a number but received "0.25" of type string'],
    ['forward: kernel 3', fwd({ kernel: 3 }), 'RangeError', 'Expected kernel to be an integer in [0, 2] but received 3 of type number'],
    ['forward: kernel naive on the CPU', fwd({ kernel: 2 }), 'RangeError', "Expected kernel to be 'auto' or 'flash' on device 'cpu' but received 'naive' (the naive kernel runs on CUDA; on the CPU the float64 reference is referenceAttention)"],
    ['forward: float32Precision 2', fwd({ float32Precision: 2 }), 'RangeError', 'Expected float32Precision to be an integer in [0, 1] but received 2 of type number'],
    ['forward: float32Precision -1', fwd({ float32Precision: -1 }), 'RangeError', 'Expected float32Precision to be an integer in [0, 1] but received -1 of type number'],
    ['forward: float32Precision a string', fwd({ float32Precision: 'tf32' }), 'TypeError', 'Expected float32Precision to be an integer but received "tf32" of type string'],
    ['forward: float32Precision undefined', fwd({ float32Precision: undefined }), 'TypeError', "Expected options to have the required key 'float32Precision' but it is missing"],
    ['forward: q and dims missing', () => b.attentionForward(without(fwdArgs(), 'q', 'dims') as never), 'TypeError', "Expected options to have the required keys 'q' and 'dims' but they are missing"],
    ['forward: an empty object', call('attentionForward', {}), 'TypeError', "Expected options to have the required keys 'q', 'k', 'v', 'dims', 'causal', 'softmaxScale', 'kernel' and 'float32Precision' but they are missing"],
    ['forward: an unknown key', fwd({ casual: true }), 'TypeError', `Expected options to have only the keys ${FWD_KEYS} but received unknown key 'casual'`],
    ['forward: a backward key', fwd({ deterministic: false }), 'TypeError', `Expected options to have only the keys ${FWD_KEYS} but received unknown key 'deterministic'`],
    ['forward: an unknown numeric key', fwd({ 0: 1 }), 'TypeError', `Expected options to have only the keys ${FWD_KEYS} but received unknown key '0'`],
    ['forward: no argument', call('attentionForward'), 'TypeError', 'Expected options to be a plain object of named arguments but received undefined'],
    ['forward: null', call('attentionForward', null), 'TypeError', 'Expected options to be a plain object of named arguments but received null'],
    ['forward: an Array', call('attentionForward', [1, 2, 3]), 'TypeError', 'Expected options to be a plain object of named arguments but received an Array of length 3'],
    ['forward: a function', call('attentionForward', () => 0), 'TypeError', 'Expected options to be a plain object of named arguments but received a function'],
    ['forward: a Map', call('attentionForward', new Map()), 'TypeError', 'Expected options to be a plain object of named arguments but received an object whose prototype is neither Object.prototype nor null'],
    ['forward: a class instance with the right keys', () => b.attentionForward(Object.assign(new (class Args {})(), fwdArgs()) as never), 'TypeError', 'Expected options to be a plain object of named arguments but received an object whose prototype is neither Object.prototype nor null'],
    ['forward: a native buffer', () => b.attentionForward(nq as never), 'TypeError', 'Expected options to be a plain object of named arguments but received an object whose prototype is neither Object.prototype nor null'],
    ['forward: the positional signature', () => (b.attentionForward as (...a: unknown[]) => unknown)(nq, nk, nv, dims(), false, 0.25, 0, 0), 'TypeError', 'Expected at most 1 argument but received 8'],
    ['forward: options and an extra argument', () => (b.attentionForward as (...a: unknown[]) => unknown)(fwdArgs(), undefined), 'TypeError', 'Expected at most 1 argument but received 2'],
    ['forward: strides of the wrong length', fwd({ strides: [1, 2, 3] }), 'TypeError', 'Expected strides to be undefined or an Array of 9 [batch, row, head] strides but received an Array of length 3'],
    // attentionBackward
    ['backward: dout released', bwd({ dout: new Named('released') }), 'TypeError', 'Expected dout to be a live tensor but it was disposed'],
    ['backward: lse undefined', bwd({ lse: undefined }), 'TypeError', "Expected options to have the required key 'lse' but it is missing"],
    ['backward: dout, out and lse missing', () => b.attentionBackward(without(bwdArgs(), 'dout', 'out', 'lse') as never), 'TypeError', "Expected options to have the required keys 'dout', 'out' and 'lse' but they are missing"],
    ['backward: an unknown key', bwd({ dq: null }), 'TypeError', `Expected options to have only the keys ${BWD_KEYS} but received unknown key 'dq'`],
    ['backward: no argument', call('attentionBackward'), 'TypeError', 'Expected options to be a plain object of named arguments but received undefined'],
    ['backward: a string', call('attentionBackward', 'dout'), 'TypeError', 'Expected options to be a plain object of named arguments but received "dout" of type string'],
    ['backward: the positional signature', () => (b.attentionBackward as (...a: unknown[]) => unknown)(ndout, nq, nk, nv, nout, nlse, dims(), false, 0.25, 0, false, 0, 0), 'TypeError', 'Expected at most 1 argument but received 13'],
    ['backward: options and an extra argument', () => (b.attentionBackward as (...a: unknown[]) => unknown)(bwdArgs(), {}), 'TypeError', 'Expected at most 1 argument but received 2'],
    ['backward: grads not an Array', bwd({ grads: new Named('nq') }), 'TypeError', 'Expected grads to be undefined or an Array of 3 [dq, dk, dv] (each a tensor or null) but received an object'],
    ['backward: gradStrides without grads', bwd({ gradStrides: [0, 0, 0, 0, 0, 0, 0, 0, 0] }), 'TypeError', 'Expected gradStrides to be undefined when grads is undefined but received an Array of length 9'],
    ['backward: out holds the wrong size', bwd({ out: new Named('nk') }), 'RangeError', 'Expected out to reach 2048 elements from offset 0 inside its storage of 1536 elements but it does not'],
    ['backward: lse at an offset leaves its storage', bwd({ lse: [new Named('nlse'), 100] }), 'RangeError', 'Expected lse to reach 128 elements from offset 100 inside its storage of 128 elements but it does not'],
    ['backward: lse bfloat16', bwd({ lse: new Named('nlseb') }), 'TypeError', 'Expected lse to have dtype float32 but received bfloat16'],
    ['backward: head dim 7', bwd({ dims: [2, 16, 24, 4, 2, 7] }), 'RangeError', 'Expected headDim to be an integer in [8, 256] but received 7 of type number'],
    ['backward: deterministic a string', bwd({ deterministic: 'yes' }), 'TypeError', 'Expected deterministic to be a boolean but received "yes" of type string'],
    ['backward: deterministic undefined', bwd({ deterministic: undefined }), 'TypeError', "Expected options to have the required key 'deterministic' but it is missing"],
    ['backward: algorithm 3', bwd({ algorithm: 3 }), 'RangeError', 'Expected algorithm to be an integer in [0, 2] but received 3 of type number'],
    ['backward: algorithm undefined', bwd({ algorithm: undefined }), 'TypeError', "Expected options to have the required key 'algorithm' but it is missing"],
    ['backward: float32Precision 2', bwd({ float32Precision: 2 }), 'RangeError', 'Expected float32Precision to be an integer in [0, 1] but received 2 of type number'],
  ])('%s', (_label, fn, name, message) => {
    expectThrows(fn, name, message);
  });

  test('NativeBuffer cannot be constructed from JS', () => {
    const Ctor = b.NativeBuffer as new (...a: unknown[]) => unknown;
    expectThrows(() => new Ctor(), 'TypeError', 'NativeBuffer cannot be constructed from JS; use the Tensor factories');
    expectThrows(() => new Ctor({}), 'TypeError', 'NativeBuffer cannot be constructed from JS; use the Tensor factories');
    expect(thrownBy(() => (Ctor as unknown as (...a: unknown[]) => unknown)())).not.toBe('did not throw');
  });

  test('a released buffer: release() is idempotent, share() throws, the getters report it', async () => {
    const x = b.createFromFloat32(0, 0, Float32Array.of(1, 2));
    x.release();
    await synchronize('cpu');
    expect(() => x.release()).not.toThrow();
    expect([x.released, x.bytes, x.device, x.dtype]).toEqual([true, 0, undefined, undefined]);
    expectThrows(() => x.share(), 'TypeError', 'Expected a live tensor but it was disposed');
  });

  test('NativeBuffer methods and getters on a foreign receiver throw instead of crashing', () => {
    const proto = (b.NativeBuffer as { prototype: object }).prototype;
    const fake = Object.create(proto) as object;
    const members = ['release', 'share', 'bytes', 'device', 'dtype', 'released'];
    const results: string[] = [];
    for (const receiver of [{}, fake]) {
      for (const m of members) {
        const desc = Object.getOwnPropertyDescriptor(proto, m)!;
        const fn = (desc.get ?? desc.value) as (this: unknown) => unknown;
        const r = thrownBy(() => fn.call(receiver));
        results.push(`${m}: ${r === 'did not throw' ? r : 'threw'}`);
      }
    }
    expect(results).toEqual([...members, ...members].map((m) => `${m}: threw`));
  });

  // Garbage in every argument position of every function, one position at a time (the others
  // valid): always a TypeError or RangeError whose message starts with "Expected", nothing allocated.
  const GARBAGE: [string, unknown][] = [
    ['undefined', undefined], ['null', null], ["'1'", '1'], ['{}', {}], ['[]', []], ['-1', -1], ['NaN', NaN],
    ['Float32Array(4)', new Float32Array(4)], ['a function', () => 0], ['a Symbol', Symbol('s')], ['10n', BigInt(10)],
  ];
  const tagOf = (x: unknown): string => Object.prototype.toString.call(x);
  test('garbage in every argument position throws an "Expected ..." error and allocates nothing', () => {
    const valid: [keyof typeof b, () => unknown[]][] = [
      ['createFromFloat32', () => [0, 0, new Float32Array(4)]],
      ['createFromBits', () => [0, 1, new Uint16Array(4)]],
      ['createZeros', () => [0, 2, 4]],
      ['injectCudaFault', () => ['illegal-address']],
      ['readFloat32', () => [nq]],
      ['readBits', () => [nq]],
      ['synchronize', () => [0]],
      ['resetPeakMemory', () => [0]],
      ['setPoison', () => [false]],
    ];
    const before = liveMemory();
    const failures: string[] = [];
    let calls = 0;
    for (const [fn, args] of valid) {
      const n = args().length;
      for (let i = 0; i < n; i++) {
        for (const [label, g] of GARBAGE) {
          const a = args();
          // A Float32Array is valid data for createFromFloat32: not garbage there.
          if (ArrayBuffer.isView(g) && ArrayBuffer.isView(a[i]) && tagOf(a[i]) === tagOf(g)) continue;
          a[i] = g;
          calls++;
          const r = thrownBy(() => (b[fn] as (...x: unknown[]) => unknown)(...a));
          if (r === 'did not throw' || !['TypeError', 'RangeError'].includes(r.name) || !r.message.startsWith('Expected ')) {
            failures.push(`${fn} arg ${i} = ${label}: ${JSON.stringify(r)}`);
          }
        }
        // Also with the argument (and everything after it) missing.
        calls++;
        const r = thrownBy(() => (b[fn] as (...x: unknown[]) => unknown)(...args().slice(0, i)));
        if (r === 'did not throw' || !r.message.startsWith('Expected ')) failures.push(`${fn} with ${i} args: ${JSON.stringify(r)}`);
      }
    }
    // The options objects of the attention calls: garbage as the argument itself, in each key one
    // key at a time (undefined is no garbage for an optional key), and each required key missing.
    const options: [keyof typeof b, () => Record<string, unknown>, string[]][] = [
      ['attentionForward', fwdArgs, ['strides']],
      ['attentionBackward', bwdArgs, ['strides', 'grads', 'gradStrides']],
    ];
    const refused = (what: string, fn: () => unknown): void => {
      calls++;
      const r = thrownBy(fn);
      if (r === 'did not throw' || !['TypeError', 'RangeError'].includes(r.name) || !r.message.startsWith('Expected ')) {
        failures.push(`${what}: ${JSON.stringify(r)}`);
      }
    };
    for (const [fn, base, optional] of options) {
      const f = b[fn] as (...x: unknown[]) => unknown;
      for (const [label, g] of GARBAGE) refused(`${fn}(${label})`, () => f(g));
      for (const key of [...Object.keys(base()), ...optional]) {
        for (const [label, g] of GARBAGE) {
          if (g === undefined && optional.includes(key)) continue;
          refused(`${fn} ${key} = ${label}`, () => f({ ...base(), [key]: g }));
        }
        if (!optional.includes(key)) refused(`${fn} without ${key}`, () => f(without(base(), key)));
      }
    }
    expect(failures).toEqual([]);
    // 15 argument positions × (11 garbage values + 1 missing), less the one valid Float32Array; then
    // per attention call 11 garbage arguments, and over its keys (8 + 1 optional, 13 + 3 optional)
    // 11 garbage values in each required key plus the key missing, and 10 in each optional key.
    expect(calls).toBe(15 * 12 - 1 + 2 * 11 + (8 * 12 + 1 * 10) + (13 * 12 + 3 * 10));
    expect(liveMemory()).toEqual(before);
  });
});
