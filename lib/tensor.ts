/**
 * Device tensors: memory owned by the addon on the CPU or a CUDA device, with a shape and a dtype.
 *
 * Threading and ordering: every operation is queued, in call order, on its device's stream (a CUDA
 * stream, or the CPU backend's executor thread) and returns at once. Reads (`toFloat32Array`,
 * `toBits`) return Promises that resolve off the event loop once the queued work that precedes them
 * has finished. Tensors are immutable once created: operations always write new tensors. Creating
 * a CUDA tensor copies from pageable host memory on the JS thread, which waits until the stream's
 * queued work is done before the copy starts.
 *
 * Lifetime: call `dispose()` (or use `using t = ...` / `[Symbol.dispose]`) when done. Disposing a
 * tensor that queued work still reads is safe; the memory is returned when that work is done (on
 * CUDA to the stream-ordered pool, at once). A FinalizationRegistry frees tensors that are garbage
 * collected without `dispose()` as a backstop, and counts them in {@link memory}.
 * @packageDocumentation
 */
import { describeValue, formatShape, rangeError, typeError } from './errors';
import type { DType } from './half';
import { binding, DEVICE_CODE, DTYPE_CODE, NativeBuffer } from './native';

export type { DType } from './half';

/**
 * The element type of a tensor: a floating {@link DType}, or 'int32' for token ids and class
 * targets (which no arithmetic op takes as a floating operand).
 */
export type TensorDType = DType | 'int32';

/** Where a tensor's memory lives: host memory for the CPU backend, or CUDA device 0. */
export type Device = 'cpu' | 'cuda';

/** The dtypes a tensor can hold. */
export const DTYPES: readonly TensorDType[] = ['float32', 'float16', 'bfloat16', 'int32'];
/** The floating dtypes (every op's floating operands take one of these). */
export const FLOAT_DTYPES: readonly DType[] = ['float32', 'float16', 'bfloat16'];
/** The devices a tensor can live on. */
export const DEVICES: readonly Device[] = ['cpu', 'cuda'];

/** Options of the tensor factories. */
export interface TensorOptions {
  /** Element type of the new tensor. Default 'float32'. */
  dtype?: TensorDType;
  /** Device of the new tensor. Default {@link defaultDevice}(): 'cuda' when usable, else 'cpu'. */
  device?: Device;
}

/** Bytes of one element of `dtype`. */
export function dtypeSize(dtype: TensorDType): number {
  return dtype === 'float32' || dtype === 'int32' ? 4 : 2;
}

let cachedDefault: Device | undefined;

/**
 * 'cuda' when the addon was built with CUDA and a device is usable, else 'cpu'. Cached: it never
 * changes within a process. A context lost to a sticky error keeps 'cuda', so that work meant for
 * the GPU fails with CUDA's error instead of moving to the CPU unnoticed.
 */
export function defaultDevice(): Device {
  if (!cachedDefault) {
    const s = binding().cudaStatus();
    cachedDefault = s.available || s.contextLost ? 'cuda' : 'cpu';
  }
  return cachedDefault;
}

let finalizedCount = 0;
const registry = new FinalizationRegistry<NativeBuffer>((buf) => {
  if (!buf.released) {
    finalizedCount += 1;
    buf.release();
  }
});

const handles = new WeakMap<Tensor, NativeBuffer>();

function checkDType(dtype: unknown, arg: string, allowed: readonly TensorDType[] = DTYPES): TensorDType {
  if (typeof dtype !== 'string' || !(allowed as readonly string[]).includes(dtype)) {
    throw typeError(`${arg} to be one of ${allowed.map((d) => `'${d}'`).join(', ')}`, describeValue(dtype));
  }
  return dtype as TensorDType;
}

function checkDevice(device: unknown, arg: string): Device {
  if (typeof device !== 'string' || !(DEVICES as readonly string[]).includes(device)) {
    throw typeError(`${arg} to be 'cpu' or 'cuda'`, describeValue(device));
  }
  return device as Device;
}

