/**
 * The nn ops (lib/ops/norm.ts, rope.ts, activation.ts, elementwise.ts) on every available device,
 * against the float64 references of lib/ops/reference/nn.ts with the flash-attention rule:
 *
 *     max |actual − ref64| ≤ factor · max |samePrecision − ref64| + atol
 *
 * factor 2 for outputs and row statistics, 3 for gradients; samePrecision is the plain float32-math
 * implementation of the same module in the tested dtype. The references run on the values stored on
 * the device (the inputs rounded to the dtype). atol is one float32 ulp (ATOL_REL) at the magnitude
 * of the largest reference value: it only covers results whose same-precision error is 0. For the
 * norms' parameter gradients, sums over rows that the backends add in their own order, the magnitude
 * is that of the summation, max over columns of |initial value| + Σ_rows |term|: a sum that cancels
 * to a small value carries rounding at the scale of its terms in any order.
 *
 * Inputs are fresh seeded random numbers (replay with the printed FA_TEST_SEED); the norms get rows
 * with their own non-trivial mean and scale. Every output starts as NaN (debug.poisonOutputs) and is
 * checked to be fully written. Sizes are awkward on purpose: rows 1, 7, 97, 1025; cols 1, 2, 3, 65,
 * 129, 384, 1536, 4099; head dims 2, 8, 34, 64, 128. A float32 finite-difference check of every
 * backward's directional derivative closes each suite.
 *
 * Validation (exact messages, nothing allocated or changed by a refused call, the raw binding fed
 * garbage) is in test/ops-nn-validation.test.ts. FA_TEST_REPORT=1 prints each result's error and bound.
 */

import type { DType } from '../lib/half';
import { dtypeRounder } from '../lib/half';
import { gelu, geluBackward, swiglu, swigluBackward } from '../lib/ops/activation';
import { add, addInPlace } from '../lib/ops/elementwise';
import { layerNorm, layerNormBackward, rmsNorm, rmsNormBackward } from '../lib/ops/norm';
import {
  referenceAdd, referenceGelu, referenceGeluBackward, referenceLayerNorm, referenceLayerNormBackward,
  referenceRmsNorm, referenceRmsNormBackward, referenceRope, referenceSwiglu, referenceSwigluBackward,
} from '../lib/ops/reference/nn';
import { applyRope } from '../lib/ops/rope';
import { Device, Tensor } from '../lib/tensor';
import { describeEachDevice, trackMemory, usePoisonedOutputs } from './helpers/backend';
import { randn, randu, Rng, rngFor, seedHint } from './helpers/random';
import { expectAllWritten, expectFlashRule, maxAbsDiff } from './helpers/tolerance';

trackMemory();
usePoisonedOutputs();

const FLOAT_DTYPES: readonly DType[] = ['float32', 'float16', 'bfloat16'];
/** Multiplier of the same-precision error for outputs and row statistics. */
const OUT_FACTOR = 2;
/** Multiplier of the same-precision error for gradients. */
const GRAD_FACTOR = 3;
/** atol relative to the largest reference magnitude (at least 1): one float32 ulp in [1, 2). */
const ATOL_REL = 2 ** -23;
/** FA_TEST_REPORT=1 prints every checked result's error next to its bound. */
const REPORT = process.env.FA_TEST_REPORT === '1';

// Tensors created by a test, disposed after it.
const live: Tensor[] = [];
afterEach(() => {
  for (const t of live.splice(0)) t.dispose();
});
function keep<T extends Tensor>(t: T): T {
  live.push(t);
  return t;
}

/** A tensor of `data` rounded to `dtype`, and the values it holds. */
function upload(data: Float32Array, shape: readonly number[], dtype: DType, device: Device): { t: Tensor; v: Float32Array } {
  const t = keep(Tensor.fromFloat32Array(data, shape, { dtype, device }));
  const rd = dtypeRounder(dtype);
  return { t, v: data.map(rd) };
}

/** The values of `t`, as a Float32Array of this realm (the addon's arrays come from Node's). */
async function read(t: Tensor): Promise<Float32Array> {
  return Float32Array.from(await t.toFloat32Array());
}

/** max |a_i|. */
function maxAbs(a: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    const x = a[i] < 0 ? -a[i] : a[i];
    if (x > m) m = x;
  }
  return m;
}

/** The rule for one result, with the atol of the module notes. */
function expectRule(
  name: string, actual: ArrayLike<number>, reference: ArrayLike<number>, samePrecision: ArrayLike<number>,
  factor: number, shape?: readonly number[], scale = maxAbs(reference),
): void {
  expectAllWritten(actual, name, { shape });
  const atol = ATOL_REL * Math.max(1, scale);
  const rep = expectFlashRule({ actual, reference, samePrecision, factor, atol, name, shape });
  if (REPORT) console.log(`${name}: maxErr ${rep.maxErr.toExponential(2)} refErr ${rep.refErr.toExponential(2)} bound ${rep.bound.toExponential(2)}`);
}

