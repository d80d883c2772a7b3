/**
 * Checkpoints in the safetensors format (https://github.com/huggingface/safetensors), the format that
 * PyTorch's `safetensors.torch.load_file` reads and `save_file` writes.
 *
 * Layout of a file:
 * ```
 * [8 bytes]  N, the header's length in bytes (unsigned 64-bit, little-endian)
 * [N bytes]  a UTF-8 JSON object: { "__metadata__"?: { string: string },
 *            "<name>": { "dtype": "F32" | "F16" | "BF16" | "I32", "shape": [d0, d1, ...],
 *                        "data_offsets": [begin, end] }, ... }
 *            padded with spaces so that 8 + N is a multiple of 8
 * [rest]     the tensors' raw little-endian bytes, row-major; data_offsets are relative to here
 * ```
 *
 * Written here rather than taken from the npm registry: the only package of that name
 * (`safetensors` 0.0.1) is an unmaintained placeholder, and the format is small enough that a reader
 * which validates every header field (offsets inside the file, no overlaps, byte counts that match
 * dtype × shape) is shorter than an adapter would be.
 * @packageDocumentation
 */
import { promises as fs } from 'fs';
import * as os from 'os';
import { describeValue, formatShape, rangeError, typeError } from './errors';
import { bf16BitsToF32, f16BitsToF32, float32ToHalfBits } from './half';
import { Device, Tensor, TensorDType } from './tensor';

/** Bytes of the little-endian length prefix. */
const LENGTH_PREFIX_BYTES = 8;
/** The header (with its prefix) is padded with spaces to a multiple of this many bytes. */
const HEADER_ALIGN = 8;
/** Headers larger than this are refused (as the reference implementation does). */
export const MAX_HEADER_BYTES = 100 * 1024 * 1024;
/** Key of the optional string-to-string metadata in the header. */
const METADATA_KEY = '__metadata__';
const SPACE = 0x20;

/** The safetensors dtype names this module reads and writes, by tensor dtype. */
const CODE_OF: Readonly<Record<TensorDType, string>> = { float32: 'F32', float16: 'F16', bfloat16: 'BF16', int32: 'I32' };
const DTYPE_OF: Readonly<Record<string, TensorDType>> = { F32: 'float32', F16: 'float16', BF16: 'bfloat16', I32: 'int32' };
const ELEMENT_BYTES: Readonly<Record<TensorDType, number>> = { float32: 4, float16: 2, bfloat16: 2, int32: 4 };

if (os.endianness() !== 'LE') {
  throw new Error('lib/safetensors.ts assumes a little-endian host (typed arrays are written as they lie in memory)');
}

/** String-to-string metadata stored under `__metadata__` (e.g. `{ format: 'pt' }`). */
export type SafetensorsMetadata = Record<string, string>;

/** Options of {@link load} and {@link decodeSafetensors}. */
export interface LoadOptions {
  /** Device of the new tensors. Required. */
  device: Device;
  /**
   * Convert every floating tensor to this dtype (through float32, round to nearest even). Default:
   * keep the file's dtype. Integer tensors are never converted.
   */
  dtype?: 'float32' | 'float16' | 'bfloat16';
}

/** A file's contents: tensors by name, and the metadata strings (empty when the file has none). */
export interface SafetensorsContents {
  /** The file's tensors by name, on the requested device (the caller disposes them). */
  tensors: Record<string, Tensor>;
  /** The `__metadata__` strings of the file's header. */
  metadata: SafetensorsMetadata;
}

function checkName(name: string): void {
  if (name.length === 0) throw rangeError('every tensor name to be a non-empty string', "''");
  if (name === METADATA_KEY) throw rangeError(`no tensor to be named '${METADATA_KEY}' (reserved for metadata)`, `'${name}'`);
}

function checkMetadata(metadata: unknown): SafetensorsMetadata {
  if (metadata === undefined) return {};
  if (metadata === null || typeof metadata !== 'object' || Array.isArray(metadata)) {
    throw typeError('metadata to be an object of strings', describeValue(metadata));
  }
  for (const [k, v] of Object.entries(metadata)) {
    if (typeof v !== 'string') throw typeError(`metadata['${k}'] to be a string`, describeValue(v));
  }
  return metadata as SafetensorsMetadata;
}

