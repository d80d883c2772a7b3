/**
 * lib/reference.ts: the float64 reference attention (forward, backward, same-precision mode), checked
 * by hand-computed cases, an independent direct implementation, finite differences and invariants.
 * Also exercises the test helpers (random.ts, tolerance.ts) that the backend tests rely on.
 */

import { DType, roundToDtype } from '../lib/half';
import { dropoutKeep } from '../lib/dropout';
import {
  referenceAttention,
  referenceAttentionBackward,
  ReferenceInput,
  ReferenceOptions,
  ReferencePrecision,
  ReferenceShape,
  roundToTf32,
} from '../lib/reference';
import { currentSeed, randn, randu, Rng, rngFor, seedHint } from './helpers/random';
import {
  checkFlashRule,
  decodeIndex,
  expectAllWritten,
  expectFlashRule,
  maxAbsDiff,
} from './helpers/tolerance';

// ----------------------------------------------------------------------------------------------
// helpers local to this file
// ----------------------------------------------------------------------------------------------

const qSize = (s: ReferenceShape) => s.batch * s.seqlenQ * s.headsQ * s.headDim;
const kSize = (s: ReferenceShape) => s.batch * s.seqlenK * s.headsKV * s.headDim;

interface Inputs {
  q: Float64Array;
  k: Float64Array;
  v: Float64Array;
  dout: Float64Array;
}

function randomInputs(shape: ReferenceShape, rng: Rng, std = 1): Inputs {
  return {
    q: Float64Array.from(randn(qSize(shape), rng, std)),
    k: Float64Array.from(randn(kSize(shape), rng, std)),
    v: Float64Array.from(randn(kSize(shape), rng)),
    dout: Float64Array.from(randn(qSize(shape), rng)),
  };
}

/** Flat index into [B, S, H, d]. */
const at = (b: number, s: number, h: number, c: number, S: number, H: number, d: number) => ((b * S + s) * H + h) * d + c;

/**
 * Direct, deliberately unoptimised attention: mask by explicit condition, exp without max
 * subtraction (fine for moderate scores), sum, divide. Independent of lib/reference.ts.
 */
function directAttention(q: ReferenceInput, k: ReferenceInput, v: ReferenceInput, sh: ReferenceShape, causal: boolean, scale: number,
  window: [number, number] = [-1, -1], softcap = 0, alibi: ArrayLike<number> | null = null, sinks: ArrayLike<number> | null = null) {
  const { batch: B, seqlenQ: Sq, seqlenK: Sk, headsQ: Hq, headsKV: Hkv, headDim: d } = sh;
  const out = new Float64Array(qSize(sh));
  const lse = new Float64Array(B * Hq * Sq);
  for (let b = 0; b < B; b++)
    for (let h = 0; h < Hq; h++) {
      const kh = Math.floor(h / (Hq / Hkv));
      for (let i = 0; i < Sq; i++) {
        let sum = 0;
        const w = new Float64Array(Sk);
        for (let j = 0; j < Sk; j++) {
          if (causal && j > i + Sk - Sq) continue;
          if (window[0] >= 0 && j < i + Sk - Sq - window[0]) continue;
          if (window[1] >= 0 && j > i + Sk - Sq + window[1]) continue;
          let dot = 0;
          for (let c = 0; c < d; c++) dot += q[at(b, i, h, c, Sq, Hq, d)] * k[at(b, j, kh, c, Sk, Hkv, d)];
          const capped = softcap > 0 ? softcap * Math.tanh((scale * dot) / softcap) : scale * dot;
          const slope = alibi === null ? 0 : alibi.length === Hq ? alibi[h] : alibi[b * Hq + h];
          w[j] = Math.exp(capped - slope * Math.abs(i + Sk - Sq - j));
          sum += w[j];
        }
        if (sinks !== null) sum += Math.exp(sinks[h]); // a key without a value
        lse[(b * Hq + h) * Sq + i] = Math.log(sum); // log(0) = -Infinity for empty rows; fixed below
        if (sum === 0) {
          lse[(b * Hq + h) * Sq + i] = Infinity;
          continue;
        }
        for (let c = 0; c < d; c++) {
          let o = 0;
          for (let j = 0; j < Sk; j++) o += (w[j] / sum) * v[at(b, j, kh, c, Sk, Hkv, d)];
          out[at(b, i, h, c, Sq, Hq, d)] = o;
        }
      }
    }
  return { out, lse };
}

/** Head h of a [B, S, H, d] array as a [B, S, 1, d] array. */
function sliceHead(x: Float64Array, B: number, S: number, H: number, d: number, h: number): Float64Array {
  const y = new Float64Array(B * S * d);
  for (let b = 0; b < B; b++) for (let s = 0; s < S; s++) for (let c = 0; c < d; c++) y[(b * S + s) * d + c] = x[at(b, s, h, c, S, H, d)];
  return y;
}

function maxAbs(a: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]));
  return m;
}

function relErr(a: ArrayLike<number>, ref: ArrayLike<number>): number {
  return maxAbsDiff(a, ref) / maxAbs(ref);
}

/** Central finite differences of `loss` with respect to each element of xs[which], the others fixed. */
function finiteDifferences(xs: Float64Array[], which: number, loss: (xs: Float64Array[]) => number, h = 1e-5): Float64Array {
  const at = xs.map((x) => x.slice());
  const x = at[which];
  const grad = new Float64Array(x.length);
  for (let e = 0; e < x.length; e++) {
    const x0 = x[e];
    x[e] = x0 + h;
    const lp = loss(at);
    x[e] = x0 - h;
    const lm = loss(at);
    x[e] = x0;
    grad[e] = (lp - lm) / (2 * h);
  }
  return grad;
}

/**
 * L = sum(out ∘ W) of the forward on xs = [q, k, v] (and xs[3] as the sinks, with `withSinks`): the loss
 * whose gradients the backward gives for dout = W.
 */
function weightedLoss(W: Float64Array, shape: ReferenceShape, opts: ReferenceOptions, withSinks = false) {
  return (xs: Float64Array[]): number => {
    const { out } = referenceAttention(xs[0], xs[1], xs[2], shape, withSinks ? { ...opts, sinks: xs[3] } : opts);
    let L = 0;
    for (let i = 0; i < out.length; i++) L += out[i] * W[i];
    return L;
  };
}

/** Each named gradient is a real one (not zeros) within 1e-6 relative of its finite differences. */
function expectGradients(name: string, grads: ReadonlyArray<readonly [string, Float64Array, Float64Array]>): void {
  for (const [n, analytic, numeric] of grads) {
    expect(maxAbs(analytic)).toBeGreaterThan(1e-3); // a real gradient, not zeros
    const rel = relErr(analytic, numeric);
    if (!(rel <= 1e-6)) throw new Error(`${name} ${n}: relative error vs finite differences ${rel}; ${seedHint()}`);
  }
}

function expectClose(a: ArrayLike<number>, b: ArrayLike<number>, tol: number, what: string): void {
  const e = maxAbsDiff(a, b);
  if (!(e <= tol)) throw new Error(`${what}: max abs diff ${e} > ${tol}; ${seedHint()}`);
}

// ----------------------------------------------------------------------------------------------
// Forward: hand-computed cases
// ----------------------------------------------------------------------------------------------

describe('forward, by hand', () => {
  test('1 query, 2 keys with known scores', () => {
    // d = 2, scale 0.5: s0 = 0.5·(1·1 + 2·0) = 0.5, s1 = 0.5·(1·0 + 2·1) = 1
    const shape = { batch: 1, seqlenQ: 1, seqlenK: 2, headsQ: 1, headsKV: 1, headDim: 2 };
    const q = [1, 2];
    const k = [1, 0, 0, 1];
    const v = [1, 2, 3, -1];
    const { out, lse } = referenceAttention(q, k, v, shape, { softmaxScale: 0.5 });
    const e0 = Math.exp(0.5);
    const e1 = Math.exp(1);
    const p0 = e0 / (e0 + e1);
    const p1 = e1 / (e0 + e1);
    expect(lse[0]).toBeCloseTo(1.4740769841801067, 14); // ln(e^0.5 + e^1)
    expect(lse[0]).toBeCloseTo(Math.log(e0 + e1), 14);
    expect(out[0]).toBeCloseTo(p0 * 1 + p1 * 3, 14);
    expect(out[1]).toBeCloseTo(p0 * 2 + p1 * -1, 14);
    expect(out[0]).toBeCloseTo(2.2449186624037093, 13); // (e^0.5 + 3e) / (e^0.5 + e)
  });

  test('uniform scores give the mean of V and lse = log(seqlenK)', () => {
    const shape = { batch: 1, seqlenQ: 2, seqlenK: 4, headsQ: 1, headsKV: 1, headDim: 3 };
    const q = [0, 0, 0, 0, 0, 0]; // all scores 0
    const k = [1, 2, 3, -1, 0.5, 2, 7, 7, 7, 0, 1, 0];
    const v = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12];
    const { out, lse } = referenceAttention(q, k, v, shape);
    const mean = [(1 + 4 + 7 + 10) / 4, (2 + 5 + 8 + 11) / 4, (3 + 6 + 9 + 12) / 4];
    expect(Array.from(out)).toEqual([...mean, ...mean].map((x) => expect.closeTo(x, 14)));
    expect(lse[0]).toBeCloseTo(Math.log(4), 15);
    expect(lse[1]).toBeCloseTo(Math.log(4), 15);
  });

  test('causal, seqlenQ > seqlenK: the first row is empty (out 0, lse +Inf), the others by hand', () => {
    // Sq = 3, Sk = 2: row i sees j <= i - 1. Row 0: none; row 1: key 0; row 2: keys 0, 1.
    const shape = { batch: 1, seqlenQ: 3, seqlenK: 2, headsQ: 1, headsKV: 1, headDim: 1 };
    const q = [5, 2, 1];
    const k = [1, -1];
    const v = [10, 20];
    const { out, lse } = referenceAttention(q, k, v, shape, { causal: true, softmaxScale: 1 });
    expect(out[0]).toBe(0);
    expect(lse[0]).toBe(Infinity);
    expect(out[1]).toBeCloseTo(10, 14); // only key 0
    expect(lse[1]).toBeCloseTo(2, 14); // score 2·1
    const p0 = Math.exp(1) / (Math.exp(1) + Math.exp(-1));
    expect(out[2]).toBeCloseTo(10 * p0 + 20 * (1 - p0), 13);
    expect(lse[2]).toBeCloseTo(Math.log(Math.exp(1) + Math.exp(-1)), 14);
  });

  test('causal, seqlenQ < seqlenK: bottom-right alignment by hand', () => {
    // Sq = 2, Sk = 3: row 0 sees keys 0, 1; row 1 sees keys 0, 1, 2.
    const shape = { batch: 1, seqlenQ: 2, seqlenK: 3, headsQ: 1, headsKV: 1, headDim: 1 };
    const q = [1, 1];
    const k = [0, 0, 0]; // uniform scores
    const v = [3, 6, 30];
    const { out, lse } = referenceAttention(q, k, v, shape, { causal: true });
    expect(out[0]).toBeCloseTo(4.5, 14); // mean of 3, 6
    expect(out[1]).toBeCloseTo(13, 14); // mean of 3, 6, 30
    expect(lse[0]).toBeCloseTo(Math.log(2), 15);
    expect(lse[1]).toBeCloseTo(Math.log(3), 15);
  });

  test.each([
    [3, 2, [[0, 0], [1, 0], [1, 1]]],
    [2, 4, [[1, 1, 1, 0], [1, 1, 1, 1]]],
    [3, 3, [[1, 0, 0], [1, 1, 0], [1, 1, 1]]],
    [4, 1, [[0], [0], [0], [1]]],
  ])('causal mask Sq=%i Sk=%i equals the hand-written visibility matrix (probed by perturbing v)', (Sq, Sk, vis) => {
    const shape = { batch: 1, seqlenQ: Sq, seqlenK: Sk, headsQ: 1, headsKV: 1, headDim: 2 };
    const rng = rngFor(`mask-${Sq}-${Sk}`);
    const { q, k, v } = randomInputs(shape, rng);
    const base = referenceAttention(q, k, v, shape, { causal: true });
    const seen: number[][] = [];
    for (let i = 0; i < Sq; i++) seen.push(new Array<number>(Sk).fill(0));
    for (let j = 0; j < Sk; j++) {
      const v2 = v.slice();
      v2[j * 2] += 1;
      const pert = referenceAttention(q, k, v2, shape, { causal: true });
      for (let i = 0; i < Sq; i++) seen[i][j] = pert.out[i * 2] !== base.out[i * 2] ? 1 : 0;
    }
    expect(seen).toEqual(vis);
    for (let i = 0; i < Sq; i++) {
      const empty = vis[i].every((x) => x === 0);
      expect(Number.isFinite(base.lse[i])).toBe(!empty);
      if (empty) {
        expect(base.lse[i]).toBe(Infinity);
        expect([base.out[i * 2], base.out[i * 2 + 1]]).toEqual([0, 0]);
      }
    }
  });
});