/** float64 `init + k · grad` and the float32 result of adding `grad` (same precision) k times. */
function accumulated(init: Float32Array, grad64: Float64Array, gradSame: Float64Array, k: number): { ref: Float64Array; same: Float64Array } {
  const ref = new Float64Array(init.length);
  const same = new Float64Array(init.length);
  for (let i = 0; i < init.length; i++) {
    ref[i] = init[i] + k * grad64[i];
    let s = init[i];
    for (let j = 0; j < k; j++) s = Math.fround(s + gradSame[i]);
    same[i] = s;
  }
  return { ref, same };
}

/**
 * The magnitude of the norms' parameter-gradient sums after `k` backward calls: max over columns of
 * |init| + k · Σ_rows |dout · x̂| (dweight) and |init| + k · Σ_rows |dout| (dbias), in float64 with the
 * float64 row statistics.
 */
function paramGradScales(
  dout: Float32Array, x: Float32Array, mean: Float64Array, rstd: Float64Array, rows: number, cols: number,
  dwInit: Float32Array, dbInit: Float32Array, k: number,
): { dweight: number; dbias: number } {
  const dw = Float64Array.from(dwInit, Math.abs);
  const db = Float64Array.from(dbInit, Math.abs);
  for (let r = 0; r < rows; r++) {
    for (let c = 0; c < cols; c++) {
      const i = r * cols + c;
      dw[c] += k * Math.abs(dout[i] * (x[i] - mean[r]) * rstd[r]);
      db[c] += k * Math.abs(dout[i]);
    }
  }
  return { dweight: maxAbs(dw), dbias: maxAbs(db) };
}

/** Rows with their own mean and scale: x[r, c] = m_r + s_r · z, m_r ~ N(0, 2²), s_r in [0.25, 3). */
function normInput(rows: number, cols: number, rng: Rng): Float32Array {
  const z = randn(rows * cols, rng);
  const m = randn(rows, rng, 2);
  const s = randu(rows, 0.25, 3, rng);
  for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) z[r * cols + c] = m[r] + s[r] * z[r * cols + c];
  return z;
}

/** `1 + 0.5 z`: a weight around 1 that is never trivially 1. */
function weightInput(n: number, rng: Rng): Float32Array {
  return randn(n, rng, 0.5).map((v) => 1 + v);
}

/** float64 dot product. */
function dot(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
}

/** `x + h · v` in float32. */
function axpy(x: Float32Array, h: number, v: Float32Array): Float32Array {
  return x.map((xi, i) => xi + h * v[i]);
}

/**
 * Checks a backward's directional derivative against central finite differences of the forward, all
 * float32 on the device: for L(x) = Σ dout · forward(x), `(L(x + hv) − L(x − hv)) / 2h` against
 * `<grad, v>`. The tolerance allows for the float32 rounding of the forward outputs (~1e-7 of each
 * term over h) and the O(h²) truncation.
 */
function expectDirectional(name: string, fd: number, analytic: number, scale: number): void {
  const tol = 2e-3 * Math.max(1, Math.abs(analytic), scale);
  if (!(Math.abs(fd - analytic) <= tol)) {
    throw new Error(`${name}: finite differences ${fd} vs backward ${analytic} (tolerance ${tol})`);
  }
}

// ------------------------------------------------------------------------------------------------
// Norms
// ------------------------------------------------------------------------------------------------

/** [lead shape, cols]: every awkward row count and column count at least once. */
const NORM_CASES: [number[], number][] = [
  [[1], 4099],
  [[7], 1536],
  [[97], 65],
  [[5, 205], 3], // 1025 rows
  [[7], 1],
  [[97], 129],
  [[1025], 384],
  [[1], 2],
];

type NormKind = 'rmsNorm' | 'layerNorm';

interface NormRun {
  out: Tensor;
  mean: Tensor | null;
  rstd: Tensor;
}

function runNormForward(kind: NormKind, x: Tensor, w: Tensor, b: Tensor | null, eps?: number): NormRun {
  const options = eps === undefined ? undefined : { eps };
  if (kind === 'rmsNorm') {
    const r = rmsNorm(x, w, options);
    return { out: keep(r.out), mean: null, rstd: keep(r.rstd) };
  }
  const r = layerNorm(x, w, b, options);
  return { out: keep(r.out), mean: keep(r.mean), rstd: keep(r.rstd) };
}

