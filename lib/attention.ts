/**
 * FlashAttention-2 forward and backward on device tensors.
 *
 * Layout, like FlashAttention-2: q is [batch, seqlenQ, headsQ, headDim]; k and v are
 * [batch, seqlenK, headsKV, headDim]; out is like q; lse is float32 [batch, headsQ, seqlenQ] in
 * natural log. q, k, v, out and dout may be views with any batch, row and head strides as long as
 * headDim has stride 1 (for example `qkv.select(2, 0)` of a packed [batch, seqlen, 3, heads, headDim]
 * projection reads the query heads in place); lse must be contiguous. The backward can write dq, dk
 * and dv into given views (see {@link GradientTargets}). seqlenQ and seqlenK may differ; headsQ must be a multiple of headsKV
 * (grouped-query / multi-query attention, with no copies of k and v); headDim is a multiple of 8 up
 * to 256. Compute is float32 for every dtype (fp32 accumulation); float32 inputs of the CUDA
 * FlashAttention-2 forward and backward run on TF32 tensor cores unless `float32Precision: 'highest'` (see
 * {@link AttentionOptions.float32Precision}).
 *
 * Causal masking is aligned to the bottom-right corner, as in FlashAttention-2: query row i sees
 * key j iff j <= i + seqlenK - seqlenQ. When seqlenQ > seqlenK the first seqlenQ - seqlenK rows see
 * no key: their output is 0, their lse is +Infinity, and their gradients are 0 (never NaN).
 *
 * Every call validates its arguments on the JS thread and throws a TypeError or RangeError that
 * names the argument; the work itself is queued (see tensor.ts) and the call returns at once.
 * @packageDocumentation
 */
import { describeValue, formatShape, rangeError, refuseUnknownKeys, typeError } from './errors';
import { BACKWARD_ALGORITHM_CODE, binding, FLOAT32_PRECISION_CODE, KERNEL_CODE, NativeBuffer } from './native';
import { Device, DType, handleOf, Tensor, wrapNative } from './tensor';

/**
 * A tensor argument as the native attention ops take it: its storage handle, element offset and
 * [batch, row, head] strides (headDim has stride 1).
 */
interface NativeView {
  buf: NativeBuffer;
  offset: number;
  strides: [number, number, number];
}

function nativeView(t: Tensor, name: string): NativeView {
  return { buf: handleOf(t, name), offset: t.offset, strides: [t.strides[0], t.strides[1], t.strides[2]] };
}

/** The `[buffer, offset]` pairs and the flat stride list of the native call. */
function nativeArgs(views: readonly NativeView[]): { args: [NativeBuffer, number][]; strides: number[] } {
  return { args: views.map((v) => [v.buf, v.offset]), strides: views.flatMap((v) => v.strides) };
}

/** Which implementation runs. */
export type AttentionKernel = 'auto' | 'flash' | 'naive';

/**
 * The kernel family that ran a call: on CUDA, FlashAttention-2 on Hopper's wgmma and TMA
 * (`'sm90-wgmma'`, fp16 / bf16 on sm_90a builds), on mma.sync (`'sm80-mma'`, fp16 / bf16, sm_80+) or
 * on TF32 mma.sync (`'fp32-mma'`, float32), or the naive kernel (`'naive'`); `'cpu'` for the C++
 * backend.
 */
export type KernelFamily = 'sm90-wgmma' | 'sm80-mma' | 'fp32-mma' | 'naive' | 'cpu';

/**
 * What ran a call, as the native planner chose it: the kernel family and, for FlashAttention-2 on
 * CUDA, the configuration of its main kernel (the forward kernel; the backward's dK/dV kernel) for the
 * call's head dim. The tile fields are null for `'naive'` and `'cpu'`.
 *
 * @example
 * const { plan } = flashAttention(q, k, v); // d128 bf16, 1024 keys, on an H100:
 * // { family: 'sm90-wgmma', headDim: 128, blockM: 128, blockN: 128, warps: 12, stages: 2 }
 * // (the same causal; at head dim 64 below 2048 keys: { ..., headDim: 64, blockM: 128, blockN: 64, warps: 8, stages: 3 })
 */
export interface KernelPlan {
  /** The kernel family. */
  family: KernelFamily;
  /** The compiled head dim that ran: the call's head dim rounded up to the next one the family has. */
  headDim: number | null;
  /** Query rows per thread block (backward: per step of a thread block's loop over queries). */
  blockM: number | null;
  /** Keys per K/V tile (backward: per thread block). */
  blockN: number | null;
  /**
   * Warps per thread block. On `'sm90-wgmma'`, 12 and 16 are the warp-specialized forward: a
   * producer warpgroup issuing the TMA loads and two (three at head dims 33–64: 192 query rows)
   * consumer warpgroups of 64 query rows, one persistent block per SM: non-causal at head dims
   * 33–256 (128-key tiles up to 128, 112 up to 192, 80 above), and causal from a length per head
   * dim (queries and keys: 2048 at 33–64, any at 65–128, 1024 above; 128-key tiles up to 128, 96 up
   * to 192, 80 above). In the backward, 12 is the warp-specialized single kernel (head dims 33–128).
   */
  warps: number | null;
  /** K/V tiles (backward: Q / dO tiles) held in shared memory at once. */
  stages: number | null;
}