// ----------------------------------------------------------------------------------------------
// Forward: against the direct implementation, scale, GQA, stability
// ----------------------------------------------------------------------------------------------

describe('forward, general', () => {
  const shapes: Array<[string, ReferenceShape]> = [
    ['MHA', { batch: 2, seqlenQ: 5, seqlenK: 7, headsQ: 3, headsKV: 3, headDim: 4 }],
    ['GQA', { batch: 1, seqlenQ: 6, seqlenK: 6, headsQ: 4, headsKV: 2, headDim: 8 }],
    ['MQA Sq>Sk', { batch: 2, seqlenQ: 9, seqlenK: 4, headsQ: 3, headsKV: 1, headDim: 3 }],
  ];

  test.each(shapes.flatMap(([n, s]) => [[n, false, s] as const, [n, true, s] as const]))(
    '%s causal=%s: out and lse = log(sum(exp)) match the direct computation',
    (name, causal, shape) => {
      const { q, k, v } = randomInputs(shape, rngFor(`direct-${name}-${causal}`));
      const scale = 0.37;
      const ref = referenceAttention(q, k, v, shape, { causal, softmaxScale: scale });
      const dir = directAttention(q, k, v, shape, causal, scale);
      expectClose(ref.out, dir.out, 1e-13, 'out');
      expectClose(ref.lse, dir.lse, 1e-13, 'lse');
      expect(ref.lse.some((x) => x === Infinity)).toBe(causal && shape.seqlenQ > shape.seqlenK);
    },
  );

  test('inputs as Float32Array, Float64Array and number[] give the same result', () => {
    const shape = shapes[1][1];
    const rng = rngFor('input-kinds');
    const q32 = randn(qSize(shape), rng);
    const k32 = randn(kSize(shape), rng);
    const v32 = randn(kSize(shape), rng);
    const a = referenceAttention(q32, k32, v32, shape, { causal: true });
    const b = referenceAttention(Float64Array.from(q32), Float64Array.from(k32), Float64Array.from(v32), shape, { causal: true });
    const c = referenceAttention(Array.from(q32), Array.from(k32), Array.from(v32), shape, { causal: true });
    expect(a.out).toEqual(b.out);
    expect(a.out).toEqual(c.out);
    expect(a.lse).toEqual(c.lse);
  });

  test('softmaxScale is respected; the default is 1/sqrt(headDim)', () => {
    const shape = { batch: 1, seqlenQ: 4, seqlenK: 5, headsQ: 2, headsKV: 1, headDim: 16 };
    const { q, k, v } = randomInputs(shape, rngFor('scale'));
    const def = referenceAttention(q, k, v, shape);
    const explicit = referenceAttention(q, k, v, shape, { softmaxScale: 1 / Math.sqrt(16) });
    expect(def.out).toEqual(explicit.out);
    expect(def.lse).toEqual(explicit.lse);
    // scale c on q and 1/c on the softmax scale cancel
    const c = 3;
    const q3 = q.map((x) => x * c);
    const moved = referenceAttention(q3, k, v, shape, { softmaxScale: 0.25 / c });
    expectClose(moved.out, def.out, 1e-13, 'out with moved scale');
    expectClose(moved.lse, def.lse, 1e-13, 'lse with moved scale');
    // a different scale changes the result
    const other = referenceAttention(q, k, v, shape, { softmaxScale: 0.5 });
    expect(maxAbsDiff(other.out, def.out)).toBeGreaterThan(1e-3);
  });

  test('GQA equals running each query head against its kv head', () => {
    const sh = { batch: 2, seqlenQ: 5, seqlenK: 4, headsQ: 6, headsKV: 2, headDim: 3 };
    const { q, k, v, dout } = randomInputs(sh, rngFor('gqa'));
    for (const causal of [false, true]) {
      const full = referenceAttentionBackward(dout, q, k, v, sh, { causal });
      const one = { ...sh, headsQ: 1, headsKV: 1 };
      const dkSum = [new Float64Array(sh.batch * sh.seqlenK * sh.headDim), new Float64Array(sh.batch * sh.seqlenK * sh.headDim)];
      const dvSum = [new Float64Array(dkSum[0].length), new Float64Array(dkSum[0].length)];
      for (let h = 0; h < sh.headsQ; h++) {
        const kh = Math.floor(h / 3);
        const r = referenceAttentionBackward(
          sliceHead(dout, sh.batch, sh.seqlenQ, sh.headsQ, sh.headDim, h),
          sliceHead(q, sh.batch, sh.seqlenQ, sh.headsQ, sh.headDim, h),
          sliceHead(k, sh.batch, sh.seqlenK, sh.headsKV, sh.headDim, kh),
          sliceHead(v, sh.batch, sh.seqlenK, sh.headsKV, sh.headDim, kh),
          one,
          { causal },
        );
        expectClose(r.out, sliceHead(full.out, sh.batch, sh.seqlenQ, sh.headsQ, sh.headDim, h), 1e-14, `out head ${h}`);
        expectClose(r.dq, sliceHead(full.dq, sh.batch, sh.seqlenQ, sh.headsQ, sh.headDim, h), 1e-14, `dq head ${h}`);
        for (let b = 0; b < sh.batch; b++)
          for (let i = 0; i < sh.seqlenQ; i++) expect(r.lse[b * sh.seqlenQ + i]).toBe(full.lse[(b * sh.headsQ + h) * sh.seqlenQ + i]);
        for (let x = 0; x < r.dk.length; x++) {
          dkSum[kh][x] += r.dk[x];
          dvSum[kh][x] += r.dv[x];
        }
      }
      for (let kh = 0; kh < 2; kh++) {
        expectClose(dkSum[kh], sliceHead(full.dk, sh.batch, sh.seqlenK, sh.headsKV, sh.headDim, kh), 1e-13, `dk kv head ${kh}`);
        expectClose(dvSum[kh], sliceHead(full.dv, sh.batch, sh.seqlenK, sh.headsKV, sh.headDim, kh), 1e-13, `dv kv head ${kh}`);
      }
    }
  });

  test.each([
    ['all scores very negative', -1],
    ['mixed huge positive and negative scores', 0],
  ])('large scores (%s): stable, finite, lse within [max, max + log n]', (_, mode) => {
    // q > 0 everywhere; keys < 0 (mode -1) or alternating sign by key (mode 0): |score| >= 4·20·20
    const shape = { batch: 1, seqlenQ: 3, seqlenK: 5, headsQ: 1, headsKV: 1, headDim: 4 };
    const rng = rngFor(`large-${mode}`);
    const q = Float64Array.from(randu(12, 20, 40, rng));
    const k = Float64Array.from(randu(20, 20, 40, rng)).map((x, e) => (mode === -1 || Math.floor(e / 4) % 2 === 1 ? -x : x));
    const v = Float64Array.from(randn(20, rng));
    const dout = Float64Array.from(randn(12, rng));
    const r = referenceAttentionBackward(dout, q, k, v, shape, { softmaxScale: 1 });
    for (const a of [r.out, r.lse, r.dq, r.dk, r.dv]) expect(a.every(Number.isFinite)).toBe(true);
    for (let i = 0; i < 3; i++) {
      let m = -Infinity;
      for (let j = 0; j < 5; j++) {
        let s = 0;
        for (let c = 0; c < 4; c++) s += q[i * 4 + c] * k[j * 4 + c];
        expect(Math.abs(s)).toBeGreaterThanOrEqual(1600); // the test really has large scores
        m = Math.max(m, s);
      }
      expect(Math.sign(m)).toBe(mode === -1 ? -1 : 1);
      expect(r.lse[i]).toBeGreaterThanOrEqual(m);
      expect(r.lse[i]).toBeLessThanOrEqual(m + Math.log(5));
      // out is a convex combination of the rows of v
      for (let c = 0; c < 4; c++) {
        const col = [0, 1, 2, 3, 4].map((j) => v[j * 4 + c]);
        expect(r.out[i * 4 + c]).toBeGreaterThanOrEqual(Math.min(...col) - 1e-12);
        expect(r.out[i * 4 + c]).toBeLessThanOrEqual(Math.max(...col) + 1e-12);
      }
    }
  });

  const shapeOf = () => ({ batch: 1, seqlenQ: 2, seqlenK: 2, headsQ: 2, headsKV: 1, headDim: 2 });

  test('validation: bad shapes, lengths and options throw', () => {
    const shape = { batch: 1, seqlenQ: 2, seqlenK: 2, headsQ: 2, headsKV: 1, headDim: 2 };
    const q = new Float64Array(8);
    const k = new Float64Array(4);
    expect(() => referenceAttention(q, k, k, shape)).not.toThrow();
    expect(() => referenceAttention(q.subarray(1), k, k, shape)).toThrow(RangeError);
    expect(() => referenceAttention(q, k, new Float64Array(5), shape)).toThrow(RangeError);
    expect(() => referenceAttention(q, k, k, { ...shape, headsKV: 3 })).toThrow(RangeError);
    expect(() => referenceAttention(q, k, k, { ...shape, headDim: 0 })).toThrow(RangeError);
    expect(() => referenceAttention(q, k, k, { ...shape, batch: 1.5 })).toThrow(RangeError);
    expect(() => referenceAttention(q, k, k, shape, { softmaxScale: NaN })).toThrow(RangeError);
    expect(() => referenceAttention(q, k, k, shape, { softmaxScale: -1 })).toThrow(RangeError);
    expect(() => referenceAttention(q, k, k, shape, { precision: 'int8' as unknown as DType })).toThrow(TypeError);
    expect(() => referenceAttentionBackward(q.subarray(2), q, k, k, shape)).toThrow(RangeError);
  });

  // Each refusal names the argument, what was expected and what was received; a typo in a key or a
  // non-boolean causal flag must not fall back to a default (a silently wrong reference).
  test.each([
    ['an unknown option key', shapeOf(), { causl: true },
      new TypeError("Expected options to have only the keys 'causal', 'softmaxScale', 'window', 'softcap', 'alibiSlopes', 'sinks', 'dropout', 'seed', 'offset', 'cuSeqlensQ', 'cuSeqlensK', 'seqlens' or 'precision' but received unknown key 'causl'")],
    ['an unknown shape key', { ...shapeOf(), seqlen: 2 }, undefined,
      new TypeError("Expected shape to have only the keys 'batch', 'seqlenQ', 'seqlenK', 'headsQ', 'headsKV' or 'headDim' but received unknown key 'seqlen'")],
    ['a non-boolean causal', shapeOf(), { causal: 'yes' },
      new TypeError('Expected options.causal to be a boolean but received "yes" of type string')],
    ['a string softmaxScale', shapeOf(), { softmaxScale: '0.5' },
      new TypeError('Expected options.softmaxScale to be a number but received "0.5" of type string')],
    ['a zero softmaxScale', shapeOf(), { softmaxScale: 0 },
      new RangeError('Expected options.softmaxScale to be a finite number > 0 but received 0')],
    ['an unknown precision', shapeOf(), { precision: 'int8' },
      new TypeError("Expected options.precision to be 'float64', 'float32', 'float16', 'bfloat16' or 'tf32' but received \"int8\" of type string")],
    ['options that are not an object', shapeOf(), [],
      new TypeError('Expected options to be an object or undefined but received an Array of length 0')],
    ['a fractional size', { ...shapeOf(), batch: 1.5 }, undefined,
      new RangeError('Expected shape.batch to be an integer >= 1 but received 1.5')],
    ['a string size', { ...shapeOf(), headDim: '2' }, undefined,
      new TypeError('Expected shape.headDim to be a number but received "2" of type string')],
    ['headsQ not a multiple of headsKV', { ...shapeOf(), headsKV: 3 }, undefined,
      new RangeError('Expected shape.headsQ to be a multiple of shape.headsKV (3) but received 2')],
    ['a window that is not a pair', shapeOf(), { window: [3] },
      new TypeError('Expected options.window to be [left, right], integers >= -1 (-1: unbounded) but received an Array of length 1')],
    ['a window side below -1', shapeOf(), { window: [2, -2] },
      new RangeError('Expected options.window to be [left, right], integers >= -1 (-1: unbounded) but received [2, -2]')],
    ['a fractional window side', shapeOf(), { window: [1.5, 0] },
      new RangeError('Expected options.window to be [left, right], integers >= -1 (-1: unbounded) but received [1.5, 0]')],
    ['a string window side', shapeOf(), { window: ['1', 0] },
      new TypeError('Expected options.window to be [left, right], integers >= -1 (-1: unbounded) but received an element "1" of type string')],
    ['a negative softcap', shapeOf(), { softcap: -1 },
      new RangeError('Expected options.softcap to be a finite number >= 0 (0: no softcap) but received -1')],
    ['an infinite softcap', shapeOf(), { softcap: Infinity },
      new RangeError('Expected options.softcap to be a finite number >= 0 (0: no softcap) but received Infinity')],
    ['ALiBi slopes of the wrong length', shapeOf(), { alibiSlopes: [0.5, 0.25, 0.125] },
      new RangeError('Expected options.alibiSlopes to have 2 elements ([headsQ] or [batch, headsQ]) but received 3')],
    ['a non-finite ALiBi slope', shapeOf(), { alibiSlopes: [0.5, NaN] },
      new RangeError('Expected options.alibiSlopes to hold finite values but received NaN at index 1')],
    ['sinks of the wrong kind', shapeOf(), { sinks: new Int32Array(2) },
      new TypeError('Expected options.sinks to be a Float32Array, Float64Array or number[] but received an Int32Array')],
    ['sinks of the wrong length', shapeOf(), { sinks: [1] },
      new RangeError('Expected options.sinks to have 2 elements ([headsQ]) but received 1')],
    ['an infinite sink', shapeOf(), { sinks: [-Infinity, 0] },
      new RangeError('Expected options.sinks to hold finite values but received -Infinity at index 0')],
    ['cuSeqlensQ without cuSeqlensK', shapeOf(), { cuSeqlensQ: [0, 2] },
      new TypeError('Expected options.cuSeqlensQ and options.cuSeqlensK to be given together but received only cuSeqlensQ')],
    ['prefix sums of the wrong length', shapeOf(), { cuSeqlensQ: [0, 1, 2], cuSeqlensK: [0, 2] },
      new RangeError('Expected options.cuSeqlensQ to have shape.batch + 1 = 2 elements but received 3')],
    ['prefix sums not from 0', shapeOf(), { cuSeqlensQ: [1, 2], cuSeqlensK: [0, 2] },
      new RangeError('Expected options.cuSeqlensQ[0] to be 0 but received 1')],
    ['a sequence longer than the shape allows', shapeOf(), { cuSeqlensQ: [0, 2], cuSeqlensK: [0, 3] },
      new RangeError("Expected sequence 0's length options.cuSeqlensK[1] − options.cuSeqlensK[0] to be from 0 to shape.seqlenK = 2 but received 3")],
    ['decreasing prefix sums', { ...shapeOf(), batch: 2 }, { cuSeqlensQ: [0, 2, 1], cuSeqlensK: [0, 2, 4] },
      new RangeError("Expected sequence 1's length options.cuSeqlensQ[2] − options.cuSeqlensQ[1] to be from 0 to shape.seqlenQ = 2 but received -1")],
    ['prefix sums of the wrong kind', shapeOf(), { cuSeqlensQ: new Float32Array([0, 2]), cuSeqlensK: [0, 2] },
      new TypeError('Expected options.cuSeqlensQ to be an Int32Array or number[] but received a Float32Array')],
    ['key padding with varlen', shapeOf(), { seqlens: [2], cuSeqlensQ: [0, 2], cuSeqlensK: [0, 2] },
      new TypeError('Expected options.seqlens (key padding of the batch layout) without options.cuSeqlensQ / cuSeqlensK (varlen) but received both')],
    ['a padding length past the sequence', shapeOf(), { seqlens: [3] },
      new RangeError('Expected options.seqlens[0] to be an integer from 0 to min(shape.seqlenQ, shape.seqlenK) = 2 but received 3')],
    ['padding lengths of the wrong count', shapeOf(), { seqlens: [1, 1] },
      new RangeError('Expected options.seqlens to have shape.batch = 1 elements but received 2')],
    ['dropout without a seed', shapeOf(), { dropout: 0.1 },
      new TypeError("Expected options.seed (the dropout mask's Philox key) with options.dropout > 0 but received no seed")],
    ['a dropout probability of 1', shapeOf(), { dropout: 1, seed: 3 },
      new RangeError('Expected options.dropout to be a probability in [0, 1) but received 1')],
    ['a string dropout', shapeOf(), { dropout: '0.1', seed: 3 },
      new TypeError('Expected options.dropout to be a number but received "0.1" of type string')],
    ['a fractional seed', shapeOf(), { dropout: 0.1, seed: 0.5 },
      new RangeError('Expected options.seed to be an integer in [0, 2^53) but received 0.5')],
    ['an offset past 32 bits', shapeOf(), { dropout: 0.1, seed: 3, offset: 2 ** 32 },
      new RangeError('Expected options.offset to be an integer in [0, 2^32) but received 4294967296')],
    ['a seed without dropout', shapeOf(), { seed: 3 },
      new TypeError('Expected options.seed and options.offset only with options.dropout but received a seed')],
    ['a shape that is not an object', null, undefined,
      new TypeError('Expected shape to be an object { batch, seqlenQ, seqlenK, headsQ, headsKV, headDim } but received null')],
  ])('refuses %s with a message naming it, in both passes', (_, shape, options, error) => {
    const q = new Float64Array(8);
    const k = new Float64Array(4);
    expect(() => referenceAttention(q, k, k, shape as never, options as never)).toThrow(error);
    expect(() => referenceAttentionBackward(q, q, k, k, shape as never, options as never)).toThrow(error);
  });

  test('an array of the wrong length or kind names the argument and its layout', () => {
    const q = new Float64Array(8);
    const k = new Float64Array(4);
    expect(() => referenceAttention(q.subarray(1), k, k, shapeOf())).toThrow(
      new RangeError('Expected q to have 8 elements ([batch, seqlenQ, headsQ, headDim]) but received 7'));
    expect(() => referenceAttentionBackward(q, q, k, new Uint16Array(4) as never, shapeOf())).toThrow(
      new TypeError('Expected v to be a Float32Array, Float64Array or number[] (float values; convert half-precision bits first) but received a Uint16Array'));
  });
});