function runNormBackward(
  kind: NormKind, dout: Tensor, x: Tensor, w: Tensor, f: NormRun, dweight: Tensor | null, dbias: Tensor | null,
): Tensor {
  if (kind === 'rmsNorm') return keep(rmsNormBackward(dout, x, w, f.rstd, { dweight }));
  return keep(layerNormBackward(dout, x, w, f.mean as Tensor, f.rstd, { dweight, dbias }));
}

function normReference(
  kind: NormKind, x: Float32Array, w: Float32Array, b: Float32Array | null, rows: number, cols: number,
  precision: 'float64' | DType, eps?: number,
) {
  const o = { precision, eps };
  return kind === 'rmsNorm'
    ? referenceRmsNorm(x, w, { rows, cols }, o)
    : referenceLayerNorm(x, w, b, { rows, cols }, o);
}

function normBackwardReference(
  kind: NormKind, dout: Float32Array, x: Float32Array, w: Float32Array, rows: number, cols: number,
  precision: 'float64' | DType, eps?: number,
) {
  const o = { precision, eps };
  return kind === 'rmsNorm'
    ? referenceRmsNormBackward(dout, x, w, { rows, cols }, o)
    : referenceLayerNormBackward(dout, x, w, { rows, cols }, o);
}

describeEachDevice('norms', (device) => {
  const kinds: NormKind[] = ['rmsNorm', 'layerNorm'];
  const cases = kinds.flatMap((kind) => FLOAT_DTYPES.flatMap((dtype) => NORM_CASES.map(([lead, cols]) => ({ kind, dtype, lead, cols }))));

  test.each(cases)('$kind $dtype lead $lead cols $cols: forward and backward against float64', async ({ kind, dtype, lead, cols }) => {
    const rows = lead.reduce((a, b) => a * b, 1);
    const rng = rngFor(`norm/${device}/${kind}/${dtype}/${rows}x${cols}`);
    const shape = [...lead, cols];
    const x = upload(normInput(rows, cols, rng), shape, dtype, device);
    const w = upload(weightInput(cols, rng), [cols], dtype, device);
    const b = kind === 'layerNorm' ? upload(randn(cols, rng, 0.5), [cols], dtype, device) : null;
    const dout = upload(randn(rows * cols, rng), shape, dtype, device);
    const dwInit = randn(cols, rng);
    const dbInit = randn(cols, rng);
    const dweight = keep(Tensor.fromFloat32Array(dwInit, [cols], { device }));
    const dbias = kind === 'layerNorm' ? keep(Tensor.fromFloat32Array(dbInit, [cols], { device })) : null;

    const f = runNormForward(kind, x.t, w.t, b?.t ?? null);
    expect(f.out.shape).toEqual(shape);
    expect(f.out.dtype).toBe(dtype);
    expect(f.rstd.shape).toEqual([rows]);
    expect(f.rstd.dtype).toBe('float32');
    const dx = runNormBackward(kind, dout.t, x.t, w.t, f, dweight, dbias);
    expect(dx.shape).toEqual(shape);
    expect(dx.dtype).toBe(dtype);

    const ref = normReference(kind, x.v, w.v, b?.v ?? null, rows, cols, 'float64');
    const same = normReference(kind, x.v, w.v, b?.v ?? null, rows, cols, dtype);
    expectRule(`${kind} out`, await read(f.out), ref.out, same.out, OUT_FACTOR, [rows, cols]);
    expectRule(`${kind} rstd`, await read(f.rstd), ref.rstd, same.rstd, OUT_FACTOR);
    if (f.mean) expectRule(`${kind} mean`, await read(f.mean), ref.mean, same.mean, OUT_FACTOR);

    const gref = normBackwardReference(kind, dout.v, x.v, w.v, rows, cols, 'float64');
    const gsame = normBackwardReference(kind, dout.v, x.v, w.v, rows, cols, dtype);
    expectRule(`${kind} dx`, await read(dx), gref.dx, gsame.dx, GRAD_FACTOR, [rows, cols]);
    const scales = paramGradScales(dout.v, x.v, ref.mean, ref.rstd, rows, cols, dwInit, dbInit, 1);
    const dw = accumulated(dwInit, gref.dweight, gsame.dweight, 1);
    expectRule(`${kind} dweight`, await read(dweight), dw.ref, dw.same, GRAD_FACTOR, undefined, scales.dweight);
    if (dbias) {
      const db = accumulated(dbInit, gref.dbias, gsame.dbias, 1);
      expectRule(`${kind} dbias`, await read(dbias), db.ref, db.same, GRAD_FACTOR, undefined, scales.dbias);
    }
  });

  // Rows that one column dominates: a one-column RMSNorm row's dx is g eps rstd^3, ill-conditioned in
  // the formula rstd (g - xhat mean(g xhat)) by x^2 / eps, and a wide row with one large column
  // cancels the same way in that column (by 1 / (1 - xhat_c^2 / cols)). The CPU backend evaluates every
  // row's dx in double from the row's own statistics and rounds once; the CUDA kernels do so on rows
  // whose cancellation factor exceeds 2, as every row here: within 2 ulps of float64, the weights 1
  // (1.3 for one column) so that g = dout w is exact or rounded once. A warp-sized row group (1 and 300
  // columns, with and without the parameter gradients) and a block-sized one (2500 columns), as the
  // CUDA kernels split rows.
  test.each([1, 300, 2500])('rmsNorm float32, rows one column dominates, %i columns: dx within 2 ulps of float64', async (cols) => {
    const big = [0.3, -0.5, 2, 0.75, -3.7, 0.4, 1];
    const rows = big.length;
    const rng = rngFor(`norm-dominant/${device}/${cols}`);
    const xs = new Float32Array(rows * cols);
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < cols; c++) xs[r * cols + c] = 1e-3 * (2 * rng.next() - 1) || 1e-4;
      xs[r * cols + (r % cols)] = big[r];
    }
    const x = upload(xs, [rows, cols], 'float32', device);
    const w = upload(new Float32Array(cols).fill(cols === 1 ? 1.3 : 1), [cols], 'float32', device);
    const dout = upload(randn(rows * cols, rng), [rows, cols], 'float32', device);
    const f = runNormForward('rmsNorm', x.t, w.t, null);
    // The reference at the backends' eps, the float32 nearest 1e-5: where g_c and xhat_c mean(g xhat)
    // nearly cancel, eps's 2.5e-9 relative rounding alone moved dx by more than 2 ulps.
    const ref = normBackwardReference('rmsNorm', dout.v, x.v, w.v, rows, cols, 'float64', Math.fround(1e-5)).dx;
    const dweight = keep(Tensor.zeros([cols], { device }));
    for (const acc of [null, dweight]) {
      const dx = await read(runNormBackward('rmsNorm', dout.t, x.t, w.t, f, acc, null));
      for (let i = 0; i < rows * cols; i++) {
        if (!(Math.abs(dx[i] - ref[i]) <= Math.abs(ref[i]) * 2 ** -22)) {
          throw new Error(`dx[${i}] = ${dx[i]}, float64 ${ref[i]} (${acc ? 'with' : 'without'} dweight); ${seedHint()}`);
        }
      }
    }
  });

  test.each(kinds)('%s: two backward calls add twice into dweight (and dbias); the same bits each time', async (kind) => {
    const rows = 97;
    const cols = 129;
    const rng = rngFor(`norm-accumulate/${device}/${kind}`);
    const x = upload(normInput(rows, cols, rng), [rows, cols], 'bfloat16', device);
    const w = upload(weightInput(cols, rng), [cols], 'bfloat16', device);
    const b = upload(randn(cols, rng), [cols], 'bfloat16', device);
    const dout = upload(randn(rows * cols, rng), [rows, cols], 'bfloat16', device);
    const dwInit = randn(cols, rng);
    const dbInit = randn(cols, rng);
    const dweight = keep(Tensor.fromFloat32Array(dwInit, [cols], { device }));
    const dbias = kind === 'layerNorm' ? keep(Tensor.fromFloat32Array(dbInit, [cols], { device })) : null;
    const f = runNormForward(kind, x.t, w.t, b.t);
    const dx1 = runNormBackward(kind, dout.t, x.t, w.t, f, dweight, dbias);
    const dx2 = runNormBackward(kind, dout.t, x.t, w.t, f, dweight, dbias);
    expect(await dx2.toBits()).toEqual(await dx1.toBits());

    const gref = normBackwardReference(kind, dout.v, x.v, w.v, rows, cols, 'float64');
    const gsame = normBackwardReference(kind, dout.v, x.v, w.v, rows, cols, 'bfloat16');
    const ref = normReference(kind, x.v, w.v, b.v, rows, cols, 'float64');
    const scales = paramGradScales(dout.v, x.v, ref.mean, ref.rstd, rows, cols, dwInit, dbInit, 2);
    const dw = accumulated(dwInit, gref.dweight, gsame.dweight, 2);
    expectRule(`${kind} dweight after 2 calls`, await read(dweight), dw.ref, dw.same, GRAD_FACTOR, undefined, scales.dweight);
    if (dbias) {
      const db = accumulated(dbInit, gref.dbias, gsame.dbias, 2);
      expectRule(`${kind} dbias after 2 calls`, await read(dbias), db.ref, db.same, GRAD_FACTOR, undefined, scales.dbias);
    }

    // Two fresh zero accumulators get the same bits (a fixed summation order), and the dx of a call
    // without parameter gradients is the same too.
    const z1 = keep(Tensor.zeros([cols], { device }));
    const z2 = keep(Tensor.zeros([cols], { device }));
    runNormBackward(kind, dout.t, x.t, w.t, f, z1, null);
    const dx3 = runNormBackward(kind, dout.t, x.t, w.t, f, null, null);
    runNormBackward(kind, dout.t, x.t, w.t, f, z2, null);
    expect(await z2.toBits()).toEqual(await z1.toBits());
    expect(await dx3.toBits()).toEqual(await dx1.toBits());
    expect(maxAbs(await read(z1))).toBeGreaterThan(0);
  });

  test.each(kinds)('%s: eps 0, 0.5 and the default 1e-5 are the eps of the math', async (kind) => {
    const rows = 7;
    const cols = 65;
    const rng = rngFor(`norm-eps/${device}/${kind}`);
    // Small rows (|x| ~ 0.05): an eps of 0.5 changes rstd by a lot, 1e-5 by a measurable amount.
    const x = upload(randn(rows * cols, rng, 0.05), [rows, cols], 'float32', device);
    const w = upload(weightInput(cols, rng), [cols], 'float32', device);
    for (const eps of [0, 0.5]) {
      const f = runNormForward(kind, x.t, w.t, null, eps);
      const ref = normReference(kind, x.v, w.v, null, rows, cols, 'float64', eps);
      const same = normReference(kind, x.v, w.v, null, rows, cols, 'float32', eps);
      expectRule(`${kind} out eps ${eps}`, await read(f.out), ref.out, same.out, OUT_FACTOR);
      expectRule(`${kind} rstd eps ${eps}`, await read(f.rstd), ref.rstd, same.rstd, OUT_FACTOR);
    }
    const byDefault = runNormForward(kind, x.t, w.t, null);
    const explicit = runNormForward(kind, x.t, w.t, null, 1e-5);
    const eps0 = runNormForward(kind, x.t, w.t, null, 0);
    expect(await byDefault.rstd.toBits()).toEqual(await explicit.rstd.toBits());
    expect(maxAbsDiff(await read(byDefault.rstd), await read(eps0.rstd))).toBeGreaterThan(1e-4);
  });

  test('layerNorm without bias, and a 3-D input with an offset view of the weight', async () => {
    const rows = 12;
    const cols = 34;
    const rng = rngFor(`norm-nobias/${device}`);
    const x = upload(normInput(rows, cols, rng), [3, 4, cols], 'float16', device);
    const w = upload(weightInput(cols, rng), [cols], 'float16', device);
    const f = runNormForward('layerNorm', x.t, w.t, null);
    const ref = referenceLayerNorm(x.v, w.v, null, { rows, cols });
    const same = referenceLayerNorm(x.v, w.v, null, { rows, cols }, { precision: 'float16' });
    expectRule('layerNorm out (no bias)', await read(f.out), ref.out, same.out, OUT_FACTOR);
  });

  test.each(kinds)('%s: float32 finite differences of the forward match the backward (dx and dweight)', async (kind) => {
    const rows = 5;
    const cols = 33;
    const rng = rngFor(`norm-fd/${device}/${kind}`);
    // Rows of scale 1.5 around their own mean: curvature small enough for h = 1e-2.
    const x0 = randn(rows * cols, rng, 1.5);
    const means = randn(rows, rng, 2);
    for (let i = 0; i < x0.length; i++) x0[i] += means[Math.floor(i / cols)];
    const w0 = weightInput(cols, rng);
    const b0 = randn(cols, rng);
    const dy = randn(rows * cols, rng);
    const vx = randn(rows * cols, rng);
    const vw = randn(cols, rng);
    const h = 1e-2;
    const loss = async (xs: Float32Array, ws: Float32Array): Promise<number> => {
      const x = upload(xs, [rows, cols], 'float32', device);
      const w = upload(ws, [cols], 'float32', device);
      const b = upload(b0, [cols], 'float32', device);
      return dot(await read(runNormForward(kind, x.t, w.t, b.t).out), dy);
    };
    const fdx = ((await loss(axpy(x0, h, vx), w0)) - (await loss(axpy(x0, -h, vx), w0))) / (2 * h);
    const fdw = ((await loss(x0, axpy(w0, h, vw))) - (await loss(x0, axpy(w0, -h, vw)))) / (2 * h);
    const x = upload(x0, [rows, cols], 'float32', device);
    const w = upload(w0, [cols], 'float32', device);
    const b = upload(b0, [cols], 'float32', device);
    const d = upload(dy, [rows, cols], 'float32', device);
    const dweight = keep(Tensor.zeros([cols], { device }));
    const dbias = kind === 'layerNorm' ? keep(Tensor.zeros([cols], { device })) : null;
    const f = runNormForward(kind, x.t, w.t, b.t);
    const dx = runNormBackward(kind, d.t, x.t, w.t, f, dweight, dbias);
    expectDirectional(`${kind} dx`, fdx, dot(await read(dx), vx), rows);
    expectDirectional(`${kind} dweight`, fdw, dot(await read(dweight), vw), rows);
    if (dbias) {
      // L is linear in the bias: its derivative along v is Σ_c v_c Σ_r dout[r, c] exactly.
      const colSums = new Float64Array(cols);
      for (let r = 0; r < rows; r++) for (let c = 0; c < cols; c++) colSums[c] += dy[r * cols + c];
      expectDirectional(`${kind} dbias`, dot(colSums, vw), dot(await read(dbias), vw), rows);
    }
  });
});

