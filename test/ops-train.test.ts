/**
 * The training ops of lib/ops (embedding, linear, cross-entropy, AdamW, gradient norm, sum, column
 * sums) on every device, against the float64 references of lib/ops/reference/train.ts with the
 * flash-attention rule (same-precision implementation: the same references in the tested dtype).
 * Fresh random inputs, awkward sizes, every float dtype, poisoned outputs, accumulation of
 * parameter gradients, and a finite-difference check of linear + cross-entropy.
 */

import { DType, FLOAT_DTYPES, Tensor } from '../lib';
import { dtypeRounder } from '../lib/half';
import { embedding, embeddingBackward } from '../lib/ops/embedding';
import { linear, linearBackward, linearGelu, LinearOptions } from '../lib/ops/linear';
import { crossEntropy, LossReduction } from '../lib/ops/loss';
import { adamwStep, gradNorm } from '../lib/ops/optim';
import { columnSum, sum } from '../lib/ops/reduce';
import {
  referenceAdamW, referenceColumnSum, referenceCrossEntropy, referenceEmbedding, referenceEmbeddingBackward,
  referenceGradNorm, referenceLinear, referenceLinearBackward, referenceSum, TrainReferencePrecision,
} from '../lib/ops/reference/train';
import { binding, NativeBuffer, NativeView } from '../lib/native';
import { storageOf, wrapNative } from '../lib/tensor';
import type { Device } from '../lib/tensor';
import { describeEachDevice, trackMemory, usePoisonedOutputs } from './helpers/backend';
import { randn, rngFor, Rng } from './helpers/random';
import { expectAllWritten, expectFlashRule } from './helpers/tolerance';

trackMemory();
usePoisonedOutputs();

// Every tensor a test creates is disposed after it.
let live: Tensor[] = [];
afterEach(() => {
  for (const t of live) t.dispose();
  live = [];
});
function keep<T extends Tensor | null>(t: T): T {
  if (t) live.push(t);
  return t;
}

/** `data` rounded to `dtype` (so that the references see exactly the tensor's values). */
function rounded(data: Float32Array, dtype: DType): Float32Array {
  const r = dtypeRounder(dtype);
  return data.map((x) => r(x));
}

/** A tensor of `dtype` holding `data` rounded to it, and those rounded values. */
function upload(data: Float32Array, shape: number[], dtype: DType, device: Device): { t: Tensor; v: Float32Array } {
  const v = rounded(data, dtype);
  return { t: keep(Tensor.fromFloat32Array(v, shape, { dtype, device })), v };
}

function ints(data: Int32Array, shape: number[], device: Device): Tensor {
  return keep(Tensor.fromInt32Array(data, shape, { device }));
}

function randomIds(n: number, vocab: number, rng: Rng): Int32Array {
  const ids = new Int32Array(n);
  for (let i = 0; i < n; i++) ids[i] = rng.int(vocab);
  return ids;
}

function maxAbs(a: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) if (Math.abs(a[i]) > m) m = Math.abs(a[i]);
  return m;
}

/** The flash rule with an atol tiny next to the values' size (float32 resolution). */
function rule(name: string, actual: ArrayLike<number>, reference: ArrayLike<number>, same: ArrayLike<number>, factor: number): void {
  expectFlashRule({ name, actual, reference, samePrecision: same, factor, atol: 1e-6 * (maxAbs(reference) + 1e-30) });
}

/** Leading dims for `rows` rows: two dims when rows factors nicely, else one. */
function lead(rows: number): number[] {
  for (const b of [5, 3, 2]) if (rows % b === 0 && rows > b) return [b, rows / b];
  return [rows];
}

/** The same-precision arithmetic of a GEMM on this device and dtype. */
function gemmPrecision(device: Device, dtype: DType, options?: LinearOptions): TrainReferencePrecision {
  if (dtype !== 'float32') return dtype;
  return device === 'cuda' && options?.float32Precision !== 'highest' ? 'tf32' : 'float32';
}

