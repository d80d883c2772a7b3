/**
 * Device tensors: memory owned by the addon on the CPU or a CUDA device, with a shape, a dtype and a
 * strided view into it.
 *
 * Views: a Tensor is (storage, element offset, shape, strides). `view`, `reshape` (when the strides
 * allow), `narrow`, `select` and `contiguous` (of a contiguous tensor) return new Tensors on the same
 * storage without copying; each holds its own handle on the storage, so a view and its base are
 * disposed independently and the storage lives until the last handle is released ({@link memory}
 * counts storages, not views). Writing through one view (`fill`, `copyFrom`, ops that write in
 * place, gradients written into given views) is seen by every view of that storage.
 *
 * Threading and ordering: every operation is queued, in call order, on its device's stream (a CUDA
 * stream, or the CPU backend's executor thread) and returns at once. Reads (`toFloat32Array`,
 * `toBits`, `readInto`) return Promises that resolve off the event loop once the queued work that
 * precedes them has finished. Tensors are mutable: in-place operations (`fill`, `copyFrom`, an
 * optimizer step) are queued on the same stream as everything else, so a read or an op queued after
 * an in-place update sees it, and one queued before does not (JS call order is stream order). Only
 * `to()` across devices orders work of two devices (see {@link Tensor.to}). Creating a CUDA tensor
 * copies from pageable host memory on the JS thread, which waits until the stream's queued work is
 * done before the copy starts.
 *
 * Lifetime: call `dispose()` (or use `using t = ...` / `[Symbol.dispose]`, or run the code inside
 * `tidy()` from scope.ts) when done. Disposing a tensor that queued work still reads is safe; the
 * memory is returned when that work is done (on CUDA to the stream-ordered pool, at once). A
 * FinalizationRegistry frees tensors that are garbage collected without `dispose()` as a backstop,
 * and counts them in {@link memory}.
 * @packageDocumentation
 */
import { describeValue, formatShape, rangeError, refuseUnknownKeys, typeError } from './errors';
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

/** @internal What lib/ passes to the Tensor constructor, which refuses every other caller. */
export const TENSOR_TOKEN: unique symbol = Symbol('flash-attn-node Tensor construction');

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

// %TypedArray%.prototype.length's own getter: the element count from the array's internal slot,
// which a subclass's `get length()` cannot change (and which works on arrays of any realm).
const typedArrayLength = Object.getOwnPropertyDescriptor(Object.getPrototypeOf(Int8Array.prototype), 'length')
  ?.get as (this: ArrayBufferView) => number;

/** The true element count of a typed array (what the addon will read), whatever `length` says. */
export function trueLength(a: ArrayBufferView): number {
  return typedArrayLength.call(a);
}

/**
 * Validates a shape: an array of positive safe integers. Reads each element once, into a snapshot
 * (a getter or Proxy that changes its answer cannot make the checked and the used shape differ);
 * returns the frozen snapshot and its element count.
 */
function checkShape(shape: unknown): { shape: readonly number[]; numel: number } {
  if (!Array.isArray(shape) || shape.length === 0) {
    throw typeError('shape to be a non-empty Array of positive integers', describeValue(shape));
  }
  const snapshot: unknown[] = [];
  for (let i = 0, n = shape.length; i < n; i += 1) snapshot.push(shape[i]);
  let numel = 1;
  for (const d of snapshot) {
    if (typeof d !== 'number' || !Number.isSafeInteger(d) || d < 1) {
      const shown = snapshot.every((x) => typeof x === 'number') ? formatShape(snapshot as number[]) : describeValue(d);
      throw rangeError('every dim of shape to be a positive integer (empty tensors are not supported)', shown);
    }
    numel *= d;
  }
  if (!Number.isSafeInteger(numel)) {
    throw rangeError('shape to have fewer than 2^53 elements', formatShape(snapshot as number[]));
  }
  return { shape: Object.freeze(snapshot as number[]), numel };
}

