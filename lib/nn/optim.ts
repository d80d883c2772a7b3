/**
 * AdamW over a model's parameters, every step on the device: the global gradient norm is computed
 * by one `gradNorm` launch and handed to the update kernels as a device scalar (`clip`), so a step
 * never waits for the host.
 * @packageDocumentation
 */
import { describeValue, rangeError, typeError } from '../errors';
import { checkOptions } from '../ops/common';
import { adamwStep, gradNorm } from '../ops/optim';
import { Tensor } from '../tensor';
import { checkParameterList, Parameter, ParameterGroup } from './module';

/** Options of {@link AdamW}. */
export interface AdamWOptions {
  /**
   * Learning rate: a number, or a schedule `(step) => lr` called with the 1-based step number
   * before each update. Default 1e-3.
   */
  lr?: number | ((step: number) => number);
  /** Default 0.9. */
  beta1?: number;
  /** Default 0.999 (nanoGPT's GPT-2 runs use 0.95). */
  beta2?: number;
  /** Default 1e-8. */
  eps?: number;
  /**
   * Decoupled weight decay (PyTorch's AdamW), applied only to parameters whose `decay` is true
   * (2-D weights and embeddings, as nanoGPT groups them). Default 0.01 (PyTorch's default).
   */
  weightDecay?: number;
  /**
   * Clip the global L2 norm of all gradients to this value (PyTorch's clip_grad_norm_: every
   * gradient is scaled by min(1, maxGradNorm / (norm + 1e-6))). Default: no clipping (0 or undefined).
   */
  maxGradNorm?: number;
}

const OPTION_KEYS = ['lr', 'beta1', 'beta2', 'eps', 'weightDecay', 'maxGradNorm'] as const;

function checkRate(value: unknown, arg: string, lo: number, hi: number): number {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < lo || value > hi) {
    throw rangeError(`${arg} to be a finite number in [${lo}, ${hi}]`, describeValue(value));
  }
  return value;
}

/**
 * The optimizer state of one update launch: a parameter's own tensors, or a whole
 * {@link ParameterGroup}'s flat storages.
 */
interface Slot {
  param: Tensor;
  grad: Tensor;
  master: Tensor | null;
  decay: boolean;
  m: Tensor;
  v: Tensor;
}

/** The groups that hold exactly `params` (every one packed, every group wholly included), or null. */
function wholeGroups(params: readonly Parameter[]): ParameterGroup[] | null {
  const groups = new Set<ParameterGroup>();
  for (const p of params) {
    if (!p.group) return null;
    groups.add(p.group);
  }
  const inGroups = [...groups].reduce((a, g) => a + g.parameters.length, 0);
  return inGroups === params.length ? [...groups] : null;
}

/**
 * AdamW (PyTorch's semantics) with float32 moments, float32 master weights for float16/bfloat16
 * parameters (the parameter's `master`), weight decay on the decay group only, a learning-rate
 * schedule and optional global gradient-norm clipping computed on the device.
 *
 * ```ts
 * const opt = new AdamW(model.parameters(), { lr: (s) => 1e-3, weightDecay: 0.1, maxGradNorm: 1 });
 * opt.zeroGrad(); const loss = model.forward(ids, { targets }); model.backward(); opt.step();
 * ```
 */
export class AdamW implements Disposable {
  readonly #slots: Slot[];
  readonly #lr: (step: number) => number;
  /** First-moment decay. */
  readonly beta1: number;
  /** Second-moment decay. */
  readonly beta2: number;
  /** Added to the denominator. */
  readonly eps: number;
  /** Decoupled weight decay, for the parameters that take it. */
  readonly weightDecay: number;
  /** The global gradient norm clipping threshold; 0: no clipping. */
  readonly maxGradNorm: number;
  #step = 0;
  #norm: Tensor | null = null;

  constructor(parameters: readonly Parameter[], options: AdamWOptions = {}) {
    parameters = checkParameterList(parameters, 'parameters');
    if (parameters.length === 0) throw typeError('parameters to be a non-empty Array of Parameters', 'an empty Array');
    const o = checkOptions<AdamWOptions>(options, 'options', OPTION_KEYS);
    const lr = o.lr ?? 1e-3;
    if (typeof lr === 'function') this.#lr = lr;
    else {
      checkRate(lr, 'options.lr', 0, Infinity);
      this.#lr = () => lr;
    }
    this.beta1 = checkRate(o.beta1 ?? 0.9, 'options.beta1', 0, 0.999999);
    this.beta2 = checkRate(o.beta2 ?? 0.999, 'options.beta2', 0, 0.999999);
    this.eps = checkRate(o.eps ?? 1e-8, 'options.eps', 0, 1);
    this.weightDecay = checkRate(o.weightDecay ?? 0.01, 'options.weightDecay', 0, Infinity);
    this.maxGradNorm = checkRate(o.maxGradNorm ?? 0, 'options.maxGradNorm', 0, Infinity);
    const unique = [...new Set(parameters)];
    const groups = wholeGroups(unique);
    const zeros = (like: Tensor): Tensor => Tensor.zeros(like.shape, { dtype: 'float32', device: like.device });
    // Packed parameters (Module.packParameters) update one flat group per launch.
    this.#slots = groups
      ? groups.map((g) => ({ param: g.value, grad: g.grad, master: g.master, decay: g.decay, m: zeros(g.grad), v: zeros(g.grad) }))
      : unique.map((p) => ({ param: p.value, grad: p.grad, master: p.master, decay: p.decay, m: zeros(p.grad), v: zeros(p.grad) }));
  }

  /** Number of update launches per step: one per parameter group when packed, else one per parameter. */
  get launchesPerStep(): number {
    return this.#slots.length;
  }

  /** Number of updates done so far. */
  get stepCount(): number {
    return this.#step;
  }

  /** The learning rate of update `step` (1-based). */
  learningRate(step: number): number {
    const lr = this.#lr(step);
    return checkRate(lr, `the learning rate of step ${step}`, 0, Infinity);
  }

  /**
   * The global L2 norm of the gradients before clipping, from the last {@link step} (float32 [1] on
   * the device; read it with `toFloat32Array()` only when logging). Null before the first step or
   * without clipping. Owned by the optimizer: valid until the next step.
   */
  get lastGradNorm(): Tensor | null {
    return this.#norm;
  }

  /** Sets the gradients of every parameter to zero. */
  zeroGrad(): void {
    for (const s of this.#slots) s.grad.fill(0);
  }

  /**
   * One AdamW update of every parameter from its accumulated gradient (queued on the device; no host
   * synchronisation). With maxGradNorm, the gradients' global norm is computed first, on the device.
   */
  step(): void {
    const step = this.#step + 1;
    const lr = this.learningRate(step);
    this.#norm?.dispose();
    this.#norm = this.maxGradNorm > 0 ? gradNorm(this.#slots.map((s) => s.grad)) : null;
    const clip = this.#norm ? { norm: this.#norm, maxNorm: this.maxGradNorm } : undefined;
    for (const s of this.#slots) {
      adamwStep({ param: s.param, grad: s.grad, m: s.m, v: s.v, master: s.master }, {
        lr, beta1: this.beta1, beta2: this.beta2, eps: this.eps,
        weightDecay: s.decay ? this.weightDecay : 0, step, ...(clip ? { clip } : {}),
      });
    }
    this.#step = step;
  }

  /** Frees the moments and the last gradient norm (not the parameters). */
  dispose(): void {
    for (const s of this.#slots) {
      s.m.dispose();
      s.v.dispose();
    }
    this.#norm?.dispose();
    this.#norm = null;
  }

  /** Same as {@link dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