describeEachDevice('embedding', (device) => {
  const cases: Array<[rows: number, vocab: number, dim: number]> = [
    [1, 65, 1], [7, 65, 3], [97, 1000, 65], [1025, 1000, 129], [97, 65, 384],
  ];
  for (const dtype of FLOAT_DTYPES) {
    for (const [rows, vocab, dim] of cases) {
      test(`forward and backward (twice) ${dtype} rows ${rows} vocab ${vocab} dim ${dim}`, async () => {
        const rng = rngFor(`embedding ${device} ${dtype} ${rows} ${vocab} ${dim}`);
        const ids = randomIds(rows, vocab, rng);
        const idsT = ints(ids, lead(rows), device);
        const table = upload(randn(vocab * dim, rng), [vocab, dim], dtype, device);
        const out = keep(embedding(idsT, table.t));
        expect(out.shape).toEqual([...lead(rows), dim]);
        expect(out.dtype).toBe(dtype);
        const got = await out.toFloat32Array();
        expectAllWritten(got, 'out');
        expect(Array.from(got)).toEqual(Array.from(referenceEmbedding(ids, table.v, vocab, dim)));

        const dout = upload(randn(rows * dim, rng), [...lead(rows), dim], dtype, device);
        const dtable0 = randn(vocab * dim, rng);
        const dtable = keep(Tensor.fromFloat32Array(dtable0, [vocab, dim], { device }));
        embeddingBackward(idsT, dout.t, dtable);
        embeddingBackward(idsT, dout.t, dtable);
        const once = (p: TrainReferencePrecision, d0: ArrayLike<number>): Float64Array =>
          referenceEmbeddingBackward(ids, dout.v, d0, vocab, dim, { precision: p });
        const ref = once('float64', once('float64', dtable0));
        const same = once('float32', once('float32', dtable0));
        rule('dtable', await dtable.toFloat32Array(), ref, same, 3);
      });
    }
  }

  test('ids outside [0, vocab) give NaN rows forward and add nothing backward', async () => {
    const rng = rngFor(`embedding bad ids ${device}`);
    const vocab = 65;
    const dim = 7;
    const ids = Int32Array.from([3, -1, 65, 64, 2147483647, 0]);
    const idsT = ints(ids, [6], device);
    const table = upload(randn(vocab * dim, rng), [vocab, dim], 'bfloat16', device);
    const got = await keep(embedding(idsT, table.t)).toFloat32Array();
    const ref = referenceEmbedding(ids, table.v, vocab, dim);
    for (let i = 0; i < got.length; i++) {
      if (Number.isNaN(ref[i])) expect(got[i]).toBeNaN();
      else expect(got[i]).toBe(ref[i]);
    }
    expect(got.slice(dim, 3 * dim).every(Number.isNaN)).toBe(true);
    const dout = upload(randn(6 * dim, rng), [6, dim], 'bfloat16', device);
    const dtable = keep(Tensor.zeros([vocab, dim], { device }));
    embeddingBackward(idsT, dout.t, dtable);
    const dt = await dtable.toFloat32Array();
    expect(Array.from(dt)).toEqual(Array.from(referenceEmbeddingBackward(ids, dout.v, new Float32Array(vocab * dim), vocab, dim)));
  });
});

