/**
 * Attention on strided views: q, k, v read in place out of a packed projection, dout and out as views,
 * and the backward writing dq, dk, dv into a packed gradient. Every result must equal, bit for bit,
 * the same call on contiguous copies of the inputs (the kernels read the same values in the same
 * order; on CUDA, views the FlashAttention-2 kernels cannot read are staged through contiguous copies,
 * which must not change a bit either). Odd sizes, GQA, causal; validation of the new arguments.
 */

import {
  AttentionGradients,
  flashAttention,
  flashAttentionBackward,
  flashAttentionWithGrad,
} from '../lib/attention';
import { tidy } from '../lib/scope';
import { binding, NativeAttentionBackwardArgs, NativeAttentionForwardArgs, NativeBuffer } from '../lib/native';
import { Device, DType, handleOf, Tensor } from '../lib/tensor';
import { describeEachDevice, liveMemory, synchronizeAll, trackMemory, usePoisonedOutputs } from './helpers/backend';
import { randn, rngFor, seedHint } from './helpers/random';

trackMemory();
usePoisonedOutputs();

async function bits(t: Tensor): Promise<number[]> {
  return Array.from(await t.toBits());
}

interface Case {
  dtype: DType;
  batch: number;
  seqlen: number;
  headsQ: number;
  headsKV: number;
  headDim: number;
  causal: boolean;
}

const CASES: Case[] = [
  { dtype: 'float32', batch: 2, seqlen: 37, headsQ: 3, headsKV: 3, headDim: 24, causal: false },
  { dtype: 'bfloat16', batch: 1, seqlen: 113, headsQ: 4, headsKV: 2, headDim: 32, causal: true },
  { dtype: 'float16', batch: 3, seqlen: 7, headsQ: 2, headsKV: 1, headDim: 16, causal: true },
];

/**
 * A packed projection [batch, seqlen, headsQ + 2 headsKV, headDim] (for headsQ == headsKV the layout
 * of [batch, seqlen, 3, heads, headDim]) and its q, k, v views along dim 2.
 */
function packed(c: Case, device: Device, label: string): { qkv: Tensor; q: Tensor; k: Tensor; v: Tensor } {
  const width = c.headsQ + 2 * c.headsKV;
  const data = randn(c.batch * c.seqlen * width * c.headDim, rngFor(label));
  const qkv = Tensor.fromFloat32Array(data, [c.batch, c.seqlen, width, c.headDim], { dtype: c.dtype, device });
  return {
    qkv,
    q: qkv.narrow(2, 0, c.headsQ),
    k: qkv.narrow(2, c.headsQ, c.headsKV),
    v: qkv.narrow(2, c.headsQ + c.headsKV, c.headsKV),
  };
}