/** Elements [offset, offset + length) of a tensor's elements in row-major order, for partial reads. */
export interface ReadRange {
  /** First element, 0 ≤ offset < numel. Default 0. */
  offset?: number;
  /** Number of elements, 1 ≤ length ≤ numel − offset. Default: to the end. */
  length?: number;
}

function checkRange(range: unknown, numel: number): { offset: number; length: number } {
  if (range === null || typeof range !== 'object' || Array.isArray(range)) {
    throw typeError('range to be an object { offset, length }', describeValue(range));
  }
  refuseUnknownKeys(range, 'range', ['offset', 'length']);
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
  if (options !== undefined && (options === null || typeof options !== 'object' || Array.isArray(options))) {
    throw typeError('options to be an object or undefined', describeValue(options));
  }
  refuseUnknownKeys(options ?? {}, 'options', ['dtype', 'device']);
  const o = (options ?? {}) as TensorOptions;
  const dtype = o.dtype === undefined ? allowed[0] : checkDType(o.dtype, 'options.dtype', allowed);
  const device = o.device === undefined ? defaultDevice() : checkDevice(o.device, 'options.device');
  return { dtype, device };
}

/** Row-major strides (in elements) of a contiguous tensor of `shape`. */
export function contiguousStrides(shape: readonly number[]): number[] {
  if (!Array.isArray(shape)) throw typeError('shape to be an Array of dims', describeValue(shape));
  const dims = [...shape] as unknown[];
  if (!dims.every((d) => typeof d === 'number' && Number.isSafeInteger(d) && d >= 0)) {
    throw rangeError('every dim of shape to be an integer >= 0', formatShape(dims as number[]));
  }
  shape = dims as number[];
  const strides = new Array<number>(shape.length);
  let s = 1;
  for (let i = shape.length - 1; i >= 0; i -= 1) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

/** 1 + the largest element index a view reaches from its offset: 1 + Σ (size − 1)·stride. */
function viewExtent(shape: readonly number[], strides: readonly number[]): number {
  let e = 1;
  for (let i = 0; i < shape.length; i += 1) e += (shape[i] - 1) * strides[i];
  return e;
}

/**
 * Strides that show a tensor of `shape`/`strides` as `newShape` without moving an element, or null
 * when no such strides exist. Walks the old dims from the innermost in runs that are contiguous
 * with each other; each run must be split or merged into whole new dims.
 */
function viewStrides(shape: readonly number[], strides: readonly number[], newShape: readonly number[]): number[] | null {
  const out = new Array<number>(newShape.length).fill(0);
  let v = newShape.length - 1;
  let base = strides[shape.length - 1];
  let runNumel = 1;
  let viewNumel = 1;
  for (let d = shape.length - 1; d >= 0; d -= 1) {
    runNumel *= shape[d];
    const runEnds = d === 0 || (shape[d - 1] !== 1 && strides[d - 1] !== runNumel * base);
    if (!runEnds) continue;
    while (v >= 0 && (viewNumel < runNumel || newShape[v] === 1)) {
      out[v] = viewNumel * base;
      viewNumel *= newShape[v];
      v -= 1;
    }
    if (viewNumel !== runNumel) return null;
    if (d > 0) {
      base = strides[d - 1];
      runNumel = 1;
      viewNumel = 1;
    }
  }
  return v === -1 ? out : null;
}

/** Checks a dim argument in [-rank, rank) and returns it as a non-negative index. */
function checkDim(dim: unknown, rank: number, arg: string): number {
  if (typeof dim !== 'number' || !Number.isSafeInteger(dim) || dim < -rank || dim >= rank) {
    throw rangeError(`${arg} to be an integer in [${-rank}, ${rank - 1}]`, describeValue(dim));
  }
  return dim < 0 ? dim + rank : dim;
}

/** Checks an integer argument in [min, max]. */
function checkInt(value: unknown, min: number, max: number, arg: string): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min || value > max) {
    throw rangeError(`${arg} to be an integer in [${min}, ${max}]`, describeValue(value));
  }
  return value;
}