describeEachDevice('linear', (device) => {
  const cases: Array<[rows: number, inF: number, outF: number]> = [
    [1, 3, 5], [7, 65, 129], [97, 129, 65], [1025, 3, 7], [33, 384, 65],
  ];
  for (const dtype of FLOAT_DTYPES) {
    for (const [rows, inF, outF] of cases) {
      for (const variant of ['bias', 'no bias', 'gelu'] as const) {
        test(`forward and backward ${dtype} ${variant} [${rows}, ${inF}] -> ${outF}`, async () => {
          const rng = rngFor(`linear ${device} ${dtype} ${variant} ${rows} ${inF} ${outF}`);
          const precision = gemmPrecision(device, dtype);
          const x = upload(randn(rows * inF, rng), [...lead(rows), inF], dtype, device);
          const w = upload(randn(outF * inF, rng, 1 / Math.sqrt(inF)), [outF, inF], dtype, device);
          const b = variant === 'no bias' ? null : upload(randn(outF, rng), [outF], dtype, device);
          const gelu = variant === 'gelu';
          let out: Tensor;
          let pre: Tensor | null = null;
          if (gelu) {
            const r = linearGelu(x.t, w.t, b?.t);
            out = keep(r.out);
            pre = keep(r.pre);
          } else {
            out = keep(linear(x.t, w.t, b?.t ?? null));
          }
          expect(out.shape).toEqual([...lead(rows), outF]);
          const ref = referenceLinear(x.v, w.v, b?.v ?? null, rows, inF, outF, { gelu });
          const same = referenceLinear(x.v, w.v, b?.v ?? null, rows, inF, outF, { gelu, precision, dtype });
          const got = await out.toFloat32Array();
          expectAllWritten(got, 'out');
          rule('out', got, ref.out, same.out, 2);
          if (pre) {
            const gp = await pre.toFloat32Array();
            expectAllWritten(gp, 'pre');
            rule('pre', gp, ref.pre, same.pre, 2);
          }

          // Backward: dx, and dweight / dbias accumulated over two calls.
          const dy = upload(randn(rows * outF, rng), [...lead(rows), outF], dtype, device);
          const dw0 = randn(outF * inF, rng);
          const db0 = randn(outF, rng);
          const dweight = keep(Tensor.fromFloat32Array(dw0, [outF, inF], { device }));
          const dbias = keep(Tensor.fromFloat32Array(db0, [outF], { device }));
          const dx = keep(linearBackward(dy.t, x.t, w.t, { dweight, dbias }));
          expect(keep(linearBackward(dy.t, x.t, w.t, { dweight, dbias, dx: false }))).toBeNull();
          expect(dx?.shape).toEqual(x.t.shape);
          const back = (p: TrainReferencePrecision): ReturnType<typeof referenceLinearBackward> => {
            const first = referenceLinearBackward(dy.v, x.v, w.v, rows, inF, outF, { precision: p, dweight: dw0, dbias: db0, dtype });
            const second = referenceLinearBackward(dy.v, x.v, w.v, rows, inF, outF,
              { precision: p, dweight: first.dweight, dbias: first.dbias, dtype });
            return { dx: first.dx, dweight: second.dweight, dbias: second.dbias };
          };
          const r64 = back('float64');
          const rs = back(precision);
          const gdx = await (dx as Tensor).toFloat32Array();
          expectAllWritten(gdx, 'dx');
          rule('dx', gdx, r64.dx, rs.dx, 3);
          rule('dweight', await dweight.toFloat32Array(), r64.dweight, rs.dweight, 3);
          rule('dbias', await dbias.toFloat32Array(), r64.dbias, rs.dbias, 3);
        });
      }
    }
  }

  if (device === 'cuda') {
    test("float32Precision 'highest' reaches float32 accuracy", async () => {
      const rng = rngFor('linear highest');
      const [rows, inF, outF] = [97, 129, 65];
      const x = upload(randn(rows * inF, rng), [rows, inF], 'float32', device);
      const w = upload(randn(outF * inF, rng), [outF, inF], 'float32', device);
      const got = await keep(linear(x.t, w.t, null, { float32Precision: 'highest' })).toFloat32Array();
      const ref = referenceLinear(x.v, w.v, null, rows, inF, outF);
      const same = referenceLinear(x.v, w.v, null, rows, inF, outF, { precision: 'float32' });
      rule('out', got, ref.out, same.out, 2);
    });
  }

  test('only the requested gradients are touched', async () => {
    const rng = rngFor(`linear partial ${device}`);
    const x = upload(randn(7 * 3, rng), [7, 3], 'float32', device);
    const w = upload(randn(5 * 3, rng), [5, 3], 'float32', device);
    const dy = upload(randn(7 * 5, rng), [7, 5], 'float32', device);
    const dbias = keep(Tensor.zeros([5], { device }));
    const dx = keep(linearBackward(dy.t, x.t, w.t, { dbias, dx: false }));
    expect(dx).toBeNull();
    const ref = referenceColumnSum(dy.v, 7, 5);
    rule('dbias', await dbias.toFloat32Array(), ref, referenceColumnSum(dy.v, 7, 5, { precision: 'float32' }), 3);
  });
});