// ----------------------------------------------------------------------------------------------
// Backward
// ----------------------------------------------------------------------------------------------

describe('backward', () => {
  const fdCases: Array<[string, ReferenceShape, ReferenceOptions]> = [
    ['MHA', { batch: 2, seqlenQ: 3, seqlenK: 4, headsQ: 2, headsKV: 2, headDim: 4 }, {}],
    ['causal MQA, scale 0.7', { batch: 1, seqlenQ: 4, seqlenK: 4, headsQ: 2, headsKV: 1, headDim: 3 }, { causal: true, softmaxScale: 0.7 }],
    ['causal GQA Sq>Sk (empty rows)', { batch: 1, seqlenQ: 5, seqlenK: 3, headsQ: 4, headsKV: 2, headDim: 2 }, { causal: true }],
    ['causal Sq<Sk', { batch: 1, seqlenQ: 3, seqlenK: 6, headsQ: 1, headsKV: 1, headDim: 5 }, { causal: true }],
    ['cross-length non-causal GQA', { batch: 1, seqlenQ: 2, seqlenK: 5, headsQ: 2, headsKV: 1, headDim: 3 }, { softmaxScale: 1.3 }],
  ];

  test.each(fdCases)('%s: gradients match central finite differences of L = sum(out ∘ W)', (name, shape, opts) => {
    const { q, k, v, dout: W } = randomInputs(shape, rngFor(`fd-${name}`));
    const g = referenceAttentionBackward(W, q, k, v, shape, opts);
    const loss = weightedLoss(W, shape, opts);
    const fd = (which: 0 | 1 | 2) => finiteDifferences([q, k, v], which, loss);
    const named: Array<[string, Float64Array, Float64Array]> = [
      ['dq', g.dq, fd(0)],
      ['dk', g.dk, fd(1)],
      ['dv', g.dv, fd(2)],
    ];
    expectGradients(name, named);
  });

  test('out and lse of the backward equal the forward', () => {
    const shape = fdCases[2][1];
    const { q, k, v, dout } = randomInputs(shape, rngFor('bwd-fwd'));
    const f = referenceAttention(q, k, v, shape, { causal: true });
    const b = referenceAttentionBackward(dout, q, k, v, shape, { causal: true });
    expect(b.out).toEqual(f.out);
    expect(b.lse).toEqual(f.lse);
  });

  test('empty rows: dq = 0 and they add nothing to dk/dv (whatever their q and dout)', () => {
    const shape = { batch: 1, seqlenQ: 5, seqlenK: 2, headsQ: 2, headsKV: 1, headDim: 3 };
    const { q, k, v, dout } = randomInputs(shape, rngFor('empty-rows'));
    const r = referenceAttentionBackward(dout, q, k, v, shape, { causal: true });
    // rows 0..2 are empty (they see j <= i - 3)
    const q2 = q.slice();
    const do2 = dout.slice();
    for (let i = 0; i < 3; i++)
      for (let x = 0; x < 6; x++) {
        q2[i * 6 + x] = 1e3 * (x + 1);
        do2[i * 6 + x] = -1e3;
      }
    const r2 = referenceAttentionBackward(do2, q2, k, v, shape, { causal: true });
    for (const a of [r, r2]) {
      for (const t of [a.out, a.dq, a.dk, a.dv]) expect(t.some(Number.isNaN)).toBe(false);
      expect(Array.from(a.dq.subarray(0, 18))).toEqual(new Array(18).fill(0));
      expect(Array.from(a.out.subarray(0, 18))).toEqual(new Array(18).fill(0));
    }
    expect(r2.dk).toEqual(r.dk);
    expect(r2.dv).toEqual(r.dv);
    expect(maxAbs(r.dq.subarray(18))).toBeGreaterThan(0);
  });

  test('seqlen 1025, headDim 128: runs quickly and satisfies the gradient invariants', () => {
    const shape = { batch: 1, seqlenQ: 1025, seqlenK: 1025, headsQ: 2, headsKV: 2, headDim: 128 };
    const rng = rngFor('big');
    const q = randn(qSize(shape), rng);
    const k = randn(kSize(shape), rng);
    const v = randn(kSize(shape), rng);
    const dout = randn(qSize(shape), rng);
    // CPU time of this process (not wall time: robust to other load on the machine)
    const t0 = process.cpuUsage();
    const f = referenceAttention(q, k, v, shape, { causal: true });
    const b = referenceAttentionBackward(dout, q, k, v, shape, { causal: true });
    const cpu = process.cpuUsage(t0);
    expect((cpu.user + cpu.system) / 1e6).toBeLessThan(10); // about 2 s
    expect(maxAbsDiff(b.out, f.out)).toBe(0); // (toEqual is slow on 262k elements)
    expect(maxAbsDiff(b.lse, f.lse)).toBe(0);
    const d = 128;
    const H = 2;
    const Sk = 1025;
    // a few rows against the direct computation (one row of the problem each)
    for (const [h, i] of [[0, 0], [1, 511], [0, 1024]]) {
      const one = { batch: 1, seqlenQ: 1, seqlenK: i + 1, headsQ: 1, headsKV: 1, headDim: d };
      const qi = q.slice(at(0, i, h, 0, 1025, H, d), at(0, i, h, d, 1025, H, d));
      const ks = sliceHead(Float64Array.from(k), 1, Sk, H, d, h).subarray(0, (i + 1) * d);
      const vs = sliceHead(Float64Array.from(v), 1, Sk, H, d, h).subarray(0, (i + 1) * d);
      const dir = directAttention(qi, ks, vs, one, false, 1 / Math.sqrt(d));
      expectClose(f.out.subarray(at(0, i, h, 0, 1025, H, d), at(0, i, h, d, 1025, H, d)), dir.out, 1e-12, `row ${i} head ${h}`);
      expect(f.lse[h * 1025 + i]).toBeCloseTo(dir.lse[0], 12);
    }
    // Σ_j dS_ij = 0 for every row, so Σ_j dk_j = 0; Σ_j P_ij = 1, so Σ_j dv_j = Σ_i dO_i.
    for (let h = 0; h < H; h++)
      for (let c = 0; c < d; c++) {
        let sk = 0;
        let sv = 0;
        let sdo = 0;
        let scale = 0;
        for (let j = 0; j < Sk; j++) {
          sk += b.dk[at(0, j, h, c, Sk, H, d)];
          sv += b.dv[at(0, j, h, c, Sk, H, d)];
          sdo += dout[at(0, j, h, c, Sk, H, d)];
          scale += Math.abs(b.dk[at(0, j, h, c, Sk, H, d)]);
        }
        expect(Math.abs(sk)).toBeLessThan(1e-10 * scale);
        expect(sv).toBeCloseTo(sdo, 9);
      }
  });
});