/** How float32 inputs use the tensor cores of the CUDA FlashAttention-2 forward. */
export type Float32Precision = 'tf32' | 'highest';

/** Options shared by the forward and the backward. */
export interface AttentionOptions {
  /** Causal mask, aligned to the bottom-right corner. Default false. */
  causal?: boolean;
  /**
   * Multiplies q·kᵀ before the softmax. A finite number > 0 (and < 2.3e38, so that
   * softmaxScale·log2(e) is a finite float32). Default 1/√headDim. Scaled scores must fit in
   * float32 (|score| < 3.4e38), as in any float32 softmax.
   */
  softmaxScale?: number;
  /**
   * Softcapping (Gemma 2): with `softcap: c > 0` every scaled score `s = softmaxScale · q·k` becomes
   * `c · tanh(s / c)` before the mask and the softmax, and the backward's gradients follow the tanh
   * exactly (as `referenceAttention` defines it). A finite number ≥ 0 that float32 holds; 0 or
   * undefined (default): no softcap. The CPU backend takes it; CUDA tensors with a softcap > 0 are
   * refused with a RangeError (the CUDA kernels do not take it yet).
   */
  softcap?: number;
  /**
   * Sliding window (Mistral, Gemma): `[left, right]`, integers ≥ −1. Query row `i` sees key `j` iff
   * `i + seqlenK − seqlenQ − left <= j <= i + seqlenK − seqlenQ + right` (bottom-right aligned, as the
   * causal mask); −1 leaves that side unbounded, and with `causal: true` the right side is 0. A row
   * whose window holds no key gets `out = 0` and `lse = +Infinity`. Undefined (default) or
   * `[-1, -1]`: no window. The CPU backend skips the key tiles outside every row's window, so the
   * cost falls with the window; CUDA tensors with a bounded window are refused with a RangeError (the
   * CUDA kernels do not take it yet).
   */
  window?: readonly [number, number];
  /**
   * ALiBi: `−slope · |i + seqlenK − seqlenQ − j|` joins score (i, j) after the softcap, as
   * FlashAttention-2 defines it. One slope per query head (`headsQ` values, for every batch) or per
   * batch and head (`batch · headsQ`, batch-major); finite numbers that float32 holds, copied at the
   * call. Undefined (default): none. The CPU backend takes them; CUDA tensors with slopes are
   * refused with a RangeError (the CUDA kernels do not take ALiBi yet).
   */
  alibiSlopes?: Float32Array | readonly number[];
  /**
   * 'flash' is FlashAttention-2: the CPU backend, and on CUDA (sm_80 or newer) the tensor-core
   * kernels: the forward and the backward for float16, bfloat16 and float32 (see `algorithm` and
   * `deterministic` for the backward's variants). 'naive' is the CUDA fp32 reference that
   * materialises the [seqlenQ, seqlenK] scores (memory grows as N²). 'auto' (default): 'flash'
   * wherever it exists for the call, else 'naive'. 'flash' where it does not exist throws a
   * RangeError that says why. The result's `kernel` says which ran.
   */
  kernel?: AttentionKernel;
  /**
   * How the CUDA FlashAttention-2 forward and backward compute float32 inputs (ignored for
   * float16/bfloat16, by the CPU backend and by the naive CUDA kernel, which always compute in full
   * fp32).
   *
   * - `'tf32'` (default): TF32 tensor cores, as PyTorch with TF32 allowed. q, k, v and the softmax
   *   probabilities are rounded to TF32 (10-bit mantissa, the precision of float16 with float32's
   *   range) before the two matrix products; accumulation and the softmax stay float32. Expected error,
   *   like a float16 computation: on unit-normal inputs (headDim 64-128, seqlen 256-1024), max |out −
   *   exact| ≈ 4-6e-4 · max|out| and max |lse − exact| ≈ 2-4e-4 (from the TF32 emulation of
   *   `referenceAttention(..., { precision: 'tf32' })`); float32 FMA is ~1e3 times closer.
   * - `'highest'`: full float32 accuracy through 3xTF32: each operand is split into two TF32 values
   *   (x = big + small) and each product is big·big + big·small + small·big (≤ ~3·2^-22 relative
   *   each, float32 accumulation), about 1.5× the error of a plain float32 implementation (same
   *   emulation: out ≈ 1-2e-6 · max|out|, lse ≈ 1e-6), for about 3× the tensor-core work.
   *
   * The backward rounds the operands of its five products (q, k, v, dout, P and dS) the same way;
   * softmax, D = rowsum(dout∘out), dS and every accumulation stay float32.
   */
  float32Precision?: Float32Precision;
}