describeEachDevice('crossEntropy', (device) => {
  const cases: Array<[rows: number, vocab: number]> = [[1, 65], [7, 1000], [97, 65], [1025, 65], [97, 1000]];
  const reductions: readonly LossReduction[] = ['mean', 'sum', 'none'];
  for (const dtype of FLOAT_DTYPES) {
    for (const [rows, vocab] of cases) {
      for (const reduction of reductions) {
        test(`${dtype} rows ${rows} vocab ${vocab} ${reduction}`, async () => {
          const rng = rngFor(`ce ${device} ${dtype} ${rows} ${vocab} ${reduction}`);
          const logits = upload(randn(rows * vocab, rng, 3), [...lead(rows), vocab], dtype, device);
          const targets = randomIds(rows, vocab, rng);
          // Every seventh row is ignored (the default index, or a custom one that is a valid class).
          const ignoreIndex = reduction === 'sum' ? 3 : -100;
          for (let r = 0; r < rows; r += 7) if (rows > 1) targets[r] = ignoreIndex;
          const gradScale = reduction === 'none' ? 1 : 0.37;
          const t = ints(targets, lead(rows), device);
          const opts = { reduction, gradScale, ignoreIndex };
          const { loss, dlogits } = crossEntropy(logits.t, t, { ...opts, grad: true });
          keep(loss);
          keep(dlogits);
          expect(loss.shape).toEqual(reduction === 'none' ? lead(rows) : [1]);
          expect(dlogits?.shape).toEqual(logits.t.shape);
          expect(dlogits?.dtype).toBe(dtype);
          const ref = referenceCrossEntropy(logits.v, targets, rows, vocab, opts);
          const same = referenceCrossEntropy(logits.v, targets, rows, vocab, { ...opts, precision: dtype, dtype });
          const gl = await loss.toFloat32Array();
          expectAllWritten(gl, 'loss');
          rule('loss', gl, ref.loss, same.loss, 2);
          const gd = await (dlogits as Tensor).toFloat32Array();
          expectAllWritten(gd, 'dlogits');
          rule('dlogits', gd, ref.dlogits, same.dlogits, 3);
          for (let r = 0; r < rows; r++) {
            if (targets[r] === ignoreIndex) expect(gd.slice(r * vocab, (r + 1) * vocab).every((x) => x === 0)).toBe(true);
          }
          // Without grad: the same loss, no dlogits.
          const plain = crossEntropy(logits.t, t, opts);
          keep(plain.loss);
          expect(plain.dlogits).toBeNull();
          expect(Array.from(await plain.loss.toFloat32Array())).toEqual(Array.from(gl));
        });
      }
    }
  }

  test("'mean' with every row ignored is NaN with zero gradients; a bad target gives a NaN row", async () => {
    const rng = rngFor(`ce edge ${device}`);
    const logits = upload(randn(3 * 65, rng), [3, 65], 'float32', device);
    const ignored = crossEntropy(logits.t, ints(Int32Array.from([-100, -100, -100]), [3], device), { grad: true });
    keep(ignored.loss);
    keep(ignored.dlogits);
    expect((await ignored.loss.toFloat32Array())[0]).toBeNaN();
    expect((await (ignored.dlogits as Tensor).toFloat32Array()).every((x) => x === 0)).toBe(true);

    const bad = crossEntropy(logits.t, ints(Int32Array.from([1, 65, -5]), [3], device), { grad: true, reduction: 'none' });
    keep(bad.loss);
    keep(bad.dlogits);
    const l = await bad.loss.toFloat32Array();
    expect(Number.isFinite(l[0])).toBe(true);
    expect(l[1]).toBeNaN();
    expect(l[2]).toBeNaN();
    const d = await (bad.dlogits as Tensor).toFloat32Array();
    expect(d.slice(0, 65).every(Number.isFinite)).toBe(true);
    expect(d.slice(65).every(Number.isNaN)).toBe(true);
  });
});