// ----------------------------------------------------------------------------------------------
// Same-precision mode
// ----------------------------------------------------------------------------------------------

describe('sliding window and softcap', () => {
  const cases: Array<[string, ReferenceShape, ReferenceOptions]> = [
    ['window [2, 1]', { batch: 1, seqlenQ: 7, seqlenK: 7, headsQ: 2, headsKV: 1, headDim: 4 }, { window: [2, 1] }],
    ['window [0, 0]: the diagonal only', { batch: 2, seqlenQ: 5, seqlenK: 5, headsQ: 1, headsKV: 1, headDim: 3 }, { window: [0, 0] }],
    ['left only, Sq < Sk', { batch: 1, seqlenQ: 4, seqlenK: 9, headsQ: 2, headsKV: 2, headDim: 4 }, { window: [3, -1] }],
    ['right only, Sq > Sk (empty rows)', { batch: 1, seqlenQ: 8, seqlenK: 5, headsQ: 1, headsKV: 1, headDim: 4 }, { window: [-1, 0] }],
    ['causal with a left window, GQA', { batch: 1, seqlenQ: 9, seqlenK: 9, headsQ: 4, headsKV: 2, headDim: 2 }, { causal: true, window: [3, 5] }],
    ['window [1, 1], Sq > Sk: rows past the keys see none', { batch: 1, seqlenQ: 9, seqlenK: 3, headsQ: 1, headsKV: 1, headDim: 4 }, { window: [1, 1] }],
    ['softcap 2', { batch: 1, seqlenQ: 6, seqlenK: 5, headsQ: 2, headsKV: 1, headDim: 4 }, { softcap: 2 }],
    ['softcap 0.5, causal, window [2, -1]', { batch: 2, seqlenQ: 6, seqlenK: 6, headsQ: 1, headsKV: 1, headDim: 3 }, { softcap: 0.5, causal: true, window: [2, -1] }],
  ];

  test.each(cases)('%s: forward equals a direct implementation', (name, shape, opts) => {
    const { q, k, v } = randomInputs(shape, rngFor(`win-${name}`), 1.5);
    const r = referenceAttention(q, k, v, shape, opts);
    const scale = 1 / Math.sqrt(shape.headDim);
    const direct = directAttention(q, k, v, shape, opts.causal === true, scale,
      (opts.window ?? [-1, -1]) as [number, number], opts.softcap ?? 0);
    expectClose(r.out, direct.out, 1e-12, `${name} out`);
    expect(r.lse.map((x) => (Number.isFinite(x) ? 0 : 1))).toEqual(direct.lse.map((x) => (Number.isFinite(x) ? 0 : 1)));
    expectClose(r.lse.filter(Number.isFinite), direct.lse.filter(Number.isFinite), 1e-12, `${name} lse`);
  });

  test('window [0, 0] gives out = v of the same position and lse = its own score', () => {
    const shape = { batch: 1, seqlenQ: 4, seqlenK: 4, headsQ: 1, headsKV: 1, headDim: 2 };
    const { q, k, v } = randomInputs(shape, rngFor('win-diag'));
    const r = referenceAttention(q, k, v, shape, { window: [0, 0], softmaxScale: 0.5 });
    for (let i = 0; i < 4; i++) {
      expect(Array.from(r.out.subarray(2 * i, 2 * i + 2))).toEqual(Array.from(v.subarray(2 * i, 2 * i + 2)));
      expect(r.lse[i]).toBeCloseTo(0.5 * (q[2 * i] * k[2 * i] + q[2 * i + 1] * k[2 * i + 1]), 14);
    }
  });

  test('a window wider than the sequence and softcap 0 change nothing (bit for bit, both passes, every precision)', () => {
    const shape = { batch: 1, seqlenQ: 6, seqlenK: 8, headsQ: 2, headsKV: 1, headDim: 4 };
    const { q, k, v, dout } = randomInputs(shape, rngFor('win-wide'));
    for (const precision of ['float64', 'bfloat16', 'tf32'] as const) {
      for (const causal of [false, true]) {
        const plain = referenceAttentionBackward(dout, q, k, v, shape, { causal, precision });
        expect(referenceAttentionBackward(dout, q, k, v, shape, { causal, precision, window: [8, 8], softcap: 0 })).toEqual(plain);
        expect(referenceAttentionBackward(dout, q, k, v, shape, { causal, precision, window: [-1, -1] })).toEqual(plain);
      }
    }
  });

  test('a large softcap approaches the uncapped scores; a small one flattens the softmax', () => {
    const shape = { batch: 1, seqlenQ: 5, seqlenK: 7, headsQ: 1, headsKV: 1, headDim: 4 };
    const { q, k, v } = randomInputs(shape, rngFor('softcap-limits'), 2);
    const plain = referenceAttention(q, k, v, shape);
    expectClose(referenceAttention(q, k, v, shape, { softcap: 1e4 }).out, plain.out, 1e-6, 'softcap 1e4');
    // c -> 0: every score -> 0, P uniform, out -> the mean of V.
    const flat = referenceAttention(q, k, v, shape, { softcap: 1e-9 });
    for (let c = 0; c < 4; c++) {
      let mean = 0;
      for (let j = 0; j < 7; j++) mean += v[j * 4 + c] / 7;
      for (let i = 0; i < 5; i++) expect(flat.out[i * 4 + c]).toBeCloseTo(mean, 8);
    }
    expect(flat.lse[0]).toBeCloseTo(Math.log(7), 8);
  });

  test('rows whose window holds no key: out 0, lse +Inf, dq 0, nothing added to dk / dv, in every precision', () => {
    // Sq 6 > Sk 3 with window [0, 0]: rows 0-2 see no key (their diagonal lies before key 0).
    const shape = { batch: 1, seqlenQ: 6, seqlenK: 3, headsQ: 1, headsKV: 1, headDim: 2 };
    const { q, k, v, dout } = randomInputs(shape, rngFor('win-empty'));
    for (const precision of ['float64', 'float16'] as const) {
      const g = referenceAttentionBackward(dout, q, k, v, shape, { window: [0, 0], precision });
      expect(Array.from(g.lse.subarray(0, 3))).toEqual([Infinity, Infinity, Infinity]);
      expect(Array.from(g.out.subarray(0, 6))).toEqual([0, 0, 0, 0, 0, 0]);
      expect(Array.from(g.dq.subarray(0, 6))).toEqual([0, 0, 0, 0, 0, 0]);
      expect(g.lse.subarray(3).every(Number.isFinite)).toBe(true);
      // Row 3 + j sees key j only: dv_j = dout_{3+j} (P = 1).
      for (let j = 0; j < 3; j++) expectClose(g.dv.subarray(2 * j, 2 * j + 2), dout.subarray(2 * (3 + j), 2 * (3 + j) + 2), precision === 'float64' ? 0 : 2e-3, `dv ${j}`);
    }
  });

  test.each(cases)('%s: gradients match central finite differences', (name, shape, opts) => {
    const { q, k, v, dout: W } = randomInputs(shape, rngFor(`win-fd-${name}`));
    const g = referenceAttentionBackward(W, q, k, v, shape, opts);
    const loss = weightedLoss(W, shape, opts);
    const fd = (which: number) => finiteDifferences([q, k, v], which, loss);
    // A window of one key ([0, 0]) makes P = 1 whatever the scores: dq and dk are exactly 0.
    const oneKey = opts.window?.[0] === 0 && opts.window?.[1] === 0;
    if (oneKey) {
      for (const [analytic, which] of [[g.dq, 0], [g.dk, 1]] as const) {
        expect(maxAbs(analytic)).toBe(0);
        expect(maxAbs(fd(which))).toBeLessThan(1e-9);
      }
    }
    expectGradients(name, oneKey ? [['dv', g.dv, fd(2)]] : [['dq', g.dq, fd(0)], ['dk', g.dk, fd(1)], ['dv', g.dv, fd(2)]]);
  });

});

// The features of the last two blocks in same-precision mode: the float64 result within each dtype's
// error, outputs representable in the dtype (dsinks in float32).
// dsinks_h = -sum_i exp(sink_h - lse_i) D_i adds terms of either sign (D_i = dout_i . out_i), so its
// error is bounded by the dtype's error times the terms' magnitude, not the sum's, which cancels: with
// FA_TEST_SEED=0x5b52c41e float16's dsinks were -0.0197 / -0.0365 from terms of magnitude 1.78 / 1.73,
// and the same-precision error of 1.8e-4 was 0.0048 of max |dsinks| but 1.0e-4 of the terms.
function sinkTermMagnitudes(dout: Float64Array, q: Float64Array, k: Float64Array, v: Float64Array,
  shape: ReferenceShape, opts: ReferenceOptions): Float64Array {
  const { out, lse } = referenceAttention(q, k, v, shape, opts);
  const { batch, seqlenQ, headsQ, headDim } = shape;
  const sinks = opts.sinks as ArrayLike<number>;
  const mag = new Float64Array(headsQ);
  for (let b = 0; b < batch; ++b)
    for (let i = 0; i < seqlenQ; ++i)
      for (let h = 0; h < headsQ; ++h) {
        const row = ((b * seqlenQ + i) * headsQ + h) * headDim;
        let dRow = 0;
        for (let c = 0; c < headDim; ++c) dRow += dout[row + c] * out[row + c];
        mag[h] += Math.exp(sinks[h] - lse[(b * headsQ + h) * seqlenQ + i]) * Math.abs(dRow);
      }
  return mag;
}