/**
 * How the CUDA FlashAttention-2 backward computes dq (see {@link AttentionBackwardOptions.algorithm}).
 */
export type BackwardAlgorithm = 'auto' | 'single-kernel' | 'two-kernel';

/** Options of the backward. */
export interface AttentionBackwardOptions extends AttentionOptions {
  /**
   * The CUDA FlashAttention-2 backward's structure:
   *
   * - `'single-kernel'`: FA2's Algorithm 2, one kernel per K/V tile computing dK, dV and dQ, with dQ
   *   accumulated through float32 atomic adds (or, with `deterministic`, ordered adds) and converted
   *   by a small kernel after it.
   * - `'two-kernel'`: a dK/dV kernel, then a dQ kernel (one thread block per query tile, looping over
   *   the keys) that writes dq directly: no atomics and no float32 accumulator, deterministic by
   *   construction, for two more matrix products per tile (S and dP are recomputed). Hopper GPUs,
   *   float16 and bfloat16, every head dim (run by the kernels of head dim 32, 64, 128, 192 or 256,
   *   zero-padded); elsewhere a RangeError says why.
   * - `'auto'` (default): `'two-kernel'` where it exists (float16 and bfloat16 on Hopper), else
   *   `'single-kernel'`; on Hopper `'single-kernel'` also where it is faster, where the single kernel
   *   is a warp-specialized one: head dims 33–128 from 512 queries and keys, causal or not,
   *   deterministic or not. On an H100 (bf16, 16k tokens per batch, 2026-11-27) the warp-specialized
   *   kernel took 0.86 / 0.82 / 0.79 / 0.78× the two kernels' time at head dim 128, seqlen 512 / 1k /
   *   2k / 4k (0.94 / 0.89 / 0.84 / 0.85× causal); on an H200 (2026-11-28) 0.92 / 0.81 / 0.79 / 0.74× at
   *   head dim 64 (0.90 / 0.84 / 0.77 / 0.79× causal). The two need no float32 dq accumulator and are
   *   deterministic.
   *
   * The result's `algorithm` says which ran. The naive kernel and the CPU backend have one structure
   * each: they accept `'auto'` and `'single-kernel'`.
   */
  algorithm?: BackwardAlgorithm;
  /**
   * Bit-identical dq across runs (dk and dv always are). Default false: the single-kernel CUDA
   * FlashAttention-2 backward adds each query tile's dq contributions with fp32 atomics, so dq's
   * summation order (and its last bits) can change from run to run. With `true` the Hopper
   * warp-specialized kernel adds the K/V tiles' dq terms to each query tile in a fixed order (turn
   * counters; 1.06× its atomic time over the bf16 FA2 grid on an H200, 1.00–1.15× per cell,
   * 2026-11-28), and the other single kernels give
   * each thread block its own fp32 accumulator slice, summed in order (up to 8 slices, or with few heads up to 64 within 256 MiB: that many times the
   * accumulator's memory, 4·batch·headsQ·seqlenQ·headDim bytes each). The two-kernel backward (see
   * `algorithm`, 'auto' on Hopper) is deterministic either way, at no extra cost.
   */
  deterministic?: boolean;
}

/** Output of {@link flashAttention}. */
export interface AttentionOutput {
  /** [batch, seqlenQ, headsQ, headDim], dtype of q. */
  out: Tensor;
  /** float32 [batch, headsQ, seqlenQ]: natural-log log-sum-exp of each row's scaled scores (+Infinity for a row that sees no key). */
  lse: Tensor;
  /** The implementation that ran ('auto' resolved): 'flash' (FlashAttention-2) or 'naive'. */
  kernel: Exclude<AttentionKernel, 'auto'>;
  /** The kernel family and configuration that ran. */
  plan: KernelPlan;
}

/** Output of {@link flashAttentionBackward}: gradients with the shapes and dtypes of q, k and v. */
export interface AttentionGradients {
  /** Gradient of q, `[batch, seqlenQ, headsQ, headDim]` (the given `dq` view itself when one was passed). */
  dq: Tensor;
  /** Gradient of k, `[batch, seqlenK, headsKV, headDim]` (summed over the query heads of a group). */
  dk: Tensor;
  /** Gradient of v, `[batch, seqlenK, headsKV, headDim]` (summed over the query heads of a group). */
  dv: Tensor;
  /** The implementation that ran ('auto' resolved): 'flash' (FlashAttention-2) or 'naive'. */
  kernel: Exclude<AttentionKernel, 'auto'>;
  /**
   * The backward's structure that ran ({@link AttentionBackwardOptions.algorithm}, 'auto' resolved):
   * 'two-kernel' or 'single-kernel'. The CPU backend and the naive kernel have one structure each and
   * report 'single-kernel'.
   */
  algorithm: Exclude<BackwardAlgorithm, 'auto'>;
  /** The kernel family and configuration that ran (the main kernel's: dK/dV of the two-kernel algorithm). */
  plan: KernelPlan;
}

