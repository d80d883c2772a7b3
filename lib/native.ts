/**
 * Loading the native addon, and the shape of what it exports. Internal: the public API is in
 * tensor.ts, attention.ts and backends.ts.
 *
 * The addon is found by node-gyp-build: a local build (build/Release, build/Debug) first, then a
 * prebuild in prebuilds/<platform>-<arch>/. Loading is lazy, so the float64 reference and the half
 * conversions work even where the addon cannot load; every native call then throws
 * {@link NativeLoadError} with what to do next.
 * @packageDocumentation
 */
import * as fs from 'fs';
import * as path from 'path';
import type { KernelPlan } from './attention';
import type { CpuSimd } from './backends';
import { describeValue } from './errors';

/** A handle on one native allocation (csrc/napi/addon.h `NativeBuffer`). */
export interface NativeBuffer {
  readonly bytes: number;
  readonly device: number | undefined;
  readonly dtype: number | undefined;
  readonly released: boolean;
  release(): void;
  share(): NativeBuffer;
}

/** A tensor argument of the native ops: `[buffer, element offset]`, or a bare buffer (offset 0). */
export type NativeTensorArg = NativeBuffer | [NativeBuffer, number];

/** An opaque running timer from `timerStart` (csrc/napi/timing_ops.cc). */
export type NativeTimer = { readonly __nativeTimer: unique symbol };

/** Memory counters of one device, as the addon reports them. */
export interface NativeCounters {
  buffers: number;
  bytes: number;
  peakBytes: number;
  poolUsedBytes?: number;
  poolPeakBytes?: number;
}

/** CUDA device description returned by `cudaStatus()`. */
export interface NativeCudaDevice {
  ordinal: number;
  name: string;
  computeCapability: string;
  multiprocessors: number;
  totalMemoryBytes: number;
  freeMemoryBytes: number;
  sharedMemoryPerBlockBytes: number;
  l2CacheBytes: number;
  driverVersion: string;
  runtimeVersion: string;
}

