/**
 * Tensor views (view, reshape, narrow, select, contiguous, clone), the strided copy-and-cast engine
 * (copyFrom, cast, to, fill, empty, full) and readInto, against a JS gather over the same strides.
 * Runs once per device; the raw binding's bad calls are checked with exact messages and unchanged
 * memory.
 */

import { Device, DType, handleOf, memory, synchronize, Tensor, TensorDType } from '../lib/tensor';
import { tidy } from '../lib/scope';
import { f32ToBf16Bits, f32ToF16Bits, roundToDtype } from '../lib/half';
import { binding, DEVICE_CODE, DTYPE_CODE } from '../lib/native';
import { describeEachDevice, liveMemory, synchronizeAll, trackMemory, usePoisonedOutputs } from './helpers/backend';
import { randn, rngFor, seedHint } from './helpers/random';

trackMemory();
usePoisonedOutputs();

const FLOATS: readonly DType[] = ['float32', 'float16', 'bfloat16'];

/** Elements of a view (row-major over `shape`) gathered from flat `data` through `strides` and `offset`. */
function gather(data: ArrayLike<number>, shape: readonly number[], strides: readonly number[], offset: number): number[] {
  const out: number[] = [];
  const idx = new Array<number>(shape.length).fill(0);
  const numel = shape.reduce((a, b) => a * b, 1);
  for (let n = 0; n < numel; n += 1) {
    let o = offset;
    for (let d = 0; d < shape.length; d += 1) o += idx[d] * strides[d];
    out.push(data[o]);
    for (let d = shape.length - 1; d >= 0; d -= 1) {
      idx[d] += 1;
      if (idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

function rounded(data: Float32Array, dtype: DType): Float32Array {
  return data.map((x) => roundToDtype(x, dtype));
}

/** A tensor's elements as numbers: int32 exactly (toFloat32Array rounds magnitudes above 2^24). */
async function values(t: Tensor): Promise<number[]> {
  return Array.from(t.dtype === 'int32' ? await t.toBits() : await t.toFloat32Array());
}

describeEachDevice('views', (device: Device) => {
  const rng = rngFor(`views-${device}`);

  test('view, reshape, narrow and select share storage and read their own elements', async () => {
    for (const dtype of FLOATS) {
      const shape = [3, 7, 5];
      const data = rounded(randn(105, rng), dtype);
      const before = liveMemory()[device].tensors;
      const base = Tensor.fromFloat32Array(data, shape, { dtype, device });
      const v = base.view([21, -1]);
      expect(v.shape).toEqual([21, 5]);
      expect(v.strides).toEqual([5, 1]);
      const n = base.narrow(1, 2, 4); // [3, 4, 5] at offset 10
      expect(n.offset).toBe(10);
      expect(n.strides).toEqual([35, 5, 1]);
      expect(n.isContiguous).toBe(false);
      const s = base.select(-1, -2); // [3, 7], stride [35, 5], offset 3
      expect(s.shape).toEqual([3, 7]);
      expect(s.offset).toBe(3);
      const row = tidy(() => base.select(0, 1).narrow(0, 3, 2)); // [2, 5] contiguous at offset 50
      expect(row.isContiguous).toBe(true);
      // Views hold storage handles, not storage.
      expect(liveMemory()[device].tensors).toBe(before + 1);
      expect(await values(v)).toEqual(Array.from(data));
      expect(await values(n)).toEqual(gather(data, [3, 4, 5], [35, 5, 1], 10));
      expect(await values(s)).toEqual(gather(data, [3, 7], [35, 5], 3));
      expect(await values(row)).toEqual(Array.from(data.subarray(50, 60)));
      // Ranges of a strided view are ranges of its own row-major elements.
      expect(Array.from(await n.toFloat32Array({ offset: 7, length: 30 }))).toEqual(
        gather(data, [3, 4, 5], [35, 5, 1], 10).slice(7, 37));
      const bits = await s.toBits();
      expect(bits.length).toBe(21);
      // Disposing the base keeps the storage for the views; the last view frees it.
      base.dispose();
      expect(await values(row)).toEqual(Array.from(data.subarray(50, 60)));
      for (const t of [v, n, s]) t.dispose();
      await synchronize(device);
      expect(liveMemory()[device].tensors).toBe(before + 1);
      row.dispose();
      await synchronize(device);
      expect(liveMemory()[device].tensors).toBe(before);
    }
  });

  test('view of a strided view splits and merges dims where the strides allow, and refuses otherwise', async () => {
    const data = randn(2 * 6 * 4, rng);
    const base = Tensor.fromFloat32Array(data, [2, 6, 4], { device });
    const n = base.narrow(1, 1, 4); // [2, 4, 4], strides [24, 4, 1]
    const split = n.view([2, 2, 2, 4]); // splits the middle dim: no copy
    expect(split.strides).toEqual([24, 8, 4, 1]);
    expect(await values(split)).toEqual(gather(data, [2, 4, 4], [24, 4, 1], 4));
    const merged = n.view([2, 16]); // merges the two inner dims: contiguous across them
    expect(merged.strides).toEqual([24, 1]);
    expect(() => n.view([32])).toThrow(new RangeError(
      'Expected shape [32] to be compatible with this view\'s strides [24, 4, 1] (shape [2, 4, 4]) without a copy; ' +
      'call reshape() to copy when needed, or contiguous() first but received [32]'));
    expect(() => n.view([5, -1])).toThrow(RangeError);
    expect(() => n.view([-1, -1])).toThrow(RangeError);
    const r = n.reshape([32]); // copies
    expect(r.isContiguous).toBe(true);
    expect(await values(r)).toEqual(gather(data, [2, 4, 4], [24, 4, 1], 4));
    const c = n.contiguous();
    expect(await values(c)).toEqual(await values(r));
    const same = base.contiguous(); // contiguous already: a new handle, no new storage
    expect(memory()[device].tensors).toBeGreaterThan(0);
    for (const t of [base, n, split, merged, r, c, same]) t.dispose();
  });

  test('narrow and select refuse bad dims and indices', () => {
    const t = Tensor.zeros([3, 4], { device });
    const before = liveMemory();
    expect(() => t.narrow(2, 0, 1)).toThrow(new RangeError('Expected dim to be an integer in [-2, 1] but received 2 of type number'));
    expect(() => t.narrow(1, 4, 1)).toThrow(new RangeError('Expected start to be an integer in [0, 3] but received 4 of type number'));
    expect(() => t.narrow(1, 1, 4)).toThrow(new RangeError('Expected length to be an integer in [1, 3] but received 4 of type number'));
    expect(() => t.select(0, 3)).toThrow(new RangeError('Expected index to be an integer in [-3, 2] but received 3 of type number'));
    expect(() => tidy(() => t.select(0, 1).select(0, 0))).toThrow(RangeError);
    expect(liveMemory()).toEqual(before);
    t.dispose();
    expect(() => t.view([12])).toThrow(new TypeError('Expected tensor to be a live Tensor but received a disposed Tensor'));
  });
});

describeEachDevice('copies, casts and fills', (device: Device) => {
  const rng = rngFor(`copies-${device}`);

  test('clone and cast of strided views, every dtype pair', async () => {
    const dtypes: TensorDType[] = ['float32', 'float16', 'bfloat16', 'int32'];
    for (const from of dtypes) {
      const raw = from === 'int32'
        ? Int32Array.from(randn(7 * 9, rng), (x) => Math.round(x * 5e6))
        : rounded(randn(7 * 9, rng, 3), from);
      const base = from === 'int32'
        ? Tensor.fromInt32Array(raw as Int32Array, [7, 9], { device })
        : Tensor.fromFloat32Array(raw as Float32Array, [7, 9], { dtype: from, device });
      const view = tidy(() => base.narrow(1, 2, 5).narrow(0, 1, 5)); // [5, 5] strides [9, 1] offset 11
      const expected = gather(raw, [5, 5], [9, 1], 11);
      const cl = view.clone();
      expect(cl.isContiguous).toBe(true);
      expect(cl.dtype).toBe(from);
      expect(await values(cl)).toEqual(from === 'int32' ? expected : expected.map((x) => Math.fround(x)));
      for (const to of dtypes) {
        if (to === 'int32' && from !== 'int32') {
          expect(() => view.cast(to)).toThrow(TypeError);
          continue;
        }
        const c = view.cast(to);
        const got = await values(c);
        const want = to === 'int32' ? expected : expected.map((x) => roundToDtype(Math.fround(x), to as DType));
        expect({ from, to, got }).toEqual({ from, to, got: want });
        c.dispose();
      }
      for (const t of [base, view, cl]) t.dispose();
    }
  });

  test('copyFrom writes through a strided view only (any strides on both sides, with a cast)', async () => {
    const dstData = randn(4 * 6 * 3, rng);
    const dst = Tensor.fromFloat32Array(dstData, [4, 6, 3], { device });
    const srcData = randn(6 * 4, rng);
    const src = tidy(() => Tensor.fromFloat32Array(srcData, [6, 4], { dtype: 'bfloat16', device }).narrow(0, 1, 4));
    const target = tidy(() => dst.select(2, 1).narrow(1, 1, 4)); // [4, 4], strides [18, 3], offset 4
    expect(target.copyFrom(src)).toBe(target);
    const got = await dst.toFloat32Array();
    const want = Array.from(dstData);
    for (let i = 0; i < 4; i += 1) {
      for (let j = 0; j < 4; j += 1) want[4 + i * 18 + j * 3] = roundToDtype(srcData[4 + i * 4 + j], 'bfloat16');
    }
    expect(Array.from(got)).toEqual(want);
    // In place through a view: a later read sees it, in call order.
    tidy(() => void dst.select(0, 0).fill(2.5));
    const after = await dst.toFloat32Array({ offset: 0, length: 18 });
    expect(Array.from(after)).toEqual(new Array(18).fill(2.5));
    for (const t of [dst, src, target]) t.dispose();
  });

  test('long rows are split across the workers without losing an element', async () => {
    // Rows longer than one task's share (65536 elements on the CPU), strided and dense.
    const data = randn(3 * 70001, rng);
    const base = Tensor.fromFloat32Array(data, [3, 70001], { device });
    const view = base.narrow(1, 1, 70000);
    const cast = view.cast('bfloat16');
    const got = await cast.toFloat32Array();
    const want = gather(data, [3, 70000], [70001, 1], 1).map((x) => roundToDtype(x, 'bfloat16'));
    expect(Array.from(got).every((x, i) => x === want[i])).toBe(true);
    const big = Tensor.empty([200003], { dtype: 'float16', device }).fill(0.1);
    const bigBits = await big.toBits();
    expect(bigBits.every((x) => x === f32ToF16Bits(0.1))).toBe(true);
    for (const t of [base, view, cast, big]) t.dispose();
  });

  test('fill of every dtype and Tensor.full / Tensor.empty', async () => {
    const f = Tensor.full([3, 5], 1 / 3, { dtype: 'float16', device });
    expect(Array.from(await f.toBits())).toEqual(new Array(15).fill(f32ToF16Bits(1 / 3)));
    const b = Tensor.full([2, 3], -7.1, { dtype: 'bfloat16', device });
    expect(Array.from(await b.toBits())).toEqual(new Array(6).fill(f32ToBf16Bits(-7.1)));
    const i = Tensor.full([4], -123456, { dtype: 'int32', device });
    expect(Array.from(await i.toBits())).toEqual([-123456, -123456, -123456, -123456]);
    const n = Tensor.full([2], NaN, { dtype: 'float32', device });
    expect(Array.from(await n.toFloat32Array()).every(Number.isNaN)).toBe(true);
    const e = Tensor.empty([97], { device }); // poisoned in this file
    expect(Array.from(await e.toFloat32Array()).every(Number.isNaN)).toBe(true);
    tidy(() => void e.narrow(0, 3, 90).fill(0));
    const ev = await e.toFloat32Array();
    expect(Number.isNaN(ev[2]) && ev[3] === 0 && ev[92] === 0 && Number.isNaN(ev[93])).toBe(true);
    const before = liveMemory();
    expect(() => Tensor.full([2], 1.5, { dtype: 'int32', device })).toThrow(new RangeError(
      'Expected value to be an integer in [-2147483648, 2147483647] for dtype int32 but received 1.5 of type number'));
    expect(() => i.fill(2 ** 31)).toThrow(RangeError);
    expect(() => f.fill('1' as unknown as number)).toThrow(new TypeError('Expected value to be a number but received "1" of type string'));
    expect(liveMemory()).toEqual(before);
    for (const t of [f, b, i, n, e]) t.dispose();
  });

  test('readInto fills a caller array and validates it first', async () => {
    const data = rounded(randn(40, rng), 'float16');
    const t = Tensor.fromFloat32Array(data, [5, 8], { dtype: 'float16', device });
    const all = new Float32Array(40);
    await t.readInto(all);
    expect(Array.from(all)).toEqual(Array.from(data));
    const part = new Uint16Array(6);
    await t.readInto(part, { offset: 10, length: 6 });
    expect(Array.from(part)).toEqual(Array.from(data.subarray(10, 16), (x) => f32ToF16Bits(x)));
    const col = new Float32Array(5);
    const view = t.select(1, 3);
    await view.readInto(col);
    expect(Array.from(col)).toEqual(gather(data, [5], [8], 3));
    expect(() => t.readInto(new Float32Array(39))).toThrow(new RangeError(
      'Expected target to have 40 elements (the elements read) but received 39'));
    expect(() => t.readInto(new Int32Array(40))).toThrow(new TypeError(
      'Expected target to be a Float32Array (values) or a Uint16Array (raw bits) for dtype float16 but received an Int32Array'));
    // A target detached before the read lands: the read rejects instead of writing.
    const detached = new Float32Array(40);
    const pending = t.readInto(detached);
    structuredClone(detached.buffer, { transfer: [detached.buffer] });
    await expect(pending).rejects.toThrow(
      'readInto: the target array was detached or resized before the read finished; nothing was written');
    const ids = Tensor.fromInt32Array(Int32Array.from([1, -2, 3]), [3], { device });
    const into = new Int32Array(3);
    await ids.readInto(into);
    expect(Array.from(into)).toEqual([1, -2, 3]);
    expect(() => ids.readInto(new Float32Array(3))).toThrow(TypeError);
    for (const x of [t, view, ids]) x.dispose();
  });

  test('the raw binding re-checks views, dtypes and overlap (exact messages, nothing allocated)', async () => {
    const b = binding();
    const t = Tensor.zeros([4, 4], { device });
    const h = t.narrow(0, 0, 4); // its own handle
    const handle = handleOf(t, 't');
    await synchronizeAll();
    const before = liveMemory();
    expect(() => b.copyStrided([handle, 0], [handle, 0], [4, 5], [5, 1], [4, 1])).toThrow(new RangeError(
      'Expected dst to reach 20 elements from offset 0 inside its storage of 16 elements but it does not'));
    expect(() => b.copyStrided([handle, 4], [handle, 0], [2, 4], [4, 1], [4, 1])).toThrow(new RangeError(
      'Expected src and dst not to share elements but they do (copy through a clone() first)'));
    expect(() => b.copyStrided([handle, 1], [handle, 2], [4, 2], [4, 1], [4, 1])).toThrow(/not to share elements/);
    expect(() => b.copyStrided([handle, 0], [handle, 0], [2, 4], [1, 1], [4, 1])).toThrow(new RangeError(
      'Expected dst to be a view whose elements are distinct (each stride larger than the span of the dims with ' +
      'smaller strides) but it is not'));
    expect(() => b.copyStrided([handle, 0], [handle, 16], [1], [1], [1])).toThrow(new RangeError(
      'Expected src offset to be an integer in [0, 15] but received 16 of type number'));
    expect(() => b.copyStrided([handle, 0], [handle, 0], [], [], [])).toThrow(new TypeError(
      'Expected sizes to be an Array of 1 to 8 sizes but received an Array of length 0'));
    expect(() => b.copyStrided([handle, 0], [handle, 4], [2, 2], [-1, 1], [2, 1])).toThrow(new RangeError(
      'Expected dstStrides to be an integer in [0, 9007199254740991] but received -1 of type number'));
    expect(() => b.fillStrided([handle, 0], [4, 4], [4, 1], '0' as unknown as number)).toThrow(new TypeError(
      'Expected value to be a number but received "0" of type string'));
    expect(() => b.transfer([handle, 4], 13, DEVICE_CODE.cpu)).toThrow(new RangeError(
      'Expected count to be an integer in [1, 12] but received 13 of type number'));
    expect(() => b.readInto(handle, 0, 16, new Float32Array(15))).toThrow(new RangeError(
      'Expected target to have 16 elements but it has 15'));
    const cols = Tensor.fromFloat32Array(Float32Array.from({ length: 16 }, (_, i) => i), [4, 4], { device });
    b.copyStrided([handleOf(cols, 'cols'), 0], [handleOf(cols, 'cols'), 2], [4, 2], [4, 1], [4, 1]);
    expect(Array.from(await cols.toFloat32Array())).toEqual([2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15]);
    cols.dispose();
    const ids = Tensor.fromInt32Array(new Int32Array(16), [16], { device });
    const idh = handleOf(ids, 'ids');
    await synchronizeAll();
    const withIds = liveMemory();
    expect(() => b.copyStrided([idh, 0], [handle, 0], [16])).toThrow(new TypeError(
      'Expected src to have dtype int32 to be copied into an int32 tensor but received float32 (float to int32 ' +
      'conversion is not supported)'));
    expect(() => b.fillStrided([idh, 0], [16], undefined, 0.5)).toThrow(new RangeError(
      'Expected value to be an integer in [-2147483648, 2147483647] for an int32 tensor but received 0.5 of type number'));
    expect(() => b.createEmpty(DEVICE_CODE[device], DTYPE_CODE.float32, 0)).toThrow('Expected numel to be an integer in [1, 9007199254740991] but received 0 of type number');
    expect(liveMemory()).toEqual(withIds);
    ids.dispose();
    await synchronizeAll();
    expect(liveMemory()).toEqual(before);
    t.dispose();
    h.dispose();
  });
});

describeEachDevice('to() across devices', (device: Device) => {
  test('to() of a strided view lands contiguous, with the same values', async () => {
    const data = randn(6 * 10, rngFor(`to-${device}`));
    const t = Tensor.fromFloat32Array(data, [6, 10], { dtype: 'float16', device });
    const view = t.narrow(1, 3, 4);
    for (const dest of ['cpu', device] as Device[]) {
      const moved = view.to(dest);
      expect(moved.device).toBe(dest);
      expect(moved.isContiguous).toBe(true);
      expect(await values(moved)).toEqual(gather(rounded(data, 'float16'), [6, 4], [10, 1], 3));
      // copyFrom across devices goes through to().
      const back = Tensor.zeros([6, 4], { dtype: 'float32', device: dest === 'cpu' ? device : 'cpu' });
      back.copyFrom(moved);
      expect(await values(back)).toEqual(await values(moved));
      moved.dispose();
      back.dispose();
    }
    t.dispose();
    view.dispose();
  }, 60000);

  test('seed', () => {
    expect(seedHint()).toMatch(/FA_TEST_SEED=0x/);
  });
});
