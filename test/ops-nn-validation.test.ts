/**
 * Bad calls of the nn ops (lib/ops/norm.ts, rope.ts, activation.ts, elementwise.ts) and of their raw
 * native bindings (csrc/napi/nn_ops.cc): each throws the exact TypeError / RangeError that names the
 * argument, what was expected and what was received, allocates nothing (memory() unchanged), and
 * changes nothing (the tensors an op updates in place keep their bits). The raw binding is fed
 * garbage: it must throw, never crash the process.
 *
 * CPU tensors (validation does not depend on the device); the device-mismatch cases run when CUDA is
 * usable.
 */

import { gelu, geluBackward, swiglu, swigluBackward } from '../lib/ops/activation';
import { add, addInPlace } from '../lib/ops/elementwise';
import { layerNorm, layerNormBackward, rmsNorm, rmsNormBackward } from '../lib/ops/norm';
import { applyRope } from '../lib/ops/rope';
import { binding, NativeBuffer } from '../lib/native';
import { handleOf, Tensor, TENSOR_TOKEN } from '../lib/tensor';
import { cudaSkipReason, HAS_CUDA, liveMemory, synchronizeAll, trackMemory } from './helpers/backend';
import { randn, rngFor } from './helpers/random';

trackMemory();

type ErrorName = 'TypeError' | 'RangeError' | 'Error';

/** The thrown value's name and message (errors from the addon come from another realm: no instanceof). */
function thrownBy(fn: () => unknown): { name: string; message: string } | 'did not throw' {
  try {
    const r = fn();
    // A call that unexpectedly succeeded must not leak what it allocated.
    const release = (x: unknown): void => {
      if (x instanceof Tensor) x.dispose();
      else if (x && typeof x === 'object' && 'release' in x) (x as NativeBuffer).release();
    };
    if (Array.isArray(r)) r.forEach(release);
    else if (r && typeof r === 'object') Object.values(r).forEach(release);
    release(r);
    return 'did not throw';
  } catch (e) {
    const err = e as Error;
    return { name: err?.name, message: err?.message };
  }
}

// Nothing queued may free memory in the background while a test compares memory() snapshots.
beforeEach(() => synchronizeAll());

const cpu = 'cpu' as const;
type FloatDType = 'float32' | 'float16' | 'bfloat16';

// Fixtures (created in beforeAll, disposed in afterAll), named so that the tables below can be built
// at collection time.
const fx: Record<string, Tensor> = {};
const F = (name: string): Tensor => fx[name];

function make(name: string, shape: number[], dtype: FloatDType = 'float32'): void {
  const n = shape.reduce((a, b) => a * b, 1);
  fx[name] = Tensor.fromFloat32Array(randn(n, rngFor(`nn-validation/${name}`)), shape, { dtype, device: cpu });
}

/** A view of fixture `base` that the public view API cannot make (a second handle on its storage). */
function viewOf(name: string, base: string, shape: number[], offset: number, strides: number[]): void {
  const b = fx[base];
  fx[name] = new Tensor(handleOf(b, base).share(), shape, b.dtype, b.device, { offset, strides }, TENSOR_TOKEN);
}

/** Creates the fixtures inside trackMemory's window (nested hooks run inside the file's). */
function useFixtures(): void {
beforeAll(() => {
  make('x', [4, 8]);
  make('xb', [4, 8], 'bfloat16');
  make('x48', [8, 4]);
  make('w', [8]);
  make('wb', [8], 'bfloat16');
  make('w9', [9]);
  make('rstd', [4]);
  make('rstdb', [4], 'bfloat16');
  make('rstd5', [5]);
  make('mean', [4]);
  make('dw', [8]);
  make('db', [8]);
  make('dwb', [8], 'bfloat16');
  make('x3', [2, 3, 8]);
  make('q', [2, 3, 2, 8]);
  make('odd', [2, 3, 2, 5]);
  make('x47', [4, 7]);
  make('x44', [4, 4]);
  make('grads16', [16]);
  fx.ids = Tensor.fromInt32Array(new Int32Array([0, 1, 2, 3]), [4], { device: cpu });
  fx.idsx = Tensor.fromInt32Array(new Int32Array(32), [4, 8], { device: cpu });
  make('disposed', [4, 8]);
  fx.disposed.dispose();
  fx.strided = fx.x.narrow(1, 0, 4); // [4, 4] with strides [8, 1]: not contiguous
  viewOf('ropeStride2', 'q', [2, 3, 1, 8], 0, [48, 16, 8, 2]); // last stride 2
  viewOf('ropeOverlap', 'q', [1, 3, 2, 8], 0, [48, 8, 8, 1]); // rows overlap heads
  fx.lo = fx.grads16.narrow(0, 0, 8);
  fx.hi = fx.grads16.narrow(0, 4, 8); // overlaps lo
});
afterAll(() => {
  for (const t of Object.values(fx)) t.dispose();
});
}