/** Validates a shape: an array of positive safe integers. Returns a frozen copy and its element count. */
function checkShape(shape: unknown): { shape: readonly number[]; numel: number } {
  if (!Array.isArray(shape) || shape.length === 0) {
    throw typeError('shape to be a non-empty Array of positive integers', describeValue(shape));
  }
  let numel = 1;
  for (const d of shape) {
    if (typeof d !== 'number' || !Number.isSafeInteger(d) || d < 1) {
      const shown = shape.every((x) => typeof x === 'number') ? formatShape(shape as number[]) : describeValue(d);
      throw rangeError('every dim of shape to be a positive integer (empty tensors are not supported)', shown);
    }
    numel *= d;
  }
  if (!Number.isSafeInteger(numel)) {
    throw rangeError('shape to have fewer than 2^53 elements', formatShape(shape as number[]));
  }
  return { shape: Object.freeze([...(shape as number[])]), numel };
}

/** Elements [offset, offset + length) of a tensor's flat, row-major storage, for partial reads. */
export interface ReadRange {
  /** First element, 0 ≤ offset < numel. Default 0. */
  offset?: number;
  /** Number of elements, 1 ≤ length ≤ numel − offset. Default: to the end. */
  length?: number;
}

function checkRange(range: unknown, numel: number): { offset: number; length: number } {
  if (range === null || typeof range !== 'object') throw typeError('range to be an object { offset, length }', describeValue(range));
  const r = range as ReadRange;
  const offset = r.offset ?? 0;
  if (typeof offset !== 'number' || !Number.isSafeInteger(offset) || offset < 0 || offset >= numel) {
    throw rangeError(`range.offset to be an integer in [0, ${numel - 1}]`, describeValue(offset));
  }
  const length = r.length ?? numel - offset;
  if (typeof length !== 'number' || !Number.isSafeInteger(length) || length < 1 || length > numel - offset) {
    throw rangeError(`range.length to be an integer in [1, ${numel - offset}]`, describeValue(length));
  }
  return { offset, length };
}

function resolveOptions(
  options: unknown, allowed: readonly TensorDType[] = DTYPES,
): { dtype: TensorDType; device: Device } {
  if (options !== undefined && (options === null || typeof options !== 'object')) {
    throw typeError('options to be an object or undefined', describeValue(options));
  }
  const o = (options ?? {}) as TensorOptions;
  const dtype = o.dtype === undefined ? allowed[0] : checkDType(o.dtype, 'options.dtype', allowed);
  const device = o.device === undefined ? defaultDevice() : checkDevice(o.device, 'options.device');
  return { dtype, device };
}