describeEachDevice('strided attention', (device: Device) => {
  for (const c of CASES) {
    const name = `${c.dtype} B${c.batch} S${c.seqlen} H${c.headsQ}/${c.headsKV} D${c.headDim}${c.causal ? ' causal' : ''}`;

    test(`forward and backward on views of a packed qkv equal the contiguous calls bit for bit: ${name}`, async () => {
      const { qkv, q, k, v } = packed(c, device, `${device}/${name}`);
      expect(q.isContiguous).toBe(false);
      const qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
      const opts = { causal: c.causal };
      const strided = flashAttention(q, k, v, opts);
      const dense = flashAttention(qc, kc, vc, opts);
      expect({ out: await bits(strided.out), lse: await bits(strided.lse), seed: seedHint() })
        .toEqual({ out: await bits(dense.out), lse: await bits(dense.lse), seed: seedHint() });

      // dout as a view (every other row of a taller tensor), out as a view of a packed copy.
      const doutData = randn(c.batch * 2 * c.seqlen * c.headsQ * c.headDim, rngFor(`${device}/${name}/dout`));
      const tall = Tensor.fromFloat32Array(doutData, [c.batch, 2 * c.seqlen, c.headsQ, c.headDim], { dtype: c.dtype, device });
      const doutView = tidy(() => tall.view([c.batch, c.seqlen, 2, c.headsQ, c.headDim]).select(2, 1));
      expect(doutView.isContiguous).toBe(false);
      const doutDense = doutView.contiguous();
      const outBox = Tensor.zeros([c.batch, c.seqlen, c.headsQ + 1, c.headDim], { dtype: c.dtype, device });
      const outView = outBox.narrow(2, 1, c.headsQ).copyFrom(strided.out);
      const gs = flashAttentionBackward(doutView, q, k, v, outView, strided.lse, opts);
      const gd = flashAttentionBackward(doutDense, qc, kc, vc, dense.out, dense.lse, opts);
      for (const key of ['dq', 'dk', 'dv'] as const) {
        expect({ key, got: await bits(gs[key]), seed: seedHint() }).toEqual({ key, got: await bits(gd[key]), seed: seedHint() });
      }
      expect(gs.kernel).toBe(gd.kernel);

      // The backward writing into a packed dqkv: every element written, equal to the separate gradients.
      const dqkv = Tensor.full(qkv.shape, NaN, { dtype: c.dtype, device });
      const targets = {
        dq: dqkv.narrow(2, 0, c.headsQ),
        dk: dqkv.narrow(2, c.headsQ, c.headsKV),
        dv: dqkv.narrow(2, c.headsQ + c.headsKV, c.headsKV),
      };
      const gp: AttentionGradients = flashAttentionBackward(doutView, q, k, v, outView, strided.lse, { ...opts, ...targets });
      expect(gp.dq).toBe(targets.dq);
      expect(gp.dv).toBe(targets.dv);
      const all = await dqkv.toFloat32Array();
      expect(all.some(Number.isNaN)).toBe(false);
      for (const key of ['dq', 'dk', 'dv'] as const) {
        expect({ key, got: await bits(targets[key]) }).toEqual({ key, got: await bits(gd[key]) });
      }

      // flashAttentionWithGrad saves the views (with their strides), not copies.
      const ctx = flashAttentionWithGrad(q, k, v, opts);
      const gc = ctx.backward(doutView);
      for (const key of ['dq', 'dk', 'dv'] as const) expect(await bits(gc[key])).toEqual(await bits(gd[key]));
      for (const t of [qkv, q, k, v, qc, kc, vc, strided.out, strided.lse, dense.out, dense.lse, tall, doutView,
        doutDense, outBox, outView, dqkv, targets.dq, targets.dk, targets.dv, ctx.out, ctx.lse,
        gs.dq, gs.dk, gs.dv, gd.dq, gd.dk, gd.dv, gc.dq, gc.dk, gc.dv]) t.dispose();
    });
  }

  test('a view whose strides break 16-byte alignment (headDim narrowed) still equals the contiguous call', async () => {
    // Rows of 36 elements: row and head strides that are not multiples of 8 elements, and bases at
    // element offset 4. The CUDA FlashAttention-2 kernels take staged contiguous copies here.
    const c = { batch: 2, seqlen: 19, heads: 2, headDim: 32 };
    const make = (label: string): Tensor => Tensor.fromFloat32Array(
      randn(c.batch * c.seqlen * c.heads * 36, rngFor(`${device}/odd/${label}`)), [c.batch, c.seqlen, c.heads, 36],
      { dtype: 'bfloat16', device });
    const bases = [make('q'), make('k'), make('v')];
    const [q, k, v] = bases.map((t) => t.narrow(3, 4, c.headDim));
    const [qc, kc, vc] = [q, k, v].map((t) => t.contiguous());
    const a = flashAttention(q, k, v, { causal: true });
    const b = flashAttention(qc, kc, vc, { causal: true });
    expect(await bits(a.out)).toEqual(await bits(b.out));
    const ga = flashAttentionBackward(b.out, q, k, v, a.out, a.lse, { causal: true });
    const gb = flashAttentionBackward(b.out, qc, kc, vc, b.out, b.lse, { causal: true });
    for (const key of ['dq', 'dk', 'dv'] as const) expect(await bits(ga[key])).toEqual(await bits(gb[key]));
    // Gradients written into such views too.
    const boxes = bases.map((t) => Tensor.full(t.shape, 0.5, { dtype: 'bfloat16', device }));
    const [dq, dk, dv] = boxes.map((t) => t.narrow(3, 4, c.headDim));
    flashAttentionBackward(b.out, q, k, v, a.out, a.lse, { causal: true, dq, dk, dv });
    for (const [got, want] of [[dq, gb.dq], [dk, gb.dk], [dv, gb.dv]] as const) expect(await bits(got)).toEqual(await bits(want));
    const pad = boxes[0].narrow(3, 0, 4);
    const untouched = await pad.toFloat32Array();
    pad.dispose();
    expect(Array.from(untouched).every((x) => x === 0.5)).toBe(true);
    await synchronizeAll();
    for (const t of [...bases, q, k, v, qc, kc, vc, a.out, a.lse, b.out, b.lse, ga.dq, ga.dk, ga.dv, gb.dq, gb.dk, gb.dv,
      ...boxes, dq, dk, dv]) t.dispose();
  });

  test('bad views and gradient targets are refused before anything is allocated', async () => {
    const c: Case = { dtype: 'float32', batch: 1, seqlen: 9, headsQ: 2, headsKV: 2, headDim: 8, causal: false };
    const { qkv, q, k, v } = packed(c, device, `${device}/bad`);
    const { out, lse } = flashAttention(q, k, v);
    const dout = out.clone();
    const other = Tensor.zeros([1, 9, 6, 8], { device });
    const spare = Tensor.zeros([1, 9, 2, 8, 2], { device });
    const stepped = spare.select(4, 0); // [1, 9, 2, 8] with headDim stride 2
    const [o1, o2, qOverlap] = [other.narrow(2, 0, 2), other.narrow(2, 1, 2), qkv.narrow(2, 1, 2)];
    const gone = other.narrow(2, 0, 2);
    gone.dispose();
    await synchronizeAll();
    const before = liveMemory();
    const expectThrow = (fn: () => unknown, message: string): void => {
      expect(fn).toThrow(message);
      expect(liveMemory()).toEqual(before);
    };
    expectThrow(() => flashAttention(stepped, k, v),
      'Expected q to have stride 1 in its last dim (headDim); call contiguous() first but received strides [288, 32, 16, 2]');
    expectThrow(() => flashAttentionBackward(stepped, q, k, v, out, lse),
      'Expected dout to have stride 1 in its last dim (headDim); call contiguous() first but received strides [288, 32, 16, 2]');
    expectThrow(() => flashAttentionBackward(dout, q, k, v, out, lse, { dq: o1, dk: o2 }),
      'Expected dk not to share elements with dq but it does');
    expectThrow(() => flashAttentionBackward(dout, q, k, v, out, lse, { dk: qOverlap }),
      'Expected dk not to share elements with q (an input of the backward) but it does');
    expectThrow(() => flashAttentionBackward(dout, q, k, v, out, lse, { dv: other }),
      'Expected options.dv to have the shape of k [1, 9, 2, 8] but received [1, 9, 6, 8]');
    expectThrow(() => flashAttentionBackward(dout, q, k, v, out, lse, { dq: stepped }),
      'Expected options.dq to have stride 1 in its last dim (headDim); call contiguous() first but received strides [288, 32, 16, 2]');
    expectThrow(() => flashAttentionBackward(dout, q, k, v, out, lse, { dq: gone }),
      'Expected options.dq to be a live Tensor but received a disposed Tensor');
    // The raw binding re-checks the strides and the targets itself.
    const raw = binding();
    const arg = (t: Tensor): [NativeBuffer, number] => [handleOf(t, 't'), t.offset];
    const dims = [1, 9, 9, 2, 2, 8];
    const qs = [...q.strides.slice(0, 3), ...k.strides.slice(0, 3), ...v.strides.slice(0, 3)];
    const fwdArgs = (strides: number[]): NativeAttentionForwardArgs => ({
      q: arg(q), k: arg(k), v: arg(v), dims, causal: false, softmaxScale: 0.5, kernel: 0, float32Precision: 0, strides,
    });
    expectThrow(() => raw.attentionForward(fwdArgs(qs.slice(0, 8))),
      'Expected strides to be undefined or an Array of 9 [batch, row, head] strides but received an Array of length 8');
    expectThrow(() => raw.attentionForward(fwdArgs([...qs.slice(0, 6), 432, 50, 8])),
      'Expected v to reach 416 elements from offset 32 inside its storage of 432 elements but it does not');
    expectThrow(() => raw.attentionForward(fwdArgs([...qs.slice(0, 6), 0, 0, 8])),
      'Expected v to be a view whose elements are distinct (each stride larger than the span of the dims with ' +
      'smaller strides) but it is not');
    expectThrow(() => raw.attentionForward(fwdArgs([...qs.slice(0, 6), -1, 48, 8])),
      'Expected v strides to be an integer in [0, 9007199254740991] but received -1 of type number');
    const bwdArgs = (grads: NativeAttentionBackwardArgs['grads'], gradStrides?: number[]): NativeAttentionBackwardArgs => ({
      dout: arg(dout), q: arg(q), k: arg(k), v: arg(v), out: arg(out), lse: arg(lse), dims, causal: false,
      softmaxScale: 0.5, kernel: 0, deterministic: false, algorithm: 0, float32Precision: 0,
      grads, gradStrides,
    });
    expectThrow(() => raw.attentionBackward(bwdArgs([arg(o1)], undefined)),
      'Expected grads to be undefined or an Array of 3 [dq, dk, dv] (each a tensor or null) but received an Array of length 1');
    expectThrow(() => raw.attentionBackward(bwdArgs([arg(o1), null, null], [1, 2])),
      'Expected gradStrides to be undefined or an Array of 9 [batch, row, head] strides but received an Array of length 2');
    expectThrow(() => raw.attentionBackward(bwdArgs([null, arg(o1), arg(o2)], [0, 0, 0, ...o1.strides.slice(0, 3), ...o2.strides.slice(0, 3)])),
      'Expected dv not to share elements with dk but it does');
    expectThrow(() => raw.attentionBackward(bwdArgs([arg(qOverlap), null, null], [...qOverlap.strides.slice(0, 3), 0, 0, 0, 0, 0, 0])),
      'Expected dq not to share elements with q (an input of the backward) but it does');
    expectThrow(() => raw.attentionBackward(bwdArgs([arg(lse), null, null], undefined)),
      'Expected dq to reach 144 elements from offset 0 inside its storage of 18 elements but it does not');
    for (const t of [qkv, q, k, v, out, lse, dout, other, spare, stepped, o1, o2, qOverlap]) t.dispose();
  });
});