// ------------------------------------------------------------------------------------------------
// RoPE
// ------------------------------------------------------------------------------------------------

/** [batch, seqlen, heads, headDim]: every head dim, odd seqlens and heads. */
const ROPE_CASES: [number, number, number, number][] = [
  [1, 7, 3, 2],
  [2, 97, 1, 8],
  [1, 33, 5, 34],
  [2, 65, 3, 64],
  [1, 129, 2, 128],
];

describeEachDevice('applyRope', (device) => {
  const cases = FLOAT_DTYPES.flatMap((dtype) => ROPE_CASES.map((dims) => ({ dtype, dims })));

  test.each(cases)('$dtype $dims: in place, against float64', async ({ dtype, dims }) => {
    const [batch, seqlen, heads, headDim] = dims;
    const rng = rngFor(`rope/${device}/${dtype}/${dims.join('x')}`);
    const x = upload(randn(batch * seqlen * heads * headDim, rng), dims, dtype, device);
    applyRope(x.t);
    const rd = { batch, seqlen, heads, headDim };
    const ref = referenceRope(x.v, rd);
    const same = referenceRope(x.v, rd, { precision: dtype });
    expectRule('rope', await read(x.t), ref, same, OUT_FACTOR, dims);
  });

  test.each(FLOAT_DTYPES)('%s: base, positionOffset, and the inverse undoing the forward', async (dtype) => {
    const dims = [2, 17, 3, 64];
    const [batch, seqlen, heads, headDim] = dims;
    const rng = rngFor(`rope-options/${device}/${dtype}`);
    const x = upload(randn(batch * seqlen * heads * headDim, rng), dims, dtype, device);
    const options = { base: 500, positionOffset: 1000 };
    applyRope(x.t, options);
    const rd = { batch, seqlen, heads, headDim };
    const ref = referenceRope(x.v, rd, options);
    const same = referenceRope(x.v, rd, { ...options, precision: dtype });
    const rotated = await read(x.t);
    expectRule('rope (base 500, offset 1000)', rotated, ref, same, OUT_FACTOR, dims);

    // The inverse of the stored result against the float64 inverse of the same values.
    applyRope(x.t, { ...options, inverse: true });
    const back = await read(x.t);
    const iref = referenceRope(rotated, rd, { ...options, inverse: true });
    const isame = referenceRope(rotated, rd, { ...options, inverse: true, precision: dtype });
    expectRule('rope inverse', back, iref, isame, OUT_FACTOR, dims);
    // Round trip: within the rounding of two stores in the dtype (each ≤ half an ulp of |x| ≤ ~5).
    const ulp = dtype === 'float32' ? 2 ** -23 : dtype === 'float16' ? 2 ** -10 : 2 ** -7;
    expect(maxAbsDiff(back, x.v)).toBeLessThanOrEqual(2 * 8 * ulp);
    expect(maxAbsDiff(rotated, x.v)).toBeGreaterThan(0.1);
  });

  test.each(FLOAT_DTYPES)('%s: q and k slices of a packed [B, S, 3, H, D] tensor, v untouched', async (dtype) => {
    const [B, S, H, D] = [2, 13, 3, 34];
    const rng = rngFor(`rope-packed/${device}/${dtype}`);
    const packed = upload(randn(B * S * 3 * H * D, rng), [B, S, 3, H, D], dtype, device);
    // select(2, slot): strided [B, S, H, D] views of q (slot 0) and k (slot 1), strides [S·3HD, 3HD, D, 1].
    const view = (slot: number): Tensor => keep(packed.t.select(2, slot));
    expect(view(0).strides).toEqual([S * 3 * H * D, 3 * H * D, D, 1]);
    applyRope(view(0));
    applyRope(view(1), { positionOffset: 5 });
    const gather = (src: ArrayLike<number>, slot: number): Float32Array => {
      const out = new Float32Array(B * S * H * D);
      for (let b = 0; b < B; b++) for (let s = 0; s < S; s++) for (let i = 0; i < H * D; i++) {
        out[(b * S + s) * H * D + i] = src[((b * S + s) * 3 + slot) * H * D + i];
      }
      return out;
    };
    const after = await read(packed.t);
    const rd = { batch: B, seqlen: S, heads: H, headDim: D };
    for (const [slot, positionOffset] of [[0, 0], [1, 5]]) {
      const ref = referenceRope(gather(packed.v, slot), rd, { positionOffset });
      const same = referenceRope(gather(packed.v, slot), rd, { positionOffset, precision: dtype });
      expectRule(`rope packed slot ${slot}`, gather(after, slot), ref, same, OUT_FACTOR, [B, S, H, D]);
    }
    expect(gather(after, 2)).toEqual(gather(packed.v, 2));
    // The views read their own elements.
    expect(await read(view(1))).toEqual(gather(after, 1));
  });

  test('float32 finite differences: the inverse rotation is the backward', async () => {
    const dims = [1, 9, 2, 8];
    const n = 9 * 2 * 8;
    const rng = rngFor(`rope-fd/${device}`);
    const x0 = randn(n, rng);
    const dy = randn(n, rng);
    const v = randn(n, rng);
    const h = 1e-2;
    const loss = async (xs: Float32Array): Promise<number> => {
      const x = upload(xs, dims, 'float32', device);
      applyRope(x.t, { positionOffset: 3 });
      return dot(await read(x.t), dy);
    };
    const fd = ((await loss(axpy(x0, h, v))) - (await loss(axpy(x0, -h, v)))) / (2 * h);
    const g = upload(dy, dims, 'float32', device);
    applyRope(g.t, { positionOffset: 3, inverse: true });
    expectDirectional('rope dx', fd, dot(await read(g.t), v), 1);
  });
});