describe('window, softcap, ALiBi and sinks in same-precision mode', () => {
  const features: Array<[string, number, ReferenceOptions]> = [
    ['a window and a softcap', 1, { causal: true, window: [11, -1], softcap: 3 }],
    ['ALiBi and sinks', 2, { causal: true, alibiSlopes: [0.0625, 0.25, 0.125, 0.5], sinks: [1, -0.5] }],
    ['dropout', 1, { dropout: 0.25, seed: 2 ** 33 + 17, offset: 3 }],
  ];
  const cases = features.flatMap(([label, batch, opts]) =>
    (['bfloat16', 'float16', 'float32'] as DType[]).map((dtype) => [dtype, label, batch, opts] as const));
  test.each(cases)('%s, %s: the float64 result within the dtype\'s error', (dtype, label, batch, opts) => {
    const shape = { batch, seqlenQ: 40, seqlenK: 48, headsQ: 2, headsKV: 1, headDim: 16 };
    const rng = rngFor(`sp-features-${label}-${dtype}`);
    const rd = (a: Float32Array) => Float64Array.from(a, (x) => roundToDtype(x, dtype));
    const q = rd(randn(qSize(shape), rng, 2));
    const k = rd(randn(kSize(shape), rng, 2));
    const v = rd(randn(kSize(shape), rng));
    const dout = rd(randn(qSize(shape), rng));
    const ref = referenceAttentionBackward(dout, q, k, v, shape, opts);
    const sp = referenceAttentionBackward(dout, q, k, v, shape, { ...opts, precision: dtype });
    const hi = { bfloat16: 3e-2, float16: 4e-3, float32: 1e-5 }[dtype];
    for (const n of ['out', 'dq', 'dk', 'dv', 'dsinks'] as const) {
      if (ref[n] === undefined) continue;
      const e = n === 'dsinks'
        ? maxAbsDiff(sp[n] as Float64Array, ref[n] as Float64Array) / maxAbs(sinkTermMagnitudes(dout, q, k, v, shape, opts))
        : relErr(sp[n] as Float64Array, ref[n] as Float64Array);
      if (!(e > 0 && e <= hi)) throw new Error(`${dtype} ${n}: relative error ${e} not in (0, ${hi}]; ${seedHint()}`);
      const inDtype = n === 'dsinks' ? (x: number) => Math.fround(x) === x : (x: number) => roundToDtype(x, dtype) === x;
      expect((sp[n] as Float64Array).every(inDtype)).toBe(true);
    }
  });
});

describe('dropout', () => {
  const shape = { batch: 2, seqlenQ: 9, seqlenK: 13, headsQ: 4, headsKV: 2, headDim: 5 };
  const drop = { dropout: 0.25, seed: 2 ** 33 + 17, offset: 3 };

  test('out = (P ∘ Z / (1 - p)) V with Z from dropoutKeep; lse as without dropout; dropout 0 changes nothing', () => {
    const { batch: B, seqlenQ: Sq, seqlenK: Sk, headsQ: Hq, headsKV: Hkv, headDim: d } = shape;
    const { q, k, v } = randomInputs(shape, rngFor('dropout-direct'));
    const plain = referenceAttention(q, k, v, shape, { causal: true });
    const r = referenceAttention(q, k, v, shape, { causal: true, ...drop });
    expect(r.lse).toEqual(plain.lse);
    expect(referenceAttention(q, k, v, shape, { causal: true, dropout: 0, seed: 5 }).out).toEqual(plain.out);
    const scale = 1 / Math.sqrt(d);
    const expected = new Float64Array(r.out.length);
    let dropped = 0;
    for (let b = 0; b < B; b++)
      for (let h = 0; h < Hq; h++) {
        const kh = Math.floor(h / (Hq / Hkv));
        for (let i = 0; i < Sq; i++) {
          const lse = plain.lse[(b * Hq + h) * Sq + i];
          for (let j = 0; j <= i + Sk - Sq; j++) {
            let dot = 0;
            for (let c = 0; c < d; c++) dot += q[at(b, i, h, c, Sq, Hq, d)] * k[at(b, j, kh, c, Sk, Hkv, d)];
            const keep = dropoutKeep({ p: drop.dropout, seed: drop.seed, offset: drop.offset }, { batch: b, head: h, headsQ: Hq, row: i, col: j });
            dropped += Number(!keep);
            const w = keep ? Math.exp(dot * scale - lse) / (1 - drop.dropout) : 0;
            for (let c = 0; c < d; c++) expected[at(b, i, h, c, Sq, Hq, d)] += w * v[at(b, j, kh, c, Sk, Hkv, d)];
          }
        }
      }
    expect(dropped).toBeGreaterThan(0);
    expectClose(r.out, expected, 1e-12, 'out with dropout');
  });

  test('the backward regenerates the mask: dq, dk, dv and dsinks match finite differences of the forward', () => {
    const sh = { batch: 1, seqlenQ: 5, seqlenK: 7, headsQ: 2, headsKV: 1, headDim: 3 };
    const { q, k, v, dout } = randomInputs(sh, rngFor('dropout-fd'));
    const sinks = Float64Array.from([0.3, -0.7]);
    const opts: ReferenceOptions = { ...drop, dropout: 0.4, window: [3, 1] };
    const g = referenceAttentionBackward(dout, q, k, v, sh, { ...opts, sinks });
    const loss = weightedLoss(dout, sh, opts, true);
    const fd = (which: number) => finiteDifferences([q, k, v, sinks], which, loss, 1e-6);
    expectGradients('dropout', [['dq', g.dq, fd(0)], ['dk', g.dk, fd(1)], ['dv', g.dv, fd(2)],
      ['dsinks', g.dsinks as Float64Array, fd(3)]]);
    const f = referenceAttention(q, k, v, sh, { ...opts, sinks });
    expect(g.out).toEqual(f.out);
  });

  test('packed (varlen) sequences of equal length give the dense batch\'s mask and results, every precision', () => {
    const sh = { batch: 2, seqlenQ: 6, seqlenK: 6, headsQ: 2, headsKV: 2, headDim: 4 };
    // lse [batch, headsQ, seqlenQ] as varlen's [headsQ, totalQ].
    const varlenLse = (lse: Float64Array) =>
      Float64Array.from({ length: lse.length }, (_, e) => lse[(Math.floor((e % 12) / 6) * 2 + Math.floor(e / 12)) * 6 + (e % 6)]);
    const { q, k, v, dout } = randomInputs(sh, rngFor('dropout-varlen'));
    for (const precision of ['float64', 'bfloat16'] as const) {
      const dense = referenceAttentionBackward(dout, q, k, v, sh, { ...drop, precision });
      const packed = referenceAttentionBackward(dout, q, k, v, sh, { ...drop, precision, cuSeqlensQ: [0, 6, 12], cuSeqlensK: [0, 6, 12] });
      for (const n of ['out', 'lse', 'dq', 'dk', 'dv'] as const) expect(packed[n]).toEqual(n === 'lse' ? varlenLse(dense.lse) : dense[n]);
    }
  });

  test('another offset gives another mask: the outputs move by far more than any rounding', () => {
    const sh = { batch: 1, seqlenQ: 40, seqlenK: 48, headsQ: 2, headsKV: 1, headDim: 16 };
    const { q, k, v } = randomInputs(sh, rngFor('dropout-offset'));
    const a = referenceAttention(q, k, v, sh, drop);
    const b = referenceAttention(q, k, v, sh, { ...drop, offset: drop.offset + 1 });
    expect(relErr(b.out, a.out)).toBeGreaterThan(0.05);
    expect(referenceAttention(q, k, v, sh, drop).out).toEqual(a.out); // and the same offset, the same bits
  });
});

describe('ALiBi and learnable sinks', () => {
  const cases: Array<[string, ReferenceShape, ReferenceOptions]> = [
    ['ALiBi per head', { batch: 2, seqlenQ: 6, seqlenK: 6, headsQ: 2, headsKV: 1, headDim: 4 }, { alibiSlopes: [0.5, 0.125] }],
    ['ALiBi per sequence and head, causal, Sq < Sk', { batch: 2, seqlenQ: 4, seqlenK: 7, headsQ: 2, headsKV: 2, headDim: 3 },
      { causal: true, alibiSlopes: [0.3, 0.7, 1.1, 0.05] }],
    ['sinks', { batch: 1, seqlenQ: 5, seqlenK: 6, headsQ: 2, headsKV: 1, headDim: 4 }, { sinks: [0.5, -1.25] }],
    ['sinks, causal Sq > Sk (rows that see no key)', { batch: 1, seqlenQ: 7, seqlenK: 4, headsQ: 2, headsKV: 2, headDim: 3 },
      { causal: true, sinks: [1.5, -0.5] }],
    ['everything: window, softcap, ALiBi, sinks, GQA', { batch: 2, seqlenQ: 6, seqlenK: 8, headsQ: 4, headsKV: 2, headDim: 3 },
      { causal: true, window: [3, -1], softcap: 1.5, alibiSlopes: [0.25, 0.5, 0.75, 1], sinks: [0.1, -0.2, 0.3, 2] }],
  ];

  test.each(cases)('%s: forward equals a direct implementation', (name, shape, opts) => {
    const { q, k, v } = randomInputs(shape, rngFor(`alibi-${name}`), 1.5);
    const r = referenceAttention(q, k, v, shape, opts);
    const direct = directAttention(q, k, v, shape, opts.causal === true, 1 / Math.sqrt(shape.headDim),
      (opts.window ?? [-1, -1]) as [number, number], opts.softcap ?? 0,
      (opts.alibiSlopes ?? null) as number[] | null, (opts.sinks ?? null) as number[] | null);
    expectClose(r.out, direct.out, 1e-12, `${name} out`);
    expectClose(r.lse, direct.lse, 1e-12, `${name} lse`);
  });

  test('a row that sees no key with a sink: out 0, lse = the sink, dq 0 (and finite everywhere)', () => {
    const shape = { batch: 1, seqlenQ: 5, seqlenK: 3, headsQ: 1, headsKV: 1, headDim: 2 };
    const { q, k, v, dout } = randomInputs(shape, rngFor('sink-empty'));
    for (const precision of ['float64', 'bfloat16'] as const) {
      const g = referenceAttentionBackward(dout, q, k, v, shape, { causal: true, sinks: [0.75], precision });
      expect(Array.from(g.lse.subarray(0, 2))).toEqual([0.75, 0.75]);
      expect(Array.from(g.out.subarray(0, 4))).toEqual([0, 0, 0, 0]);
      expect(Array.from(g.dq.subarray(0, 4))).toEqual([0, 0, 0, 0]);
      expect([...g.lse, ...g.out, ...g.dq, ...g.dk, ...g.dv, ...(g.dsinks as Float64Array)].every(Number.isFinite)).toBe(true);
    }
  });

  test('a sink of -30 is no sink; ALiBi slopes of 0 are no bias (within float64 rounding)', () => {
    const shape = { batch: 1, seqlenQ: 4, seqlenK: 5, headsQ: 2, headsKV: 1, headDim: 4 };
    const { q, k, v, dout } = randomInputs(shape, rngFor('sink-limits'));
    const plain = referenceAttentionBackward(dout, q, k, v, shape);
    const faint = referenceAttentionBackward(dout, q, k, v, shape, { sinks: [-30, -30] });
    for (const n of ['out', 'lse', 'dq', 'dk', 'dv'] as const) expectClose(faint[n], plain[n], 1e-10, `sink -30 ${n}`);
    expect(maxAbs(faint.dsinks as Float64Array)).toBeLessThan(1e-10);
    expect(referenceAttentionBackward(dout, q, k, v, shape, { alibiSlopes: [0, 0] })).toEqual(plain);
  });

  test.each(cases)('%s: gradients, dsinks included, match central finite differences', (name, shape, opts) => {
    const { q, k, v, dout: W } = randomInputs(shape, rngFor(`alibi-fd-${name}`));
    const g = referenceAttentionBackward(W, q, k, v, shape, opts);
    const sinks = opts.sinks === undefined ? null : Float64Array.from(opts.sinks as number[]);
    const loss = weightedLoss(W, shape, opts, sinks !== null);
    const fd = (which: number) => finiteDifferences([q, k, v, sinks ?? new Float64Array(0)], which, loss);
    const named: Array<[string, Float64Array, Float64Array]> = [['dq', g.dq, fd(0)], ['dk', g.dk, fd(1)], ['dv', g.dv, fd(2)]];
    if (sinks !== null) named.push(['dsinks', g.dsinks as Float64Array, fd(3)]);
    else expect(g.dsinks).toBeUndefined();
    expectGradients(name, named);
  });
});

