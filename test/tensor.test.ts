/**
 * Tensor: creation, conversions bit for bit against lib/half.ts, fields, lifetime (dispose, memory
 * accounting, disposing under queued work, the FinalizationRegistry backstop) and read ordering.
 * Runs once per device (see helpers/backend.ts).
 */

import { runNodeChild } from './helpers/child';
import * as path from 'path';

import {
  Device,
  DType,
  DTYPES,
  FLOAT_DTYPES,
  dtypeSize,
  flashAttention,
  float32ToHalfBits,
  halfBitsToFloat32,
  memory,
  referenceAttention,
  roundToTf32,
  roundToDtype,
  synchronize,
  Tensor,
} from '../lib';
import { debug } from '../lib/testing';
import type { HalfDType } from '../lib/half';
import { binding } from '../lib/native';
import { storageOf } from '../lib/tensor';
import {
  describeEachDevice,
  liveMemory,
  synchronizeAll,
  trackMemory,
  usePoisonedOutputs,
} from './helpers/backend';
import { randn, rngFor, seedHint } from './helpers/random';
import { expectAllWritten, expectFlashRule } from './helpers/tolerance';

trackMemory();
usePoisonedOutputs();

const HALF_DTYPES: readonly HalfDType[] = ['float16', 'bfloat16'];

// ---------------------------------------------------------------------------------------------
// Test data: float32 bit patterns that exercise every branch of the half conversions
// ---------------------------------------------------------------------------------------------

/** float32 bit patterns of special and boundary values (NaN payloads, ±Inf, subnormals, ties). */
const SPECIAL_F32_BITS: readonly number[] = [
  0x00000000, 0x80000000, // ±0
  0x7f800000, 0xff800000, // ±Inf
  0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7fbfffff, 0x7fc0ffff, 0x7fffe000, 0xff812345, 0x7f802000, // NaNs
  0x00000001, 0x80000001, 0x007fffff, 0x00400000, 0x00800000, 0x80800000, // float32 subnormals, smallest normal
  0x3f800000, 0xbf800000, 0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001, // 1, bf16 ties (even down, odd up)
  0x7f7fffff, 0xff7fffff, 0x7f7f0000, 0x7f7f7fff, 0x7f7f8000, 0xff7f8000, // bf16 max, overflow by rounding
  0x477fe000, 0x477fefff, 0x477ff000, 0xc77ff000, 0x47800000, // fp16 max 65504, 65519.99, 65520 -> Inf
  0x38800000, 0x387fffff, 0x38000000, 0x33800000, 0x33000000, 0x33000001, 0x32ffffff, 0xb3000000, // fp16 2^-14, 2^-24, 2^-25
  0x33c00000, 0x34200000, 0x34400000, 0x38801000, 0x38803000, 0x3f801000, 0x3f803000, // fp16 subnormal/normal ties
];

/** Exact ties (and one ulp either side) between neighbouring half values, for a spread of patterns. */
function tiesBits(dtype: HalfDType): number[] {
  const out: number[] = [];
  const maxFinite = dtype === 'float16' ? 0x7bff : 0x7f7f;
  const f = new Float32Array(1);
  const u = new Uint32Array(f.buffer);
  for (let h = 0; h < maxFinite; h += 13) {
    for (const sign of [0, 0x8000]) {
      const pair = halfBitsToFloat32(Uint16Array.of(h | sign, (h + 1) | sign), dtype);
      f[0] = (pair[0] + pair[1]) / 2; // exact: the midpoint has at most 12 significant bits
      const mid = u[0];
      out.push(mid, mid + 1, mid - 1);
    }
  }
  return out.map((x) => x >>> 0);
}

/** `n` random float32 bit patterns (every exponent, NaNs included), then the special ones. */
function bitPatternsF32(label: string, n: number): Float32Array {
  const rng = rngFor(label);
  const extra = [...SPECIAL_F32_BITS, ...tiesBits('float16'), ...tiesBits('bfloat16')];
  const u = new Uint32Array(n + extra.length);
  for (let i = 0; i < n; i++) u[i] = rng.nextU32();
  u.set(extra, n);
  return new Float32Array(u.buffer);
}