describeEachDevice('adamwStep', (device) => {
  const sizes = [1, 7, 1025, 20000];
  for (const dtype of FLOAT_DTYPES) {
    for (const numel of sizes) {
      for (const clip of [false, true]) {
        test(`${dtype} numel ${numel}${clip ? ' with clip' : ''}: four steps`, async () => {
          const rng = rngFor(`adamw ${device} ${dtype} ${numel} ${clip}`);
          const half = dtype !== 'float32';
          const init = randn(numel, rng);
          const param = upload(init, [numel], dtype, device);
          const master = half ? keep(Tensor.fromFloat32Array(init, [numel], { device })) : null;
          const m = keep(Tensor.zeros([numel], { device }));
          const v = keep(Tensor.zeros([numel], { device }));
          const options = { lr: 0.01, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, gradScale: 0.5 };
          type Ref = ReturnType<typeof referenceAdamW>;
          const start = (): Ref => ({
            param: Float64Array.from(param.v), master: Float64Array.from(half ? init : param.v),
            m: new Float64Array(numel), v: new Float64Array(numel),
          });
          let r64 = start();
          let rs = start();
          for (let step = 1; step <= 4; step++) {
            const g = Tensor.fromFloat32Array(randn(numel, rng, 2), [numel], { device });
            keep(g);
            const gv = await g.toFloat32Array();
            let norm: Tensor | undefined;
            let normValue = 0;
            if (clip) {
              norm = keep(gradNorm([g]));
              normValue = (await norm.toFloat32Array())[0];
            }
            const maxNorm = clip ? Math.sqrt(numel) * 0.5 : 0;
            adamwStep({ param: param.t, grad: g, m, v, master }, { ...options, step, ...(norm ? { clip: { norm, maxNorm } } : {}) });
            const refOpts = { ...options, step, dtype, ...(clip ? { clip: { norm: normValue, maxNorm } } : {}) };
            r64 = referenceAdamW({ param: r64.param, master: half ? r64.master : undefined, grad: gv, m: r64.m, v: r64.v }, refOpts);
            rs = referenceAdamW({ param: rs.param, master: half ? rs.master : undefined, grad: gv, m: rs.m, v: rs.v },
              { ...refOpts, precision: dtype });
          }
          rule('m', await m.toFloat32Array(), r64.m, rs.m, 3);
          rule('v', await v.toFloat32Array(), r64.v, rs.v, 3);
          rule('param', await param.t.toFloat32Array(), r64.param, rs.param, 3);
          if (master) rule('master', await master.toFloat32Array(), r64.master, rs.master, 3);
          // The steps moved the weights in place (the same tensor objects read new values). For a
          // half parameter the float32 master is the one that must move: four steps of random sign
          // can leave a single bfloat16 element on its old value after rounding.
          const moved = master ? await master.toFloat32Array() : await param.t.toFloat32Array();
          expect(moved.some((x, i) => x !== (master ? init[i] : param.v[i]))).toBe(true);
        });
      }
    }
  }

  test('clipping scales the step by maxNorm / norm', async () => {
    // The update itself hardly sees a uniform scale of g (m / sqrt(v)); the first moment does:
    // after one step from m = 0, m = (1 - beta1) · g · min(1, maxNorm / (norm + 1e-6)).
    const rng = rngFor(`adamw clip ${device}`);
    const numel = 97;
    const g = keep(Tensor.fromFloat32Array(randn(numel, rng), [numel], { device }));
    const gv = await g.toFloat32Array();
    const norm = keep(gradNorm([g]));
    const nv = (await norm.toFloat32Array())[0];
    const param = keep(Tensor.fromFloat32Array(randn(numel, rng), [numel], { device }));
    const m = keep(Tensor.zeros([numel], { device }));
    const v = keep(Tensor.zeros([numel], { device }));
    adamwStep({ param, grad: g, m, v }, { lr: 1e-3, beta1: 0.5, step: 1, clip: { norm, maxNorm: nv / 4 } });
    const got = await m.toFloat32Array();
    const clip = (nv / 4) / (nv + 1e-6);
    for (let i = 0; i < numel; i++) expect(got[i]).toBeCloseTo(0.5 * gv[i] * clip, 5);
  });
});