describe('varlen: packed sequences', () => {
  // [label, prefix sums of queries and keys, heads Q / KV, head dim, options]
  const cases: Array<[string, number[], number[], number, number, number, ReferenceOptions]> = [
    ['mixed lengths, causal', [0, 5, 6, 13], [0, 7, 8, 13], 2, 2, 4, { causal: true }],
    ['an empty sequence, a sequence without keys, length 1', [0, 0, 3, 4, 9], [0, 2, 2, 3, 11], 2, 1, 3, { causal: true }],
    ['a sequence without keys, with sinks', [0, 3, 5], [0, 0, 6], 2, 2, 2, { sinks: [0.25, -1.5] }],
    ['window and softcap, GQA', [0, 6, 14], [0, 9, 14], 4, 2, 2, { window: [2, 1], softcap: 1.5 }],
    ['ALiBi per sequence and sinks', [0, 4, 11, 12], [0, 4, 11, 20], 2, 2, 3,
      { causal: true, alibiSlopes: [0.5, 0.25, 0.125, 1, 0.75, 0.3], sinks: [0.4, -0.6] }],
  ];

  test.each(cases)('%s: each sequence equals the dense reference on it alone, every precision', (name, cuQ, cuK, Hq, Hkv, d, opts) => {
    const B = cuQ.length - 1;
    const maxQ = Math.max(...cuQ.slice(1).map((x, b) => x - cuQ[b]));
    const maxK = Math.max(...cuK.slice(1).map((x, b) => x - cuK[b]));
    const shape = { batch: B, seqlenQ: maxQ, seqlenK: maxK, headsQ: Hq, headsKV: Hkv, headDim: d };
    const rng = rngFor(`varlen-${name}`);
    const totalQ = cuQ[B];
    const totalK = cuK[B];
    const q = Float64Array.from(randn(totalQ * Hq * d, rng));
    const k = Float64Array.from(randn(totalK * Hkv * d, rng));
    const v = Float64Array.from(randn(totalK * Hkv * d, rng));
    const dout = Float64Array.from(randn(totalQ * Hq * d, rng));
    for (const precision of ['float64', 'bfloat16', 'tf32'] as const) {
      const g = referenceAttentionBackward(dout, q, k, v, shape, { ...opts, precision, cuSeqlensQ: cuQ, cuSeqlensK: Int32Array.from(cuK) });
      const f = referenceAttention(q, k, v, shape, { ...opts, precision, cuSeqlensQ: cuQ, cuSeqlensK: cuK });
      expect(f.out).toEqual(g.out);
      expect(f.lse).toEqual(g.lse);
      expect(g.out.length).toBe(totalQ * Hq * d);
      expect(g.lse.length).toBe(Hq * totalQ);
      expect(g.dk.length).toBe(totalK * Hkv * d);
      const dsinks = new Float64Array(Hq);
      for (let b = 0; b < B; b++) {
        const sq = cuQ[b + 1] - cuQ[b];
        const sk = cuK[b + 1] - cuK[b];
        const qs = (x: Float64Array) => x.subarray(cuQ[b] * Hq * d, cuQ[b + 1] * Hq * d);
        const ks = (x: Float64Array) => x.subarray(cuK[b] * Hkv * d, cuK[b + 1] * Hkv * d);
        if (sq === 0) continue;
        const lseOf = (h: number) => Array.from({ length: sq }, (_, i) => g.lse[h * totalQ + cuQ[b] + i]);
        if (sk === 0) {
          // Queries without keys: empty rows (the sink's logit as lse with sinks), nothing else.
          expect(maxAbs(qs(g.out))).toBe(0);
          expect(maxAbs(qs(g.dq))).toBe(0);
          for (let h = 0; h < Hq; h++) {
            const sink = opts.sinks === undefined ? Infinity : (opts.sinks as number[])[h];
            expect(lseOf(h)).toEqual(new Array(sq).fill(precision === 'float64' ? sink : Math.fround(sink)));
          }
          continue;
        }
        const one = { batch: 1, seqlenQ: sq, seqlenK: sk, headsQ: Hq, headsKV: Hkv, headDim: d };
        const alibi = opts.alibiSlopes === undefined ? {} : { alibiSlopes: (opts.alibiSlopes as number[]).slice(b * Hq, (b + 1) * Hq) };
        const dense = referenceAttentionBackward(qs(dout), qs(q), ks(k), ks(v), one, { ...opts, ...alibi, precision });
        expect(qs(g.out)).toEqual(dense.out);
        expect(qs(g.dq)).toEqual(dense.dq);
        expect(ks(g.dk)).toEqual(dense.dk);
        expect(ks(g.dv)).toEqual(dense.dv);
        for (let h = 0; h < Hq; h++) expect(lseOf(h)).toEqual(Array.from(dense.lse.subarray(h * sq, (h + 1) * sq)));
        if (dense.dsinks) for (let h = 0; h < Hq; h++) dsinks[h] += dense.dsinks[h];
      }
      if (opts.sinks !== undefined && precision === 'float64') expectClose(g.dsinks as Float64Array, dsinks, 1e-12, `${name} dsinks`);
    }
  });

  test('sequences of equal length equal the dense batch (the same memory order; lse [headsQ, totalQ])', () => {
    const shape = { batch: 3, seqlenQ: 5, seqlenK: 7, headsQ: 2, headsKV: 1, headDim: 4 };
    const { q, k, v, dout } = randomInputs(shape, rngFor('varlen-dense'));
    const dense = referenceAttentionBackward(dout, q, k, v, shape, { causal: true });
    const packed = referenceAttentionBackward(dout, q, k, v, shape, { causal: true, cuSeqlensQ: [0, 5, 10, 15], cuSeqlensK: [0, 7, 14, 21] });
    for (const n of ['out', 'dq', 'dk', 'dv'] as const) expect(packed[n]).toEqual(dense[n]);
    for (let b = 0; b < 3; b++)
      for (let h = 0; h < 2; h++)
        for (let i = 0; i < 5; i++) expect(packed.lse[h * 15 + b * 5 + i]).toBe(dense.lse[(b * 2 + h) * 5 + i]);
  });

  test('the packed arrays must hold totalQ / totalK rows', () => {
    const shape = { batch: 2, seqlenQ: 3, seqlenK: 3, headsQ: 1, headsKV: 1, headDim: 2 };
    const opts = { cuSeqlensQ: [0, 3, 4], cuSeqlensK: [0, 2, 5] };
    expect(() => referenceAttention(new Float64Array(8), new Float64Array(10), new Float64Array(10), shape, opts)).not.toThrow();
    expect(() => referenceAttention(new Float64Array(12), new Float64Array(10), new Float64Array(10), shape, opts)).toThrow(
      new RangeError('Expected q to have 8 elements ([totalQ = 4, headsQ, headDim]) but received 12'));
    expect(() => referenceAttentionBackward(new Float64Array(8), new Float64Array(8), new Float64Array(12), new Float64Array(10), shape, opts)).toThrow(
      new RangeError('Expected k to have 10 elements ([totalK = 5, headsKV, headDim]) but received 12'));
  });
});

describe('key padding (per-sequence lengths of the batch layout)', () => {
  test.each([
    ['causal, a sequence of length 0 and a full one', [3, 0, 6, 1], { causal: true }],
    ['window, ALiBi per sequence, sinks', [4, 2, 6, 5], { window: [1, 2], alibiSlopes: [0.5, 0.25, 1, 0.125, 0.75, 0.3, 0.6, 0.9], sinks: [0.5, -1] }],
  ] as Array<[string, number[], ReferenceOptions]>)('%s: each sequence equals the dense reference on its first tokens; the padding is zero', (name, lens, opts) => {
    const shape = { batch: 4, seqlenQ: 6, seqlenK: 7, headsQ: 2, headsKV: 1, headDim: 3 };
    const { q, k, v, dout } = randomInputs(shape, rngFor(`pad-${name}`));
    const { headsQ: Hq, headsKV: Hkv, headDim: d, seqlenQ: Sq, seqlenK: Sk } = shape;
    for (const precision of ['float64', 'float16'] as const) {
      const g = referenceAttentionBackward(dout, q, k, v, shape, { ...opts, precision, seqlens: lens });
      const f = referenceAttention(q, k, v, shape, { ...opts, precision, seqlens: Int32Array.from(lens) });
      expect(f.out).toEqual(g.out);
      expect(f.lse).toEqual(g.lse);
      for (let b = 0; b < 4; b++) {
        const L = lens[b];
        const qRows = (x: Float64Array, from: number, to: number) => x.subarray((b * Sq + from) * Hq * d, (b * Sq + to) * Hq * d);
        const kRows = (x: Float64Array, from: number, to: number) => x.subarray((b * Sk + from) * Hkv * d, (b * Sk + to) * Hkv * d);
        // The padding: out, dq, dk, dv 0 and lse +Infinity.
        for (const x of [qRows(g.out, L, Sq), qRows(g.dq, L, Sq), kRows(g.dk, L, Sk), kRows(g.dv, L, Sk)]) expect(maxAbs(x)).toBe(0);
        for (let h = 0; h < Hq; h++) for (let i = L; i < Sq; i++) expect(g.lse[(b * Hq + h) * Sq + i]).toBe(Infinity);
        if (L === 0) continue;
        const one = { batch: 1, seqlenQ: L, seqlenK: L, headsQ: Hq, headsKV: Hkv, headDim: d };
        const alibi = opts.alibiSlopes === undefined ? {} : { alibiSlopes: (opts.alibiSlopes as number[]).slice(b * Hq, (b + 1) * Hq) };
        const dense = referenceAttentionBackward(qRows(dout, 0, L), qRows(q, 0, L), kRows(k, 0, L), kRows(v, 0, L), one, { ...opts, ...alibi, precision });
        expect(qRows(g.out, 0, L)).toEqual(dense.out);
        expect(qRows(g.dq, 0, L)).toEqual(dense.dq);
        expect(kRows(g.dk, 0, L)).toEqual(dense.dk);
        expect(kRows(g.dv, 0, L)).toEqual(dense.dv);
        for (let h = 0; h < Hq; h++) {
          expect(Array.from(g.lse.subarray((b * Hq + h) * Sq, (b * Hq + h) * Sq + L))).toEqual(Array.from(dense.lse.subarray(h * L, (h + 1) * L)));
        }
      }
    }
  });

  test('full lengths change nothing', () => {
    const shape = { batch: 2, seqlenQ: 5, seqlenK: 5, headsQ: 1, headsKV: 1, headDim: 4 };
    const { q, k, v, dout } = randomInputs(shape, rngFor('pad-full'));
    expect(referenceAttentionBackward(dout, q, k, v, shape, { causal: true, seqlens: [5, 5] }))
      .toEqual(referenceAttentionBackward(dout, q, k, v, shape, { causal: true }));
  });
});