interface Problem {
  dims: number[]; // [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim]
  device: Device;
  dtype: DType;
  causal: boolean;
  scale: number;
  softcap: number; // 0: none
  window: [number, number]; // [-1, -1]: none
  alibi: Float32Array | null; // headsQ or batch * headsQ slopes
  kernel: AttentionKernel;
  float32Precision: Float32Precision;
}

const QKV_DIMS = '[batch, seqlen, heads, headDim]';

function checkRank4(t: Tensor, name: string): void {
  if (t.shape.length !== 4) {
    throw rangeError(`${name} to have 4 dims ${QKV_DIMS}`, formatShape(t.shape));
  }
  if (t.strides[3] !== 1 && t.shape[3] !== 1) {
    throw rangeError(`${name} to have stride 1 in its last dim (headDim); call contiguous() first`,
      `strides ${formatShape(t.strides)}`);
  }
}

function checkLike(t: Tensor, name: string, ref: Tensor, refName: string): void {
  if (t.dtype !== ref.dtype) throw typeError(`${name} to have dtype ${ref.dtype} (like ${refName})`, t.dtype);
  if (t.device !== ref.device) throw typeError(`${name} to be on device ${ref.device} (like ${refName})`, t.device);
}

interface CheckedOptions {
  causal: boolean;
  scale?: number;
  softcap: number;
  window: [number, number];
  alibi: Float32Array | null;
  kernel: AttentionKernel;
  float32Precision: Float32Precision;
  deterministic: boolean;
  algorithm: BackwardAlgorithm;
}

// The forward takes the backward's keys too (one options object can serve both passes), and checks
// them as the backward would.
const OPTION_KEYS: readonly string[] = [
  'causal', 'softmaxScale', 'softcap', 'window', 'alibiSlopes', 'kernel', 'float32Precision', 'deterministic',
  'algorithm',
];

/** `options.alibiSlopes` (undefined: none), copied to float32; its length is checked against the shapes later. */
function checkAlibi(slopes: unknown): Float32Array | null {
  if (slopes === undefined) return null;
  const what = 'options.alibiSlopes to be a Float32Array or an Array of finite numbers';
  if (!(slopes instanceof Float32Array) && !Array.isArray(slopes)) throw typeError(what, describeValue(slopes));
  const out = new Float32Array(slopes.length);
  for (let i = 0; i < slopes.length; i++) {
    const x: unknown = slopes[i];
    if (typeof x !== 'number') throw typeError(what, `element ${i} ${describeValue(x)}`);
    if (!Number.isFinite(x) || !Number.isFinite(Math.fround(x))) {
      throw rangeError(`${what} that float32 holds`, `element ${i} ${String(x)}`);
    }
    out[i] = x;
  }
  return out;
}

/** `options.window` (undefined: none) as [left, right], -1 where unbounded. */
function checkWindow(window: unknown): [number, number] {
  if (window === undefined) return [-1, -1];
  const what = 'options.window to be [left, right], integers >= -1 (-1: unbounded)';
  if (!Array.isArray(window) || window.length !== 2) throw typeError(what, describeValue(window));
  const sides: unknown[] = [window[0], window[1]]; // each element read once
  for (const x of sides) {
    if (typeof x !== 'number') throw typeError(what, `an element ${describeValue(x)}`);
    if (!Number.isSafeInteger(x) || x < -1) throw rangeError(what, `[${sides.map(String).join(', ')}]`);
  }
  return [sides[0] as number, sides[1] as number];
}

