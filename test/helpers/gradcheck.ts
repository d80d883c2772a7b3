/**
 * Finite-difference checks of the layers' explicit backward passes (lib/nn): the directional
 * derivative of a scalar function of a layer's input and parameters, computed by central
 * differences of float32 forwards, against the same derivative from the analytic gradients.
 */
import { Module, Parameter } from '../../lib/nn/module';
import { Device, synchronize, Tensor } from '../../lib/tensor';
import { randn, Rng } from './random';

/** Euclidean norm of the combined random direction (input and parameters). */
const DIRECTION_NORM = 4;
/**
 * Norm of the component along the analytic gradient added to the random direction: the directional
 * derivative of a correct backward is then at least about GRADIENT_SHARE·|gradient|, never a random
 * projection near zero (a random direction alone gave |derivative| < 1e-3 on about 1 seed in 40 for
 * the small GPT), while a wrong gradient still differs from the numeric derivative along it.
 */
const GRADIENT_SHARE = 0.5;

/** Fraction of the summed |terms| below which a derivative counts as cancelled (see GradCheckResult). */
const CANCELLATION_FLOOR = 0.1;

/** How a check runs a layer: build the input from values, run forward, and run backward. */
export interface GradCheckCase {
  /** The layer (float32, CPU). */
  module: Module;
  /** The differentiable input's values and shape, or null (ids only, e.g. an embedding). */
  input: { values: Float32Array; shape: number[] } | null;
  /**
   * The scalar to differentiate: runs the forward on `x` (a new tensor, or null) and returns a
   * tensor whose dot product with `weights` (or itself, for a [1] loss) is the scalar.
   */
  forward(x: Tensor | null): Tensor;
  /** Runs the backward with the upstream gradient `dout` (null for a loss); returns dx or null. */
  backward(dout: Tensor | null): Tensor | null;
  /** Whether the forward's output is a scalar loss [1] (then the upstream gradient is 1). */
  scalar?: boolean;
}

function dot(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < a.length; i += 1) s += a[i] * b[i];
  return s;
}

/** Result of {@link directionalGradCheck}. */
export interface GradCheckResult {
  analytic: number;
  numeric: number;
  /** |analytic − numeric| / max(|numeric|, 0.1 · Σ |term|, 1e-3) (terms: the input's and each parameter's share). */
  relError: number;
}

/**
 * Compares the directional derivative of f(x, θ) = <forward(x; θ), w> (w random, or 1 for a
 * scalar loss) along a direction (u for x, v_p for every parameter p: random, plus a component along
 * the analytic gradient, see GRADIENT_SHARE) computed two ways:
 * analytically, <dx, u> + Σ_p <dθ_p, v_p> from one forward and backward in training mode; and
 * numerically, (f(+ε) − f(−ε)) / 2ε from two evaluation-mode forwards with every input and
 * parameter moved by ±ε times its direction. Leaves the parameters at the (random) base point.
 */
export async function directionalGradCheck(c: GradCheckCase, rng: Rng, device: Device, eps = 1e-2): Promise<GradCheckResult> {
  const params: Parameter[] = c.module.parameters();
  // Random parameters (std 0.5) instead of the initial ones (zero biases, unit norm weights), so
  // that every term of the backward is exercised.
  const base = params.map((p) => randn(p.numel, rng, 0.5));
  // Directions of total norm DIRECTION_NORM (every input and parameter element moves), so that a
  // step of ε changes the point by ε·DIRECTION_NORM however many elements there are.
  const total = params.reduce((a, p) => a + p.numel, 0) + (c.input ? c.input.values.length : 0);
  const std = DIRECTION_NORM / Math.sqrt(total);
  const dirs = params.map((p) => randn(p.numel, rng, std));
  const u = c.input ? randn(c.input.values.length, rng, std) : null;
  const makeInput = (t: number): Tensor | null => {
    if (!c.input) return null;
    const v = Float32Array.from(c.input.values, (x, i) => x + t * (u as Float32Array)[i]);
    return Tensor.fromFloat32Array(v, c.input.shape, { device });
  };
  const setParams = (t: number): void => {
    params.forEach((p, i) => p.setData(Float32Array.from(base[i], (x, j) => x + t * dirs[i][j])));
  };

  // Analytic, at the base point.
  setParams(0);
  c.module.train(true);
  c.module.zeroGrad();
  const x0 = makeInput(0);
  const out0 = c.forward(x0);
  const w = c.scalar ? null : randn(out0.numel, rng);
  const dout = w ? Tensor.fromFloat32Array(w, [...out0.shape], { device }) : null;
  const dx = c.backward(dout);
  const dxValues = dx && u ? await dx.toFloat32Array() : null;
  const grads = await Promise.all(params.map((p) => p.grad.toFloat32Array()));
  const gradNorm = Math.sqrt(grads.reduce((a, g) => a + dot(g, g), dxValues ? dot(dxValues, dxValues) : 0));
  if (gradNorm > 0) {
    const k = GRADIENT_SHARE / gradNorm;
    grads.forEach((g, i) => g.forEach((x, j) => { dirs[i][j] += k * x; }));
    if (dxValues && u) dxValues.forEach((x, j) => { u[j] += k * x; });
  }
  const terms: number[] = [];
  if (dxValues && u) terms.push(dot(dxValues, u));
  grads.forEach((g, i) => terms.push(dot(g, dirs[i])));
  const analytic = terms.reduce((a, b) => a + b, 0);
  // The terms of the input and of each parameter can cancel: errors are measured against their size.
  const scale = CANCELLATION_FLOOR * terms.reduce((a, b) => a + Math.abs(b), 0);
  for (const t of [x0, out0, dout, dx]) t?.dispose();

  // Numeric: central differences in evaluation mode.
  c.module.eval();
  const f = async (t: number): Promise<number> => {
    setParams(t);
    const x = makeInput(t);
    const out = c.forward(x);
    const values = await out.toFloat32Array();
    out.dispose();
    x?.dispose();
    return w ? dot(values, w) : values[0];
  };
  const numeric = ((await f(eps)) - (await f(-eps))) / (2 * eps);
  setParams(0);
  c.module.train(true);
  await synchronize(device);
  const relError = Math.abs(analytic - numeric) / Math.max(Math.abs(numeric), scale, 1e-3);
  return { analytic, numeric, relError };
}