/** Everything the addon exports (csrc/napi/*.cc). */
export interface NativeBinding {
  NativeBuffer: unknown;
  /** Whether `value` is a NativeBuffer the addon made (checked by its type tag, not its prototype). */
  isNativeBuffer(value: unknown): boolean;
  cudaCompiled: boolean;
  /**
   * Why the addon has no CUDA, as its build recorded it; null in a CUDA build. Undefined from an addon
   * built before the build recorded it.
   */
  cpuOnlyReason: CpuOnlyReason | null | undefined;
  cpuThreads: number;
  /** The instruction-set variant the CPU attention and matmul kernels run (csrc/cpu/cpu_isa.h). */
  cpuSimd: CpuSimd;
  createFromFloat32(device: number, dtype: number, data: Float32Array): NativeBuffer;
  createFromBits(device: number, dtype: number, data: Uint16Array | Float32Array | Int32Array): NativeBuffer;
  createZeros(device: number, dtype: number, numel: number): NativeBuffer;
  createEmpty(device: number, dtype: number, numel: number): NativeBuffer;
  copyStrided(
    dst: NativeTensorArg, src: NativeTensorArg, sizes: number[], dstStrides?: number[], srcStrides?: number[],
  ): void;
  fillStrided(dst: NativeTensorArg, sizes: number[], strides: number[] | undefined, value: number): void;
  transfer(src: NativeTensorArg, count: number, device: number): NativeBuffer;
  readInto(buf: NativeBuffer, offset: number, count: number, target: Float32Array | Uint16Array | Int32Array): Promise<void>;
  exportPointer(buf: NativeBuffer): { ptr: bigint; stream: bigint };
  importPointer(device: number, dtype: number, ptr: bigint, numel: number, stream: bigint): NativeBuffer;
  injectCudaFault(kind: 'illegal-address'): void;
  readFloat32(buf: NativeBuffer, offset?: number, count?: number): Promise<Float32Array>;
  readBits(buf: NativeBuffer, offset?: number, count?: number): Promise<Uint16Array | Float32Array | Int32Array>;
  synchronize(device: number, trimCache?: boolean): Promise<void>;
  memory(): { cpu: NativeCounters; cuda: NativeCounters };
  resetPeakMemory(device: number): void;
  setPoison(enabled: boolean): void;
  cudaStatus(): { available: boolean; reason: string | null; contextLost: boolean; device?: NativeCudaDevice };
  cudaDeviceCount(): { count: number; reason: string | null };
  timerStart(device: number): NativeTimer;
  timerStop(timer: NativeTimer): Promise<number>;
  /**
   * The attention forward (csrc/napi/attention_ops.cc): one plain object of named arguments, read once
   * and checked before anything is allocated (a TypeError for an unknown key, a missing required key or
   * a value of the wrong type; a refused call changes nothing). Returns `[out, lse, kernel, plan]`:
   * new contiguous tensors, the implementation that ran and its family and configuration.
   */
  attentionForward(args: NativeAttentionForwardArgs): [NativeBuffer, NativeBuffer, 'flash' | 'naive', KernelPlan];
  /**
   * The attention backward (csrc/napi/attention_ops.cc), checked like {@link attentionForward}.
   * Returns `[dq, dk, dv, kernel, algorithm, plan]`: a gradient written into a view of `grads` comes
   * back as null, the others as new contiguous tensors; kernel, algorithm and plan are those that ran.
   */
  attentionBackward(
    args: NativeAttentionBackwardArgs,
  ): [
    NativeBuffer | null, NativeBuffer | null, NativeBuffer | null, 'flash' | 'naive', 'single-kernel' | 'two-kernel',
    KernelPlan,
  ];
  // Training ops (csrc/napi/train_ops.cc); tensors are [buffer, element offset] pairs.
  embeddingForward(ids: NativeView, table: NativeView, rows: number, vocab: number, dim: number): NativeBuffer;
  embeddingBackward(ids: NativeView, dout: NativeView, dtable: NativeView, rows: number, vocab: number, dim: number): void;
  linearForward(
    x: NativeView, weight: NativeView, bias: NativeView | null, rows: number, inFeatures: number, outFeatures: number,
    gelu: boolean, float32Precision: number,
  ): [NativeBuffer, NativeBuffer | null];
  linearBackward(
    dy: NativeView, x: NativeView, weight: NativeView, dweight: NativeView | null, dbias: NativeView | null, dx: boolean,
    rows: number, inFeatures: number, outFeatures: number, float32Precision: number,
  ): NativeBuffer | null;
  crossEntropy(
    logits: NativeView, targets: NativeView, rows: number, vocab: number, ignoreIndex: number, reduction: number,
    grad: boolean, gradScale: number,
  ): [NativeBuffer, NativeBuffer | null];
  adamwStep(
    param: NativeView, grad: NativeView, m: NativeView, v: NativeView, master: NativeView | null, numel: number,
    lr: number, beta1: number, beta2: number, eps: number, weightDecay: number, step: number, gradScale: number,
    clipNorm: NativeView | null, maxNorm: number,
  ): void;
  gradNorm(tensors: NativeView[], numels: number[]): NativeBuffer;
  sum(x: NativeView, numel: number): NativeBuffer;
  columnSum(x: NativeView, rows: number, cols: number, out: NativeView | null): NativeBuffer | undefined;
  // The nn ops (csrc/napi/nn_ops.cc).
  normForward(
    x: NativeTensorArg, weight: NativeTensorArg, bias: NativeTensorArg | null, rows: number, cols: number,
    eps: number, layerNorm: boolean,
  ): [NativeBuffer, NativeBuffer | null, NativeBuffer];
  normBackward(
    dout: NativeTensorArg, x: NativeTensorArg, weight: NativeTensorArg, mean: NativeTensorArg | null,
    rstd: NativeTensorArg, dweight: NativeTensorArg | null, dbias: NativeTensorArg | null, rows: number,
    cols: number, layerNorm: boolean,
  ): NativeBuffer;
  rope(
    x: NativeTensorArg, dims: [number, number, number, number], strides: [number, number, number], base: number,
    positionOffset: number, inverse: boolean,
  ): void;
  geluForward(x: NativeTensorArg, numel: number): NativeBuffer;
  geluBackward(dout: NativeTensorArg, x: NativeTensorArg, numel: number): NativeBuffer;
  swigluForward(x: NativeTensorArg, rows: number, cols: number): NativeBuffer;
  swigluBackward(dout: NativeTensorArg, x: NativeTensorArg, rows: number, cols: number): NativeBuffer;
  add(a: NativeTensorArg, b: NativeTensorArg, numel: number, alpha: number, inPlace: boolean): NativeBuffer | undefined;
}