const hex = (x: number, digits: number): string => `0x${(x >>> 0).toString(16).padStart(digits, '0')}`;

/** Bits of a float32 array (same buffer). */
function u32View(a: Float32Array): Uint32Array {
  return new Uint32Array(a.buffer, a.byteOffset, a.length);
}

/**
 * Index-by-index comparison of two bit arrays. Returns null when equal, else a description of the
 * first mismatch (for a readable `toBeNull()` failure).
 */
function bitMismatch(
  got: ArrayLike<number>,
  want: ArrayLike<number>,
  input: Uint32Array | Uint16Array,
  digits: number,
): string | null {
  if (got.length !== want.length) return `length ${got.length}, expected ${want.length}`;
  let count = 0;
  let first = -1;
  for (let i = 0; i < want.length; i++) {
    if (got[i] !== want[i]) {
      if (first < 0) first = i;
      count++;
    }
  }
  if (count === 0) return null;
  return `${count} mismatches; first at ${first}: input ${hex(input[first], input instanceof Uint16Array ? 4 : 8)}` +
    ` gave ${hex(got[first], digits)}, expected ${hex(want[first], digits)} (${seedHint()})`;
}

/** `Object.prototype.toString` tag: robust to typed arrays created in another realm (the addon's). */
const tag = (x: unknown): string => Object.prototype.toString.call(x);

/** The values of `a` as a plain array (for `toEqual` across realms). */
const plain = (a: ArrayLike<number>): number[] => Array.from(a);

// ---------------------------------------------------------------------------------------------

