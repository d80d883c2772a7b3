/**
 * FlashAttention-2 forward and backward on device tensors.
 *
 * Layout, like FlashAttention-2: q is [batch, seqlenQ, headsQ, headDim]; k and v are
 * [batch, seqlenK, headsKV, headDim]; out is like q; lse is float32 [batch, headsQ, seqlenQ] in
 * natural log. All contiguous. seqlenQ and seqlenK may differ; headsQ must be a multiple of headsKV
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
import { describeValue, formatShape, rangeError, typeError } from './errors';
import { BACKWARD_ALGORITHM_CODE, binding, FLOAT32_PRECISION_CODE, KERNEL_CODE, NativeBuffer } from './native';
import { Device, DType, handleOf, Tensor, wrapNative } from './tensor';

/** Which implementation runs. */
export type AttentionKernel = 'auto' | 'flash' | 'naive';

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
   *   construction, for two more matrix products per tile (S and dP are recomputed). Hopper GPUs at
   *   head dims 32, 64 and 128 (after padding); elsewhere a RangeError says why.
   * - `'auto'` (default): `'two-kernel'` where it exists (float16 and bfloat16 on Hopper at head
   *   dims 32, 64 and 128 after padding), else `'single-kernel'`. On an H200 (bf16, the
   *   FlashAttention-2 grid, bench/RESULTS.md) the two kernels took 0.97× the single kernel's time
   *   (0.93–1.03× per cell), with no float32 dq accumulator and deterministic results.
   *
   * The result's `algorithm` says which ran. The naive kernel and the CPU backend have one structure
   * each: they accept `'auto'` and `'single-kernel'`.
   */
  algorithm?: BackwardAlgorithm;
  /**
   * Bit-identical dq across runs (dk and dv always are). Default false: the single-kernel CUDA
   * FlashAttention-2 backward adds each query tile's dq contributions with fp32 atomics, so dq's
   * summation order (and its last bits) can change from run to run. With `true` each thread block
   * adds into its own fp32 accumulator slice in a fixed order and the slices are summed in order (up
   * to 8 slices, or with few heads up to 64 within 256 MiB: that many times the accumulator's memory,
   * 4·batch·headsQ·seqlenQ·headDim bytes each). The two-kernel backward (see `algorithm`, 'auto' on
   * Hopper at head dims 32, 64 and 128) is deterministic either way, at no extra cost.
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
}

/** Output of {@link flashAttentionBackward}: gradients with the shapes and dtypes of q, k and v. */
export interface AttentionGradients {
  dq: Tensor;
  dk: Tensor;
  dv: Tensor;
  /** The implementation that ran ('auto' resolved): 'flash' (FlashAttention-2) or 'naive'. */
  kernel: Exclude<AttentionKernel, 'auto'>;
  /**
   * The backward's structure that ran ({@link AttentionBackwardOptions.algorithm}, 'auto' resolved):
   * 'two-kernel' or 'single-kernel'. The CPU backend and the naive kernel have one structure each and
   * report 'single-kernel'.
   */
  algorithm: Exclude<BackwardAlgorithm, 'auto'>;
}

interface Problem {
  dims: number[]; // [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim]
  device: Device;
  dtype: DType;
  causal: boolean;
  scale: number;
  kernel: AttentionKernel;
  float32Precision: Float32Precision;
}

const QKV_DIMS = '[batch, seqlen, heads, headDim]';

function checkRank4(t: Tensor, name: string): void {
  if (t.shape.length !== 4) {
    throw rangeError(`${name} to have 4 dims ${QKV_DIMS}`, formatShape(t.shape));
  }
}

function checkLike(t: Tensor, name: string, ref: Tensor, refName: string): void {
  if (t.dtype !== ref.dtype) throw typeError(`${name} to have dtype ${ref.dtype} (like ${refName})`, t.dtype);
  if (t.device !== ref.device) throw typeError(`${name} to be on device ${ref.device} (like ${refName})`, t.device);
}