/**
 * Encodes tensors (any device, any dtype of a Tensor) into the bytes of a safetensors file. Waits
 * for each tensor's queued work (it reads them). Tensors are written in the order of `tensors`'
 * keys; a view is written as its own elements, row-major. Nothing is modified.
 */
export async function encodeSafetensors(tensors: Record<string, Tensor>, metadata?: SafetensorsMetadata): Promise<Buffer> {
  if (tensors === null || typeof tensors !== 'object' || Array.isArray(tensors)) {
    throw typeError('tensors to be an object mapping names to Tensors', describeValue(tensors));
  }
  const meta = checkMetadata(metadata);
  const names = Object.keys(tensors);
  for (const name of names) {
    checkName(name);
    const t = tensors[name];
    if (!(t instanceof Tensor)) throw typeError(`tensors['${name}'] to be a Tensor`, describeValue(t));
    if (t.disposed) throw typeError(`tensors['${name}'] to be a live Tensor`, 'a disposed Tensor');
  }
  const header: Record<string, unknown> = {};
  if (Object.keys(meta).length > 0) header[METADATA_KEY] = meta;
  let offset = 0;
  for (const name of names) {
    const t = tensors[name];
    const bytes = t.numel * ELEMENT_BYTES[t.dtype];
    header[name] = { dtype: CODE_OF[t.dtype], shape: [...t.shape], data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  const json = Buffer.from(JSON.stringify(header), 'utf8');
  const padded = Math.ceil((LENGTH_PREFIX_BYTES + json.length) / HEADER_ALIGN) * HEADER_ALIGN - LENGTH_PREFIX_BYTES;
  const out = Buffer.alloc(LENGTH_PREFIX_BYTES + padded + offset);
  out.writeBigUInt64LE(BigInt(padded), 0);
  json.copy(out, LENGTH_PREFIX_BYTES);
  out.fill(SPACE, LENGTH_PREFIX_BYTES + json.length, LENGTH_PREFIX_BYTES + padded);
  let at = LENGTH_PREFIX_BYTES + padded;
  const reads = await Promise.all(names.map((n) => tensors[n].toBits()));
  for (const bits of reads) {
    const src = Buffer.from(bits.buffer, bits.byteOffset, bits.byteLength);
    src.copy(out, at);
    at += src.length;
  }
  return out;
}

/**
 * Writes `tensors` (and optional string `metadata`) to `path` as a safetensors file, replacing any
 * file there. Resolves once the file is written. See {@link encodeSafetensors}.
 */
export async function save(path: string, tensors: Record<string, Tensor>, metadata?: SafetensorsMetadata): Promise<void> {
  if (typeof path !== 'string' || path.length === 0) throw typeError('path to be a non-empty string', describeValue(path));
  const bytes = await encodeSafetensors(tensors, metadata);
  await fs.writeFile(path, bytes);
}

/** One validated header entry. */
interface Entry {
  name: string;
  dtype: TensorDType;
  shape: number[];
  begin: number;
  end: number;
}

function corrupt(what: string): Error {
  return new Error(`Invalid safetensors file: ${what}`);
}

/** Parses and validates the header of a safetensors byte buffer. Throws a descriptive Error. */
function parseHeader(buf: Uint8Array): { entries: Entry[]; metadata: SafetensorsMetadata; dataStart: number } {
  if (buf.length < LENGTH_PREFIX_BYTES) {
    throw corrupt(`expected at least ${LENGTH_PREFIX_BYTES} bytes (the header length) but the file has ${buf.length}`);
  }
  const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
  const n = view.getBigUint64(0, true);
  if (n > BigInt(MAX_HEADER_BYTES)) throw corrupt(`header length ${n} exceeds the limit of ${MAX_HEADER_BYTES} bytes`);
  const headerBytes = Number(n);
  if (LENGTH_PREFIX_BYTES + headerBytes > buf.length) {
    throw corrupt(`header length ${headerBytes} runs past the end of the file (${buf.length} bytes)`);
  }
  const text = Buffer.from(buf.buffer, buf.byteOffset + LENGTH_PREFIX_BYTES, headerBytes).toString('utf8');
  let header: unknown;
  try {
    header = JSON.parse(text);
  } catch (e) {
    throw corrupt(`header is not valid JSON (${(e as Error).message})`);
  }
  if (header === null || typeof header !== 'object' || Array.isArray(header)) {
    throw corrupt(`header must be a JSON object but is ${describeValue(header)}`);
  }
  const dataStart = LENGTH_PREFIX_BYTES + headerBytes;
  const dataBytes = buf.length - dataStart;
  let metadata: SafetensorsMetadata = {};
  const entries: Entry[] = [];
  for (const [name, raw] of Object.entries(header as Record<string, unknown>)) {
    if (name === METADATA_KEY) {
      if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw corrupt(`'${METADATA_KEY}' must be an object of strings`);
      for (const [k, v] of Object.entries(raw)) {
        if (typeof v !== 'string') throw corrupt(`'${METADATA_KEY}.${k}' must be a string but is ${describeValue(v)}`);
      }
      metadata = raw as SafetensorsMetadata;
      continue;
    }
    if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw corrupt(`entry '${name}' must be an object`);
    const e = raw as Record<string, unknown>;
    for (const key of Object.keys(e)) {
      if (key !== 'dtype' && key !== 'shape' && key !== 'data_offsets') throw corrupt(`entry '${name}' has unknown field '${key}'`);
    }
    const code = e.dtype;
    if (typeof code !== 'string' || !(code in DTYPE_OF)) {
      throw corrupt(`entry '${name}' has dtype ${typeof code === 'string' ? `'${code}'` : describeValue(code)}; supported: ${Object.keys(DTYPE_OF).join(', ')}`);
    }
    const dtype = DTYPE_OF[code];
    const shape = e.shape;
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      throw corrupt(`entry '${name}' must have a shape of non-negative integers but has ${describeValue(shape)}`);
    }
    const numel = (shape as number[]).reduce((a, b) => a * b, 1);
    if (numel === 0) throw corrupt(`entry '${name}' has shape ${formatShape(shape)} with no elements (empty tensors are not supported)`);
    const offs = e.data_offsets;
    if (!Array.isArray(offs) || offs.length !== 2 || !offs.every((x) => Number.isSafeInteger(x) && x >= 0)) {
      throw corrupt(`entry '${name}' must have data_offsets [begin, end] of non-negative integers but has ${describeValue(offs)}`);
    }
    const [begin, end] = offs as number[];
    if (end < begin) throw corrupt(`entry '${name}' has data_offsets [${begin}, ${end}] that end before they begin`);
    if (end > dataBytes) throw corrupt(`entry '${name}' has data_offsets [${begin}, ${end}] past the end of the data (${dataBytes} bytes)`);
    const want = numel * ELEMENT_BYTES[dtype];
    if (end - begin !== want) {
      throw corrupt(`entry '${name}' spans ${end - begin} bytes but ${code} ${formatShape(shape)} needs ${want}`);
    }
    // A 0-dim tensor (shape []) is loaded as shape [1]: this package's tensors have at least one dim.
    entries.push({ name, dtype, shape: shape.length === 0 ? [1] : (shape as number[]), begin, end });
  }
  const sorted = [...entries].sort((a, b) => a.begin - b.begin);
  for (let i = 1; i < sorted.length; i += 1) {
    if (sorted[i].begin < sorted[i - 1].end) {
      throw corrupt(`entries '${sorted[i - 1].name}' [${sorted[i - 1].begin}, ${sorted[i - 1].end}] and '${sorted[i].name}' [${sorted[i].begin}, ${sorted[i].end}] overlap`);
    }
  }
  return { entries, metadata, dataStart };
}

/** Float32 values of raw little-endian element bytes of a floating dtype. */
function toFloat32(bytes: Uint8Array, dtype: 'float32' | 'float16' | 'bfloat16'): Float32Array {
  const copy = new Uint8Array(bytes); // aligned copy
  if (dtype === 'float32') return new Float32Array(copy.buffer);
  const bits = new Uint16Array(copy.buffer);
  const out = new Float32Array(bits.length);
  const conv = dtype === 'float16' ? f16BitsToF32 : bf16BitsToF32;
  for (let i = 0; i < bits.length; i += 1) out[i] = conv(bits[i]);
  return out;
}

/**
 * Decodes the bytes of a safetensors file into new tensors on `options.device`. Validates the whole
 * header before creating any tensor, so a corrupt file allocates nothing; the Error starts with
 * "Invalid safetensors file:" and says which entry and field is wrong.
 */
export function decodeSafetensors(buf: Uint8Array, options: LoadOptions): SafetensorsContents {
  if (!(buf instanceof Uint8Array)) throw typeError('buf to be a Uint8Array or Buffer', describeValue(buf));
  const { device, dtype } = checkLoadOptions(options);
  const { entries, metadata, dataStart } = parseHeader(buf);
  const tensors: Record<string, Tensor> = {};
  try {
    for (const e of entries) {
      const bytes = buf.subarray(dataStart + e.begin, dataStart + e.end);
      let t: Tensor;
      if (e.dtype === 'int32') {
        t = Tensor.fromBits(new Int32Array(new Uint8Array(bytes).buffer), e.shape, { dtype: 'int32', device });
      } else if (dtype === undefined || dtype === e.dtype) {
        const copy = new Uint8Array(bytes);
        const bits = e.dtype === 'float32' ? new Float32Array(copy.buffer) : new Uint16Array(copy.buffer);
        t = Tensor.fromBits(bits, e.shape, { dtype: e.dtype, device });
      } else {
        const values = toFloat32(bytes, e.dtype);
        t = dtype === 'float32'
          ? Tensor.fromFloat32Array(values, e.shape, { dtype, device })
          : Tensor.fromBits(float32ToHalfBits(values, dtype), e.shape, { dtype, device });
      }
      tensors[e.name] = t;
    }
  } catch (err) {
    for (const t of Object.values(tensors)) t.dispose();
    throw err;
  }
  return { tensors, metadata };
}

function checkLoadOptions(options: unknown): LoadOptions {
  if (options === null || typeof options !== 'object') throw typeError('options to be an object { device, dtype? }', describeValue(options));
  const o = options as Record<string, unknown>;
  for (const key of Object.keys(o)) {
    if (key !== 'device' && key !== 'dtype') throw typeError("options to have only the keys 'device' and 'dtype'", `'${key}'`);
  }
  if (o.device !== 'cpu' && o.device !== 'cuda') throw typeError("options.device to be 'cpu' or 'cuda'", describeValue(o.device));
  if (o.dtype !== undefined && o.dtype !== 'float32' && o.dtype !== 'float16' && o.dtype !== 'bfloat16') {
    throw typeError("options.dtype to be 'float32', 'float16' or 'bfloat16'", describeValue(o.dtype));
  }
  return o as unknown as LoadOptions;
}

/**
 * Reads a safetensors file into new tensors on `options.device` (converted to `options.dtype` when
 * given). The caller owns (disposes) the returned tensors. Refuses a corrupt file with an Error that
 * starts with "Invalid safetensors file:" and allocates nothing then.
 */
export async function load(path: string, options: LoadOptions): Promise<Record<string, Tensor>> {
  return (await loadWithMetadata(path, options)).tensors;
}

/** As {@link load}, and also returns the file's `__metadata__` strings. */
export async function loadWithMetadata(path: string, options: LoadOptions): Promise<SafetensorsContents> {
  if (typeof path !== 'string' || path.length === 0) throw typeError('path to be a non-empty string', describeValue(path));
  checkLoadOptions(options);
  const buf = await fs.readFile(path);
  return decodeSafetensors(buf, options);
}