/** Expects `fn` to throw exactly `name: message`, to allocate nothing, and to leave `unchanged` as it was. */
async function expectRefused(fn: () => unknown, name: ErrorName, message: string, unchanged: string[] = []): Promise<void> {
  const bitsBefore = await Promise.all(unchanged.map((n) => F(n).toBits()));
  const before = liveMemory();
  expect(thrownBy(fn)).toEqual({ name, message });
  expect(liveMemory()).toEqual(before);
  await synchronizeAll();
  const bitsAfter = await Promise.all(unchanged.map((n) => F(n).toBits()));
  expect(bitsAfter.map((b) => Array.from(b))).toEqual(bitsBefore.map((b) => Array.from(b)));
}

type Case = [string, () => unknown, ErrorName, string, string[]?];

/**
 * Rows of equal length: test.each passes a row's items as arguments, and a callback that declares
 * more parameters than a row has items gets Jest's `done` callback in the last one.
 */
function cases(rows: Case[]): [string, () => unknown, ErrorName, string, string[]][] {
  return rows.map(([label, fn, name, message, unchanged]) => [label, fn, name, message, unchanged ?? []]);
}

const MAX_F32 = '3.4028234663852886e+38';
const FLOATS = "'float32', 'float16' or 'bfloat16'";

describe('lib/ops: bad calls', () => {
  useFixtures();
  test.each(cases([
    // rmsNorm / layerNorm
    ['rmsNorm: x int32', () => rmsNorm(F('idsx'), F('w')), 'TypeError', `Expected x to have dtype ${FLOATS} but received 'int32'`],
    ['rmsNorm: x null', () => rmsNorm(null as unknown as Tensor, F('w')), 'TypeError', 'Expected x to be a Tensor but received null'],
    ['rmsNorm: x disposed', () => rmsNorm(F('disposed'), F('w')), 'TypeError', 'Expected x to be a live Tensor but received a disposed Tensor'],
    ['rmsNorm: x not contiguous', () => rmsNorm(F('strided'), F('w')), 'RangeError', 'Expected x to be contiguous (call .contiguous() first) but received strides [8, 1]'],
    ['rmsNorm: weight bfloat16', () => rmsNorm(F('x'), F('wb')), 'TypeError', "Expected weight to have dtype 'float32' but received 'bfloat16'"],
    ['rmsNorm: weight [9]', () => rmsNorm(F('x'), F('w9')), 'RangeError', 'Expected weight to have shape [8] but received [9]'],
    ['rmsNorm: options a number', () => rmsNorm(F('x'), F('w'), 5 as unknown as object), 'TypeError', 'Expected options to be an object or undefined but received 5 of type number'],
    ['rmsNorm: unknown option', () => rmsNorm(F('x'), F('w'), { epsilon: 1 } as object), 'TypeError', "Expected options to have only the keys 'eps' but received unknown key 'epsilon'"],
    ['rmsNorm: eps -1', () => rmsNorm(F('x'), F('w'), { eps: -1 }), 'RangeError', `Expected options.eps to be a finite number >= 0 <= ${MAX_F32} but received -1`],
    ['rmsNorm: eps NaN', () => rmsNorm(F('x'), F('w'), { eps: NaN }), 'RangeError', `Expected options.eps to be a finite number >= 0 <= ${MAX_F32} but received NaN`],
    ['rmsNorm: eps 1e39', () => rmsNorm(F('x'), F('w'), { eps: 1e39 }), 'RangeError', `Expected options.eps to be a finite number >= 0 <= ${MAX_F32} but received 1e+39`],
    ['rmsNorm: eps a string', () => rmsNorm(F('x'), F('w'), { eps: '1e-5' as unknown as number }), 'TypeError', 'Expected options.eps to be a number but received "1e-5" of type string'],
    ['layerNorm: bias undefined', () => layerNorm(F('x'), F('w'), undefined as unknown as null), 'TypeError', 'Expected bias to be a Tensor or null but received undefined'],
    ['layerNorm: bias bfloat16', () => layerNorm(F('x'), F('w'), F('wb')), 'TypeError', "Expected bias to have dtype 'float32' but received 'bfloat16'"],
    ['layerNorm: bias [9]', () => layerNorm(F('x'), F('w'), F('w9')), 'RangeError', 'Expected bias to have shape [8] but received [9]'],
    // backwards
    ['rmsNormBackward: dout bfloat16', () => rmsNormBackward(F('xb'), F('x'), F('w'), F('rstd'), { dweight: F('dw') }), 'TypeError', "Expected dout to have dtype 'float32' (like x) but received 'bfloat16'", ['dw']],
    ['rmsNormBackward: dout [8, 4]', () => rmsNormBackward(F('x48'), F('x'), F('w'), F('rstd'), { dweight: F('dw') }), 'RangeError', 'Expected dout to have the shape of x [4, 8] but received [8, 4]', ['dw']],
    ['rmsNormBackward: rstd [5]', () => rmsNormBackward(F('x'), F('x'), F('w'), F('rstd5'), { dweight: F('dw') }), 'RangeError', 'Expected rstd to have shape [4] but received [5]', ['dw']],
    ['rmsNormBackward: rstd bfloat16', () => rmsNormBackward(F('x'), F('x'), F('w'), F('rstdb'), {}), 'TypeError', "Expected rstd to have dtype 'float32' but received 'bfloat16'"],
    ['rmsNormBackward: grads with dbias', () => rmsNormBackward(F('x'), F('x'), F('w'), F('rstd'), { dweight: F('dw'), dbias: F('db') } as object), 'TypeError', "Expected grads to have only the keys 'dweight' but received unknown key 'dbias'", ['dw', 'db']],
    ['rmsNormBackward: dweight bfloat16', () => rmsNormBackward(F('x'), F('x'), F('w'), F('rstd'), { dweight: F('dwb') }), 'TypeError', "Expected grads.dweight to have dtype 'float32' but received 'bfloat16'", ['dwb']],
    ['rmsNormBackward: dweight [9]', () => rmsNormBackward(F('x'), F('x'), F('w'), F('rstd'), { dweight: F('w9') }), 'RangeError', 'Expected grads.dweight to have shape [8] but received [9]', ['w9']],
    ['layerNormBackward: mean [5]', () => layerNormBackward(F('x'), F('x'), F('w'), F('rstd5'), F('rstd'), { dweight: F('dw') }), 'RangeError', 'Expected mean to have shape [4] but received [5]', ['dw']],
    ['layerNormBackward: dbias bfloat16', () => layerNormBackward(F('x'), F('x'), F('w'), F('mean'), F('rstd'), { dweight: F('dw'), dbias: F('dwb') }), 'TypeError', "Expected grads.dbias to have dtype 'float32' but received 'bfloat16'", ['dw', 'dwb']],
    ['layerNormBackward: dbias is dweight', () => layerNormBackward(F('x'), F('x'), F('w'), F('mean'), F('rstd'), { dweight: F('dw'), dbias: F('dw') }), 'RangeError', 'Expected grads.dbias to be another tensor than grads.dweight but received the same tensor', ['dw']],
    ['layerNormBackward: dbias overlaps dweight', () => layerNormBackward(F('x'), F('x'), F('w'), F('mean'), F('rstd'), { dweight: F('lo'), dbias: F('hi') }), 'RangeError', 'Expected dbias not to overlap dweight (both are accumulated into) but it does', ['grads16']],
    ['layerNormBackward: unknown grad', () => layerNormBackward(F('x'), F('x'), F('w'), F('mean'), F('rstd'), { dgamma: F('dw') } as object), 'TypeError', "Expected grads to have only the keys 'dweight' or 'dbias' but received unknown key 'dgamma'", ['dw']],
    // applyRope
    ['applyRope: 3 dims', () => applyRope(F('x3')), 'RangeError', 'Expected x to have 4 dims but received [2, 3, 8]', ['x3']],
    ['applyRope: odd head dim', () => applyRope(F('odd')), 'RangeError', 'Expected x to have an even last dim (head dim) but received [2, 3, 2, 5]', ['odd']],
    ['applyRope: int32', () => applyRope(F('ids')), 'TypeError', `Expected x to have dtype ${FLOATS} but received 'int32'`],
    ['applyRope: last stride 2', () => applyRope(F('ropeStride2')), 'RangeError', 'Expected x to have a last stride of 1 but received strides [48, 16, 8, 2]', ['q']],
    ['applyRope: overlapping vectors', () => applyRope(F('ropeOverlap')), 'RangeError', 'Expected x to be a view whose [headDim] vectors do not overlap but received strides [48, 8, 8, 1] for shape [1, 3, 2, 8]', ['q']],
    ['applyRope: base 1', () => applyRope(F('q'), { base: 1 }), 'RangeError', `Expected options.base to be a finite number > 1 <= ${MAX_F32} but received 1`, ['q']],
    ['applyRope: base Infinity', () => applyRope(F('q'), { base: Infinity }), 'RangeError', `Expected options.base to be a finite number > 1 <= ${MAX_F32} but received Infinity`, ['q']],
    ['applyRope: positionOffset 1.5', () => applyRope(F('q'), { positionOffset: 1.5 }), 'RangeError', 'Expected options.positionOffset to be an integer >= 0 <= 2147483647 but received 1.5', ['q']],
    ['applyRope: positionOffset -1', () => applyRope(F('q'), { positionOffset: -1 }), 'RangeError', 'Expected options.positionOffset to be an integer >= 0 <= 2147483647 but received -1', ['q']],
    ['applyRope: positionOffset 2^31', () => applyRope(F('q'), { positionOffset: 2 ** 31 }), 'RangeError', 'Expected options.positionOffset to be an integer >= 0 <= 2147483647 but received 2147483648', ['q']],
    ['applyRope: inverse 1', () => applyRope(F('q'), { inverse: 1 as unknown as boolean }), 'TypeError', 'Expected options.inverse to be a boolean but received 1 of type number', ['q']],
    ['applyRope: unknown option', () => applyRope(F('q'), { theta: 1 } as object), 'TypeError', "Expected options to have only the keys 'base', 'positionOffset' or 'inverse' but received unknown key 'theta'", ['q']],
    // activations
    ['gelu: int32', () => gelu(F('ids')), 'TypeError', `Expected x to have dtype ${FLOATS} but received 'int32'`],
    ['gelu: not contiguous', () => gelu(F('strided')), 'RangeError', 'Expected x to be contiguous (call .contiguous() first) but received strides [8, 1]'],
    ['geluBackward: dout [8, 4]', () => geluBackward(F('x48'), F('x')), 'RangeError', 'Expected dout to have the shape of x [4, 8] but received [8, 4]'],
    ['geluBackward: dout bfloat16', () => geluBackward(F('xb'), F('x')), 'TypeError', "Expected dout to have dtype 'float32' (like x) but received 'bfloat16'"],
    ['swiglu: odd last dim', () => swiglu(F('x47')), 'RangeError', 'Expected x to have an even last dim (the gate half, then the value half) but received [4, 7]'],
    ['swigluBackward: dout [4, 8]', () => swigluBackward(F('x'), F('x')), 'RangeError', "Expected dout to have shape [4, 4] (x's with the last dim halved) but received [4, 8]"],
    ['swigluBackward: dout bfloat16', () => swigluBackward(F('xb'), F('x')), 'TypeError', "Expected dout to have dtype 'float32' but received 'bfloat16'"],
    // add
    ['add: b bfloat16', () => add(F('x'), F('xb')), 'TypeError', "Expected b to have dtype 'float32' (like a) but received 'bfloat16'"],
    ['add: b [8]', () => add(F('x'), F('w')), 'RangeError', 'Expected b to have the shape of a [4, 8] but received [8]'],
    ['add: a int32', () => add(F('ids'), F('ids')), 'TypeError', `Expected a to have dtype ${FLOATS} but received 'int32'`],
    ['add: alpha Infinity', () => add(F('x'), F('x'), { alpha: Infinity }), 'RangeError', `Expected options.alpha to be a finite number >= -${MAX_F32} <= ${MAX_F32} but received Infinity`],
    ['add: alpha a string', () => add(F('x'), F('x'), { alpha: '2' as unknown as number }), 'TypeError', 'Expected options.alpha to be a number but received "2" of type string'],
    ['addInPlace: unknown option', () => addInPlace(F('x'), F('x'), { beta: 1 } as object), 'TypeError', "Expected options to have only the keys 'alpha' but received unknown key 'beta'", ['x']],
    ['addInPlace: b overlaps a at another offset', () => addInPlace(F('lo'), F('hi')), 'RangeError', 'Expected b not to overlap a (an in-place add writes a while it reads b) but it does', ['grads16']],
    ['addInPlace: a disposed', () => addInPlace(F('disposed'), F('x')), 'TypeError', 'Expected a to be a live Tensor but received a disposed Tensor', ['x']],
  ]))('%s', async (_name, fn, name, message, unchanged) => {
    await expectRefused(fn, name, message, unchanged);
  });

  const cudaTest = HAS_CUDA ? test : test.skip;
  cudaTest(`tensors on two devices are refused${HAS_CUDA ? '' : ` [cuda] skipped: ${cudaSkipReason()}`}`, async () => {
    const xc = Tensor.fromFloat32Array(randn(32, rngFor('nn-validation/xc')), [4, 8], { device: 'cuda' });
    try {
      await expectRefused(() => rmsNorm(xc, F('w')), 'TypeError', "Expected weight to be on device 'cuda' but received 'cpu'");
      await expectRefused(() => add(xc, F('x')), 'TypeError', "Expected b to be on device 'cuda' (like a) but received 'cpu'");
      await expectRefused(() => layerNormBackward(xc, xc, F('w'), F('mean'), F('rstd'), {}), 'TypeError', "Expected weight to be on device 'cuda' but received 'cpu'");
    } finally {
      xc.dispose();
    }
  });
});