/**
 * The options object of {@link NativeBinding.attentionForward}. Every key but `strides` is required;
 * any other key is refused.
 */
export interface NativeAttentionForwardArgs {
  /** [batch, seqlenQ, headsQ, headDim]; float32, float16 or bfloat16. */
  q: NativeTensorArg;
  /** [batch, seqlenK, headsKV, headDim]; q's dtype and device. */
  k: NativeTensorArg;
  /** Like k. */
  v: NativeTensorArg;
  /** [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim]: integers >= 1, headDim a multiple of 8 up to 256. */
  dims: number[];
  /** Whether query row i sees only the keys up to i + seqlenK - seqlenQ. */
  causal: boolean;
  /** The factor of q·kᵀ in the softmax: a finite number > 0 that stays finite in float32. */
  softmaxScale: number;
  /** Softcap of the scaled scores (`c · tanh(s / c)`): a finite number >= 0 (0 or undefined: none); CPU tensors only. */
  softcap?: number;
  /**
   * Sliding window `[left, right]`, integers >= -1 (-1: that side unbounded; undefined: none), bottom-right
   * aligned like the causal mask; CPU tensors only when bounded.
   */
  window?: number[];
  /** ALiBi slopes: headsQ or batch * headsQ finite float32 values (undefined: none); CPU tensors only. */
  alibiSlopes?: Float32Array | number[];
  /** Which implementation runs: a {@link KERNEL_CODE} value. */
  kernel: number;
  /** The float32 inputs' matmul precision on CUDA: a {@link FLOAT32_PRECISION_CODE} value. */
  float32Precision: number;
  /** The [batch, row, head] element strides of q, k and v (9 integers), or undefined for contiguous ones. */
  strides?: number[];
}

/**
 * The options object of {@link NativeBinding.attentionBackward}: the forward's keys plus the
 * backward's. Every key but `strides`, `grads` and `gradStrides` is required; any other key is refused.
 */
export interface NativeAttentionBackwardArgs {
  /** The gradient of the loss with respect to out: like q. */
  dout: NativeTensorArg;
  /** As in {@link NativeAttentionForwardArgs}. */
  q: NativeTensorArg;
  /** As in {@link NativeAttentionForwardArgs}. */
  k: NativeTensorArg;
  /** As in {@link NativeAttentionForwardArgs}. */
  v: NativeTensorArg;
  /** The forward's out: like q. */
  out: NativeTensorArg;
  /** The forward's lse: contiguous float32 [batch, headsQ, seqlenQ]. */
  lse: NativeTensorArg;
  /** As in {@link NativeAttentionForwardArgs}. */
  dims: number[];
  /** As in {@link NativeAttentionForwardArgs}. */
  causal: boolean;
  /** As in {@link NativeAttentionForwardArgs}. */
  softmaxScale: number;
  /** As in {@link NativeAttentionForwardArgs}. */
  softcap?: number;
  /** As in {@link NativeAttentionForwardArgs}. */
  window?: number[];
  /** As in {@link NativeAttentionForwardArgs}. */
  alibiSlopes?: Float32Array | number[];
  /** As in {@link NativeAttentionForwardArgs}. */
  kernel: number;
  /** Whether dq is summed in a fixed order (bitwise reproducible). */
  deterministic: boolean;
  /** How the CUDA FlashAttention-2 backward computes dq: a {@link BACKWARD_ALGORITHM_CODE} value. */
  algorithm: number;
  /** As in {@link NativeAttentionForwardArgs}. */
  float32Precision: number;
  /** The [batch, row, head] element strides of dout, q, k, v and out (15 integers), or undefined for contiguous ones. */
  strides?: number[];
  /**
   * [dq, dk, dv]: a tensor to write each gradient into (a view, e.g. of a packed dqkv; no element shared
   * with another target or an input), or null for a new contiguous tensor. Undefined: three new tensors.
   */
  grads?: (NativeTensorArg | null)[];
  /**
   * The [batch, row, head] strides of the grads (9 integers, each checked; a null entry's are unused), or
   * undefined for contiguous ones. Only with grads.
   */
  gradStrides?: number[];
}