// ------------------------------------------------------------------------------------------------
// Activations
// ------------------------------------------------------------------------------------------------

/** Shapes of GELU's input: numel 1, 7, 97, 1025·3, 4099. */
const GELU_SHAPES: number[][] = [[1], [7], [97], [1025, 3], [4099]];
/** [lead, F] of SwiGLU (input [...lead, 2F]). */
const SWIGLU_CASES: [number[], number][] = [
  [[1], 1],
  [[7], 65],
  [[97], 3],
  [[5, 205], 2],
  [[1], 4099],
  [[3], 384],
];

describeEachDevice('activations', (device) => {
  const geluCases = FLOAT_DTYPES.flatMap((dtype) => GELU_SHAPES.map((shape) => ({ dtype, shape })));

  test.each(geluCases)('gelu $dtype $shape: forward and backward against float64', async ({ dtype, shape }) => {
    const n = shape.reduce((a, b) => a * b, 1);
    const rng = rngFor(`gelu/${device}/${dtype}/${shape.join('x')}`);
    const x = upload(randn(n, rng, 3), shape, dtype, device);
    const dout = upload(randn(n, rng), shape, dtype, device);
    const out = keep(gelu(x.t));
    const dx = keep(geluBackward(dout.t, x.t));
    expect([out.shape, out.dtype, dx.shape, dx.dtype]).toEqual([shape, dtype, shape, dtype]);
    expectRule('gelu', await read(out), referenceGelu(x.v), referenceGelu(x.v, { precision: dtype }), OUT_FACTOR);
    expectRule('gelu dx', await read(dx), referenceGeluBackward(dout.v, x.v),
      referenceGeluBackward(dout.v, x.v, { precision: dtype }), GRAD_FACTOR);
  });

  const swigluCases = FLOAT_DTYPES.flatMap((dtype) => SWIGLU_CASES.map(([lead, F]) => ({ dtype, lead, F })));

  test.each(swigluCases)('swiglu $dtype lead $lead F $F: forward and backward against float64', async ({ dtype, lead, F }) => {
    const rows = lead.reduce((a, b) => a * b, 1);
    const rng = rngFor(`swiglu/${device}/${dtype}/${rows}x${F}`);
    const x = upload(randn(rows * 2 * F, rng, 3), [...lead, 2 * F], dtype, device);
    const dout = upload(randn(rows * F, rng), [...lead, F], dtype, device);
    const out = keep(swiglu(x.t));
    const dx = keep(swigluBackward(dout.t, x.t));
    expect([out.shape, dx.shape]).toEqual([[...lead, F], [...lead, 2 * F]]);
    const d = { rows, cols: F };
    expectRule('swiglu', await read(out), referenceSwiglu(x.v, d), referenceSwiglu(x.v, d, { precision: dtype }), OUT_FACTOR);
    expectRule('swiglu dx', await read(dx), referenceSwigluBackward(dout.v, x.v, d),
      referenceSwigluBackward(dout.v, x.v, d, { precision: dtype }), GRAD_FACTOR);
  });

  test('gelu and swiglu: float32 finite differences match the backward', async () => {
    const rng = rngFor(`activation-fd/${device}`);
    const n = 6 * 2 * 17;
    const x0 = randn(n, rng, 2);
    const v = randn(n, rng);
    const h = 1e-2;
    const dyG = randn(n, rng);
    const dyS = randn(n / 2, rng);
    const lossG = async (xs: Float32Array): Promise<number> => dot(await read(keep(gelu(upload(xs, [n], 'float32', device).t))), dyG);
    const lossS = async (xs: Float32Array): Promise<number> =>
      dot(await read(keep(swiglu(upload(xs, [6, 34], 'float32', device).t))), dyS);
    const fdG = ((await lossG(axpy(x0, h, v))) - (await lossG(axpy(x0, -h, v)))) / (2 * h);
    const fdS = ((await lossS(axpy(x0, h, v))) - (await lossS(axpy(x0, -h, v)))) / (2 * h);
    const dxG = keep(geluBackward(upload(dyG, [n], 'float32', device).t, upload(x0, [n], 'float32', device).t));
    const dxS = keep(swigluBackward(upload(dyS, [6, 17], 'float32', device).t, upload(x0, [6, 34], 'float32', device).t));
    expectDirectional('gelu dx', fdG, dot(await read(dxG), v), 1);
    expectDirectional('swiglu dx', fdS, dot(await read(dxS), v), 1);
  });
});