function checkOptions(options: unknown): CheckedOptions {
  if (options !== undefined && (options === null || typeof options !== 'object' || Array.isArray(options))) {
    throw typeError('options to be an object or undefined', describeValue(options));
  }
  // Unknown keys are refused: a typo ({ casual: true }) must not run with a default instead.
  refuseUnknownKeys(options ?? {}, 'options', OPTION_KEYS);
  const o = (options ?? {}) as AttentionBackwardOptions;
  if (o.causal !== undefined && typeof o.causal !== 'boolean') {
    throw typeError('options.causal to be a boolean', describeValue(o.causal));
  }
  if (o.softmaxScale !== undefined) {
    if (typeof o.softmaxScale !== 'number') {
      throw typeError('options.softmaxScale to be a number', describeValue(o.softmaxScale));
    }
    // The kernels use softmaxScale·log2(e) in float32: it must be a positive finite float32 too.
    const f = Math.fround(o.softmaxScale);
    if (!Number.isFinite(o.softmaxScale) || o.softmaxScale <= 0 || f <= 0 || !Number.isFinite(Math.fround(f * Math.LOG2E))) {
      throw rangeError('options.softmaxScale to be a finite number > 0 and < 2.3e38', String(o.softmaxScale));
    }
  }
  if (o.softcap !== undefined) {
    if (typeof o.softcap !== 'number') throw typeError('options.softcap to be a number', describeValue(o.softcap));
    // The kernels take it as a float32: a positive softcap must stay positive and finite there.
    const f = Math.fround(o.softcap);
    if (!Number.isFinite(o.softcap) || o.softcap < 0 || !Number.isFinite(f) || (o.softcap > 0 && f <= 0)) {
      throw rangeError('options.softcap to be a finite number >= 0 (0: none) that float32 holds', String(o.softcap));
    }
  }
  const window = checkWindow(o.window);
  const alibi = checkAlibi(o.alibiSlopes);
  if (o.kernel !== undefined && !['auto', 'flash', 'naive'].includes(o.kernel as string)) {
    throw typeError("options.kernel to be 'auto', 'flash' or 'naive'", describeValue(o.kernel));
  }
  if (o.float32Precision !== undefined && !['tf32', 'highest'].includes(o.float32Precision as string)) {
    throw typeError("options.float32Precision to be 'tf32' or 'highest'", describeValue(o.float32Precision));
  }
  if (o.deterministic !== undefined && typeof o.deterministic !== 'boolean') {
    throw typeError('options.deterministic to be a boolean', describeValue(o.deterministic));
  }
  if (o.algorithm !== undefined && !['auto', 'single-kernel', 'two-kernel'].includes(o.algorithm as string)) {
    throw typeError("options.algorithm to be 'auto', 'single-kernel' or 'two-kernel'", describeValue(o.algorithm));
  }
  return {
    causal: o.causal ?? false,
    scale: o.softmaxScale,
    softcap: o.softcap ?? 0,
    window,
    alibi,
    kernel: o.kernel ?? 'auto',
    float32Precision: o.float32Precision ?? 'tf32',
    deterministic: o.deterministic ?? false,
    algorithm: o.algorithm ?? 'auto',
  };
}

/** A backward call's problem: the forward's, plus the backward's own options. */
type BackwardProblem = Problem & { deterministic: boolean; algorithm: BackwardAlgorithm };

/** Validates q, k, v (and the options) and derives the problem's dimensions. */
function checkQKV(q: unknown, k: unknown, v: unknown, options: unknown): BackwardProblem {
  handleOf(q, 'q');
  handleOf(k, 'k');
  handleOf(v, 'v');
  const Q = q as Tensor, K = k as Tensor, V = v as Tensor;
  checkRank4(Q, 'q');
  checkRank4(K, 'k');
  checkRank4(V, 'v');
  if (Q.dtype === 'int32') throw typeError("q to have dtype 'float32', 'float16' or 'bfloat16'", "'int32'");
  checkLike(K, 'k', Q, 'q');
  checkLike(V, 'v', Q, 'q');
  const [batch, seqlenQ, headsQ, headDim] = Q.shape;
  const [batchK, seqlenK, headsKV, headDimK] = K.shape;
  if (headDim % 8 !== 0 || headDim > 256) {
    throw rangeError('headDim of q to be a multiple of 8 in [8, 256]', `${headDim} (q is ${formatShape(Q.shape)})`);
  }
  if (batchK !== batch) throw rangeError(`k to have batch ${batch} (like q)`, `${batchK} (k is ${formatShape(K.shape)})`);
  if (headDimK !== headDim) {
    throw rangeError(`k to have headDim ${headDim} (like q)`, `${headDimK} (k is ${formatShape(K.shape)})`);
  }
  if (headsQ % headsKV !== 0) {
    throw rangeError(`heads of q (${headsQ}) to be a multiple of heads of k`, `${headsKV} (k is ${formatShape(K.shape)})`);
  }
  if (V.shape.some((d, i) => d !== K.shape[i])) {
    throw rangeError(`v to have the shape of k ${formatShape(K.shape)}`, formatShape(V.shape));
  }
  const o = checkOptions(options);
  if (o.alibi !== null && o.alibi.length !== headsQ && o.alibi.length !== batch * headsQ) {
    throw rangeError(`options.alibiSlopes to hold headsQ (${headsQ}) or batch * headsQ (${batch * headsQ}) slopes`,
      `${o.alibi.length}`);
  }
  // The score options the CUDA kernels do not take yet: refused on CUDA tensors, naming the option.
  const cpuOnly: [boolean, string, string, string][] = [
    [o.softcap > 0, 'options.softcap to be 0', 'a softcap', String(o.softcap)],
    [o.alibi !== null, 'options.alibiSlopes to be undefined', 'ALiBi', `${o.alibi?.length} slopes`],
    [o.window[0] >= 0 || o.window[1] >= 0, 'options.window to be [-1, -1]', 'a sliding window', `[${o.window.join(', ')}]`],
  ];
  for (const [given, expected, feature, received] of cpuOnly) {
    if (given && Q.device !== 'cpu') {
      throw rangeError(`${expected} for ${Q.device} tensors (the CUDA kernels do not take ${feature} yet; the CPU backend does)`,
        received);
    }
  }
  return {
    dims: [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim],
    device: Q.device,
    dtype: Q.dtype,
    causal: o.causal,
    scale: o.scale ?? 1 / Math.sqrt(headDim),
    softcap: o.softcap,
    window: o.window,
    alibi: o.alibi,
    kernel: o.kernel,
    float32Precision: o.float32Precision,
    deterministic: o.deterministic,
    algorithm: o.algorithm,
  };
}