describe('same-precision mode', () => {
  const shape = { batch: 1, seqlenQ: 96, seqlenK: 80, headsQ: 2, headsKV: 1, headDim: 64 };
  // max |samePrecision − float64| / max |float64| on unit-normal data, by dtype
  const bands: Record<DType, [number, number]> = {
    bfloat16: [4e-4, 3e-2],
    float16: [5e-5, 4e-3],
    float32: [5e-9, 1e-5],
  };

  test.each<DType>(['bfloat16', 'float16', 'float32'])(
    '%s: nonzero error of the expected magnitude, outputs representable in the dtype',
    (dtype) => {
      const rng = rngFor(`sp-${dtype}`);
      const rd = (a: Float32Array) => Float64Array.from(a, (x) => roundToDtype(x, dtype));
      // inputs already in the dtype: the error measured is that of the computation alone
      const q = rd(randn(qSize(shape), rng));
      const k = rd(randn(kSize(shape), rng));
      const v = rd(randn(kSize(shape), rng));
      const dout = rd(randn(qSize(shape), rng));
      const ref = referenceAttentionBackward(dout, q, k, v, shape, { causal: true });
      const sp = referenceAttentionBackward(dout, q, k, v, shape, { causal: true, precision: dtype });
      const [lo, hi] = bands[dtype];
      const report: string[] = [];
      for (const n of ['out', 'dq', 'dk', 'dv'] as const) {
        const e = relErr(sp[n], ref[n]);
        if (!(e >= lo && e <= hi)) report.push(`${n}: ${e} not in [${lo}, ${hi}]`);
        const notRepresentable = sp[n].findIndex((x) => roundToDtype(x, dtype) !== x);
        if (notRepresentable >= 0) report.push(`${n}[${notRepresentable}] not a ${dtype} value`);
      }
      const finite = (a: Float64Array) => a.filter((_, i) => Number.isFinite(ref.lse[i]));
      expect(finite(ref.lse).length).toBe(shape.headsQ * shape.seqlenK); // 16 empty rows per head
      const lseErr = relErr(finite(sp.lse), finite(ref.lse));
      if (!(lseErr > 0 && lseErr < 1e-6)) report.push(`lse: ${lseErr}`);
      if (sp.lse.some((x) => Math.fround(x) !== x)) report.push('lse not float32');
      expect(report).toEqual([]);
      // forward-only entry point gives the backward's out/lse
      const fwd = referenceAttention(q, k, v, shape, { causal: true, precision: dtype });
      expect(fwd.out).toEqual(sp.out);
      expect(fwd.lse).toEqual(sp.lse);
    },
  );

  /**
   * The same-precision algorithm written again, directly from the steps listed in the JSDoc of
   * ReferenceOptions.precision (naive indexing, no scratch rows), for an exact comparison.
   */
  function samePrecisionDirect(dout: Float64Array, q: Float64Array, k: Float64Array, v: Float64Array, sh: ReferenceShape, causal: boolean, dtype: DType | 'tf32') {
    const { batch: B, seqlenQ: Sq, seqlenK: Sk, headsQ: Hq, headsKV: Hkv, headDim: d } = sh;
    const f = Math.fround;
    // 'tf32': operands (inputs, P, dS) rounded to TF32, stored results to float32; a dtype: both to it.
    const rd = dtype === 'tf32' ? roundToTf32 : (x: number) => roundToDtype(x, dtype);
    const rdOut = dtype === 'tf32' ? f : rd;
    const scale = f(1 / Math.sqrt(d));
    const [Q, K, V, DO] = [q, k, v, dout].map((a) => a.map(rd));
    const out = new Float64Array(Q.length);
    const lse = new Float64Array(B * Hq * Sq);
    const dq = new Float64Array(Q.length);
    const dkAcc = new Float64Array(K.length); // float32 values
    const dvAcc = new Float64Array(K.length);
    const group = Hq / Hkv;
    for (let b = 0; b < B; b++)
      for (let h = 0; h < Hq; h++) {
        const kh = Math.floor(h / group);
        for (let i = 0; i < Sq; i++) {
          const vis = (j: number) => !causal || j <= i + Sk - Sq;
          const js = Array.from({ length: Sk }, (_, j) => j).filter(vis);
          if (js.length === 0) {
            lse[(b * Hq + h) * Sq + i] = Infinity;
            continue;
          }
          const s = js.map((j) => {
            let a = 0;
            for (let c = 0; c < d; c++) a = f(a + f(Q[at(b, i, h, c, Sq, Hq, d)] * K[at(b, j, kh, c, Sk, Hkv, d)]));
            return f(scale * a);
          });
          const m = Math.max(...s);
          const e = s.map((x) => f(Math.exp(f(x - m))));
          let l = 0;
          for (const x of e) l = f(l + x);
          const p = e.map((x) => f(x / l));
          lse[(b * Hq + h) * Sq + i] = f(m + f(Math.log(l)));
          const pr = p.map(rd);
          let D = 0;
          for (let c = 0; c < d; c++) {
            let a = 0;
            js.forEach((j, t) => (a = f(a + f(pr[t] * V[at(b, j, kh, c, Sk, Hkv, d)]))));
            out[at(b, i, h, c, Sq, Hq, d)] = rdOut(a);
            D = f(D + f(DO[at(b, i, h, c, Sq, Hq, d)] * rdOut(a)));
          }
          const dqAcc = new Float64Array(d);
          js.forEach((j, t) => {
            let dp = 0;
            for (let c = 0; c < d; c++) {
              const x = at(b, j, kh, c, Sk, Hkv, d);
              dvAcc[x] = f(dvAcc[x] + f(pr[t] * DO[at(b, i, h, c, Sq, Hq, d)]));
              dp = f(dp + f(DO[at(b, i, h, c, Sq, Hq, d)] * V[x]));
            }
            const ds = rd(f(p[t] * f(dp - D)));
            for (let c = 0; c < d; c++) {
              const x = at(b, j, kh, c, Sk, Hkv, d);
              dqAcc[c] = f(dqAcc[c] + f(ds * K[x]));
              dkAcc[x] = f(dkAcc[x] + f(ds * Q[at(b, i, h, c, Sq, Hq, d)]));
            }
          });
          for (let c = 0; c < d; c++) dq[at(b, i, h, c, Sq, Hq, d)] = rdOut(f(dqAcc[c] * scale));
        }
      }
    return { out, lse, dq, dk: dkAcc.map((x) => rdOut(f(x * scale))), dv: dvAcc.map(rdOut) };
  }

  test.each<[DType | 'tf32', boolean]>([
    ['bfloat16', true],
    ['float16', false],
    ['float32', true],
    ['tf32', true],
    ['tf32', false],
  ])('%s causal=%s: bit-exact with the documented rounding steps, written again naively', (dtype, causal) => {
    const small = { batch: 2, seqlenQ: 7, seqlenK: 5, headsQ: 4, headsKV: 2, headDim: 8 };
    const { q, k, v, dout } = randomInputs(small, rngFor(`sp-direct-${dtype}`));
    const got = referenceAttentionBackward(dout, q, k, v, small, { causal, precision: dtype });
    const want = samePrecisionDirect(dout, q, k, v, small, causal, dtype);
    for (const n of ['out', 'lse', 'dq', 'dk', 'dv'] as const) {
      const diff = maxAbsDiff(got[n], want[n]);
      if (diff !== 0) throw new Error(`${dtype} ${n}: differs from the documented steps by ${diff}; ${seedHint()}`);
    }
  });

  test('the coarser the dtype, the larger the error', () => {
    const rng = rngFor('sp-order');
    const q = randn(qSize(shape), rng);
    const k = randn(kSize(shape), rng);
    const v = randn(kSize(shape), rng);
    const ref = referenceAttention(q, k, v, shape);
    const err = (p: DType) => relErr(referenceAttention(q, k, v, shape, { precision: p }).out, ref.out);
    const [eb, eh, ef] = [err('bfloat16'), err('float16'), err('float32')];
    expect(eb).toBeGreaterThan(3 * eh);
    expect(eh).toBeGreaterThan(30 * ef);
    expect(ef).toBeGreaterThan(0);
  });

  test("'tf32': error of float16's magnitude (the same 10-bit mantissa), outputs float32 values, not TF32 ones", () => {
    const rng = rngFor('sp-tf32');
    const f = Math.fround;
    const q = Float64Array.from(randn(qSize(shape), rng), f);
    const k = Float64Array.from(randn(kSize(shape), rng), f);
    const v = Float64Array.from(randn(kSize(shape), rng), f);
    const dout = Float64Array.from(randn(qSize(shape), rng), f);
    const ref = referenceAttentionBackward(dout, q, k, v, shape, { causal: true });
    const err = (p: ReferencePrecision, n: 'out' | 'dq' | 'dk' | 'dv') =>
      relErr(referenceAttentionBackward(dout, q, k, v, shape, { causal: true, precision: p })[n], ref[n]);
    const report: string[] = [];
    for (const n of ['out', 'dq', 'dk', 'dv'] as const) {
      const [e32, etf, e16] = [err('float32', n), err('tf32', n), err('float16', n)];
      if (!(etf >= 5e-5 && etf <= 4e-3)) report.push(`${n}: tf32 error ${etf} not in [5e-5, 4e-3]`);
      if (!(etf > 30 * e32)) report.push(`${n}: tf32 error ${etf} not well above float32's ${e32}`);
      if (!(etf > e16 / 4 && etf < 4 * e16)) report.push(`${n}: tf32 error ${etf} not within 4x of float16's ${e16}`);
    }
    const sp = referenceAttentionBackward(dout, q, k, v, shape, { causal: true, precision: 'tf32' });
    for (const n of ['out', 'lse', 'dq', 'dk', 'dv'] as const) {
      if (sp[n].some((x) => f(x) !== x)) report.push(`${n} not float32`);
    }
    // Stored results are float32, not rounded to TF32: almost none is a TF32 value on the rows that see
    // 2 keys or more (causal, 96 x 80: rows 0-15 see none, row 16 sees one and its out is exactly ṽ).
    const rowOf = (i: number) => Math.floor(i / (shape.headsQ * shape.headDim));
    const mixed = sp.out.filter((_, i) => rowOf(i) >= 17);
    const tf32Valued = mixed.filter((x) => roundToTf32(x) === x).length;
    if (tf32Valued > mixed.length / 100) report.push(`${tf32Valued} of ${mixed.length} outputs are TF32 values`);
    expect(report).toEqual([]);
  });

  test('inputs are rounded to the dtype internally (unrounded and pre-rounded inputs agree exactly)', () => {
    const small = { batch: 1, seqlenQ: 7, seqlenK: 9, headsQ: 2, headsKV: 2, headDim: 8 };
    const { q, k, v, dout } = randomInputs(small, rngFor('sp-round-inputs'));
    for (const dtype of ['bfloat16', 'float16'] as const) {
      const rd = (a: Float64Array) => a.map((x) => roundToDtype(x, dtype));
      const a = referenceAttentionBackward(dout, q, k, v, small, { precision: dtype });
      const b = referenceAttentionBackward(rd(dout), rd(q), rd(k), rd(v), small, { precision: dtype });
      for (const n of ['out', 'lse', 'dq', 'dk', 'dv'] as const) expect(a[n]).toEqual(b[n]);
      // and the rounding matters: the float64 reference on unrounded inputs differs
      const exact = referenceAttention(q, k, v, small);
      expect(maxAbsDiff(a.out, exact.out)).toBeGreaterThan(0);
    }
  });

  test('empty rows: out 0, lse +Inf, dq 0, never NaN', () => {
    const small = { batch: 1, seqlenQ: 6, seqlenK: 4, headsQ: 2, headsKV: 1, headDim: 8 };
    const { q, k, v, dout } = randomInputs(small, rngFor('sp-empty'));
    for (const dtype of ['bfloat16', 'float16', 'float32', 'tf32'] as const) {
      const r = referenceAttentionBackward(dout, q, k, v, small, { causal: true, precision: dtype });
      for (const t of [r.out, r.lse, r.dq, r.dk, r.dv]) expect(t.some(Number.isNaN)).toBe(false);
      for (let h = 0; h < 2; h++) {
        expect([r.lse[h * 6], r.lse[h * 6 + 1]]).toEqual([Infinity, Infinity]);
        expect(Number.isFinite(r.lse[h * 6 + 2])).toBe(true);
      }
      expect(maxAbs(r.out.subarray(0, 2 * 16))).toBe(0);
      expect(maxAbs(r.dq.subarray(0, 2 * 16))).toBe(0);
      expect(maxAbs(r.dq.subarray(2 * 16))).toBeGreaterThan(0);
    }
  });
});