describeEachDevice('Tensor', (device: Device) => {
  describe('fromFloat32Array -> toFloat32Array / toBits', () => {
    test('float32 round trip is bit-exact (NaN payloads, ±Inf, ±0, subnormals, random patterns)', async () => {
      const data = bitPatternsF32(`tensor/${device}/f32`, 20000);
      const t = Tensor.fromFloat32Array(data, [data.length], { dtype: 'float32', device });
      try {
        const back = await t.toFloat32Array();
        expect(tag(back)).toBe('[object Float32Array]');
        expect(bitMismatch(u32View(back), u32View(data), u32View(data), 8)).toBeNull();
        const bits = await t.toBits();
        expect(tag(bits)).toBe('[object Float32Array]');
        expect(bitMismatch(u32View(bits as Float32Array), u32View(data), u32View(data), 8)).toBeNull();
      } finally {
        t.dispose();
      }
    });

    test.each(['float32', ...HALF_DTYPES] as DType[])('%s: ranged reads equal the same slice of the whole read, bit for bit', async (dtype) => {
      const data = bitPatternsF32(`tensor/${device}/range/${dtype}`, 4099);
      const n = data.length;
      const t = Tensor.fromFloat32Array(data, [1, n], { dtype, device });
      try {
        const all = await t.toFloat32Array();
        const allBits = await t.toBits();
        for (const [offset, length] of [[0, 1], [1, 7], [n - 1, 1], [1000, n - 1000], [0, n], [n - 4, 4], [17, 4099]]) {
          const part = await t.toFloat32Array({ offset, length });
          const bits = await t.toBits({ offset, length });
          expect([offset, part.length, tag(part), tag(bits)]).toEqual([offset, length, '[object Float32Array]', tag(allBits)]);
          expect(Array.from(u32View(part))).toEqual(Array.from(u32View(all.subarray(offset, offset + length))));
          const wantBits = allBits.subarray(offset, offset + length);
          expect(Array.from(tag(bits) === '[object Float32Array]' ? u32View(bits as Float32Array) : bits))
            .toEqual(Array.from(tag(wantBits) === '[object Float32Array]' ? u32View(wantBits as Float32Array) : wantBits));
        }
        // The defaults: offset 0, length to the end.
        expect((await t.toFloat32Array({ offset: n - 99 })).length).toBe(99);
        expect((await t.toFloat32Array({ length: 5 })).length).toBe(5);
      } finally {
        t.dispose();
      }
    });

    test.each(HALF_DTYPES)('%s: toBits equals lib/half.ts float32ToHalfBits bit for bit, values equal roundToDtype', async (dtype) => {
      const data = bitPatternsF32(`tensor/${device}/${dtype}`, 20000);
      const want = float32ToHalfBits(data, dtype);
      const t = Tensor.fromFloat32Array(data, [1, data.length], { dtype, device });
      try {
        const bits = await t.toBits();
        expect(tag(bits)).toBe('[object Uint16Array]');
        expect(bitMismatch(bits, want, u32View(data), 4)).toBeNull();

        const back = await t.toFloat32Array();
        expect(tag(back)).toBe('[object Float32Array]');
        // Decoding is bit-exact too (NaN payloads included) ...
        const decoded = halfBitsToFloat32(want, dtype);
        expect(bitMismatch(u32View(back), u32View(decoded), u32View(data), 8)).toBeNull();
        // ... and, as values, the stored numbers are roundToDtype of the input (signed zeros kept).
        let bad = -1;
        for (let i = 0; i < data.length; i++) {
          const r = roundToDtype(data[i], dtype);
          const ok = Number.isNaN(r) ? Number.isNaN(back[i]) : Object.is(back[i], r);
          if (!ok) {
            bad = i;
            break;
          }
        }
        expect(bad < 0 ? null : `index ${bad}: input ${data[bad]} read back ${back[bad]}, roundToDtype ${roundToDtype(data[bad], dtype)}`).toBeNull();
      } finally {
        t.dispose();
      }
    });

    test.each(HALF_DTYPES)('%s: NaN stays NaN, overflow becomes ±Infinity, the tiniest values become signed zeros', async (dtype) => {
      const big = dtype === 'float16' ? 65520 : 3.4e38; // rounds up to Inf (bf16: above max + half ulp)
      const tiny = dtype === 'float16' ? 2 ** -25 : 2 ** -134; // half the smallest subnormal: a tie, to even 0
      const data = Float32Array.of(NaN, Infinity, -Infinity, big, -big, tiny, -tiny, 1, -2.5);
      const t = Tensor.fromFloat32Array(data, [data.length], { dtype, device });
      try {
        const back = plain(await t.toFloat32Array());
        expect(Number.isNaN(back[0])).toBe(true);
        expect(back.slice(1, 5)).toEqual([Infinity, -Infinity, Infinity, -Infinity]);
        expect([Object.is(back[5], 0), Object.is(back[6], -0)]).toEqual([true, true]);
        expect(back.slice(7)).toEqual([1, -2.5]);
      } finally {
        t.dispose();
      }
    });
  });

  describe('fromBits', () => {
    test.each(HALF_DTYPES)('%s: all 65536 bit patterns round trip through toBits, and decode like halfBitsToFloat32', async (dtype) => {
      const all = new Uint16Array(65536).map((_, i) => i);
      const t = Tensor.fromBits(all, [256, 256], { dtype, device });
      try {
        expect(t.dtype).toBe(dtype);
        const bits = await t.toBits();
        expect(bitMismatch(bits, all, all, 4)).toBeNull();
        const values = await t.toFloat32Array();
        const want = halfBitsToFloat32(all, dtype);
        expect(bitMismatch(u32View(values), u32View(want), all, 8)).toBeNull();
      } finally {
        t.dispose();
      }
    });

    test('float32: random bit patterns (NaN payloads included) round trip exactly', async () => {
      const data = bitPatternsF32(`tensor/${device}/fromBits-f32`, 5000);
      const t = Tensor.fromBits(data, [data.length], { dtype: 'float32', device });
      try {
        const bits = await t.toBits();
        expect(tag(bits)).toBe('[object Float32Array]');
        expect(bitMismatch(u32View(bits as Float32Array), u32View(data), u32View(data), 8)).toBeNull();
      } finally {
        t.dispose();
      }
    });

    test('the input array is copied: changing it afterwards changes nothing', async () => {
      const bits = Uint16Array.of(0x3c00, 0x4000, 0xc000, 0x0001);
      const data = Float32Array.of(1, 2, 3, 4);
      const a = Tensor.fromBits(bits, [4], { dtype: 'float16', device });
      const b = Tensor.fromFloat32Array(data, [2, 2], { device });
      bits.fill(0);
      data.fill(0);
      try {
        expect(plain(await a.toFloat32Array())).toEqual([1, 2, -2, 2 ** -24]);
        expect(plain(await b.toFloat32Array())).toEqual([1, 2, 3, 4]);
      } finally {
        a.dispose();
        b.dispose();
      }
    });
  });

  describe('int32', () => {
    test('fromInt32Array round trips through toBits and toFloat32Array; strides and offset describe a whole tensor', async () => {
      const data = Int32Array.from([0, -1, 7, 2147483647, -2147483648, 65, 12345, 3]);
      const t = Tensor.fromInt32Array(data, [2, 4], { device });
      try {
        expect(DTYPES).toContain('int32');
        expect(t.dtype).toBe('int32');
        expect(t.bytes).toBe(32);
        expect(t.strides).toEqual([4, 1]);
        expect(t.offset).toBe(0);
        expect(t.isContiguous).toBe(true);
        const bits = await t.toBits();
        expect(bits.constructor.name).toBe('Int32Array');
        expect(Array.from(bits)).toEqual(Array.from(data));
        expect(Array.from(await t.toBits({ offset: 2, length: 3 }))).toEqual([7, 2147483647, -2147483648]);
        expect(Array.from(await t.toFloat32Array({ offset: 5, length: 3 }))).toEqual([65, 12345, 3]);
      } finally {
        t.dispose();
      }
    });

    test('int32 is refused where a floating dtype is needed, with the argument named', () => {
      expect(() => Tensor.fromFloat32Array(new Float32Array(2), [2], { dtype: 'int32', device })).toThrow(
        "Expected options.dtype to be one of 'float32', 'float16', 'bfloat16' but received \"int32\" of type string",
      );
      expect(() => Tensor.fromInt32Array(new Int32Array(2), [2], { dtype: 'float32', device })).toThrow(
        "Expected options.dtype to be one of 'int32' but received \"float32\" of type string",
      );
      expect(() => Tensor.fromInt32Array(new Float32Array(2) as unknown as Int32Array, [2], { device })).toThrow(
        'Expected data to be an Int32Array but received a Float32Array',
      );
      const ids = Tensor.fromInt32Array(new Int32Array(2 * 3 * 1 * 8).fill(1), [2, 3, 1, 8], { device });
      try {
        expect(() => flashAttention(ids, ids, ids)).toThrow(
          "Expected q to have dtype 'float32', 'float16' or 'bfloat16' but received 'int32'",
        );
        // The raw binding re-checks.
        const [h] = storageOf(ids, 'ids');
        expect(() => binding().attentionForward({
          q: h, k: h, v: h, dims: [2, 3, 3, 1, 1, 8], causal: false, softmaxScale: 1, kernel: 0, float32Precision: 0,
        })).toThrow(
          'Expected q to have dtype float32, float16 or bfloat16 but received int32',
        );
      } finally {
        ids.dispose();
      }
    });
  });

  describe('fields', () => {
    test.each(FLOAT_DTYPES)('%s: shape, dtype, device, numel, bytes, toString', (dtype: DType) => {
      const shape = [2, 3, 5, 8];
      const t = Tensor.fromFloat32Array(randn(240, rngFor(`fields/${dtype}`)), shape, { dtype, device });
      try {
        expect(t.shape).toEqual([2, 3, 5, 8]);
        expect(Object.isFrozen(t.shape)).toBe(true);
        shape[0] = 7; // the tensor kept a copy
        expect(t.shape).toEqual([2, 3, 5, 8]);
        expect(t.dtype).toBe(dtype);
        expect(t.device).toBe(device);
        expect(t.numel).toBe(240);
        expect(t.bytes).toBe(240 * (dtype === 'float32' ? 4 : 2));
        expect(t.bytes).toBe(240 * dtypeSize(dtype));
        expect(t.disposed).toBe(false);
        expect(String(t)).toBe(`Tensor(${dtype} [2, 3, 5, 8] on ${device})`);
      } finally {
        t.dispose();
      }
      expect(String(t)).toBe(`Tensor(${dtype} [2, 3, 5, 8] on ${device}, disposed)`);
    });

    test('the default dtype is float32', () => {
      const t = Tensor.fromFloat32Array(Float32Array.of(1, 2), [2], { device });
      try {
        expect(t.dtype).toBe('float32');
        expect(t.bytes).toBe(8);
      } finally {
        t.dispose();
      }
    });

    test('flashAttention outputs: out like q, lse float32 [batch, headsQ, seqlenQ], on the same device', async () => {
      const rng = rngFor(`fields/attention/${device}`);
      const q = Tensor.fromFloat32Array(randn(2 * 5 * 4 * 16, rng), [2, 5, 4, 16], { dtype: 'bfloat16', device });
      const k = Tensor.fromFloat32Array(randn(2 * 7 * 2 * 16, rng), [2, 7, 2, 16], { dtype: 'bfloat16', device });
      const { out, lse } = flashAttention(q, k, k);
      try {
        expect([out.shape, out.dtype, out.device, out.numel, out.bytes]).toEqual([[2, 5, 4, 16], 'bfloat16', device, 640, 1280]);
        expect([lse.shape, lse.dtype, lse.device, lse.numel, lse.bytes]).toEqual([[2, 4, 5], 'float32', device, 40, 160]);
        expect(Object.isFrozen(out.shape) && Object.isFrozen(lse.shape)).toBe(true);
        expectAllWritten(await out.toFloat32Array(), 'out');
        expectAllWritten(await lse.toFloat32Array(), 'lse');
      } finally {
        for (const t of [q, k, out, lse]) t.dispose();
      }
    });
  });

  describe('lifetime', () => {
    test('dispose is idempotent, sets `disposed`, and a disposed tensor cannot be read', async () => {
      const t = Tensor.fromFloat32Array(Float32Array.of(1, 2, 3), [3], { device });
      t.dispose();
      expect(t.disposed).toBe(true);
      expect(() => t.dispose()).not.toThrow();
      expect(t.disposed).toBe(true);
      const msg = 'Expected tensor to be a live Tensor but received a disposed Tensor';
      expect(() => t.toFloat32Array()).toThrow(new TypeError(msg));
      expect(() => t.toBits()).toThrow(new TypeError(msg));
      // The fields stay readable.
      expect([t.shape, t.dtype, t.device, t.numel, t.bytes]).toEqual([[3], 'float32', device, 3, 12]);
    });

    test('Symbol.dispose and `using` free the tensor at the end of the scope', async () => {
      await synchronizeAll();
      const before = memory()[device].tensors;
      const t = Tensor.fromFloat32Array(Float32Array.of(1, 2), [2], { device });
      t[Symbol.dispose]();
      expect(t.disposed).toBe(true);

      let kept: Tensor | undefined;
      {
        using u = Tensor.fromFloat32Array(Float32Array.of(1, 2, 3, 4), [4], { device });
        kept = u;
        expect(u.disposed).toBe(false);
        expect(memory()[device].tensors).toBe(before + 1);
      }
      expect(kept.disposed).toBe(true);
      await synchronize(device);
      expect(memory()[device].tensors).toBe(before);
    });

    test('memory() counts live tensors and bytes per device, and returns to the start after dispose + synchronize', async () => {
      await synchronizeAll();
      const start = liveMemory();
      const other: Device = device === 'cpu' ? 'cuda' : 'cpu';
      const rng = rngFor(`memory/${device}`);
      const made = [
        Tensor.fromFloat32Array(randn(1000, rng), [10, 100], { dtype: 'float32', device }),
        Tensor.fromFloat32Array(randn(1000, rng), [1000], { dtype: 'float16', device }),
        Tensor.fromFloat32Array(randn(333, rng), [3, 111], { dtype: 'bfloat16', device }),
        Tensor.fromBits(new Uint16Array(64).fill(0x3f80), [64], { dtype: 'bfloat16', device }),
      ];
      try {
        const bytes = 4000 + 2000 + 666 + 128;
        expect(made.reduce((a, t) => a + t.bytes, 0)).toBe(bytes);
        const m = memory();
        expect(m[device].tensors).toBe(start[device].tensors + 4);
        expect(m[device].bytes).toBe(start[device].bytes + bytes);
        expect(m[device].peakBytes).toBeGreaterThanOrEqual(m[device].bytes);
        expect(liveMemory()[other]).toEqual(start[other]); // nothing on the other device
        made[0].dispose();
        made[0].dispose(); // idempotent: counted once
        await synchronize(device);
        expect(liveMemory()[device]).toEqual({ tensors: start[device].tensors + 3, bytes: start[device].bytes + bytes - 4000 });
      } finally {
        for (const t of made) t.dispose();
      }
      await synchronize(device);
      expect(liveMemory()).toEqual(start);
    });

    test('disposing q, k, v while a queued flashAttention still reads them is safe', async () => {
      const rng = rngFor(`dispose-under-work/${device}`);
      // A large op queued first keeps the device busy, so the op under test is still queued below.
      const [bs, bh, bd] = device === 'cpu' ? [1024, 4, 128] : [4096, 16, 128];
      const bq = Tensor.fromFloat32Array(randn(bs * bh * bd, rng), [1, bs, bh, bd], { device });
      const shape = { batch: 1, seqlenQ: 200, seqlenK: 150, headsQ: 2, headsKV: 2, headDim: 64 };
      const qd = randn(200 * 2 * 64, rng);
      const kd = randn(150 * 2 * 64, rng);
      const vd = randn(150 * 2 * 64, rng);
      let blocker: ReturnType<typeof flashAttention> | undefined;
      let result: ReturnType<typeof flashAttention> | undefined;
      try {
        await synchronize(device);
        const before = memory()[device].tensors;
        blocker = flashAttention(bq, bq, bq);
        const q = Tensor.fromFloat32Array(qd, [1, 200, 2, 64], { device });
        const k = Tensor.fromFloat32Array(kd, [1, 150, 2, 64], { device });
        const v = Tensor.fromFloat32Array(vd, [1, 150, 2, 64], { device });
        result = flashAttention(q, k, v, { causal: true });
        q.dispose();
        k.dispose();
        v.dispose();
        expect([q.disposed, k.disposed, v.disposed]).toEqual([true, true, true]);
        if (device === 'cpu') {
          // The queued op still holds q, k, v: their memory is returned only when it is done.
          expect(memory().cpu.tensors).toBe(before + 2 + 3 + 2);
        }
        const out = await result.out.toFloat32Array();
        const lse = await result.lse.toFloat32Array();
        expectAllWritten(out, 'out');
        expectAllWritten(lse, 'lse');
        const ref = referenceAttention(qd, kd, vd, shape, { causal: true });
        // float32 on CUDA runs the FA2 forward on TF32 tensor cores (the default float32Precision):
        // its same-precision implementation is the TF32 one.
        const same = referenceAttention(qd, kd, vd, shape, { causal: true, precision: device === 'cuda' ? 'tf32' : 'float32' });
        expectFlashRule({ actual: out, reference: ref.out, samePrecision: same.out, factor: 2, atol: 1e-5, name: 'out' });
        expectFlashRule({ actual: lse, reference: ref.lse, samePrecision: same.lse, factor: 2, atol: 1e-5, name: 'lse' });
        await synchronize(device);
        expect(memory()[device].tensors).toBe(before + 2 + 2); // q, k, v gone; blocker and result outputs left
      } finally {
        bq.dispose();
        blocker?.out.dispose();
        blocker?.lse.dispose();
        result?.out.dispose();
        result?.lse.dispose();
      }
    });

    test('a tensor dropped without dispose is reclaimed by the FinalizationRegistry backstop (child node --expose-gc)', () => {
      const repo = path.resolve(__dirname, '..');
      const script = `
        const fa = require(${JSON.stringify(path.join(repo, 'lib', 'index.ts'))});
        const device = process.env.FA_GC_DEVICE;
        const tick = () => new Promise((r) => setImmediate(r));
        (async () => {
          await fa.synchronize(device);
          const before = fa.memory();
          (() => {
            for (let i = 0; i < 100; i++) fa.Tensor.fromFloat32Array(new Float32Array(256).fill(i + 0.5), [16, 16], { device });
            // Disposed ones must not count as finalized without dispose.
            for (let i = 0; i < 10; i++) fa.Tensor.fromFloat32Array(new Float32Array(8), [8], { device }).dispose();
          })();
          const during = fa.memory();
          for (let i = 0; i < 50 && fa.memory().finalizedWithoutDispose < 100; i++) {
            global.gc();
            await tick();
            await tick();
          }
          await fa.synchronize(device);
          const after = fa.memory();
          process.stdout.write(JSON.stringify({ before, during, after }));
        })().catch((e) => { console.error(e); process.exit(1); });
      `;
      const child = runNodeChild(script, { cwd: repo, nodeArgs: ['--expose-gc'], env: { FA_GC_DEVICE: device } });
      expect({ status: child.status, stderr: child.stderr }).toEqual({ status: 0, stderr: '' });
      const r = JSON.parse(child.stdout) as Record<'before' | 'during' | 'after', ReturnType<typeof memory>>;
      expect(r.before[device].tensors).toBe(0);
      expect(r.during[device].tensors).toBe(100);
      expect(r.during[device].bytes).toBe(100 * 256 * 4);
      expect(r.after.finalizedWithoutDispose).toBe(100);
      expect(r.after[device].tensors).toBe(0);
      expect(r.after[device].bytes).toBe(0);
    });
  });

  describe('ordering', () => {
    test('reads are asynchronous, and a read issued right after an op sees its result (outputs start as NaN)', async () => {
      const rng = rngFor(`ordering/${device}`);
      const [S, H, D] = device === 'cpu' ? [768, 2, 64] : [4096, 8, 128];
      const qd = randn(S * H * D, rng);
      const q = Tensor.fromFloat32Array(qd, [1, S, H, D], { device });
      debug.poisonOutputs(true);
      const { out, lse } = flashAttention(q, q, q, { causal: true });
      try {
        const pending = out.toFloat32Array(); // issued before the op can have finished
        expect(typeof pending.then).toBe('function');
        const first = await pending;
        expectAllWritten(first, 'out read right after the op');
        expectAllWritten(await lse.toFloat32Array(), 'lse read right after the op');
        await synchronize(device);
        const later = await out.toFloat32Array();
        expect(bitMismatch(u32View(later), u32View(first), u32View(first), 8)).toBeNull();
        // Row 0 of a causal self-attention sees only key 0: out = v[0] = q[0] up to rounding (P = l = 2^ε
        // with ε the rounding error of the scaled score, so out = v·P/l within a couple of ulps). On CUDA
        // the float32 forward runs in TF32, which rounds v to TF32 first.
        const f = await q.toFloat32Array();
        const v0 = (x: number): number => (device === 'cuda' ? roundToTf32(x) : x);
        for (let i = 0; i < D; i++) expect(Math.abs(first[i] - v0(f[i]))).toBeLessThanOrEqual(4 * 2 ** -24 * Math.abs(f[i]));
      } finally {
        for (const t of [q, out, lse]) t.dispose();
      }
    });

    test('reads issued back to back all resolve with the same data', async () => {
      const data = randn(4096, rngFor(`ordering2/${device}`));
      const t = Tensor.fromFloat32Array(data, [4096], { dtype: 'bfloat16', device });
      try {
        const results = await Promise.all([0, 1, 2, 3].map(() => t.toBits()));
        for (const r of results) expect(plain(r)).toEqual(plain(float32ToHalfBits(data, 'bfloat16')));
      } finally {
        t.dispose();
      }
    });
  });
});