function checkSameShape(t: unknown, name: string, ref: Tensor, refName: string): Tensor {
  handleOf(t, name);
  const T = t as Tensor;
  checkLike(T, name, ref, refName);
  if (T.shape.length !== ref.shape.length || T.shape.some((d, i) => d !== ref.shape[i])) {
    throw rangeError(`${name} to have the shape of ${refName} ${formatShape(ref.shape)}`, formatShape(T.shape));
  }
  return T;
}

function checkLse(lse: unknown, p: Problem): Tensor {
  handleOf(lse, 'lse');
  const L = lse as Tensor;
  const [batch, seqlenQ, , headsQ] = p.dims;
  const want = [batch, headsQ, seqlenQ];
  if (L.dtype !== 'float32') throw typeError('lse to have dtype float32', L.dtype);
  if (L.device !== p.device) throw typeError(`lse to be on device ${p.device} (like q)`, L.device);
  if (L.shape.length !== 3 || L.shape.some((d, i) => d !== want[i])) {
    throw rangeError(`lse to have shape [batch, headsQ, seqlenQ] = ${formatShape(want)}`, formatShape(L.shape));
  }
  if (!L.isContiguous) throw rangeError('lse to be contiguous (call contiguous() first)', `strides ${formatShape(L.strides)}`);
  return L;
}

function forwardNative(q: NativeView, k: NativeView, v: NativeView, p: Problem): AttentionOutput {
  const { args, strides } = nativeArgs([q, k, v]);
  const [outBuf, lseBuf, kernel, plan] = binding().attentionForward({
    q: args[0], k: args[1], v: args[2], dims: p.dims, causal: p.causal, softmaxScale: p.scale, softcap: p.softcap,
    window: p.window, alibiSlopes: p.alibi ?? undefined, kernel: KERNEL_CODE[p.kernel], float32Precision: FLOAT32_PRECISION_CODE[p.float32Precision], strides,
  });
  const [batch, seqlenQ, , headsQ, , headDim] = p.dims;
  return {
    out: wrapNative(outBuf, [batch, seqlenQ, headsQ, headDim], p.dtype, p.device),
    lse: wrapNative(lseBuf, [batch, headsQ, seqlenQ], 'float32', p.device),
    kernel,
    plan,
  };
}

/**
 * Attention forward: out = softmax(softmaxScale · q·kᵀ [+ causal mask]) · v, and the row
 * log-sum-exp. Queued on the tensors' device; returns new tensors at once.
 *
 * @param q [batch, seqlenQ, headsQ, headDim]; a view with any batch, row and head strides (headDim stride 1)
 * @param k [batch, seqlenK, headsKV, headDim], same dtype and device as q; a view like q
 * @param v like k
 * @param options see {@link AttentionOptions}; the backward's keys (`deterministic`, `algorithm`) are
 *   accepted and checked too, so one options object can serve both passes. Unknown keys are refused.
 * @throws TypeError / RangeError naming the argument; a refused call changes nothing.
 * @example
 * const { out, lse } = flashAttention(q, k, v, { causal: true });
 * const values = await out.toFloat32Array();
 */
export function flashAttention(q: Tensor, k: Tensor, v: Tensor, options?: AttentionBackwardOptions): AttentionOutput {
  const p = checkQKV(q, k, v, options);
  return forwardNative(nativeView(q, 'q'), nativeView(k, 'k'), nativeView(v, 'v'), p);
}

/**
 * Attention backward: gradients of a loss with respect to q, k and v, given its gradient `dout`
 * with respect to `out`. `out` and `lse` are the forward's outputs for the same q, k, v and
 * options. With GQA, dk and dv of a kv head are summed over the query heads that share it.
 *
 * @param dout like out: [batch, seqlenQ, headsQ, headDim]; a view like q
 * @param out the forward's out; a view like q
 * @param lse float32 [batch, headsQ, seqlenQ] from {@link flashAttention}, contiguous
 * @param options also `dq`, `dk`, `dv`: views to write the gradients into ({@link GradientTargets})
 */
