/**
 * AdamW (decoupled weight decay, PyTorch's `torch.optim.AdamW`) with float32 master weights for
 * float16 / bfloat16 parameters, and the global gradient norm that clipping needs. Both stay on the
 * device: clipping reads the norm from a device tensor, so a step never waits for the host.
 * CPU and CUDA, one API (csrc/common/op_params.h `AdamWParams`, `NormOfParams`).
 * @packageDocumentation
 */
import { describeValue, rangeError, typeError } from '../errors';
import { binding } from '../native';
import { Tensor, wrapNative } from '../tensor';
import { arg, checkNumber, checkOptions, checkTensor } from './common';

/** The tensors of one parameter that {@link adamwStep} reads and updates. All contiguous, one device. */
export interface AdamWState {
  /** The parameter, float32, float16 or bfloat16, any shape: updated in place. */
  param: Tensor;
  /** float32, param's element count: the gradient (read only). */
  grad: Tensor;
  /** float32, param's element count: the first moment, updated in place (start from zeros). */
  m: Tensor;
  /** float32, param's element count: the second moment, updated in place (start from zeros). */
  v: Tensor;
  /**
   * float32, param's element count: the master weights, updated in place; `param` receives them
   * rounded to its dtype. Required for a float16 / bfloat16 param; must be null or absent for a
   * float32 param (which is its own master).
   */
  master?: Tensor | null;
}

/** Global-norm gradient clipping inside {@link adamwStep}. */
export interface AdamWClip {
  /** float32 `[1]` on the param's device: the global gradient norm, from {@link gradNorm}. */
  norm: Tensor;
  /** The largest norm let through (> 0): the gradient is scaled by `min(1, maxNorm / (norm + 1e-6))`. */
  maxNorm: number;
}

/** Hyper-parameters of one {@link adamwStep}. */
export interface AdamWOptions {
  /** Learning rate, >= 0. */
  lr: number;
  /** First-moment decay, in [0, 1). Default 0.9. */
  beta1?: number;
  /** Second-moment decay, in [0, 1). Default 0.999. */
  beta2?: number;
  /** Added to the denominator, > 0. Default 1e-8. */
  eps?: number;
  /** Decoupled weight decay, >= 0: `w -= lr · weightDecay · w` before the Adam update. Default 0. */
  weightDecay?: number;
  /**
   * The step number, an integer >= 1 (1 for the first step): the bias corrections `1 − beta^step` are
   * computed from it on the host in double precision.
   */
  step: number;
  /** Multiplies the gradient first (e.g. 1 / loss scale). A finite number. Default 1. */
  gradScale?: number;
  /** Global-norm clipping (see {@link AdamWClip}). Default: none. */
  clip?: AdamWClip;
}

/** The largest finite float32: every hyper-parameter is used as a float32. */
const FLOAT32_MAX = 3.4028234663852886e38;

/**
 * One AdamW step on one parameter, in place, elementwise in float32:
 *
 * ```
 * g = grad · gradScale · clip,  clip = min(1, maxNorm / (norm + 1e-6)) (1 without options.clip)
 * w = master ?? param
 * w −= lr · weightDecay · w
 * m = beta1 · m + (1 − beta1) · g;   v = beta2 · v + (1 − beta2) · g²
 * w −= lr · (m / (1 − beta1^step)) / (sqrt(v / (1 − beta2^step)) + eps)
 * param = w rounded to param's dtype (nearest even);  master = w
 * ```
 *
 * NaN or ±Infinity in the gradient update their elements like any other value (skip the step
 * yourself, e.g. when the gradient norm is not finite). Nothing is returned; no host sync happens.
 *
 * @param state the parameter's tensors (see {@link AdamWState}); each written tensor has its own
 *   storage, distinct from every other argument's.
 * @param options see {@link AdamWOptions}.
 * @throws TypeError / RangeError naming the argument; a refused call changes nothing.
 */