interface CheckedOptions {
  causal: boolean;
  scale?: number;
  kernel: AttentionKernel;
  float32Precision: Float32Precision;
  deterministic: boolean;
  algorithm: BackwardAlgorithm;
}

function checkOptions(options: unknown, backward: boolean): CheckedOptions {
  if (options !== undefined && (options === null || typeof options !== 'object' || Array.isArray(options))) {
    throw typeError('options to be an object or undefined', describeValue(options));
  }
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
  if (o.kernel !== undefined && !['auto', 'flash', 'naive'].includes(o.kernel as string)) {
    throw typeError("options.kernel to be 'auto', 'flash' or 'naive'", describeValue(o.kernel));
  }
  if (o.float32Precision !== undefined && !['tf32', 'highest'].includes(o.float32Precision as string)) {
    throw typeError("options.float32Precision to be 'tf32' or 'highest'", describeValue(o.float32Precision));
  }
  if (backward && o.deterministic !== undefined && typeof o.deterministic !== 'boolean') {
    throw typeError('options.deterministic to be a boolean', describeValue(o.deterministic));
  }
  if (backward && o.algorithm !== undefined && !['auto', 'single-kernel', 'two-kernel'].includes(o.algorithm as string)) {
    throw typeError("options.algorithm to be 'auto', 'single-kernel' or 'two-kernel'", describeValue(o.algorithm));
  }
  return {
    causal: o.causal ?? false,
    scale: o.softmaxScale,
    kernel: o.kernel ?? 'auto',
    float32Precision: o.float32Precision ?? 'tf32',
    deterministic: o.deterministic ?? false,
    algorithm: o.algorithm ?? 'auto',
  };
}

/** A backward call's problem: the forward's, plus the backward's own options. */
type BackwardProblem = Problem & { deterministic: boolean; algorithm: BackwardAlgorithm };