/** A tensor argument of the ops: its storage and the element offset of its first element. */
export type NativeView = [NativeBuffer, number];

/** Numeric codes shared with the C++ enums, generated from csrc/enums.json (scripts/gen-enums.js). */
export {
  DTYPE_CODE, DEVICE_CODE, KERNEL_CODE, FLOAT32_PRECISION_CODE, REDUCTION_CODE, BACKWARD_ALGORITHM_CODE,
} from './enum-codes';

/** Thrown by every native call when the addon could not be loaded; the message says what to do. */
export class NativeLoadError extends Error {
  /** Always 'NativeLoadError'. */
  override readonly name = 'NativeLoadError';
  constructor(message: string, cause: unknown) {
    // The loader passes a string; anything else is described rather than coerced (a Symbol throws).
    super(typeof message === 'string' ? message : `NativeLoadError with a non-string message: ${describeValue(message)}`, { cause });
  }
}

/** The package's root directory (the one with package.json), from lib/ or dist/lib/. */
export function packageRoot(): string {
  let dir = __dirname;
  for (;;) {
    const pkg = path.join(dir, 'package.json');
    if (fs.existsSync(pkg)) {
      try {
        if (JSON.parse(fs.readFileSync(pkg, 'utf8')).name === 'flash-attn-node') return dir;
      } catch {
        // not ours; keep looking
      }
    }
    const parent = path.dirname(dir);
    if (parent === dir) return path.resolve(__dirname, '..');
    dir = parent;
  }
}

let cached: NativeBinding | undefined;
let loadFailure: NativeLoadError | undefined;
let addonPath: string | undefined;

function describeLoadFailure(root: string, err: unknown): string {
  const reason = err instanceof Error ? err.message : String(err);
  const platform = `${process.platform}-${process.arch}`;
  return [
    `flash-attn-node: the native addon could not be loaded (${reason.split('\n')[0]}).`,
    `Looked in ${path.join(root, 'build', 'Release')}, ${path.join(root, 'build', 'Debug')} and ` +
      `${path.join(root, 'prebuilds', platform)}.`,
    'What to do next:',
    '  - build it from source: `npm rebuild flash-attn-node` (needs python3, make and a C++17 compiler;',
    '    with nvcc on PATH or CUDA_HOME set, the CUDA kernels are built too);',
    '  - in a clone of the repository: `npm install`, or `npm run build:native` for the cmake-js build;',
    `  - or install a release that ships a prebuild for ${platform}.`,
    'The float64 reference (referenceAttention) works without the addon.',
  ].join('\n');
}

/**
 * Why an addon was built without CUDA, as scripts/build-config.js recorded it (FA_CPU_ONLY_REASON):
 * - 'disabled': FA_CUDA=0 requested a CPU-only build;
 * - 'nvcc-not-found': no nvcc in CUDA_HOME, CUDA_PATH, /usr/local/cuda or on PATH;
 * - 'cudart-not-found': nvcc was found, but not the static CUDA runtime (libcudart_static.a) beside it;
 * - 'unknown': the build did not record a reason.
 */
export type CpuOnlyReason = 'disabled' | 'nvcc-not-found' | 'cudart-not-found' | 'unknown';