describeEachDevice('reductions', (device) => {
  for (const dtype of FLOAT_DTYPES) {
    for (const numel of [1, 7, 1025, 393600]) {
      test(`sum ${dtype} numel ${numel}`, async () => {
        const rng = rngFor(`sum ${device} ${dtype} ${numel}`);
        const x = upload(randn(numel, rng), [numel], dtype, device);
        const out = keep(sum(x.t));
        expect(out.shape).toEqual([1]);
        const got = await out.toFloat32Array();
        let l1 = 0;
        for (const e of x.v) l1 += Math.abs(e);
        expectFlashRule({
          name: 'sum', actual: got, reference: [referenceSum(x.v)], samePrecision: [referenceSum(x.v, { precision: dtype })],
          factor: 2, atol: 1e-7 * l1,
        });
      });
    }
    const shapes: Array<[rows: number, cols: number]> = [[1, 1], [7, 3], [97, 65], [1025, 129], [300, 384], [257, 1]];
    for (const [rows, cols] of shapes) {
      test(`columnSum ${dtype} [${rows}, ${cols}], new and accumulated twice`, async () => {
        const rng = rngFor(`colsum ${device} ${dtype} ${rows} ${cols}`);
        const x = upload(randn(rows * cols, rng), [...lead(rows), cols], dtype, device);
        const fresh = keep(columnSum(x.t));
        expect(fresh.shape).toEqual([cols]);
        const got = await fresh.toFloat32Array();
        expectAllWritten(got, 'columnSum');
        rule('columnSum', got, referenceColumnSum(x.v, rows, cols), referenceColumnSum(x.v, rows, cols, { precision: 'float32' }), 2);
        const out0 = randn(cols, rng);
        const out = keep(Tensor.fromFloat32Array(out0, [cols], { device }));
        expect(columnSum(x.t, out)).toBe(out);
        columnSum(x.t, out);
        const twice = (p: TrainReferencePrecision): Float64Array =>
          referenceColumnSum(x.v, rows, cols, { precision: p, out: referenceColumnSum(x.v, rows, cols, { precision: p, out: out0 }) });
        rule('columnSum +=', await out.toFloat32Array(), twice('float64'), twice('float32'), 2);
      });
    }
  }

  test('integer-valued inputs sum exactly (every element counted once)', async () => {
    const rng = rngFor(`exact ${device}`);
    const rows = 1025;
    const cols = 65;
    const data = new Float32Array(rows * cols);
    for (let i = 0; i < data.length; i++) data[i] = rng.int(17) - 8;
    const x = keep(Tensor.fromFloat32Array(data, [rows, cols], { device, dtype: 'bfloat16' }));
    expect((await keep(sum(x)).toFloat32Array())[0]).toBe(referenceSum(data));
    expect(Array.from(await keep(columnSum(x)).toFloat32Array())).toEqual(Array.from(referenceColumnSum(data, rows, cols)));
    expect((await keep(gradNorm([x])).toFloat32Array())[0]).toBeCloseTo(referenceGradNorm([data]), 2);
  });

  test('gradNorm over tensors of mixed dtypes and shapes', async () => {
    const rng = rngFor(`gradnorm ${device}`);
    const parts = [
      upload(randn(97 * 65, rng), [97, 65], 'float32', device),
      upload(randn(20000, rng), [20000], 'bfloat16', device),
      upload(randn(21, rng), [7, 3], 'float16', device),
      upload(randn(1, rng), [1], 'float32', device),
    ];
    const out = keep(gradNorm(parts.map((p) => p.t)));
    expect(out.shape).toEqual([1]);
    expect(out.dtype).toBe('float32');
    const values = parts.map((p) => p.v);
    rule('gradNorm', await out.toFloat32Array(), [referenceGradNorm(values)], [referenceGradNorm(values, { precision: 'float32' })], 2);
  });
});

describeEachDevice('linear + cross-entropy gradients (finite differences)', (device) => {
  test('the directional derivatives of the loss match the analytic gradients (float32)', async () => {
    const rng = rngFor(`fd ${device}`);
    const [rows, inF, vocab] = [6, 4, 5];
    const options: LinearOptions = { float32Precision: 'highest' };
    const x = keep(Tensor.fromFloat32Array(randn(rows * inF, rng), [rows, inF], { device }));
    const wv = randn(vocab * inF, rng);
    const bv = randn(vocab, rng);
    const targets = ints(Int32Array.from([0, 4, -100, 2, 1, 3]), [rows], device);
    const lossAt = async (w: Float32Array, b: Float32Array): Promise<number> => {
      const wt = keep(Tensor.fromFloat32Array(w, [vocab, inF], { device }));
      const bt = keep(Tensor.fromFloat32Array(b, [vocab], { device }));
      const logits = keep(linear(x, wt, bt, options));
      const { loss } = crossEntropy(logits, targets);
      keep(loss);
      return (await loss.toFloat32Array())[0];
    };
    const w = keep(Tensor.fromFloat32Array(wv, [vocab, inF], { device }));
    const b = keep(Tensor.fromFloat32Array(bv, [vocab], { device }));
    const logits = keep(linear(x, w, b, options));
    const { loss, dlogits } = crossEntropy(logits, targets, { grad: true });
    keep(loss);
    keep(dlogits);
    const dweight = keep(Tensor.zeros([vocab, inF], { device }));
    const dbias = keep(Tensor.zeros([vocab], { device }));
    keep(linearBackward(dlogits as Tensor, x, w, { dweight, dbias, dx: false }, options));
    const dw = await dweight.toFloat32Array();
    const db = await dbias.toFloat32Array();
    const uw = randn(vocab * inF, rng);
    const ub = randn(vocab, rng);
    const h = 1e-2;
    const step = (s: number): [Float32Array, Float32Array] =>
      [wv.map((e, i) => e + s * h * uw[i]), bv.map((e, i) => e + s * h * ub[i])];
    const numeric = ((await lossAt(...step(1))) - (await lossAt(...step(-1)))) / (2 * h);
    let analytic = 0;
    for (let i = 0; i < dw.length; i++) analytic += dw[i] * uw[i];
    for (let i = 0; i < db.length; i++) analytic += db[i] * ub[i];
    expect(Math.abs(numeric - analytic)).toBeLessThan(2e-3 * Math.max(1, Math.abs(analytic)));
  });
});

