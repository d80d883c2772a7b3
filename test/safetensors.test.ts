/**
 * lib/safetensors.ts: every dtype round-trips bit for bit, a file laid out as PyTorch's `safetensors`
 * writes it parses, and corrupt files are refused with errors that say what is wrong, allocating
 * nothing.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'fs';
import { tmpdir } from 'os';
import { join } from 'path';
import { f32ToBf16Bits, f32ToF16Bits } from '../lib/half';
import { decodeSafetensors, encodeSafetensors, load, loadWithMetadata, save } from '../lib/safetensors';
import { Tensor } from '../lib/tensor';
import { describeEachDevice, liveMemory, synchronizeAll, trackMemory } from './helpers/backend';
import { randn, rngFor } from './helpers/random';

trackMemory();

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'fa-safetensors-'));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A header and data laid out byte for byte as `safetensors.torch.save_file` writes them. */
function fileFromHeader(header: string, data: Uint8Array): Buffer {
  const padded = Math.ceil((8 + Buffer.byteLength(header)) / 8) * 8 - 8;
  const out = Buffer.alloc(8 + padded + data.length, 0x20);
  out.writeBigUInt64LE(BigInt(padded), 0);
  out.write(header, 8, 'utf8');
  Buffer.from(data).copy(out, 8 + padded);
  return out;
}

function disposeAll(ts: Record<string, Tensor>): void {
  for (const t of Object.values(ts)) t.dispose();
}