const REBUILD = '`npm rebuild flash-attn-node`';
const CPU_ONLY: Record<CpuOnlyReason, { cause: string; remedy: string }> = {
  disabled: {
    cause: 'FA_CUDA=0 requested a CPU-only build',
    remedy: `For the GPU kernels, rebuild with FA_CUDA unset, or with FA_CUDA=1 (then a missing CUDA toolkit fails the ` +
      `build instead of giving a CPU-only addon): \`FA_CUDA=1 npm rebuild flash-attn-node\`.`,
  },
  'nvcc-not-found': {
    cause: 'nvcc was not found when the addon was built',
    remedy: `For the GPU kernels, install the CUDA toolkit, set CUDA_HOME to its root (or put its bin/ on PATH; ` +
      `CUDA_PATH and /usr/local/cuda are searched too) and run ${REBUILD}.`,
  },
  'cudart-not-found': {
    cause: 'nvcc was found when the addon was built, but not the static CUDA runtime (libcudart_static.a)',
    remedy: `For the GPU kernels, install the full CUDA toolkit (libcudart_static.a in its lib64/), set CUDA_HOME to ` +
      `its root and run ${REBUILD}.`,
  },
  unknown: {
    cause: 'the build did not record why',
    remedy: `For the GPU kernels, install the CUDA toolkit, set CUDA_HOME to its root (or put nvcc on PATH) and run ${REBUILD}.`,
  },
};

function cpuOnlyEntry(reason: unknown): { cause: string; remedy: string } {
  return typeof reason === 'string' && Object.prototype.hasOwnProperty.call(CPU_ONLY, reason)
    ? CPU_ONLY[reason as CpuOnlyReason]
    : CPU_ONLY.unknown;
}

/**
 * Why this CPU-only addon has no CUDA and how to get a CUDA build, in one paragraph (the CUDA backend's
 * `reason` in {@link backends}). `reason` is the addon's `cpuOnlyReason`; anything else reads as 'unknown'.
 */
export function cpuOnlyReasonText(reason: unknown): string {
  const { cause, remedy } = cpuOnlyEntry(reason);
  return `this build of flash-attn-node was compiled without CUDA (${cause}). ${remedy}`;
}

/**
 * The notice (a process warning, code FLASH_ATTN_NODE_CPU_ONLY) that loading a CPU-only addon emits:
 * `message` says why there is no CUDA, `detail` what to do. `reason` as in {@link cpuOnlyReasonText}.
 */
export function cpuOnlyNotice(reason: unknown): { message: string; detail: string } {
  const { cause, remedy } = cpuOnlyEntry(reason);
  return {
    message: `flash-attn-node was built without CUDA (${cause}): only the CPU backend is available`,
    detail: `${remedy} Set FLASH_ATTN_NODE_QUIET=1 to hide this notice.`,
  };
}

/** The loaded addon; throws {@link NativeLoadError} (with instructions) when it cannot load. */
export function binding(): NativeBinding {
  if (cached) return cached;
  if (loadFailure) throw loadFailure;
  const root = packageRoot();
  try {
    // eslint-disable-next-line @typescript-eslint/no-var-requires
    const load = require('node-gyp-build') as ((dir: string) => NativeBinding) & { resolve(dir: string): string };
    addonPath = load.resolve(root);
    cached = load(root);
  } catch (err) {
    loadFailure = new NativeLoadError(describeLoadFailure(root, err), err);
    throw loadFailure;
  }
  if (!cached.cudaCompiled && !process.env.FLASH_ATTN_NODE_QUIET) {
    const notice = cpuOnlyNotice(cached.cpuOnlyReason);
    process.emitWarning(notice.message, { code: 'FLASH_ATTN_NODE_CPU_ONLY', detail: notice.detail });
  }
  return cached;
}

/** Whether the addon is loaded or loadable, without throwing; and where it was found. */
export function nativeStatus(): { loaded: boolean; path: string | null; error: string | null } {
  try {
    binding();
    return { loaded: true, path: addonPath ?? null, error: null };
  } catch (err) {
    return { loaded: false, path: null, error: err instanceof Error ? err.message : String(err) };
  }
}