// ------------------------------------------------------------------------------------------------
// Residual add
// ------------------------------------------------------------------------------------------------

describeEachDevice('add', (device) => {
  const shapes: number[][] = [[1], [7, 3], [97, 65], [1025, 129]];
  const cases = FLOAT_DTYPES.flatMap((dtype) => shapes.flatMap((shape) => [1, -0.375].map((alpha) => ({ dtype, shape, alpha }))));

  test.each(cases)('$dtype $shape alpha $alpha: add and addInPlace against float64', async ({ dtype, shape, alpha }) => {
    const n = shape.reduce((x, y) => x * y, 1);
    const rng = rngFor(`add/${device}/${dtype}/${shape.join('x')}/${alpha}`);
    const a = upload(randn(n, rng), shape, dtype, device);
    const b = upload(randn(n, rng, 2), shape, dtype, device);
    const options = alpha === 1 ? undefined : { alpha };
    const out = keep(add(a.t, b.t, options));
    expect([out.shape, out.dtype]).toEqual([shape, dtype]);
    const ref = referenceAdd(a.v, b.v, { alpha });
    const same = referenceAdd(a.v, b.v, { alpha, precision: dtype });
    expectRule('add', await read(out), ref, same, OUT_FACTOR);
    expect(await read(a.t)).toEqual(a.v); // not in place

    addInPlace(a.t, b.t, options);
    expectRule('addInPlace', await read(a.t), ref, same, OUT_FACTOR);
    expect(await a.t.toBits()).toEqual(await out.toBits());
  });

  test.each(FLOAT_DTYPES)('%s: addInPlace(a, a) doubles a; an offset view adds into its own elements only', async (dtype) => {
    const rng = rngFor(`add-self/${device}/${dtype}`);
    const a = upload(randn(97, rng), [97], dtype, device);
    addInPlace(a.t, a.t, { alpha: 1 });
    expect(await read(a.t)).toEqual(a.v.map((x) => dtypeRounder(dtype)(2 * x)));

    // A [5] view at offset 3 of a [16] tensor: only elements 3..7 change.
    const base = upload(randn(16, rng), [16], dtype, device);
    const b = upload(randn(5, rng), [5], dtype, device);
    const view = keep(base.t.narrow(0, 3, 5));
    addInPlace(view, b.t);
    const after = await read(base.t);
    const want = Float32Array.from(base.v);
    const rd = dtypeRounder(dtype);
    for (let i = 0; i < 5; i++) want[3 + i] = rd(base.v[3 + i] + b.v[i]);
    expect(after).toEqual(want);
  });
});