describeEachDevice('safetensors', (device) => {
  test('every dtype round-trips bit for bit through a file, with metadata', async () => {
    const rng = rngFor(`safetensors-roundtrip-${device}`);
    const f32 = randn(7 * 13, rng);
    const halfSrc = randn(97, rng);
    const f16 = Uint16Array.from(halfSrc, (x) => f32ToF16Bits(x));
    const bf16 = Uint16Array.from(halfSrc, (x) => f32ToBf16Bits(x));
    const i32 = Int32Array.from({ length: 5 }, (_, i) => (i * 7919) - 20000);
    const src: Record<string, Tensor> = {
      'h.0.attn.weight': Tensor.fromBits(f32, [7, 13], { dtype: 'float32', device }),
      half: Tensor.fromBits(f16, [97], { dtype: 'float16', device }),
      brain: Tensor.fromBits(bf16, [1, 97, 1], { dtype: 'bfloat16', device }),
      ids: Tensor.fromBits(i32, [5], { dtype: 'int32', device }),
    };
    const path = join(dir, `roundtrip-${device}.safetensors`);
    await save(path, src, { format: 'pt', step: '0' });
    const { tensors, metadata } = await loadWithMetadata(path, { device });
    try {
      expect(metadata).toEqual({ format: 'pt', step: '0' });
      expect(Object.keys(tensors)).toEqual(Object.keys(src));
      for (const [name, t] of Object.entries(src)) {
        const back = tensors[name];
        expect([back.dtype, back.shape, back.device]).toEqual([t.dtype, t.shape, device]);
        expect(await back.toBits()).toEqual(await t.toBits());
      }
    } finally {
      disposeAll(src);
      disposeAll(tensors);
    }
  });

  test('the header is JSON padded with spaces to 8 bytes and offsets are contiguous', async () => {
    const a = Tensor.fromFloat32Array(new Float32Array([1, 2, 3]), [3], { device });
    const b = Tensor.fromBits(new Uint16Array([0x3c00]), [1], { dtype: 'float16', device });
    try {
      const bytes = await encodeSafetensors({ a, b });
      const n = Number(bytes.readBigUInt64LE(0));
      expect((8 + n) % 8).toBe(0);
      const header = bytes.subarray(8, 8 + n).toString('utf8');
      expect(JSON.parse(header)).toEqual({
        a: { dtype: 'F32', shape: [3], data_offsets: [0, 12] },
        b: { dtype: 'F16', shape: [1], data_offsets: [12, 14] },
      });
      expect(header.trimEnd().length).toBeLessThan(n + 1);
      expect(/^ *$/.test(header.slice(header.lastIndexOf('}') + 1))).toBe(true);
      expect(bytes.length).toBe(8 + n + 14);
      expect(Array.from(new Float32Array(new Uint8Array(bytes.subarray(8 + n, 8 + n + 12)).buffer))).toEqual([1, 2, 3]);
    } finally {
      a.dispose();
      b.dispose();
    }
  });

  test('a file in the layout PyTorch writes parses (sorted by alignment, metadata first)', async () => {
    // save_file({'weight': [[1, -2], [0.5, 3]] f32, 'bias': [1, -1, 2] f16}, metadata={'format': 'pt'})
    const header = '{"__metadata__":{"format":"pt"},"weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},'
      + '"bias":{"dtype":"F16","shape":[3],"data_offsets":[16,22]}}';
    const data = new Uint8Array(22);
    new Float32Array(data.buffer, 0, 4).set([1, -2, 0.5, 3]);
    new DataView(data.buffer).setUint16(16, 0x3c00, true);
    new DataView(data.buffer).setUint16(18, 0xbc00, true);
    new DataView(data.buffer).setUint16(20, 0x4000, true);
    const path = join(dir, `python-${device}.safetensors`);
    writeFileSync(path, fileFromHeader(header, data));
    const { tensors, metadata } = await loadWithMetadata(path, { device });
    try {
      expect(metadata).toEqual({ format: 'pt' });
      expect(tensors.weight.shape).toEqual([2, 2]);
      expect(Array.from(await tensors.weight.toFloat32Array())).toEqual([1, -2, 0.5, 3]);
      expect(tensors.bias.dtype).toBe('float16');
      expect(Array.from(await tensors.bias.toFloat32Array())).toEqual([1, -1, 2]);
    } finally {
      disposeAll(tensors);
    }
    // Converted on load: F16 -> bfloat16, F32 -> bfloat16 (exact for these values).
    const converted = await load(path, { device, dtype: 'bfloat16' });
    try {
      expect([converted.weight.dtype, converted.bias.dtype]).toEqual(['bfloat16', 'bfloat16']);
      expect(Array.from(await converted.weight.toFloat32Array())).toEqual([1, -2, 0.5, 3]);
      expect(Array.from(await converted.bias.toFloat32Array())).toEqual([1, -1, 2]);
    } finally {
      disposeAll(converted);
    }
  });

  const good = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}';
  const corruptCases: [string, () => Uint8Array, RegExp][] = [
    ['shorter than the length prefix', () => new Uint8Array(5), /at least 8 bytes/],
    ['a header length past the end', () => {
      const b = fileFromHeader(good, new Uint8Array(12));
      b.writeBigUInt64LE(BigInt(b.length), 0);
      return b;
    }, /runs past the end of the file/],
    ['a huge header length', () => {
      const b = fileFromHeader(good, new Uint8Array(12));
      b.writeBigUInt64LE(1n << 40n, 0);
      return b;
    }, /exceeds the limit/],
    ['a header that is not JSON', () => fileFromHeader('{"a": ', new Uint8Array(0)), /not valid JSON/],
    ['a header that is an array', () => fileFromHeader('[1, 2]', new Uint8Array(0)), /must be a JSON object/],
    ['an unsupported dtype', () => fileFromHeader('{"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}', new Uint8Array(8)),
      /entry 'a' has dtype 'F64'; supported: F32, F16, BF16, I32/],
    ['a negative dim', () => fileFromHeader('{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', new Uint8Array(4)),
      /entry 'a' must have a shape of non-negative integers/],
    ['a byte count that does not match the shape', () => fileFromHeader('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', new Uint8Array(8)),
      /entry 'a' spans 8 bytes but F32 \[3\] needs 12/],
    ['offsets past the end of the data', () => fileFromHeader(good, new Uint8Array(11)),
      /entry 'b' has data_offsets \[8, 12\] past the end of the data \(11 bytes\)/],
    ['offsets that end before they begin', () => fileFromHeader('{"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}', new Uint8Array(8)),
      /end before they begin/],
    ['overlapping entries', () => fileFromHeader(
      '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', new Uint8Array(12)),
    /entries 'a' \[0, 8\] and 'b' \[4, 12\] overlap/],
    ['metadata that is not strings', () => fileFromHeader('{"__metadata__":{"step":3}}', new Uint8Array(0)),
      /'__metadata__.step' must be a string/],
    ['an unknown entry field', () => fileFromHeader('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}', new Uint8Array(4)),
      /entry 'a' has unknown field 'x'/],
  ];
  test.each(corruptCases)('refuses a file with %s, allocating nothing', async (_name, make, message) => {
    await synchronizeAll();
    const before = liveMemory();
    expect(() => decodeSafetensors(make(), { device })).toThrow(/^Invalid safetensors file: /);
    expect(() => decodeSafetensors(make(), { device })).toThrow(message);
    const path = join(dir, `corrupt-${device}.safetensors`);
    writeFileSync(path, make());
    await expect(load(path, { device })).rejects.toThrow(message);
    await synchronizeAll();
    expect(liveMemory()).toEqual(before);
  });

  test('refuses bad arguments with errors that name them', async () => {
    const t = Tensor.fromFloat32Array(new Float32Array([1]), [1], { device });
    try {
      await expect(encodeSafetensors({ __metadata__: t })).rejects.toThrow(/reserved for metadata/);
      await expect(encodeSafetensors({ a: 3 as unknown as Tensor })).rejects.toThrow("Expected tensors['a'] to be a Tensor");
      await expect(encodeSafetensors({ a: t }, { step: 1 as unknown as string })).rejects.toThrow("Expected metadata['step'] to be a string");
      expect(() => decodeSafetensors(new Uint8Array(16), { device, extra: 1 } as never)).toThrow(/only the keys 'device' and 'dtype'/);
      expect(() => decodeSafetensors(new Uint8Array(16), { device: 'gpu' } as never)).toThrow("Expected options.device to be 'cpu' or 'cuda'");
      expect(() => decodeSafetensors(new Uint8Array(16), { device, dtype: 'int32' } as never)).toThrow(/options.dtype/);
      await expect(load(join(dir, 'missing.safetensors'), { device })).rejects.toThrow(/ENOENT/);
    } finally {
      t.dispose();
    }
  });
});