describeEachDevice('tensor arguments at an element offset (the raw bindings)', (device) => {
  test('ops read and write from the offset, and only the extent they were given', async () => {
    const rng = rngFor(`offsets ${device}`);
    const b = binding();
    const data = randn(20, rng);
    const x = keep(Tensor.fromFloat32Array(data, [20], { device }));
    const [buf] = storageOf(x, 'x');
    // sum of elements [5, 12)
    const s = keep(wrap(b.sum([buf, 5], 7), [1], device));
    expect((await s.toFloat32Array())[0]).toBeCloseTo(referenceSum(data.slice(5, 12)), 5);
    // column sums of the [3, 4] matrix at element 8, added into out[2..6) of a [10] accumulator
    const out0 = randn(10, rng);
    const out = keep(Tensor.fromFloat32Array(out0, [10], { device }));
    b.columnSum([buf, 8], 3, 4, [storageOf(out, 'out')[0], 2]);
    const got = await out.toFloat32Array();
    const ref = referenceColumnSum(data.slice(8, 20), 3, 4, { out: out0.slice(2, 6) });
    for (let c = 0; c < 10; c++) {
      if (c >= 2 && c < 6) expect(got[c]).toBeCloseTo(ref[c - 2], 5);
      else expect(got[c]).toBe(out0[c]);
    }
    // embedding of ids [1, 4) of an id tensor, from a table stored at element 6
    const ids = ints(Int32Array.from([9, 0, 2, 1, 9]), [5], device);
    const e = keep(wrap(b.embeddingForward([storageOf(ids, 'ids')[0], 1], [buf, 6], 3, 3, 4), [3, 4], device));
    expect(Array.from(await e.toFloat32Array())).toEqual(Array.from(referenceEmbedding([0, 2, 1], data.slice(6, 18), 3, 4)));
    // AdamW on elements [3, 7) of a parameter: the others stay as they were
    const param = keep(Tensor.fromFloat32Array(data, [20], { device }));
    const grad = keep(Tensor.fromFloat32Array(randn(4, rng), [4], { device }));
    const m = keep(Tensor.zeros([4], { device }));
    const v = keep(Tensor.zeros([4], { device }));
    const view = (t: Tensor): NativeView => storageOf(t, 't');
    b.adamwStep([storageOf(param, 'param')[0], 3], view(grad), view(m), view(v), null, 4, 0.1, 0.9, 0.999, 1e-8, 0, 1, 1, null, 0);
    const p = await param.toFloat32Array();
    for (let i = 0; i < 20; i++) {
      if (i >= 3 && i < 7) expect(p[i]).not.toBe(data[i]);
      else expect(p[i]).toBe(data[i]);
    }
  });
});

describeEachDevice('determinism', (device) => {
  test('reductions and the embedding backward give the same bits twice', async () => {
    const rng = rngFor(`determinism ${device}`);
    const rows = 1025;
    const dim = 129;
    const vocab = 65;
    const x = upload(randn(rows * dim, rng), [rows, dim], 'bfloat16', device);
    const ids = ints(randomIds(rows, vocab, rng), [rows], device);
    const run = async (): Promise<Float32Array[]> => {
      const dtable = keep(Tensor.zeros([vocab, dim], { device }));
      embeddingBackward(ids, x.t, dtable);
      return Promise.all([
        keep(sum(x.t)).toFloat32Array(), keep(columnSum(x.t)).toFloat32Array(), keep(gradNorm([x.t, dtable])).toFloat32Array(),
        dtable.toFloat32Array(),
      ]);
    };
    const first = await run();
    const second = await run();
    for (let i = 0; i < first.length; i++) expect(second[i]).toEqual(first[i]);
  });
});

/** A float32 tensor on a buffer a raw binding returned. */
function wrap(buf: NativeBuffer, shape: number[], device: Device): Tensor {
  return wrapNative(buf, shape, 'float32', device);
}