/** Row-major strides (in elements) of a contiguous tensor of `shape`. */
export function contiguousStrides(shape: readonly number[]): number[] {
  const strides = new Array<number>(shape.length);
  let s = 1;
  for (let i = shape.length - 1; i >= 0; i -= 1) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

/**
 * A tensor on a device: a shape, a dtype, and a view (element offset and strides) into storage
 * that the addon owns. Create it with {@link Tensor.fromFloat32Array}, {@link Tensor.fromBits},
 * {@link Tensor.fromInt32Array} or {@link Tensor.zeros}; operations such as `flashAttention`
 * return new tensors.
 */
export class Tensor implements Disposable {
  /** Dimensions, outermost first. Frozen. */
  readonly shape: readonly number[];
  /** Element type. */
  readonly dtype: TensorDType;
  /** Device the memory lives on. */
  readonly device: Device;
  /** Number of elements (product of the shape). */
  readonly numel: number;
  /** Element strides of each dim (row-major contiguous for a new tensor). Frozen. */
  readonly strides: readonly number[];
  /** Offset of the first element in the storage, in elements. */
  readonly offset: number;

  /**
   * @internal Use the static factories; this wraps an existing native buffer. Without `view`, the
   * tensor is the whole buffer, contiguous.
   */
  constructor(
    buf: NativeBuffer, shape: readonly number[], dtype: TensorDType, device: Device,
    view?: { offset: number; strides: readonly number[] },
  ) {
    this.shape = shape;
    this.dtype = dtype;
    this.device = device;
    this.numel = shape.reduce((a, b) => a * b, 1);
    this.offset = view?.offset ?? 0;
    this.strides = Object.freeze(view ? [...view.strides] : contiguousStrides(shape));
    if (!view && buf.bytes !== this.numel * dtypeSize(dtype)) {
      throw new Error(`internal: buffer of ${buf.bytes} bytes does not match ${formatShape(shape)} ${dtype}`);
    }
    handles.set(this, buf);
    registry.register(this, buf, this);
  }

  /** Whether the elements are laid out row-major without gaps (the offset may be anything). */
  get isContiguous(): boolean {
    let s = 1;
    for (let i = this.shape.length - 1; i >= 0; i -= 1) {
      if (this.shape[i] !== 1 && this.strides[i] !== s) return false;
      s *= this.shape[i];
    }
    return true;
  }

  /**
   * A new int32 tensor (token ids, class targets) holding a copy of `data`. `data.length` must equal
   * the product of `shape`. `options.dtype` may be omitted or 'int32'.
   */
  static fromInt32Array(data: Int32Array, shape: readonly number[], options?: TensorOptions): Tensor {
    const s = checkShape(shape);
    const { dtype, device } = resolveOptions(options, ['int32']);
    if (!(data instanceof Int32Array)) throw typeError('data to be an Int32Array', describeValue(data));
    if (data.length !== s.numel) {
      throw rangeError(`data to have ${s.numel} elements for shape ${formatShape(s.shape)}`, `${data.length}`);
    }
    const buf = binding().createFromBits(DEVICE_CODE[device], DTYPE_CODE[dtype], data);
    return new Tensor(buf, s.shape, dtype, device);
  }

  /**
   * A new tensor holding `data` converted to `options.dtype` (round to nearest, ties to even, for
   * float16 and bfloat16; NaN stays NaN and overflow becomes ±Infinity). `data.length` must equal
   * the product of `shape`. The data is copied; the array may be reused at once.
   */
  static fromFloat32Array(data: Float32Array, shape: readonly number[], options?: TensorOptions): Tensor {
    const s = checkShape(shape);
    const { dtype, device } = resolveOptions(options, FLOAT_DTYPES);
    if (!(data instanceof Float32Array)) throw typeError('data to be a Float32Array', describeValue(data));
    if (data.length !== s.numel) {
      throw rangeError(`data to have ${s.numel} elements for shape ${formatShape(s.shape)}`, `${data.length}`);
    }
    const buf = binding().createFromFloat32(DEVICE_CODE[device], DTYPE_CODE[dtype], data);
    return new Tensor(buf, s.shape, dtype, device);
  }

  /**
   * A new tensor from raw element bits: a Uint16Array of IEEE binary16 or bfloat16 bit patterns for
   * those dtypes, a Float32Array for 'float32', an Int32Array for 'int32'. `options.dtype` is
   * required. Copied.
   */
  static fromBits(bits: Uint16Array | Float32Array | Int32Array, shape: readonly number[], options: TensorOptions): Tensor {
    const s = checkShape(shape);
    if (options === undefined || options === null || typeof options !== 'object' || options.dtype === undefined) {
      throw typeError("options.dtype to be given for fromBits ('float32', 'float16', 'bfloat16' or 'int32')", 'none');
    }
    const { dtype, device } = resolveOptions(options);
    const want = dtype === 'float32' ? Float32Array : dtype === 'int32' ? Int32Array : Uint16Array;
    if (!(bits instanceof want)) throw typeError(`bits to be a ${want.name} for dtype ${dtype}`, describeValue(bits));
    if (bits.length !== s.numel) {
      throw rangeError(`bits to have ${s.numel} elements for shape ${formatShape(s.shape)}`, `${bits.length}`);
    }
    const buf = binding().createFromBits(DEVICE_CODE[device], DTYPE_CODE[dtype], bits);
    return new Tensor(buf, s.shape, dtype, device);
  }

  /**
   * A new tensor of zeros, allocated on the device without host data (e.g. an accumulator, or a
   * buffer to fill later). An allocation the device cannot hold throws an Error that says how many
   * bytes were asked for and how many are free; the process carries on.
   */
  static zeros(shape: readonly number[], options?: TensorOptions): Tensor {
    const s = checkShape(shape);
    const { dtype, device } = resolveOptions(options);
    const buf = binding().createZeros(DEVICE_CODE[device], DTYPE_CODE[dtype], s.numel);
    return new Tensor(buf, s.shape, dtype, device);
  }

  /** Bytes of device memory the tensor holds. */
  get bytes(): number {
    return this.numel * dtypeSize(this.dtype);
  }

  /** Whether {@link dispose} was called. */
  get disposed(): boolean {
    const h = handles.get(this);
    return !h || h.released;
  }

  /**
   * Reads the values back as float32 (exact for every dtype), once queued work is done. With
   * `range`, only the elements [offset, offset + length) of the flat, row-major tensor (e.g. a few
   * rows of a tensor too large to copy whole; default offset 0, length to the end).
   */
  toFloat32Array(range?: ReadRange): Promise<Float32Array> {
    const h = handleOf(this, 'tensor');
    if (range === undefined) return binding().readFloat32(h);
    const { offset, length } = checkRange(range, this.numel);
    return binding().readFloat32(h, offset, length);
  }

  /**
   * Reads the raw element bits back: a Uint16Array for float16/bfloat16, a Float32Array for float32,
   * an Int32Array for int32. `range` as for {@link toFloat32Array}.
   */
  toBits(range?: ReadRange): Promise<Uint16Array | Float32Array | Int32Array> {
    const h = handleOf(this, 'tensor');
    if (range === undefined) return binding().readBits(h);
    const { offset, length } = checkRange(range, this.numel);
    return binding().readBits(h, offset, length);
  }

  /** Frees the tensor's memory (after queued work that uses it). Idempotent. */
  dispose(): void {
    const h = handles.get(this);
    if (h && !h.released) {
      registry.unregister(this);
      h.release();
    }
  }

  /** Same as {@link dispose}; lets `using t = ...` free the tensor at the end of a scope. */
  [Symbol.dispose](): void {
    this.dispose();
  }

  /** `Tensor(bfloat16 [2, 128, 8, 64] on cuda)`. */
  toString(): string {
    return `Tensor(${this.dtype} ${formatShape(this.shape)} on ${this.device}${this.disposed ? ', disposed' : ''})`;
  }
}

/**
 * @internal The native handle of a live tensor. Throws a TypeError naming `arg` for a value that is
 * not a Tensor or a disposed one.
 */
export function handleOf(t: unknown, arg: string): NativeBuffer {
  if (!(t instanceof Tensor)) throw typeError(`${arg} to be a Tensor`, describeValue(t));
  const h = handles.get(t);
  if (!h || h.released) throw typeError(`${arg} to be a live Tensor`, 'a disposed Tensor');
  return h;
}

/** @internal Wraps a native buffer that an operation returned. */
export function wrapNative(buf: NativeBuffer, shape: readonly number[], dtype: TensorDType, device: Device): Tensor {
  return new Tensor(buf, Object.freeze([...shape]), dtype, device);
}

/**
 * @internal A live tensor's storage as the addon's ops take it: `[buffer, offset]` (csrc/napi/
 * dispatch.h `tensor_arg`). Throws a TypeError naming `arg` for a non-Tensor or a disposed one.
 */
export function storageOf(t: unknown, arg: string): [NativeBuffer, number] {
  const h = handleOf(t, arg);
  return [h, (t as Tensor).offset];
}

/** Memory held by live tensors on one device. */
export interface DeviceMemory {
  /** Live allocations (tensors, including ones kept alive by queued work). */
  tensors: number;
  /** Bytes they hold. */
  bytes: number;
  /** The most bytes held at once since the start (or {@link resetPeakMemory}). */
  peakBytes: number;
  /** CUDA only: bytes the stream-ordered pool has handed out (tensors plus kernel workspaces). */
  poolUsedBytes?: number;
  /** CUDA only: the pool's high-water mark since {@link resetPeakMemory}. */
  poolPeakBytes?: number;
}

/** Snapshot of the addon's memory accounting. */
export interface MemoryReport {
  cpu: DeviceMemory;
  cuda: DeviceMemory;
  /** Tensors freed by the garbage-collection backstop instead of `dispose()` (a leak in the caller). */
  finalizedWithoutDispose: number;
}

/**
 * Live tensors and bytes per device. Counts change when memory is really returned: after
 * `dispose()`, and after queued work that still uses the tensor is done; `await synchronize()`
 * first for exact numbers.
 */
export function memory(): MemoryReport {
  const m = binding().memory();
  const conv = (c: typeof m.cpu): DeviceMemory => {
    const out: DeviceMemory = { tensors: c.buffers, bytes: c.bytes, peakBytes: c.peakBytes };
    if (c.poolUsedBytes !== undefined) out.poolUsedBytes = c.poolUsedBytes;
    if (c.poolPeakBytes !== undefined) out.poolPeakBytes = c.poolPeakBytes;
    return out;
  };
  return { cpu: conv(m.cpu), cuda: conv(m.cuda), finalizedWithoutDispose: finalizedCount };
}

/** Restarts the peak counters of `device` (and, on CUDA, the pool's high-water mark). */
export function resetPeakMemory(device: Device): void {
  binding().resetPeakMemory(DEVICE_CODE[checkDevice(device, 'device')]);
}

/**
 * Resolves when everything queued on `device` so far has finished; rejects with the error of a
 * queued operation that failed. Default: {@link defaultDevice}().
 */
export function synchronize(device?: Device): Promise<void> {
  const d = device === undefined ? defaultDevice() : checkDevice(device, 'device');
  return binding().synchronize(DEVICE_CODE[d]);
}

/**
 * Waits for the queued work on `device` (default {@link defaultDevice}()), then returns the memory
 * that CUDA's stream-ordered pool keeps cached for reuse to the driver, so that another process
 * (PyTorch beside a benchmark, say) can allocate it. Live tensors are untouched. On the CPU it only
 * waits (host memory is returned as tensors are freed). Throws at once for a bad or unavailable
 * device; rejects with the error of queued work that failed.
 */
export function emptyCache(device?: Device): Promise<void> {
  const d = device === undefined ? defaultDevice() : checkDevice(device, 'device');
  return binding().synchronize(DEVICE_CODE[d], true);
}

/** Testing aids. Not for production use. */
export const debug = {
  /**
   * When enabled, every output tensor an operation allocates is first filled with NaN (0xff bytes),
   * so a test can check that the kernel wrote every element.
   */
  poisonOutputs(enabled: boolean): void {
    if (typeof enabled !== 'boolean') throw typeError('enabled to be a boolean', describeValue(enabled));
    binding().setPoison(enabled);
  },
  /**
   * Breaks this process's CUDA context on purpose, to test the handling of sticky errors: enqueues a
   * store to an unmapped address. The next synchronisation (a read, `synchronize`, or the next call
   * that checks the stream) fails with CUDA's cudaErrorIllegalAddress, and every later CUDA call of
   * the process fails at once with a message saying that the context is lost; the CPU backend keeps
   * working. Only kind 'illegal-address' exists. Throws if CUDA is not usable.
   */
  injectCudaFault(kind: 'illegal-address'): void {
    if (kind !== 'illegal-address') throw typeError("kind to be 'illegal-address'", describeValue(kind));
    binding().injectCudaFault(kind);
  },
};
