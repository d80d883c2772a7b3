/**
 * lib/nn: every layer's explicit backward against a float32 finite-difference directional
 * derivative (tiny sizes, CPU), the parameter bookkeeping (names, groups, dtypes, tied weights),
 * AdamW against a float64 reference, and memory: forward + backward + dispose returns to the
 * baseline.
 */
import {
  Block, CausalSelfAttention, Embedding, LayerNorm, Linear, MLP, RMSNorm, TransformerOptions,
} from '../lib/nn/layers';
import { GPT } from '../lib/nn/gpt';
import { Module, packParameters, Parameter } from '../lib/nn/module';
import { AdamW } from '../lib/nn/optim';
import { Tensor } from '../lib/tensor';
import { describeEachDevice, liveMemory, synchronizeAll, trackMemory } from './helpers/backend';
import type { Device } from '../lib/tensor';
import { directionalGradCheck, GradCheckCase } from './helpers/gradcheck';
import { randn, rngFor, seedHint } from './helpers/random';

trackMemory();

/** The device of the CPU-only tests (bookkeeping, AdamW reference). */
const device = 'cpu' as const;
/** Relative error allowed between the analytic and the central-difference derivative (float32 forwards, ε = 1e-2 along a direction of norm 4). */
const FD_TOL = 5e-3;

const [B, S, C, H] = [2, 5, 16, 2]; // head dim 8, the smallest the attention takes

function sampler(label: string): (n: number, std: number) => Float32Array {
  const rng = rngFor(label);
  return (n, std) => randn(n, rng, std);
}

function opts(device: Device, label: string, over: Partial<TransformerOptions> = {}): TransformerOptions {
  return {
    device, dtype: 'float32', normal: sampler(label), dModel: C, heads: H, layers: 2, norm: 'layernorm', mlp: 'gelu',
    mlpHidden: 4 * C, bias: true, rope: false, ...over,
  };
}

/** A check case for a layer mapping [B, S, width] to a tensor, with `backward(dout)` returning dx. */
function layerCase(
  module: Module & { forward(x: Tensor): Tensor; backward(d: Tensor): Tensor | null },
  width: number, label: string,
): GradCheckCase & { device: Device } {
  return {
    module,
    input: { values: randn(B * S * width, rngFor(`${label}-x`)), shape: [B, S, width] },
    forward: (x) => module.forward(x as Tensor),
    backward: (d) => module.backward(d as Tensor),
    device: module.parameters()[0].device,
  };
}

async function expectGradOk(c: GradCheckCase & { device: Device }, label: string): Promise<void> {
  const r = await directionalGradCheck(c, rngFor(`${label}-dir`), c.device);
  c.module.dispose();
  if (!(r.relError <= FD_TOL)) {
    throw new Error(`${label}: analytic ${r.analytic} vs numeric ${r.numeric} (relative error ${r.relError}) ${seedHint()}`);
  }
  // A check that cannot fail is a defect: the derivative must be far from zero.
  expect(Math.abs(r.numeric)).toBeGreaterThan(1e-3);
}

// On CUDA the float32 products run at 'highest' precision (3xTF32), close enough to float32 for the
// same tolerance.
describeEachDevice('layer backward passes match finite differences', (device) => {
  const o = (label: string): { device: Device; normal: (n: number, std: number) => Float32Array } => ({ device, normal: sampler(label) });
  test('Linear with bias', () => expectGradOk(layerCase(new Linear(C, 7, o('lin')), C, 'lin'), 'Linear'));
  test('Linear without bias', () => expectGradOk(layerCase(new Linear(C, 7, { ...o('linnb'), bias: false }), C, 'linnb'), 'Linear no bias'));
  test('Linear with fused GELU', () => expectGradOk(layerCase(new Linear(C, 9, { ...o('lg'), activation: 'gelu' }), C, 'lg'), 'Linear+GELU'));
  test('LayerNorm', () => expectGradOk(layerCase(new LayerNorm(C, { device }), C, 'ln'), 'LayerNorm'));
  test('LayerNorm without bias', () => expectGradOk(layerCase(new LayerNorm(C, { device, bias: false }), C, 'lnnb'), 'LayerNorm no bias'));
  test('RMSNorm', () => expectGradOk(layerCase(new RMSNorm(C, { device }), C, 'rms'), 'RMSNorm'));
  test('CausalSelfAttention, learned positions', () =>
    expectGradOk(layerCase(new CausalSelfAttention(opts(device, 'attn')), C, 'attn'), 'attention'));
  test('CausalSelfAttention with RoPE and no bias', () =>
    expectGradOk(layerCase(new CausalSelfAttention(opts(device, 'attnr', { rope: true, bias: false })), C, 'attnr'), 'attention+RoPE'));
  test('MLP, GELU', () => expectGradOk(layerCase(new MLP(opts(device, 'mlp')), C, 'mlp'), 'MLP gelu'));
  test('MLP, SwiGLU', () => expectGradOk(layerCase(new MLP(opts(device, 'swi', { mlp: 'swiglu', mlpHidden: 24 })), C, 'swi'), 'MLP swiglu'));
  test('Block, LayerNorm + GELU', () => expectGradOk(layerCase(new Block(opts(device, 'blk')), C, 'blk'), 'Block'));
  test('Block, RMSNorm + SwiGLU + RoPE', () =>
    expectGradOk(layerCase(new Block(opts(device, 'blk2', { norm: 'rmsnorm', mlp: 'swiglu', mlpHidden: 40, rope: true, bias: false })), C, 'blk2'),
      'Block rmsnorm swiglu rope'));
  test('Embedding (parameter gradient, repeated ids)', async () => {
    const emb = new Embedding(11, C, o('emb'));
    const ids = Tensor.fromInt32Array(Int32Array.from([3, 0, 3, 10, 7, 3]), [2, 3], { device });
    try {
      await expectGradOk({ module: emb, input: null, forward: () => emb.forward(ids), backward: (d) => (emb.backward(d as Tensor), null), device }, 'Embedding');
    } finally {
      ids.dispose();
    }
  });
});