export function flashAttentionBackward(
  dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
  options?: AttentionBackwardOptions & GradientTargets,
): AttentionGradients {
  const targets = checkTargets(options, q, k);
  const p = checkQKV(q, k, v, withoutTargets(options));
  checkSameShape(dout, 'dout', q, 'q');
  checkRank4(dout as Tensor, 'dout');
  checkSameShape(out, 'out', q, 'q');
  checkRank4(out as Tensor, 'out');
  checkLse(lse, p);
  return backwardNative(nativeView(dout, 'dout'), nativeView(q, 'q'), nativeView(k, 'k'), nativeView(v, 'v'),
    nativeView(out, 'out'), [handleOf(lse, 'lse'), lse.offset], p, targets);
}

/**
 * Views to write the backward's gradients into instead of new tensors (for example the slices
 * `dqkv.select(2, 0)`, `select(2, 1)`, `select(2, 2)` of a packed [batch, seqlen, 3, heads, headDim]
 * gradient, so the projection's backward reads one tensor). Each is optional: the shape, dtype and
 * device of q (dq) or k (dk, dv), any batch, row and head strides with headDim stride 1, no element
 * shared with another target or with an input of the backward (a RangeError says which). The
 * gradient is written over the view's elements (not accumulated); the result returns the given
 * tensor itself.
 */
export interface GradientTargets {
  /** Where dq goes: [batch, seqlenQ, headsQ, headDim]. */
  dq?: Tensor;
  /** Where dk goes: [batch, seqlenK, headsKV, headDim]. */
  dk?: Tensor;
  /** Where dv goes: like dk. */
  dv?: Tensor;
}

const TARGET_KEYS = ['dq', 'dk', 'dv'] as const;

function withoutTargets(options: unknown): unknown {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) return options;
  const rest: Record<string, unknown> = { ...(options as Record<string, unknown>) };
  for (const key of TARGET_KEYS) delete rest[key];
  return rest;
}

/** Validates options.dq / dk / dv (undefined entries: new tensors). */
function checkTargets(options: unknown, q: unknown, k: unknown): (Tensor | null)[] {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) return [null, null, null];
  const o = options as GradientTargets;
  return TARGET_KEYS.map((key) => {
    const t = o[key];
    if (t === undefined) return null;
    const name = `options.${key}`;
    handleOf(t, name);
    const refName = key === 'dq' ? 'q' : 'k';
    const ref = handleOf(key === 'dq' ? q : k, refName) && ((key === 'dq' ? q : k) as Tensor);
    checkSameShape(t, name, ref, refName);
    checkRank4(t, name);
    return t;
  });
}

function backwardNative(
  dout: NativeView, q: NativeView, k: NativeView, v: NativeView, out: NativeView, lse: [NativeBuffer, number],
  p: BackwardProblem, targets: readonly (Tensor | null)[],
): AttentionGradients {
  const { args, strides } = nativeArgs([dout, q, k, v, out]);
  const given = targets.some((t) => t !== null);
  const grads = given ? targets.map((t, i) => (t === null ? null : nativeView(t, TARGET_KEYS[i]))) : [];
  const [dq, dk, dv, kernel, algorithm, plan] = binding().attentionBackward({
    dout: args[0], q: args[1], k: args[2], v: args[3], out: args[4], lse, dims: p.dims, causal: p.causal,
    softmaxScale: p.scale, softcap: p.softcap, window: p.window, alibiSlopes: p.alibi ?? undefined, kernel: KERNEL_CODE[p.kernel],
    deterministic: p.deterministic,
    algorithm: BACKWARD_ALGORITHM_CODE[p.algorithm], float32Precision: FLOAT32_PRECISION_CODE[p.float32Precision],
    strides,
    grads: given ? grads.map((g) => (g === null ? null : [g.buf, g.offset])) : undefined,
    gradStrides: given ? grads.flatMap((g) => (g === null ? [0, 0, 0] : g.strides)) : undefined,
  });
  const [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim] = p.dims;
  const wrap = (buf: NativeBuffer | null, i: number, shape: number[]): Tensor =>
    buf === null ? (targets[i] as Tensor) : wrapNative(buf, shape, p.dtype, p.device);
  return {
    dq: wrap(dq, 0, [batch, seqlenQ, headsQ, headDim]),
    dk: wrap(dk, 1, [batch, seqlenK, headsKV, headDim]),
    dv: wrap(dv, 2, [batch, seqlenK, headsKV, headDim]),
    kernel,
    algorithm,
    plan,
  };
}

/** Marks the constructor calls of {@link AttentionContext} that lib/ makes. */
const CONTEXT_TOKEN: unique symbol = Symbol('flash-attn-node AttentionContext construction');

/**
 * The result of {@link flashAttentionWithGrad}: the forward's outputs plus what the backward
 * needs, saved as extra references (so the caller may dispose q, k, v or out before the backward).
 */

export class AttentionContext implements Disposable {
  /** The forward output (the caller owns it and disposes it). */
  readonly out: Tensor;
  /** The log-sum-exp (the caller owns it and disposes it). */
  readonly lse: Tensor;
  /** The forward's implementation ('auto' resolved). */
  readonly kernel: Exclude<AttentionKernel, 'auto'>;
  /** The forward's kernel family and configuration. */
  readonly plan: KernelPlan;
  #saved: NativeView[] | null; // q, k, v, out, lse
  readonly #problem: BackwardProblem;

