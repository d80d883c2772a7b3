/**
 * Zero-copy interop with other native libraries: hand a tensor's memory to another addon as a raw
 * pointer ({@link exportTensor}), or wrap memory that another addon owns as a Tensor
 * ({@link importTensor}). Nothing is copied either way.
 *
 * Ownership:
 * - Export: the returned {@link ExportedTensor} holds its own handle on the storage; the memory stays
 *   valid until `release()` is called (and every other tensor and view of the storage is disposed).
 *   The other library must not free it.
 * - Import: the memory stays the other library's; flash-attn-node never frees it and {@link memory}
 *   does not count it. The owner must keep it valid until every tensor and view made from it is
 *   disposed and the work queued on it is done: dispose them, then `await synchronize(device)`,
 *   then free.
 *
 * Ordering (which writes a reader sees):
 * - Export: our queued work on the tensor may still be running. On CUDA, the consumer either waits
 *   (`await synchronize('cuda')`) or makes its own stream wait for `stream` (record an event on it
 *   and `cudaStreamWaitEvent`); on the CPU it waits with `await synchronize('cpu')` (`stream` is 0n).
 *   If the consumer writes the memory, it must finish (or order those writes on `stream`) before
 *   the next flash-attn-node call that uses the tensor.
 * - Import: on CUDA, pass the producer's stream as `stream`: the import makes our compute stream
 *   wait for everything queued on that stream so far, so later ops see the producer's writes. Work
 *   the producer queues after the import is not ordered: synchronise again, or import again. On the
 *   CPU the producer's writes must be complete when `importTensor` is called (`stream` must be 0n).
 *   Our later writes are visible to the producer once `await synchronize(device)` resolves.
 * @packageDocumentation
 */
import { describeValue, formatShape, rangeError, typeError } from './errors';
import { binding, DEVICE_CODE, DTYPE_CODE, NativeBuffer } from './native';
import { contiguousStrides, Device, DEVICES, DTYPES, dtypeSize, handleOf, Tensor, TENSOR_TOKEN, TensorDType } from './tensor';

/** A tensor's memory as a raw pointer, from {@link exportTensor}. */
export interface ExportedTensor {
  /** Address of the first element of the tensor (its storage's base plus offset × element size). */
  readonly ptr: bigint;
  /** Dimensions. */
  readonly shape: readonly number[];
  /** Element strides of each dim. */
  readonly strides: readonly number[];
  /** Element type ('float16' / 'bfloat16' are IEEE binary16 / bfloat16 bit patterns). */
  readonly dtype: TensorDType;
  /** Where the memory lives: host memory, or CUDA device 0. */
  readonly device: Device;
  /** The cudaStream_t that orders our work on the memory (0n on the CPU). */
  readonly stream: bigint;
  /** Drops this export's handle on the storage. Idempotent. */
  release(): void;
}

/**
 * Exports `t` (a tensor or view) without copying: its first element's address, shape, strides,
 * dtype, device and our stream, holding the storage alive until `release()`. See the module notes
 * for the ordering rules.
 */
export function exportTensor(t: Tensor): ExportedTensor {
  const h = handleOf(t, 't');
  const { ptr, stream } = binding().exportPointer(h);
  let held: NativeBuffer | null = h.share();
  return Object.freeze({
    ptr: ptr + BigInt(t.offset * dtypeSize(t.dtype)),
    shape: t.shape,
    strides: t.strides,
    dtype: t.dtype,
    device: t.device,
    stream,
    release(): void {
      held?.release();
      held = null;
    },
  });
}

/** Options of {@link importTensor}. */
export interface ImportOptions {
  /** Element type of the memory. */
  dtype: TensorDType;
  /** Where the memory lives ('cuda': device memory of CUDA device 0). */
  device: Device;
  /** Element strides (non-negative, distinct elements); default row-major contiguous. */
  strides?: readonly number[];
  /** CUDA: the producer's cudaStream_t to order after (see the module notes); default 0n (none). */
  stream?: bigint;
}

/**
 * Wraps memory that another library owns as a Tensor, without copying: `ptr` is the address of
 * element [0, ..., 0]; the tensor reads and writes that memory in place. See the module notes for
 * ownership (the owner frees it, after dispose and synchronize) and ordering.
 */
export function importTensor(ptr: bigint, shape: readonly number[], options: ImportOptions): Tensor {
  if (typeof ptr !== 'bigint') throw typeError('ptr to be a bigint', describeValue(ptr));
  if (!Array.isArray(shape) || shape.length === 0 || shape.length > 8 ||
      shape.some((d) => typeof d !== 'number' || !Number.isSafeInteger(d) || d < 1)) {
    throw rangeError('shape to be an Array of 1 to 8 positive integers', Array.isArray(shape) ? formatShape(shape) : describeValue(shape));
  }
  if (options === null || typeof options !== 'object') throw typeError('options to be an object', describeValue(options));
  for (const key of Object.keys(options)) {
    if (!['dtype', 'device', 'strides', 'stream'].includes(key)) {
      throw typeError("options to have only the keys 'dtype', 'device', 'strides' and 'stream'", `unknown key '${key}'`);
    }
  }
  const { dtype, device } = options;
  if (!(DTYPES as readonly unknown[]).includes(dtype)) {
    throw typeError(`options.dtype to be one of ${DTYPES.map((d) => `'${d}'`).join(', ')}`, describeValue(dtype));
  }
  if (!(DEVICES as readonly unknown[]).includes(device)) throw typeError("options.device to be 'cpu' or 'cuda'", describeValue(device));
  const strides = options.strides ?? contiguousStrides(shape);
  if (!Array.isArray(strides) || strides.length !== shape.length ||
      strides.some((s) => typeof s !== 'number' || !Number.isSafeInteger(s) || s < 0)) {
    throw rangeError(`options.strides to be ${shape.length} non-negative integers`,
      Array.isArray(strides) ? formatShape(strides) : describeValue(strides));
  }
  const stream = options.stream ?? 0n;
  if (typeof stream !== 'bigint') throw typeError('options.stream to be a bigint', describeValue(stream));
  const extent = 1 + shape.reduce((acc, d, i) => acc + (d - 1) * strides[i], 0);
  if (!Number.isSafeInteger(extent)) throw rangeError('the view to reach fewer than 2^53 elements', `${extent}`);
  // Distinct elements: sorted by stride, each stride beyond the span of the smaller ones.
  let span = 0;
  for (const i of shape.map((_, k) => k).filter((k) => shape[k] > 1).sort((a, b) => strides[a] - strides[b])) {
    if (strides[i] <= span) {
      throw rangeError('options.strides to address distinct elements (each stride larger than the span of the ' +
        'dims with smaller strides)', formatShape(strides));
    }
    span += (shape[i] - 1) * strides[i];
  }
  const buf = binding().importPointer(DEVICE_CODE[device], DTYPE_CODE[dtype], ptr, extent, stream);
  return new Tensor(buf, Object.freeze([...shape]), dtype, device, { offset: 0, strides: Object.freeze([...strides]) }, TENSOR_TOKEN);
}