export function adamwStep(state: AdamWState, options: AdamWOptions): void {
  if (state === undefined) throw typeError('state to be an object { param, grad, m, v, master? }', 'undefined');
  const s = checkOptions<AdamWState>(state, 'state', ['param', 'grad', 'm', 'v', 'master']);
  const param = checkTensor(s.param, 'state.param');
  const numel = param.numel;
  const same = { dtype: 'float32', device: param.device } as const;
  const flat = (t: unknown, name: string): Tensor => {
    const c = checkTensor(t, name, same);
    if (c.numel !== numel) throw rangeError(`${name} to have ${numel} elements (like state.param)`, `${c.numel}`);
    return c;
  };
  const grad = flat(s.grad, 'state.grad');
  const m = flat(s.m, 'state.m');
  const v = flat(s.v, 'state.v');
  let master: Tensor | null = null;
  if (param.dtype === 'float32') {
    if (s.master !== undefined && s.master !== null) {
      throw typeError('state.master to be null or absent for a float32 param (it is its own master weight)', describeValue(s.master));
    }
  } else {
    if (s.master === undefined || s.master === null) {
      throw typeError(`state.master (float32 master weights) for a ${param.dtype} param`, describeValue(s.master));
    }
    master = flat(s.master, 'state.master');
  }

  if (options === undefined) throw typeError('options to be an object { lr, step, ... }', 'undefined');
  const o = checkOptions<AdamWOptions>(options, 'options',
    ['lr', 'beta1', 'beta2', 'eps', 'weightDecay', 'step', 'gradScale', 'clip']);
  const lr = checkNumber(o.lr, 'options.lr', { min: 0, max: FLOAT32_MAX });
  const beta = (x: unknown, name: string, dflt: number): number => {
    if (x === undefined) return dflt;
    const b = checkNumber(x, name, { min: 0 });
    if (!(Math.fround(b) < 1)) throw rangeError(`${name} to be a number >= 0 and < 1 (as a float32)`, String(b));
    return b;
  };
  const beta1 = beta(o.beta1, 'options.beta1', 0.9);
  const beta2 = beta(o.beta2, 'options.beta2', 0.999);
  const eps = o.eps === undefined ? 1e-8 : checkNumber(o.eps, 'options.eps', { above: 0, max: FLOAT32_MAX });
  const weightDecay = o.weightDecay === undefined ? 0 : checkNumber(o.weightDecay, 'options.weightDecay', { min: 0, max: FLOAT32_MAX });
  const step = checkNumber(o.step, 'options.step', { integer: true, min: 1 });
  const gradScale = o.gradScale === undefined ? 1 : checkNumber(o.gradScale, 'options.gradScale', { min: -FLOAT32_MAX, max: FLOAT32_MAX });
  let clipNorm: Tensor | null = null;
  let maxNorm = 0;
  if (o.clip !== undefined) {
    if (o.clip === null) throw typeError('options.clip to be an object { norm, maxNorm } or undefined', 'null');
    const c = checkOptions<AdamWClip>(o.clip, 'options.clip', ['norm', 'maxNorm']);
    clipNorm = checkTensor(c.norm, 'options.clip.norm', { ...same, shape: [1] });
    maxNorm = checkNumber(c.maxNorm, 'options.clip.maxNorm', { above: 0, max: FLOAT32_MAX });
  }
  binding().adamwStep(
    arg(param, 'state.param'), arg(grad, 'state.grad'), arg(m, 'state.m'), arg(v, 'state.v'),
    master ? arg(master, 'state.master') : null, numel, lr, beta1, beta2, eps, weightDecay, step, gradScale,
    clipNorm ? arg(clipNorm, 'options.clip.norm') : null, maxNorm,
  );
}

/**
 * The global L2 norm of every element of every tensor, `sqrt(Σ x²)`, accumulated in float32 in an
 * order fixed by the sizes (deterministic), for {@link AdamWClip.norm}.
 *
 * @param tensors a non-empty array of contiguous float32 / float16 / bfloat16 tensors on one device
 *   (mixed dtypes and shapes are fine).
 * @returns a new float32 `[1]` tensor on their device. A NaN or ±Infinity element makes it NaN or
 *   +Infinity.
 * @throws TypeError / RangeError naming the argument.
 */
export function gradNorm(tensors: readonly Tensor[]): Tensor {
  if (!Array.isArray(tensors) || tensors.length === 0) {
    throw typeError('tensors to be a non-empty Array of tensors', describeValue(tensors));
  }
  const first = checkTensor(tensors[0], 'tensors[0]');
  const list = tensors.map((t, i) => (i === 0 ? first : checkTensor(t, `tensors[${i}]`, { device: first.device })));
  const out = binding().gradNorm(list.map((t, i) => arg(t, `tensors[${i}]`)), list.map((t) => t.numel));
  return wrapNative(out, [1], 'float32', first.device);
}