/** The typed array that {@link Tensor.readInto} takes for `dtype`, and its description. */
function readTargetOk(target: unknown, dtype: TensorDType): boolean {
  if (dtype === 'int32') return target instanceof Int32Array;
  if (target instanceof Float32Array) return true;
  return dtype !== 'float32' && target instanceof Uint16Array;
}

/** Values for {@link Tensor.fill} / {@link Tensor.full}: any number, an int32 integer for 'int32'. */
function checkFillValue(value: unknown, dtype: TensorDType): number {
  if (typeof value !== 'number') throw typeError('value to be a number', describeValue(value));
  if (dtype === 'int32' && !(Number.isInteger(value) && value >= -2147483648 && value <= 2147483647)) {
    throw rangeError('value to be an integer in [-2147483648, 2147483647] for dtype int32', describeValue(value));
  }
  return value;
}

let creationHook: ((t: Tensor) => void) | null = null;

/**
 * @internal Registers the function that the Tensor constructor calls with every new tensor (views
 * included), or null. scope.ts uses it to track what a `tidy()` callback creates.
 */
export function setCreationHook(hook: ((t: Tensor) => void) | null): void {
  creationHook = hook;
}

/**
 * A tensor on a device: a shape, a dtype, and a view (element offset and strides) into storage
 * that the addon owns. Create it with {@link Tensor.fromFloat32Array}, {@link Tensor.fromBits},
 * {@link Tensor.fromInt32Array}, {@link Tensor.zeros}, {@link Tensor.empty} or {@link Tensor.full};
 * operations such as `flashAttention` return new tensors; `view`, `reshape`, `narrow`, `select`
 * return views of the same storage (see the module's notes on views).
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
   * tensor is the whole buffer, contiguous. `token` is {@link TENSOR_TOKEN}: only lib/ constructs
   * tensors (a hand-made buffer would be called into by the finalizer), at no per-tensor native call.
   */
  constructor(
    buf: NativeBuffer, shape: readonly number[], dtype: TensorDType, device: Device,
    view: { offset: number; strides: readonly number[] } | undefined, token: symbol,
  ) {
    if (token !== TENSOR_TOKEN) {
      throw new TypeError('Tensor has no public constructor: create tensors with Tensor.fromFloat32Array, '
        + 'Tensor.fromInt32Array, Tensor.empty, Tensor.full or an operation');
    }
    this.shape = Object.isFrozen(shape) ? shape : Object.freeze([...shape]);
    this.dtype = dtype;
    this.device = device;
    this.numel = shape.reduce((a, b) => a * b, 1);
    this.offset = view?.offset ?? 0;
    this.strides = Object.freeze(view ? [...view.strides] : contiguousStrides(shape));
    // Internal consistency (the factories validated everything before allocating); the buffer is
    // released rather than left to the garbage collector if it ever fails.
    if (!view && buf.bytes !== this.numel * dtypeSize(dtype)) {
      buf.release();
      throw new Error(`internal: buffer of ${buf.bytes} bytes does not match ${formatShape(shape)} ${dtype}`);
    }
    if (view && this.offset + viewExtent(shape, this.strides) > buf.bytes / dtypeSize(dtype)) {
      buf.release();
      throw new Error(`internal: view ${formatShape(shape)} at offset ${this.offset} leaves its storage`);
    }
    handles.set(this, buf);
    registry.register(this, buf, this);
    // shape, dtype, device, numel, strides and offset are the tensor's identity: read-only at run
    // time too (an assignment throws in strict code), not only in the type.
    Object.freeze(this);
    if (creationHook) creationHook(this);
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
    if (trueLength(data) !== s.numel) {
      throw rangeError(`data to have ${s.numel} elements for shape ${formatShape(s.shape)}`, `${trueLength(data)}`);
    }
    const buf = binding().createFromBits(DEVICE_CODE[device], DTYPE_CODE[dtype], data);
    return new Tensor(buf, s.shape, dtype, device, undefined, TENSOR_TOKEN);
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
    if (trueLength(data) !== s.numel) {
      throw rangeError(`data to have ${s.numel} elements for shape ${formatShape(s.shape)}`, `${trueLength(data)}`);
    }
    const buf = binding().createFromFloat32(DEVICE_CODE[device], DTYPE_CODE[dtype], data);
    return new Tensor(buf, s.shape, dtype, device, undefined, TENSOR_TOKEN);
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
    if (trueLength(bits) !== s.numel) {
      throw rangeError(`bits to have ${s.numel} elements for shape ${formatShape(s.shape)}`, `${trueLength(bits)}`);
    }
    const buf = binding().createFromBits(DEVICE_CODE[device], DTYPE_CODE[dtype], bits);
    return new Tensor(buf, s.shape, dtype, device, undefined, TENSOR_TOKEN);
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
    return new Tensor(buf, s.shape, dtype, device, undefined, TENSOR_TOKEN);
  }

  /**
   * A new tensor whose elements are not initialised (their values are whatever the memory held; NaN
   * while `debug.poisonOutputs(true)` is on), to be written by `fill`, `copyFrom` or an op.
   */
  static empty(shape: readonly number[], options?: TensorOptions): Tensor {
    const s = checkShape(shape);
    const { dtype, device } = resolveOptions(options);
    const buf = binding().createEmpty(DEVICE_CODE[device], DTYPE_CODE[dtype], s.numel);
    return new Tensor(buf, s.shape, dtype, device, undefined, TENSOR_TOKEN);
  }

  /**
   * A new tensor with every element `value` (converted as {@link fill} does; validated before
   * anything is allocated).
   */
  static full(shape: readonly number[], value: number, options?: TensorOptions): Tensor {
    const s = checkShape(shape);
    const { dtype } = resolveOptions(options);
    checkFillValue(value, dtype);
    return Tensor.empty(s.shape, options).fill(value);
  }

  /** Bytes of this tensor's elements (numel × element size; a view's storage may be larger). */
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
   * rows of a tensor too large to copy whole; default offset 0, length to the end). A view reads its
   * own elements: a contiguous view straight from its storage, a strided one through a contiguous
   * copy made on its device (queued like any op, freed once read).
   */
  toFloat32Array(range?: ReadRange): Promise<Float32Array> {
    const h = handleOf(this, 'tensor');
    const r = range === undefined ? { offset: 0, length: this.numel } : checkRange(range, this.numel);
    if (!this.isContiguous) return this.#throughCopy((c) => c.toFloat32Array(range));
    return binding().readFloat32(h, this.offset + r.offset, r.length);
  }

  /**
   * Reads the raw element bits back: a Uint16Array for float16/bfloat16, a Float32Array for float32,
   * an Int32Array for int32. `range` and views as for {@link toFloat32Array}.
   */
  toBits(range?: ReadRange): Promise<Uint16Array | Float32Array | Int32Array> {
    const h = handleOf(this, 'tensor');
    const r = range === undefined ? { offset: 0, length: this.numel } : checkRange(range, this.numel);
    if (!this.isContiguous) return this.#throughCopy((c) => c.toBits(range));
    return binding().readBits(h, this.offset + r.offset, r.length);
  }

  /**
   * Reads elements into a caller's typed array, once queued work is done: a Float32Array receives
   * the values of any floating dtype (exact), a Uint16Array the raw bits of a float16/bfloat16
   * tensor, an Int32Array an int32 tensor's values. `target.length` must equal the number of
   * elements read (`range.length`, default all; `range` as for {@link toFloat32Array}). The array is
   * written only when the read succeeds: a failed read (an error of the queued work, say) rejects
   * and leaves it untouched. Views as for {@link toFloat32Array}.
   */
  readInto(target: Float32Array | Uint16Array | Int32Array, range?: ReadRange): Promise<void> {
    const h = handleOf(this, 'tensor');
    if (!readTargetOk(target, this.dtype)) {
      const want = this.dtype === 'int32' ? 'an Int32Array' : this.dtype === 'float32' ? 'a Float32Array'
        : 'a Float32Array (values) or a Uint16Array (raw bits)';
      throw typeError(`target to be ${want} for dtype ${this.dtype}`, describeValue(target));
    }
    const r = range === undefined ? { offset: 0, length: this.numel } : checkRange(range, this.numel);
    if (trueLength(target) !== r.length) {
      throw rangeError(`target to have ${r.length} elements (the elements read)`, `${trueLength(target)}`);
    }
    if (!this.isContiguous) return this.#throughCopy((c) => c.readInto(target, range));
    return binding().readInto(h, this.offset + r.offset, r.length, target);
  }

  /** Runs a read on a contiguous copy of this strided view and frees the copy (the read keeps it alive). */
  #throughCopy<T>(read: (c: Tensor) => Promise<T>): Promise<T> {
    const c = this.contiguous();
    try {
      return read(c);
    } finally {
      c.dispose();
    }
  }

  /** A new Tensor on this one's storage: the same memory, its own handle. */
  #alias(shape: readonly number[], strides: readonly number[], offset: number): Tensor {
    const h = handleOf(this, 'tensor');
    return new Tensor(h.share(), Object.freeze([...shape]), this.dtype, this.device, { offset, strides }, TENSOR_TOKEN);
  }

  /**
   * A view with shape `shape` (one dim may be -1: inferred from the element count) on the same
   * storage; never copies. Throws a RangeError when the element counts differ, or when this tensor's
   * strides cannot be shown as `shape` without moving elements (a narrowed or selected view merged
   * across its gap): call {@link reshape} (which copies then) or {@link contiguous} first.
   */
  view(shape: readonly number[]): Tensor {
    handleOf(this, 'tensor');
    const s = this.#resolveShape(shape);
    const strides = viewStrides(this.shape, this.strides, s);
    if (strides === null) {
      throw rangeError(
        `shape ${formatShape(s)} to be compatible with this view's strides ${formatShape(this.strides)} ` +
          `(shape ${formatShape(this.shape)}) without a copy; call reshape() to copy when needed, or contiguous() first`,
        formatShape(s));
    }
    return this.#alias(s, strides, this.offset);
  }

  /**
   * This tensor with shape `shape` (one dim may be -1): a view on the same storage when the strides
   * allow it (always for a contiguous tensor), else a contiguous copy.
   */
  reshape(shape: readonly number[]): Tensor {
    handleOf(this, 'tensor');
    const s = this.#resolveShape(shape);
    if (viewStrides(this.shape, this.strides, s) !== null) return this.view(s);
    const c = this.contiguous();
    try {
      return c.view(s);
    } finally {
      c.dispose();
    }
  }

  #resolveShape(shape: readonly number[]): number[] {
    if (!Array.isArray(shape) || shape.length === 0) {
      throw typeError('shape to be a non-empty Array of positive integers (one may be -1)', describeValue(shape));
    }
    let known = 1;
    let infer = -1;
    shape.forEach((d, i) => {
      if (d === -1 && infer < 0) {
        infer = i;
      } else if (typeof d !== 'number' || !Number.isSafeInteger(d) || d < 1) {
        throw rangeError('every dim of shape to be a positive integer, or one of them -1', formatShape(shape));
      } else {
        known *= d;
      }
    });
    const out = [...shape];
    if (infer >= 0) {
      if (this.numel % known !== 0) {
        throw rangeError(`shape ${formatShape(shape)} to have a -1 that divides ${this.numel} elements evenly`,
          formatShape(shape));
      }
      out[infer] = this.numel / known;
    }
    if (out.reduce((a, b) => a * b, 1) !== this.numel) {
      throw rangeError(`shape to hold ${this.numel} elements (like ${formatShape(this.shape)})`, formatShape(shape));
    }
    return out;
  }

  /**
   * A view of elements [start, start + length) along `dim` (negative dims count from the end, as in
   * PyTorch: -1 is the last); never copies.
   */
  narrow(dim: number, start: number, length: number): Tensor {
    handleOf(this, 'tensor');
    const d = checkDim(dim, this.shape.length, 'dim');
    const n = this.shape[d];
    checkInt(start, 0, n - 1, 'start');
    checkInt(length, 1, n - start, 'length');
    const shape = [...this.shape];
    shape[d] = length;
    return this.#alias(shape, this.strides, this.offset + start * this.strides[d]);
  }

  /**
   * A view of index `index` along `dim`, with that dim removed (negative dims and indices count from
   * the end, as in PyTorch); never copies. A 1-dim tensor cannot drop its only dim (tensors have at
   * least one): use `narrow(0, index, 1)`.
   */
  select(dim: number, index: number): Tensor {
    handleOf(this, 'tensor');
    const d = checkDim(dim, this.shape.length, 'dim');
    if (this.shape.length === 1) {
      throw rangeError('a tensor of at least 2 dims for select() (use narrow(0, index, 1) on a 1-dim tensor)',
        formatShape(this.shape));
    }
    const n = this.shape[d];
    const i = checkInt(index, -n, n - 1, 'index');
    const shape = this.shape.filter((_, k) => k !== d);
    const strides = this.strides.filter((_, k) => k !== d);
    return this.#alias(shape, strides, this.offset + (i < 0 ? i + n : i) * this.strides[d]);
  }

  /**
   * This tensor laid out row-major without gaps: a new handle on the same storage when it already is
   * (no copy), else a contiguous copy (queued on its device).
   */
  contiguous(): Tensor {
    handleOf(this, 'tensor');
    if (this.isContiguous) return this.#alias(this.shape, contiguousStrides(this.shape), this.offset);
    return this.clone();
  }

  /** A contiguous copy with its own storage (queued on this tensor's device). */
  clone(): Tensor {
    handleOf(this, 'tensor');
    return this.#copyInto(Tensor.empty(this.shape, { dtype: this.dtype, device: this.device }));
  }

  /** Copies this tensor into the new tensor `t` and returns it; frees `t` if the copy is refused. */
  #copyInto(t: Tensor): Tensor {
    try {
      return t.copyFrom(this);
    } catch (err) {
      t.dispose();
      throw err;
    }
  }

  /**
   * A contiguous copy converted to `dtype`, on this device: float dtypes round to nearest, ties to
   * even (NaN stays NaN, overflow becomes ±Infinity); int32 converts to the nearest float32 (exact
   * up to 2^24), then rounds like a float. A float dtype cannot be cast to 'int32' (TypeError).
   * Same dtype: a copy.
   */
  cast(dtype: TensorDType): Tensor {
    handleOf(this, 'tensor');
    const d = checkDType(dtype, 'dtype');
    if (d === 'int32' && this.dtype !== 'int32') {
      throw typeError(`dtype to be 'float32', 'float16' or 'bfloat16' for a ${this.dtype} tensor (float to int32 ` +
        'is not supported)', "'int32'");
    }
    return this.#copyInto(Tensor.empty(this.shape, { dtype: d, device: this.device }));
  }

  /**
   * This tensor on `device`, contiguous, same dtype. On its own device it is {@link contiguous} (no
   * copy when already contiguous). Across devices the data goes through host memory, after the work
   * queued so far on both devices: to 'cuda', the JS thread first waits for the CPU backend's queued
   * work (as creating a CUDA tensor from host data waits), then the upload is queued on the CUDA
   * stream; to 'cpu', a task queued on the CPU backend waits for the CUDA work queued so far and
   * copies down, so the call returns at once and later CPU work sees the data.
   */
  to(device: Device): Tensor {
    handleOf(this, 'tensor');
    const d = checkDevice(device, 'device');
    if (d === this.device) return this.contiguous();
    const c = this.contiguous();
    try {
      const buf = binding().transfer([handleOf(c, 'tensor'), c.offset], c.numel, DEVICE_CODE[d]);
      return new Tensor(buf, this.shape, this.dtype, d, undefined, TENSOR_TOKEN);
    } finally {
      c.dispose();
    }
  }

  /**
   * Copies `src` into this tensor in place (queued): same shape, any strides on either side, the
   * dtype converted as {@link cast} does (float into int32 is refused). From another device the data
   * goes through {@link to} first. `src` must not share elements with this view (unless it is this
   * very view). Returns this.
   */
  copyFrom(src: Tensor): this {
    const h = handleOf(this, 'tensor');
    const sh = handleOf(src, 'src');
    if (src.shape.length !== this.shape.length || src.shape.some((x, i) => x !== this.shape[i])) {
      throw rangeError(`src to have shape ${formatShape(this.shape)} (like the destination)`, formatShape(src.shape));
    }
    if (this.dtype === 'int32' && src.dtype !== 'int32') {
      throw typeError(`src to have dtype int32 to be copied into an int32 tensor (float to int32 is not supported)`,
        `'${src.dtype}'`);
    }
    if (src.device !== this.device) {
      const moved = src.to(this.device);
      try {
        return this.copyFrom(moved);
      } finally {
        moved.dispose();
      }
    }
    binding().copyStrided([h, this.offset], [sh, src.offset], [...this.shape], [...this.strides], [...src.strides]);
    return this;
  }

  /**
   * Sets every element of this tensor (or view) to `value` in place (queued), converted to the dtype
   * (rounded to nearest even for float16/bfloat16; NaN and ±Infinity allowed for float dtypes; an
   * integer in int32's range for int32). Returns this.
   */
  fill(value: number): this {
    const h = handleOf(this, 'tensor');
    const v = checkFillValue(value, this.dtype);
    binding().fillStrided([h, this.offset], [...this.shape], [...this.strides], v);
    return this;
  }

  /** Frees the tensor's memory (after queued work that uses it). Idempotent. */
  dispose(): void {
    if (!(this instanceof Tensor)) {
      // e.g. `const d = t.dispose; d()`: nothing to free, and the tensor's memory would stay.
      throw new TypeError('dispose() was called without its tensor: call t.dispose(), or bind it (t.dispose.bind(t))');
    }
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

  /** `Tensor(bfloat16 [2, 128, 8, 64] on cuda)`; `Tensor(not made by this library)` for an imitation. */
  toString(): string {
    if (!handles.has(this)) return 'Tensor(not made by this library)';
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
  if (!h) throw typeError(`${arg} to be a Tensor made by this library`, 'an object with Tensor\'s prototype and no storage');
  if (h.released) throw typeError(`${arg} to be a live Tensor`, 'a disposed Tensor');
  return h;
}

/** @internal Wraps a native buffer that an operation returned. */
export function wrapNative(buf: NativeBuffer, shape: readonly number[], dtype: TensorDType, device: Device): Tensor {
  return new Tensor(buf, Object.freeze([...shape]), dtype, device, undefined, TENSOR_TOKEN);
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
  /**
   * Live storages (allocations, including ones kept alive by queued work). A tensor and all its
   * views count once; memory imported from another library (interop.ts) is not counted.
   */
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
  /** The CPU backend's live tensors and bytes. */
  cpu: DeviceMemory;
  /** The CUDA device's live tensors and bytes (zeros without CUDA). */
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