  /** @internal Made by {@link flashAttentionWithGrad} only (`token` is its module's). */
  constructor(out: AttentionOutput, saved: NativeView[], problem: BackwardProblem, token?: symbol) {
    if (token !== CONTEXT_TOKEN) {
      throw new TypeError('Expected an AttentionContext made by flashAttentionWithGrad(q, k, v, options) but received a direct constructor call');
    }
    this.out = out.out;
    this.lse = out.lse;
    this.kernel = out.kernel;
    this.plan = out.plan;
    this.#saved = saved;
    this.#problem = problem;
  }

  /** Whether the saved tensors were released (after {@link backward} or {@link dispose}). */
  get released(): boolean {
    return this.#saved === null;
  }

  /**
   * Gradients with respect to q, k and v for `dout` (like out), using the options given to
   * {@link flashAttentionWithGrad}; `deterministic` and `algorithm` given here override those. Releases
   * what the context saved once the backward is queued: call it once. A refused call (a TypeError or
   * RangeError) releases nothing, so it can be retried with corrected arguments.
   */
  backward(dout: Tensor, options?: { deterministic?: boolean; algorithm?: BackwardAlgorithm }): AttentionGradients {
    if (this.#saved === null) {
      throw new Error(
        'AttentionContext.backward() was already called or the context was disposed: its saved tensors are released',
      );
    }
    if (options !== undefined && (options === null || typeof options !== 'object' || Array.isArray(options))) {
      throw typeError('options to be an object or undefined', describeValue(options));
    }
    const extra = Object.keys(options ?? {}).filter((key) => key !== 'deterministic' && key !== 'algorithm');
    if (extra.length > 0) {
      throw typeError("options of backward() to hold only 'deterministic' and 'algorithm' (the rest are the forward's)", extra.join(', '));
    }
    const o = checkOptions(options);
    // Options given here override the ones given to flashAttentionWithGrad; the others keep theirs.
    const given = (options ?? {}) as { deterministic?: boolean; algorithm?: BackwardAlgorithm };
    const p = {
      ...this.#problem,
      deterministic: given.deterministic !== undefined ? o.deterministic : this.#problem.deterministic,
      algorithm: given.algorithm !== undefined ? o.algorithm : this.#problem.algorithm,
    };
    const [batch, seqlenQ, , headsQ, , headDim] = p.dims;
    handleOf(dout, 'dout');
    const D = dout as Tensor;
    const want = [batch, seqlenQ, headsQ, headDim];
    if (D.dtype !== p.dtype) throw typeError(`dout to have dtype ${p.dtype} (like q)`, D.dtype);
    if (D.device !== p.device) throw typeError(`dout to be on device ${p.device} (like q)`, D.device);
    if (D.shape.length !== 4 || D.shape.some((x, i) => x !== want[i])) {
      throw rangeError(`dout to have the shape of out ${formatShape(want)}`, formatShape(D.shape));
    }
    checkRank4(D, 'dout');
    const [q, k, v, out, lse] = this.#saved;
    // Released only once the backward is queued: a call the native layer refuses (say, an algorithm
    // this dtype or device cannot run) changes nothing, and a corrected retry still finds the saved
    // tensors.
    const grads = backwardNative(nativeView(D, 'dout'), q, k, v, out, [lse.buf, lse.offset], p, [null, null, null]);
    this.dispose();
    return grads;
  }

  /** Releases the saved tensors without running the backward. Idempotent. */
  dispose(): void {
    if (this.#saved) for (const b of this.#saved) b.buf.release();
    this.#saved = null;
  }

  /** Same as {@link dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}

/**
 * Forward for training: like {@link flashAttention}, and returns a context whose
 * `backward(dout)` computes the gradients and frees what was saved for it.
 *
 * @example
 * const ctx = flashAttentionWithGrad(q, k, v, { causal: true });
 * const loss = ...ctx.out...;
 * const { dq, dk, dv } = ctx.backward(dout);
 */
export function flashAttentionWithGrad(q: Tensor, k: Tensor, v: Tensor, options?: AttentionBackwardOptions): AttentionContext {
  const p = checkQKV(q, k, v, options);
  const views = [nativeView(q, 'q'), nativeView(k, 'k'), nativeView(v, 'v')];
  const result = forwardNative(views[0], views[1], views[2], p);
  // Each saved view holds its own handle on its storage (views of a packed qkv share one storage).
  const saved = [...views, nativeView(result.out, 'out'), { ...nativeView(result.lse as Tensor, 'lse'), strides: [0, 0, 0] }]
    .map((sv) => ({ ...sv, buf: sv.buf.share() })) as NativeView[];
  return new AttentionContext(result, saved, p, CONTEXT_TOKEN);
}