describe('parameter bookkeeping', () => {
  test('GPT parameters carry nanoGPT names, decay groups and a tied LM head', () => {
    const model = new GPT({ vocabSize: 13, blockSize: 8, layers: 2, heads: H, dModel: C, device }, sampler('names'));
    try {
      const named = model.namedParameters();
      const names = named.map((p) => p.name);
      expect(names.slice(0, 2)).toEqual(['transformer.wte.weight', 'transformer.wpe.weight']);
      expect(names).toContain('transformer.h.1.attn.c_attn.weight');
      expect(names).toContain('transformer.h.0.mlp.c_proj.bias');
      expect(names[names.length - 1]).toBe('transformer.ln_f.bias');
      expect(names.some((n) => n.startsWith('lm_head'))).toBe(false);
      expect(new Set(names).size).toBe(names.length);
      // 13·16 + 8·16 + per block (2·2·16 + 16·48 + 48 + 16·16 + 16 + 16·64 + 64 + 64·16 + 16) + 2·16
      const perBlock = 4 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C);
      expect(model.numParameters()).toBe(13 * C + 8 * C + 2 * perBlock + 2 * C);
      // Packed into two flat groups: the decayed matrices and embeddings, and the vectors.
      expect(model.parameterGroups.map((g) => [g.decay, g.parameters.length])).toEqual([[true, 2 + 2 * 4], [false, 2 + 2 * 8]]);
      for (const { name, parameter } of named) {
        expect([name, parameter.decay, parameter.group?.decay]).toEqual([name, parameter.shape.length >= 2, parameter.shape.length >= 2]);
        expect(parameter.grad.dtype).toBe('float32');
        expect(parameter.master).toBeNull();
      }
    } finally {
      model.dispose();
    }
  });

  test('bfloat16 parameters keep float32 masters and gradients; the state dict holds the masters', async () => {
    const model = new GPT({ vocabSize: 13, blockSize: 8, layers: 1, heads: H, dModel: C, dtype: 'bfloat16', device, mlp: 'swiglu', norm: 'rmsnorm', positions: 'rope', bias: false },
      sampler('bf16'));
    try {
      const names = model.namedParameters().map((p) => p.name);
      expect(names).not.toContain('transformer.wpe.weight');
      expect(names.some((n) => n.endsWith('.bias'))).toBe(false);
      for (const p of model.parameters()) {
        expect([p.value.dtype, p.grad.dtype, p.master?.dtype]).toEqual(['bfloat16', 'float32', 'float32']);
      }
      const state = model.stateDict();
      expect(Object.values(state).every((t) => t.dtype === 'float32')).toBe(true);
      const w = model.h[0].attn.c_attn.weight;
      const master = await (w.master as Tensor).toFloat32Array();
      const value = await w.value.toFloat32Array();
      // The value is the master rounded to bfloat16 (and the weights are not all representable).
      let differ = 0;
      master.forEach((m, i) => {
        expect(Math.abs(value[i] - m)).toBeLessThanOrEqual(Math.abs(m) * 2 ** -8);
        if (value[i] !== m) differ += 1;
      });
      expect(differ).toBeGreaterThan(0);
    } finally {
      model.dispose();
    }
  });

  test('loadStateDict round-trips and refuses a wrong shape or an extra name, changing nothing', async () => {
    const a = new GPT({ vocabSize: 13, blockSize: 8, layers: 1, heads: H, dModel: C, device }, sampler('sd-a'));
    const b = new GPT({ vocabSize: 13, blockSize: 8, layers: 1, heads: H, dModel: C, device }, sampler('sd-b'));
    const bad = Tensor.zeros([3], { device });
    try {
      const before = await b.wte.weight.value.toFloat32Array();
      await expect(b.loadStateDict({ ...a.stateDict(), extra: bad })).rejects.toThrow("an extra 'extra'");
      await expect(b.loadStateDict({ ...a.stateDict(), 'transformer.wte.weight': bad })).rejects.toThrow(/state\['transformer.wte.weight'\] to have shape \[13, 16\]/);
      expect(await b.wte.weight.value.toFloat32Array()).toEqual(before);
      await b.loadStateDict(a.stateDict());
      for (const [name, t] of Object.entries(a.stateDict())) {
        expect([name, await b.stateDict()[name].toFloat32Array()]).toEqual([name, await t.toFloat32Array()]);
      }
    } finally {
      a.dispose();
      b.dispose();
      bad.dispose();
    }
  });

  test('backward without a training-mode forward throws', () => {
    const lin = new Linear(C, 4, { device, normal: sampler('nofwd') });
    try {
      expect(() => lin.backward(lin.weight.grad)).toThrow(/Linear.backward\(\) needs a forward\(\) in training mode first/);
    } finally {
      lin.dispose();
    }
  });
});