describe('raw native binding: garbage is refused with a clear error', () => {
  useFixtures();
  const b = binding();
  const T = (name: string, offset = 0): [NativeBuffer, number] => [handleOf(F(name), name), offset];
  const call = (fn: keyof typeof b, ...args: unknown[]): (() => unknown) => () =>
    (b[fn] as (...a: unknown[]) => unknown)(...args);
  // Lazy arguments: fixtures exist only once beforeAll ran.
  const lazy = (fn: keyof typeof b, ...args: (() => unknown)[]): (() => unknown) => () =>
    (b[fn] as (...a: unknown[]) => unknown)(...args.map((a) => a()));
  const v = <X>(x: X): (() => X) => () => x;
  const t = (name: string, offset = 0): (() => [NativeBuffer, number]) => () => T(name, offset);
  const released = (): NativeBuffer => handleOf(F('x'), 'x').share();

  test('the valid calls under the garbage below do work', async () => {
    const before = liveMemory();
    const [out, mean, rstd] = b.normForward(T('x'), T('w'), null, 4, 8, 1e-5, false);
    expect(mean).toBeNull();
    const dx = b.normBackward(T('x'), T('x'), T('w'), null, T('rstd'), T('dw'), null, 4, 8, false);
    b.rope(T('q'), [2, 3, 2, 8], [48, 16, 8], 10000, 0, false);
    const g = b.geluForward(T('x'), 32);
    const s = b.swigluForward(T('x'), 4, 4);
    const a = b.add(T('x'), T('x'), 32, 1, false) as NativeBuffer;
    expect(b.add(T('x', 16), T('w'), 8, 0, true)).toBeUndefined();
    expect(liveMemory().cpu.tensors).toBe(before.cpu.tensors + 6);
    for (const x of [out, rstd, dx, g, s, a]) x.release();
    await synchronizeAll();
    expect(liveMemory()).toEqual(before);
  });

  const norm = (over: Record<number, () => unknown>): (() => unknown) => {
    const base: (() => unknown)[] = [t('x'), t('w'), v(null), v(4), v(8), v(1e-5), v(false)];
    for (const [i, a] of Object.entries(over)) base[Number(i)] = a;
    return lazy('normForward', ...base);
  };
  const normBwd = (over: Record<number, () => unknown>): (() => unknown) => {
    const base: (() => unknown)[] = [t('x'), t('x'), t('w'), t('mean'), t('rstd'), t('dw'), t('db'), v(4), v(8), v(true)];
    for (const [i, a] of Object.entries(over)) base[Number(i)] = a;
    return lazy('normBackward', ...base);
  };
  const rope = (over: Record<number, () => unknown>): (() => unknown) => {
    const base: (() => unknown)[] = [t('q'), v([2, 3, 2, 8]), v([48, 16, 8]), v(10000), v(0), v(false)];
    for (const [i, a] of Object.entries(over)) base[Number(i)] = a;
    return lazy('rope', ...base);
  };

  test.each(cases([
    // normForward
    ['normForward: x null', norm({ 0: v(null) }), 'TypeError', 'Expected x to be a native buffer but received null'],
    ['normForward: x a Float32Array', norm({ 0: v(new Float32Array(32)) }), 'TypeError', 'Expected x to be a native buffer but received a Float32Array'],
    ['normForward: x [buffer]', norm({ 0: () => [handleOf(F('x'), 'x')] }), 'TypeError', 'Expected x to be a tensor ([buffer, offset]) but received an Array of length 1'],
    ['normForward: x offset 32', norm({ 0: t('x', 32) }), 'RangeError', 'Expected x offset to be an integer in [0, 31] but received 32 of type number'],
    ['normForward: x offset -1', norm({ 0: t('x', -1) }), 'RangeError', 'Expected x offset to be an integer in [0, 31] but received -1 of type number'],
    ['normForward: x released', norm({ 0: () => { const h = released(); h.release(); return h; } }), 'TypeError', 'Expected x to be a live tensor but it was disposed'],
    ['normForward: x int32', norm({ 0: t('idsx') }), 'TypeError', 'Expected x to have dtype float32, float16 or bfloat16 but received int32'],
    ['normForward: rows beyond x', norm({ 3: v(5) }), 'RangeError', 'Expected x to reach 40 elements from offset 0 inside its storage of 32 elements but it does not'],
    ['normForward: offset pushes x past its end', norm({ 0: t('x', 1) }), 'RangeError', 'Expected x to reach 32 elements from offset 1 inside its storage of 32 elements but it does not'],
    ['normForward: rows 0', norm({ 3: v(0) }), 'RangeError', 'Expected rows to be an integer in [1, 9007199254740991] but received 0 of type number'],
    ['normForward: cols 2.5', norm({ 4: v(2.5) }), 'RangeError', 'Expected cols to be an integer in [1, 9007199254740991] but received 2.5 of type number'],
    ['normForward: cols a string', norm({ 4: v('8') }), 'TypeError', 'Expected cols to be an integer but received "8" of type string'],
    ['normForward: rows x cols beyond 2^60', norm({ 3: v(2 ** 40), 4: v(2 ** 40) }), 'RangeError', 'Expected x to have fewer than 2^60 elements but received [1099511627776, 1099511627776]'],
    ['normForward: weight bfloat16', norm({ 1: t('wb') }), 'TypeError', 'Expected weight to have dtype float32 but received bfloat16'],
    ['normForward: weight too short', norm({ 1: t('rstd') }), 'RangeError', 'Expected weight to reach 8 elements from offset 0 inside its storage of 4 elements but it does not'],
    ['normForward: bias for RMSNorm', norm({ 2: t('w') }), 'TypeError', 'Expected bias to be null for RMSNorm (layerNorm false) but received a tensor'],
    ['normForward: bias too short', norm({ 2: t('rstd'), 6: v(true) }), 'RangeError', 'Expected bias to reach 8 elements from offset 0 inside its storage of 4 elements but it does not'],
    ['normForward: eps NaN', norm({ 5: v(NaN) }), 'RangeError', 'Expected eps to be a finite number >= 0 but received NaN'],
    ['normForward: eps -1e-5', norm({ 5: v(-1e-5) }), 'RangeError', 'Expected eps to be a finite number >= 0 but received -0.00001'],
    ['normForward: eps 1e39 (Infinity in float32)', norm({ 5: v(1e39) }), 'RangeError', 'Expected eps to be a finite number >= 0 but received 1e+39'],
    ['normForward: eps missing', norm({ 5: v(undefined) }), 'TypeError', 'Expected eps to be a number but received undefined'],
    ['normForward: layerNorm 1', norm({ 6: v(1) }), 'TypeError', 'Expected layerNorm to be a boolean but received 1 of type number'],
    // normBackward
    ['normBackward: dout bfloat16', normBwd({ 0: t('xb') }), 'TypeError', 'Expected dout to have dtype float32 but received bfloat16', ['dw', 'db']],
    ['normBackward: mean null for LayerNorm', normBwd({ 3: v(null) }), 'TypeError', 'Expected mean to be a tensor for LayerNorm (layerNorm true) but received null', ['dw', 'db']],
    ['normBackward: mean for RMSNorm', normBwd({ 6: v(null), 9: v(false) }), 'TypeError', 'Expected mean to be null for RMSNorm (layerNorm false) but received a tensor', ['dw']],
    ['normBackward: dbias for RMSNorm', normBwd({ 3: v(null), 9: v(false) }), 'TypeError', 'Expected dbias to be null for RMSNorm (layerNorm false) but received a tensor', ['dw', 'db']],
    ['normBackward: rstd bfloat16', normBwd({ 4: t('rstdb') }), 'TypeError', 'Expected rstd to have dtype float32 but received bfloat16', ['dw', 'db']],
    ['normBackward: mean too short', normBwd({ 3: t('mean', 1) }), 'RangeError', 'Expected mean to reach 4 elements from offset 1 inside its storage of 4 elements but it does not', ['dw', 'db']],
    ['normBackward: dweight bfloat16', normBwd({ 5: t('dwb') }), 'TypeError', 'Expected dweight to have dtype float32 but received bfloat16', ['dwb', 'db']],
    ['normBackward: dweight too short', normBwd({ 5: t('rstd') }), 'RangeError', 'Expected dweight to reach 8 elements from offset 0 inside its storage of 4 elements but it does not', ['rstd', 'db']],
    ['normBackward: dbias is dweight', normBwd({ 6: t('dw') }), 'RangeError', 'Expected dbias not to overlap dweight (both are accumulated into) but it does', ['dw']],
    ['normBackward: dbias overlaps dweight', normBwd({ 5: t('grads16'), 6: t('grads16', 7) }), 'RangeError', 'Expected dbias not to overlap dweight (both are accumulated into) but it does', ['grads16']],
    ['normBackward: layerNorm missing', normBwd({ 9: v(undefined) }), 'TypeError', 'Expected layerNorm to be a boolean but received undefined', ['dw', 'db']],
    // rope
    ['rope: x a number', rope({ 0: v(3) }), 'TypeError', 'Expected x to be a native buffer but received 3 of type number'],
    ['rope: dims of 3', rope({ 1: v([2, 3, 16]) }), 'TypeError', 'Expected dims to be an Array of 4 [batch, seqlen, heads, headDim] but received an Array of length 3', ['q']],
    ['rope: strides not an Array', rope({ 2: v('48,16,8') }), 'TypeError', 'Expected strides to be an Array of 3 [batchStride, rowStride, headStride] but received "48,16,8" of type string', ['q']],
    ['rope: headDim odd', rope({ 1: v([2, 3, 2, 7]) }), 'RangeError', 'Expected headDim to be even but received 7', ['q']],
    ['rope: headDim 0', rope({ 1: v([2, 3, 2, 0]) }), 'RangeError', 'Expected headDim to be an integer in [2, 2147483647] but received 0 of type number', ['q']],
    ['rope: batch 2^31', rope({ 1: v([2 ** 31, 3, 2, 8]) }), 'RangeError', 'Expected batch to be an integer in [1, 2147483647] but received 2147483648 of type number', ['q']],
    ['rope: rowStride -16', rope({ 2: v([48, -16, 8]) }), 'RangeError', 'Expected rowStride to be an integer in [0, 9007199254740991] but received -16 of type number', ['q']],
    ['rope: heads overlap', rope({ 2: v([48, 16, 4]) }), 'RangeError', 'Expected x to be a view whose [headDim] vectors do not overlap (headStride >= 8) but received headStride 4', ['q']],
    ['rope: heads overlap the next row', rope({ 2: v([48, 8, 16]) }), 'RangeError', 'Expected x to be a view whose [headDim] vectors do not overlap (headStride >= 24) but received headStride 16', ['q']],
    ['rope: the view reaches past x', rope({ 2: v([49, 16, 8]) }), 'RangeError', 'Expected x to reach 97 elements from offset 0 inside its storage of 96 elements but it does not', ['q']],
    ['rope: the offset pushes the view past x', rope({ 0: t('q', 1) }), 'RangeError', 'Expected x to reach 96 elements from offset 1 inside its storage of 96 elements but it does not', ['q']],
    ['rope: strides beyond 2^60', rope({ 1: v([2 ** 31 - 1, 3, 2, 8]), 2: v([2 ** 53 - 1, 48, 16]) }), 'RangeError', "Expected x's view to reach fewer than 2^60 elements but it reaches more", ['q']],
    ['rope: base 1', rope({ 3: v(1) }), 'RangeError', 'Expected base to be a finite number > 1 but received 1', ['q']],
    ['rope: base 1 + 1e-9 (1 in float32)', rope({ 3: v(1 + 1e-9) }), 'RangeError', 'Expected base to be a finite number > 1 but received 1.000000001', ['q']],
    ['rope: base NaN', rope({ 3: v(NaN) }), 'RangeError', 'Expected base to be a finite number > 1 but received NaN', ['q']],
    ['rope: positionOffset -1', rope({ 4: v(-1) }), 'RangeError', 'Expected positionOffset to be an integer in [0, 2147483647] but received -1 of type number', ['q']],
    ['rope: inverse "no"', rope({ 5: v('no') }), 'TypeError', 'Expected inverse to be a boolean but received "no" of type string', ['q']],
    ['rope: x int32', rope({ 0: t('idsx'), 1: v([1, 1, 1, 2]) }), 'TypeError', 'Expected x to have dtype float32, float16 or bfloat16 but received int32', ['idsx']],
    // activations
    ['geluForward: numel 33', lazy('geluForward', t('x'), v(33)), 'RangeError', 'Expected x to reach 33 elements from offset 0 inside its storage of 32 elements but it does not'],
    ['geluForward: numel 0', lazy('geluForward', t('x'), v(0)), 'RangeError', 'Expected numel to be an integer in [1, 9007199254740991] but received 0 of type number'],
    ['geluForward: x undefined', call('geluForward', undefined), 'TypeError', 'Expected x to be a native buffer but received undefined'],
    ['geluBackward: dout too short', lazy('geluBackward', t('w'), t('x'), v(32)), 'RangeError', 'Expected dout to reach 32 elements from offset 0 inside its storage of 8 elements but it does not'],
    ['geluBackward: dout bfloat16', lazy('geluBackward', t('xb'), t('x'), v(32)), 'TypeError', 'Expected dout to have dtype float32 but received bfloat16'],
    ['swigluForward: x too short for rows', lazy('swigluForward', t('x'), v(5), v(4)), 'RangeError', 'Expected x to reach 40 elements from offset 0 inside its storage of 32 elements but it does not'],
    ['swigluForward: cols 0', lazy('swigluForward', t('x'), v(4), v(0)), 'RangeError', 'Expected cols to be an integer in [1, 9007199254740991] but received 0 of type number'],
    ['swigluBackward: dout too short', lazy('swigluBackward', t('w'), t('x'), v(4), v(4)), 'RangeError', 'Expected dout to reach 16 elements from offset 0 inside its storage of 8 elements but it does not'],
    // add
    ['add: b too short', lazy('add', t('x'), t('w'), v(32), v(1), v(false)), 'RangeError', 'Expected b to reach 32 elements from offset 0 inside its storage of 8 elements but it does not'],
    ['add: b bfloat16', lazy('add', t('x'), t('xb'), v(32), v(1), v(false)), 'TypeError', 'Expected b to have dtype float32 but received bfloat16'],
    ['add: alpha Infinity', lazy('add', t('x'), t('x'), v(32), v(Infinity), v(false)), 'RangeError', 'Expected alpha to be a finite float32 number but received Infinity'],
    ['add: alpha 1e39 (Infinity in float32)', lazy('add', t('x'), t('x'), v(32), v(1e39), v(true)), 'RangeError', 'Expected alpha to be a finite float32 number but received 1e+39', ['x']],
    ['add: inPlace 0', lazy('add', t('x'), t('x'), v(32), v(1), v(0)), 'TypeError', 'Expected inPlace to be a boolean but received 0 of type number', ['x']],
    ['add: in place over a shifted b', lazy('add', t('grads16'), t('grads16', 3), v(8), v(1), v(true)), 'RangeError', 'Expected b not to overlap a (an in-place add writes a while it reads b) but it does', ['grads16']],
    ['add: a int32', lazy('add', t('idsx'), t('idsx'), v(32), v(1), v(true)), 'TypeError', 'Expected a to have dtype float32, float16 or bfloat16 but received int32', ['idsx']],
  ]))('%s', async (_name, fn, name, message, unchanged) => {
    await expectRefused(fn, name, message, unchanged);
  });

  test('no arguments at all', async () => {
    for (const fn of ['normForward', 'normBackward', 'rope', 'geluForward', 'geluBackward', 'swigluForward', 'swigluBackward', 'add'] as const) {
      const r = thrownBy(call(fn));
      expect(r).not.toBe('did not throw');
      expect((r as { name: string }).name).toBe('TypeError');
    }
  });
});