/** Validates q, k, v (and the options) and derives the problem's dimensions. */
function checkQKV(q: unknown, k: unknown, v: unknown, options: unknown, backward: boolean): BackwardProblem {
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
  const o = checkOptions(options, backward);
  return {
    dims: [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim],
    device: Q.device,
    dtype: Q.dtype,
    causal: o.causal,
    scale: o.scale ?? 1 / Math.sqrt(headDim),
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
  return L;
}

function forwardNative(q: NativeBuffer, k: NativeBuffer, v: NativeBuffer, p: Problem): AttentionOutput {
  const [outBuf, lseBuf, kernel] = binding().attentionForward(q, k, v, p.dims, p.causal, p.scale, KERNEL_CODE[p.kernel],
    FLOAT32_PRECISION_CODE[p.float32Precision]);
  const [batch, seqlenQ, , headsQ, , headDim] = p.dims;
  return {
    out: wrapNative(outBuf, [batch, seqlenQ, headsQ, headDim], p.dtype, p.device),
    lse: wrapNative(lseBuf, [batch, headsQ, seqlenQ], 'float32', p.device),
    kernel,
  };
}

/**
 * Attention forward: out = softmax(softmaxScale · q·kᵀ [+ causal mask]) · v, and the row
 * log-sum-exp. Queued on the tensors' device; returns new tensors at once.
 *
 * @param q [batch, seqlenQ, headsQ, headDim]
 * @param k [batch, seqlenK, headsKV, headDim], same dtype and device as q
 * @param v like k
 * @example
 * const { out, lse } = flashAttention(q, k, v, { causal: true });
 * const values = await out.toFloat32Array();
 */
export function flashAttention(q: Tensor, k: Tensor, v: Tensor, options?: AttentionOptions): AttentionOutput {
  const p = checkQKV(q, k, v, options, false);
  return forwardNative(handleOf(q, 'q'), handleOf(k, 'k'), handleOf(v, 'v'), p);
}

/**
 * Attention backward: gradients of a loss with respect to q, k and v, given its gradient `dout`
 * with respect to `out`. `out` and `lse` are the forward's outputs for the same q, k, v and
 * options. With GQA, dk and dv of a kv head are summed over the query heads that share it.
 *
 * @param dout like out: [batch, seqlenQ, headsQ, headDim]
 * @param lse float32 [batch, headsQ, seqlenQ] from {@link flashAttention}
 */
export function flashAttentionBackward(
  dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, options?: AttentionBackwardOptions,
): AttentionGradients {
  const p = checkQKV(q, k, v, options, true);
  checkSameShape(dout, 'dout', q, 'q');
  checkSameShape(out, 'out', q, 'q');
  checkLse(lse, p);
  return backwardNative(handleOf(dout, 'dout'), handleOf(q, 'q'), handleOf(k, 'k'), handleOf(v, 'v'),
    handleOf(out, 'out'), handleOf(lse, 'lse'), p);
}

function backwardNative(
  dout: NativeBuffer, q: NativeBuffer, k: NativeBuffer, v: NativeBuffer, out: NativeBuffer, lse: NativeBuffer,
  p: BackwardProblem,
): AttentionGradients {
  const [dq, dk, dv, kernel, algorithm] = binding().attentionBackward(dout, q, k, v, out, lse, p.dims, p.causal, p.scale,
    KERNEL_CODE[p.kernel], p.deterministic, BACKWARD_ALGORITHM_CODE[p.algorithm], FLOAT32_PRECISION_CODE[p.float32Precision]);
  const [batch, seqlenQ, seqlenK, headsQ, headsKV, headDim] = p.dims;
  return {
    dq: wrapNative(dq, [batch, seqlenQ, headsQ, headDim], p.dtype, p.device),
    dk: wrapNative(dk, [batch, seqlenK, headsKV, headDim], p.dtype, p.device),
    dv: wrapNative(dv, [batch, seqlenK, headsKV, headDim], p.dtype, p.device),
    kernel,
    algorithm,
  };
}

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
  #saved: NativeBuffer[] | null;
  readonly #problem: BackwardProblem;

  /** @internal */
  constructor(out: AttentionOutput, saved: NativeBuffer[], problem: BackwardProblem) {
    this.out = out.out;
    this.lse = out.lse;
    this.kernel = out.kernel;
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
   * what the context saved: call it once.
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
    const o = checkOptions(options, true);
    // Options given here override the ones given to flashAttentionWithGrad; the others keep theirs.
    const given = (options ?? {}) as { deterministic?: boolean; algorithm?: BackwardAlgorithm };
    const p = {
      ...this.#problem,
      deterministic: given.deterministic !== undefined ? o.deterministic : this.#problem.deterministic,
      algorithm: given.algorithm !== undefined ? o.algorithm : this.#problem.algorithm,
    };
    const [batch, seqlenQ, , headsQ, , headDim] = p.dims;
    const d = handleOf(dout, 'dout');
    const D = dout as Tensor;
    const want = [batch, seqlenQ, headsQ, headDim];
    if (D.dtype !== p.dtype) throw typeError(`dout to have dtype ${p.dtype} (like q)`, D.dtype);
    if (D.device !== p.device) throw typeError(`dout to be on device ${p.device} (like q)`, D.device);
    if (D.shape.length !== 4 || D.shape.some((x, i) => x !== want[i])) {
      throw rangeError(`dout to have the shape of out ${formatShape(want)}`, formatShape(D.shape));
    }
    const [q, k, v, out, lse] = this.#saved;
    try {
      return backwardNative(d, q, k, v, out, lse, p);
    } finally {
      this.dispose();
    }
  }

  /** Releases the saved tensors without running the backward. Idempotent. */
  dispose(): void {
    if (this.#saved) for (const b of this.#saved) b.release();
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
  const p = checkQKV(q, k, v, options, true);
  const hq = handleOf(q, 'q'), hk = handleOf(k, 'k'), hv = handleOf(v, 'v');
  const result = forwardNative(hq, hk, hv, p);
  const saved = [hq.share(), hk.share(), hv.share(), handleOf(result.out, 'out').share(), handleOf(result.lse, 'lse').share()];
  return new AttentionContext(result, saved, p);
}