describeEachDevice('memory', (device) => {
  test('forward + backward + step + dispose returns to the baseline; eval forward keeps nothing', async () => {
    await synchronizeAll();
    const start = liveMemory();
    const model = new GPT({ vocabSize: 13, blockSize: 8, layers: 2, heads: H, dModel: C, device }, sampler('mem'));
    const opt = new AdamW(model.parameters(), { lr: 1e-3, maxGradNorm: 1 });
    const ids = Tensor.fromInt32Array(Int32Array.from({ length: 2 * 8 }, (_, i) => (i * 5) % 13), [2, 8], { device });
    const targets = Tensor.fromInt32Array(Int32Array.from({ length: 2 * 8 }, (_, i) => (i * 3 + 1) % 13), [2, 8], { device });
    try {
      // One step allocates the optimizer's norm; measure from after it.
      for (let i = 0; i < 2; i += 1) {
        opt.zeroGrad();
        model.forward(ids, { targets }).dispose();
        model.backward();
        opt.step();
      }
      await synchronizeAll();
      const steady = liveMemory();
      for (let i = 0; i < 3; i += 1) {
        opt.zeroGrad();
        const loss = model.forward(ids, { targets });
        model.backward();
        opt.step();
        loss.dispose();
        await synchronizeAll();
        expect(liveMemory()).toEqual(steady);
      }
      model.eval();
      model.forward(ids, { targets }).dispose();
      model.logits(ids).dispose();
      await synchronizeAll();
      expect(liveMemory()).toEqual(steady);
      // A forward whose backward never runs is released by train()/release().
      model.train(true);
      model.forward(ids, { targets }).dispose();
      model.release();
      await synchronizeAll();
      expect(liveMemory()).toEqual(steady);
    } finally {
      ids.dispose();
      targets.dispose();
      opt.dispose();
      model.dispose();
    }
    await synchronizeAll();
    expect(liveMemory()).toEqual(start);
  });
});