// ----------------------------------------------------------------------------------------------
// TF32 rounding (the tensor-core operands of the CUDA float32 forward)
// ----------------------------------------------------------------------------------------------

describe('roundToTf32', () => {
  const bitsOf = (x: number): number => new Uint32Array(Float32Array.of(x).buffer)[0];
  const fromBits = (u: number): number => new Float32Array(Uint32Array.of(u).buffer)[0];

  test.each<[string, number, number]>([
    ['exact values stay', 1.5, 1.5],
    ['1 + 2^-11 is a tie: away from zero (ties-to-even would give 1)', 1 + 2 ** -11, 1 + 2 ** -10],
    ['-(1 + 2^-11) is a tie: away from zero', -(1 + 2 ** -11), -(1 + 2 ** -10)],
    ['just below the tie rounds down', 1 + 2 ** -11 - 2 ** -23, 1],
    ['just above the tie rounds up', 1 + 2 ** -11 + 2 ** -23, 1 + 2 ** -10],
    ['1 + 3 * 2^-11 is a tie: away (1 + 2^-9)', 1 + 3 * 2 ** -11, 1 + 2 ** -9],
    ['0.1', 0.1, 0.0999755859375],
    ['a carry into the exponent', 2 - 2 ** -12, 2],
    ['the largest TF32 value stays', (2 - 2 ** -10) * 2 ** 127, (2 - 2 ** -10) * 2 ** 127],
    ['half a TF32 ulp above it overflows to Infinity', fromBits(0x7f7ff000), Infinity],
    ['the largest float32 overflows to Infinity', fromBits(0x7f7fffff), Infinity],
    ['-largest float32 overflows to -Infinity', -fromBits(0x7f7fffff), -Infinity],
    ['the smallest subnormal rounds to 0', 2 ** -149, 0],
    ['a subnormal tie rounds away (2^-137 -> 2^-136)', 2 ** -137, 2 ** -136],
    ['Infinity', Infinity, Infinity],
    ['-Infinity', -Infinity, -Infinity],
  ])('%s', (_label, x, want) => {
    expect(roundToTf32(x)).toBe(want);
  });

  test('NaN stays NaN, -0 stays -0; the input is first rounded to float32', () => {
    expect(roundToTf32(NaN)).toBeNaN();
    expect(Object.is(roundToTf32(-0), -0)).toBe(true);
    // 1 + 2^-11 + 2^-30 rounds to float32 1 + 2^-11 (a float32 tie, to even), then away: 1 + 2^-10.
    expect(roundToTf32(1 + 2 ** -11 + 2 ** -30)).toBe(1 + 2 ** -10);
  });

  test('random float32 values: low 13 bits cleared, within half a TF32 ulp, idempotent, sign kept', () => {
    const rng = rngFor('tf32-random');
    const xs = [...randn(2000, rng), ...randu(2000, -1e30, 1e30, rng), ...randu(1000, -1e-30, 1e-30, rng)];
    const bad: string[] = [];
    for (const x of xs) {
      const y = roundToTf32(x);
      const u = bitsOf(y);
      if ((u & 0x1fff) !== 0) bad.push(`${x} -> ${y}: low bits ${u & 0x1fff}`);
      if (!(Math.abs(y - x) <= 2 ** -11 * Math.abs(x))) bad.push(`${x} -> ${y}: off by more than half an ulp`);
      if (roundToTf32(y) !== y) bad.push(`${x} -> ${y}: not idempotent`);
      if (Math.sign(y) !== Math.sign(x)) bad.push(`${x} -> ${y}: sign`);
      // Nearest: the TF32 neighbour of y on x's side (one TF32 ulp = 0x2000 in the bit pattern, towards
      // or away from zero) is not closer.
      if (y !== x) {
        const other = fromBits(Math.abs(y) > Math.abs(x) ? u - 0x2000 : u + 0x2000);
        if (Math.abs(other - x) < Math.abs(y - x)) bad.push(`${x} -> ${y}: ${other} is nearer`);
      }
      if (bad.length > 5) break;
    }
    expect(bad).toEqual([]);
  });
});

// ----------------------------------------------------------------------------------------------
// The test helpers
// ----------------------------------------------------------------------------------------------

describe('test helpers', () => {
  test('flash rule: the same-precision result passes at factor 2, a 3x worse one fails with a readable message', () => {
    const sh = { batch: 1, seqlenQ: 16, seqlenK: 16, headsQ: 2, headsKV: 2, headDim: 8 };
    const { q, k, v } = randomInputs(sh, rngFor('rule'));
    const ref = referenceAttention(q, k, v, sh);
    const sp = referenceAttention(q, k, v, sh, { precision: 'bfloat16' });
    const ok = expectFlashRule({ actual: sp.out, reference: ref.out, samePrecision: sp.out, factor: 2, atol: 0, name: 'out' });
    expect(ok.pass).toBe(true);
    expect(ok.maxErr).toBe(ok.refErr);
    expect(ok.refErr).toBeGreaterThan(0);
    const worse = ref.out.map((r, i) => r + 3 * (sp.out[i] - r));
    const input = {
      actual: worse,
      reference: ref.out,
      samePrecision: sp.out,
      factor: 2,
      atol: 0,
      name: 'out',
      shape: [1, 16, 2, 8],
      dims: ['b', 's', 'h', 'd'],
    };
    const rep = checkFlashRule(input);
    expect(rep.pass).toBe(false);
    expect(rep.maxErr).toBeCloseTo(3 * rep.refErr, 12);
    expect(Math.abs(worse[rep.worstIndex] - ref.out[rep.worstIndex])).toBe(rep.maxErr);
    expect(() => expectFlashRule(input)).toThrow(/out/);
    expect(() => expectFlashRule(input)).toThrow(/FA_TEST_SEED=0x[0-9a-f]{8}/);
    expect(() => expectFlashRule(input)).toThrow(decodeIndex(rep.worstIndex, input.shape, input.dims));
    // atol can rescue it
    expect(checkFlashRule({ ...input, atol: rep.maxErr }).pass).toBe(true);
  });

  test('flash rule: +Inf == +Inf is no error; NaN or a lost infinity fails', () => {
    const reference = [Infinity, 1, 2];
    const samePrecision = [Infinity, 1.01, 2];
    expect(checkFlashRule({ actual: [Infinity, 1.015, 2], reference, samePrecision, factor: 2, atol: 0, name: 'lse' }).pass).toBe(true);
    const nan = checkFlashRule({ actual: [Infinity, NaN, 2], reference, samePrecision, factor: 2, atol: 1, name: 'lse' });
    expect([nan.pass, nan.worstIndex, nan.maxErr]).toEqual([false, 1, Infinity]);
    expect(checkFlashRule({ actual: [5, 1, 2], reference, samePrecision, factor: 2, atol: 1, name: 'lse' }).pass).toBe(false);
    expect(checkFlashRule({ actual: [Infinity, 1, 2], reference, samePrecision: [NaN, 1, 2], factor: 2, atol: 1, name: 'x' }).pass).toBe(false);
    expect(() => checkFlashRule({ actual: [1], reference, samePrecision, factor: 2, atol: 0, name: 'x' })).toThrow(/lengths/);
  });

  test('maxAbsDiff, decodeIndex, expectAllWritten', () => {
    expect(maxAbsDiff([1, 2, Infinity], [1, 2.5, Infinity])).toBe(0.5);
    expect(maxAbsDiff([NaN], [0])).toBe(Infinity);
    expect(decodeIndex(2 * 12 + 1 * 4 + 3, [3, 3, 4], ['b', 's', 'd'])).toBe('[b=2, s=1, d=3]');
    expect(decodeIndex(7, [2, 4])).toBe('[i0=1, i1=3]');
    const a = new Float32Array(10).fill(NaN);
    for (let i = 0; i < 10; i++) if (i !== 6) a[i] = i;
    expect(() => expectAllWritten(a, 'out')).toThrow(/out: 1 of 10 .* index 6/);
    a[6] = 0;
    expect(() => expectAllWritten(a, 'out')).not.toThrow();
    const bits = new Uint16Array([0x3c00, 0x7e00, 0x7c00]);
    expect(() => expectAllWritten(bits, 'h', { dtype: 'float16' })).toThrow(/index 1/);
    expect(() => expectAllWritten(bits.subarray(2), 'h', { dtype: 'float16' })).not.toThrow(); // Inf is written data
    expect(() => expectAllWritten([1, -7, 3], 'p', { poison: -7 })).toThrow(/index 1/);
  });

  test('random: seeded, reproducible streams; randn ~ N(0, 1) and randu in range, never zero', () => {
    expect(Number.isInteger(currentSeed())).toBe(true);
    const a = rngFor('x');
    const b = rngFor('x');
    const c = rngFor('y');
    const sa = [a.nextU32(), a.nextU32(), a.nextU32()];
    expect([b.nextU32(), b.nextU32(), b.nextU32()]).toEqual(sa);
    expect([c.nextU32(), c.nextU32(), c.nextU32()]).not.toEqual(sa);
    // known answer: xoshiro128** seeded through splitmix32 (computed independently in Python)
    const known = new Rng(12345);
    expect(Array.from({ length: 5 }, () => known.nextU32())).toEqual([518667457, 440444462, 4232892992, 3757857622, 3939018813]);
    const n = 200000;
    const z = randn(n, rngFor('normal'));
    let mean = 0;
    let sq = 0;
    for (const x of z) {
      mean += x;
      sq += x * x;
    }
    mean /= n;
    const variance = sq / n - mean * mean;
    expect(Math.abs(mean)).toBeLessThan(0.015); // 6.7 standard errors
    expect(Math.abs(variance - 1)).toBeLessThan(0.025);
    expect(z.includes(0)).toBe(false);
    const u = randu(n, -0.5, 2, rngFor('uniform'));
    expect(u.every((x) => x >= -0.5 && x < 2 && x !== 0)).toBe(true);
    expect(Math.min(...u.subarray(0, 50000))).toBeLessThan(-0.49);
    expect(Math.max(...u.subarray(0, 50000))).toBeGreaterThan(1.99);
  });
});