describe('AdamW', () => {
  /** PyTorch's AdamW in float64 with clip_grad_norm_ over all gradients. */
  function reference(w: Float64Array[], g: Float64Array[], m: Float64Array[], v: Float64Array[], step: number,
    o: { lr: number; beta1: number; beta2: number; eps: number; wd: number[]; maxNorm: number }): void {
    let sq = 0;
    for (const gi of g) for (const x of gi) sq += x * x;
    const clip = Math.min(1, o.maxNorm / (Math.sqrt(sq) + 1e-6));
    const bc1 = 1 - o.beta1 ** step, bc2 = 1 - o.beta2 ** step;
    w.forEach((wi, p) => {
      for (let i = 0; i < wi.length; i += 1) {
        const gr = g[p][i] * clip;
        wi[i] -= o.lr * o.wd[p] * wi[i];
        m[p][i] = o.beta1 * m[p][i] + (1 - o.beta1) * gr;
        v[p][i] = o.beta2 * v[p][i] + (1 - o.beta2) * gr * gr;
        wi[i] -= o.lr * (m[p][i] / bc1) / (Math.sqrt(v[p][i] / bc2) + o.eps);
      }
    });
  }

  test('two clipped steps with a schedule match a float64 reference; decay only on 2-D weights', async () => {
    const rng = rngFor('adamw');
    const shapes = [[3, 5], [7]];
    const init = shapes.map((s) => randn(s[0] * (s[1] ?? 1), rng));
    const params = shapes.map((s, i) => new Parameter(init[i], s, { device }));
    expect(params.map((p) => p.decay)).toEqual([true, false]);
    const lr = (step: number): number => 1e-2 * step;
    const opt = new AdamW(params, { lr, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0.1, maxGradNorm: 0.5 });
    const w = init.map((x) => Float64Array.from(x));
    const m = init.map((x) => new Float64Array(x.length));
    const v = init.map((x) => new Float64Array(x.length));
    try {
      for (let step = 1; step <= 2; step += 1) {
        const grads = shapes.map((s) => randn(s[0] * (s[1] ?? 1), rng, 3));
        params.forEach((p, i) => {
          const g = Tensor.fromFloat32Array(grads[i], p.shape, { device });
          p.grad.copyFrom(g);
          g.dispose();
        });
        opt.step();
        reference(w, grads.map((x) => Float64Array.from(x)), m, v, step, { lr: lr(step), beta1: 0.9, beta2: 0.95, eps: 1e-8, wd: [0.1, 0], maxNorm: 0.5 });
      }
      expect(opt.stepCount).toBe(2);
      const norm = await (opt.lastGradNorm as Tensor).toFloat32Array();
      expect(norm[0]).toBeGreaterThan(0.5); // the clip was active
      for (let p = 0; p < params.length; p += 1) {
        const got = await params[p].value.toFloat32Array();
        got.forEach((x, i) => expect(Math.abs(x - w[p][i])).toBeLessThanOrEqual(1e-5 * Math.max(1, Math.abs(w[p][i]))));
      }
    } finally {
      opt.dispose();
      for (const p of params) p.dispose();
    }
  });

  test('packed groups update in one launch per group, like the parameters one by one', async () => {
    const rng = rngFor('adamw-packed');
    const shapes = [[4, 3], [5], [2, 7], [3]];
    const data = shapes.map((s) => randn(s[0] * (s[1] ?? 1), rng));
    const grads = shapes.map((s) => randn(s[0] * (s[1] ?? 1), rng));
    const make = (): Parameter[] => shapes.map((s, i) => new Parameter(data[i], s, { device, dtype: 'bfloat16' }));
    const loose = make(), packed = make();
    const groups = packParameters(packed);
    const o = { lr: 1e-2, weightDecay: 0.1, maxGradNorm: 0.5 };
    const optLoose = new AdamW(loose, o), optPacked = new AdamW(packed, o);
    try {
      expect(groups.map((g) => [g.decay, g.numel, g.value.dtype, g.master?.dtype])).toEqual([[true, 26, 'bfloat16', 'float32'], [false, 8, 'bfloat16', 'float32']]);
      expect([optLoose.launchesPerStep, optPacked.launchesPerStep]).toEqual([4, 2]);
      // The parameters are views: a write through the group shows in the parameter.
      expect(await packed[2].value.toFloat32Array()).toEqual(await loose[2].value.toFloat32Array());
      for (let step = 0; step < 2; step += 1) {
        for (const set of [loose, packed]) {
          set.forEach((p, i) => {
            const g = Tensor.fromFloat32Array(grads[i], p.shape, { device });
            p.grad.copyFrom(g);
            g.dispose();
          });
        }
        optLoose.step();
        optPacked.step();
      }
      for (let i = 0; i < shapes.length; i += 1) {
        const a = await (loose[i].master as Tensor).toFloat32Array();
        const b = await (packed[i].master as Tensor).toFloat32Array();
        a.forEach((x, j) => expect(Math.abs(x - b[j])).toBeLessThanOrEqual(1e-6));
      }
      optPacked.zeroGrad();
      expect(Array.from(await groups[0].grad.toFloat32Array()).every((x) => x === 0)).toBe(true);
    } finally {
      optLoose.dispose();
      optPacked.dispose();
      for (const p of [...loose, ...packed]) p.dispose();
      for (const g of groups) g.dispose();
    }
  });

  test('refuses bad options with errors that name them', () => {
    const p = new Parameter(new Float32Array(2), [2], { device });
    try {
      expect(() => new AdamW([p], { lr: -1 })).toThrow('Expected options.lr to be a finite number in [0, Infinity] but received -1');
      expect(() => new AdamW([p], { momentum: 0.9 } as never)).toThrow(/^Expected options to have only the keys 'lr', .* unknown key 'momentum'$/);
      expect(() => new AdamW([p], [] as never)).toThrow(/^Expected options to be an object or undefined but received an Array/);
      expect(() => new AdamW([], {})).toThrow('Expected parameters to be a non-empty Array of Parameters');
    } finally {
      p.dispose();
    }
  });
});
