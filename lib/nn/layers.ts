/**
 * The layers of a GPT-style transformer, each with an explicit `forward` and `backward` (see
 * ./module.ts for the ownership rules): {@link Embedding}, {@link Linear}, {@link LayerNorm},
 * {@link RMSNorm}, {@link CausalSelfAttention}, {@link MLP} and {@link Block}. Activations are
 * [batch, seqlen, channels] tensors of the model's dtype; parameter gradients are float32.
 * @packageDocumentation
 */
import { flashAttention, flashAttentionBackward } from '../attention';
import type { DType } from '../half';
import { addInPlace, add } from '../ops/elementwise';
import { embedding, embeddingBackward } from '../ops/embedding';
import { geluBackward, swiglu, swigluBackward } from '../ops/activation';
import { linear, linearBackward, linearGelu, LinearOptions } from '../ops/linear';
import { layerNorm, layerNormBackward, rmsNorm, rmsNormBackward } from '../ops/norm';
import { applyRope } from '../ops/rope';
import { Device, Tensor } from '../tensor';
import { Module, Parameter } from './module';
import { checkDim, innerLinear, layerOptions, linearLayerOptions, normOptions, transformerOptions } from './options';

/** `n` samples of a normal distribution with mean 0 and standard deviation `std` (float32). */
export type NormalSampler = (n: number, std: number) => Float32Array;

/** What every layer constructor takes. */
export interface LayerOptions {
  /** dtype of the parameters and activations. Default 'float32'. */
  dtype?: DType;
  /** Device of the parameters. Required. */
  device: Device;
  /** Source of normal samples for the initial weights (seed it for reproducible runs). Required. */
  normal: NormalSampler;
}

function param(data: Float32Array, shape: number[], o: LayerOptions): Parameter {
  return new Parameter(data, shape, { dtype: o.dtype ?? 'float32', device: o.device });
}

function filled(n: number, value: number): Float32Array {
  return new Float32Array(n).fill(value);
}

/** Standard deviation of nanoGPT's (and GPT-2's) initial weights. */
export const INIT_STD = 0.02;

/**
 * A lookup table: `forward(ids)` gathers rows of `weight` [vocab, dim]. `backward(dout)` adds the
 * rows of dout into the gradient rows of their ids (ids that repeat add up). Initial weights
 * normal(0, 0.02).
 */
export class Embedding extends Module {
  /** [vocab, dim], the model's dtype. */
  readonly weight: Parameter;
  #ids: Tensor | null = null;

  constructor(
    /** Rows of the table: ids are in [0, vocab). */
    readonly vocab: number,
    /** Width of each row. */
    readonly dim: number,
    options: LayerOptions,
  ) {
    super();
    checkDim(vocab, 'Embedding vocab');
    checkDim(dim, 'Embedding dim');
    const o = layerOptions(options, 'Embedding options');
    this.weight = this.addParameter('weight', param(o.normal(vocab * dim, INIT_STD), [vocab, dim], o));
  }

  /**
   * @param ids int32 [...lead], each in [0, vocab); referenced until backward (the caller keeps it alive)
   * @returns [...lead, dim], the model's dtype (caller owns)
   */
  forward(ids: Tensor): Tensor {
    const out = embedding(ids, this.weight.value);
    if (this.training) this.#ids = ids;
    return out;
  }

  /** Accumulates dweight from `dout` [...lead, dim]. Returns nothing (ids have no gradient). */
  backward(dout: Tensor): void {
    const ids = this.requireSaved(this.#ids, 'Embedding');
    this.#ids = null;
    embeddingBackward(ids, dout, this.weight.grad);
  }

  protected override releaseSaved(): void {
    this.#ids = null;
  }
}

/** Options of {@link Linear}. */
export interface LinearLayerOptions extends LayerOptions {
  /** Whether the layer has a bias (initialised to zero). Default true. */
  bias?: boolean;
  /**
   * 'gelu': the output is gelu(x·Wᵀ + b) (tanh approximation, fused into the GEMM's epilogue); the
   * pre-activation is kept for the backward. Default 'none'.
   */
  activation?: 'none' | 'gelu';
  /** Standard deviation of the initial weights. Default 0.02. */
  std?: number;
  /** How float32 products use the CUDA tensor cores (see LinearOptions). Default 'highest'. */
  float32Precision?: LinearOptions['float32Precision'];
}

/** `y = x·Wᵀ + b` (optionally followed by GELU) with weight [out, in] and bias [out]. */
export class Linear extends Module {
  /** [outFeatures, inFeatures], the model's dtype. */
  readonly weight: Parameter;
  /** [outFeatures] or null. */
  readonly bias: Parameter | null;
  /** 'gelu': GELU (tanh) fused into the product's epilogue; 'none': the plain affine map. */
  readonly activation: 'none' | 'gelu';
  readonly #options: LinearOptions;
  #saved: { x: Tensor; pre: Tensor | null } | null = null;

  constructor(
    /** Width of the input's last dim. */
    readonly inFeatures: number,
    /** Width of the output's last dim. */
    readonly outFeatures: number,
    options: LinearLayerOptions,
  ) {
    super();
    checkDim(inFeatures, 'Linear inFeatures');
    checkDim(outFeatures, 'Linear outFeatures');
    const o = linearLayerOptions(options, 'Linear options');
    const std = o.std ?? INIT_STD;
    this.weight = this.addParameter('weight', param(o.normal(outFeatures * inFeatures, std), [outFeatures, inFeatures], o));
    this.bias = o.bias ?? true ? this.addParameter('bias', param(filled(outFeatures, 0), [outFeatures], o)) : null;
    this.activation = o.activation ?? 'none';
    this.#options = { float32Precision: o.float32Precision ?? 'highest' };
  }

  /**
   * @param x [...lead, inFeatures]; referenced until backward
   * @returns [...lead, outFeatures] (caller owns)
   */
  forward(x: Tensor): Tensor {
    this.releaseSaved();
    const b = this.bias ? this.bias.value : null;
    if (this.activation === 'gelu') {
      const { out, pre } = linearGelu(x, this.weight.value, b, this.#options);
      if (this.training) this.#saved = { x, pre };
      else pre.dispose();
      return out;
    }
    const y = linear(x, this.weight.value, b, this.#options);
    if (this.training) this.#saved = { x, pre: null };
    return y;
  }

  /**
   * Accumulates dweight and dbias from `dout` [...lead, outFeatures]; returns dx [...lead,
   * inFeatures] (caller owns), or null with `{ dx: false }` (e.g. the first layer).
   */
  backward(dout: Tensor, options: { dx?: boolean } = {}): Tensor | null {
    const { x, pre } = this.requireSaved(this.#saved, 'Linear');
    this.#saved = null;
    const dy = pre ? geluBackward(dout, pre) : dout;
    pre?.dispose();
    try {
      return linearBackward(dy, x, this.weight.value,
        { dweight: this.weight.grad, dbias: this.bias ? this.bias.grad : null, dx: options.dx ?? true }, this.#options);
    } finally {
      if (dy !== dout) dy.dispose();
    }
  }

  protected override releaseSaved(): void {
    this.#saved?.pre?.dispose();
    this.#saved = null;
  }
}

/** Options of the normalisation layers. */
export interface NormOptions extends Omit<LayerOptions, 'normal'> {
  /** Added to the variance (mean square). Default 1e-5. */
  eps?: number;
}

/** LayerNorm over the last dim, weight 1 and (optional) bias 0 initially, as PyTorch's. */
export class LayerNorm extends Module {
  /** [dim], the model's dtype: the scale. */
  readonly weight: Parameter;
  /** [dim] or null: the shift. */
  readonly bias: Parameter | null;
  /** Added to the variance before the square root. */
  readonly eps: number;
  #saved: { x: Tensor; mean: Tensor; rstd: Tensor } | null = null;

  constructor(
    /** Width of the normalised last dim. */
    readonly dim: number,
    options: NormOptions & { bias?: boolean },
  ) {
    super();
    checkDim(dim, 'LayerNorm dim');
    const o = normOptions(options, 'LayerNorm options', true);
    this.weight = this.addParameter('weight', new Parameter(filled(dim, 1), [dim], { dtype: o.dtype, device: o.device }));
    this.bias = o.bias ?? true
      ? this.addParameter('bias', new Parameter(filled(dim, 0), [dim], { dtype: o.dtype, device: o.device }))
      : null;
    this.eps = o.eps ?? 1e-5;
  }

  /** @param x [...lead, dim]; referenced until backward. @returns normalised x (caller owns) */
  forward(x: Tensor): Tensor {
    this.releaseSaved();
    const { out, mean, rstd } = layerNorm(x, this.weight.value, this.bias ? this.bias.value : null, { eps: this.eps });
    if (this.training) this.#saved = { x, mean, rstd };
    else {
      mean.dispose();
      rstd.dispose();
    }
    return out;
  }

  /** Accumulates dweight (and dbias); returns dx (caller owns). */
  backward(dout: Tensor): Tensor {
    const { x, mean, rstd } = this.requireSaved(this.#saved, 'LayerNorm');
    this.#saved = null;
    try {
      return layerNormBackward(dout, x, this.weight.value, mean, rstd,
        { dweight: this.weight.grad, dbias: this.bias ? this.bias.grad : null });
    } finally {
      mean.dispose();
      rstd.dispose();
    }
  }

  protected override releaseSaved(): void {
    if (this.#saved) {
      this.#saved.mean.dispose();
      this.#saved.rstd.dispose();
    }
    this.#saved = null;
  }
}

/** RMSNorm over the last dim (weight only, 1 initially). */
export class RMSNorm extends Module {
  /** [dim], the model's dtype: the scale. */
  readonly weight: Parameter;
  /** Added to the mean square before the square root. */
  readonly eps: number;
  #saved: { x: Tensor; rstd: Tensor } | null = null;

  constructor(
    /** Width of the normalised last dim. */
    readonly dim: number,
    options: NormOptions,
  ) {
    super();
    checkDim(dim, 'RMSNorm dim');
    const o = normOptions(options, 'RMSNorm options', false);
    this.weight = this.addParameter('weight', new Parameter(filled(dim, 1), [dim], { dtype: o.dtype, device: o.device }));
    this.eps = o.eps ?? 1e-5;
  }

  /** @param x [...lead, dim]; referenced until backward. @returns normalised x (caller owns) */
  forward(x: Tensor): Tensor {
    this.releaseSaved();
    const { out, rstd } = rmsNorm(x, this.weight.value, { eps: this.eps });
    if (this.training) this.#saved = { x, rstd };
    else rstd.dispose();
    return out;
  }

  /** Accumulates dweight; returns dx (caller owns). */
  backward(dout: Tensor): Tensor {
    const { x, rstd } = this.requireSaved(this.#saved, 'RMSNorm');
    this.#saved = null;
    try {
      return rmsNormBackward(dout, x, this.weight.value, rstd, { dweight: this.weight.grad });
    } finally {
      rstd.dispose();
    }
  }

  protected override releaseSaved(): void {
    this.#saved?.rstd.dispose();
    this.#saved = null;
  }
}

/** The normalisation layers' common interface. */
export type Norm = LayerNorm | RMSNorm;

/** Architecture choices shared by the transformer layers (see GPTConfig in ./gpt.ts). */
export interface TransformerOptions extends LayerOptions {
  /** Model width (channels). */
  dModel: number;
  /** Attention heads; dModel must be a multiple of it. */
  heads: number;
  /** Number of blocks (scales the initial weights of the residual projections by 1/√(2·layers)). */
  layers: number;
  /** 'layernorm' (GPT-2) or 'rmsnorm'. */
  norm: 'layernorm' | 'rmsnorm';
  /** 'gelu' (GPT-2: 4·dModel hidden, tanh GELU) or 'swiglu'. */
  mlp: 'gelu' | 'swiglu';
  /** Hidden width of the MLP (for 'swiglu', the width after the gate). */
  mlpHidden: number;
  /** Biases in the linear layers and LayerNorms. */
  bias: boolean;
  /** Rotary embeddings on q and k (instead of learned positions, which the GPT adds). */
  rope: boolean;
  /** RoPE base. Default 10000. */
  ropeBase?: number;
  /** How float32 products (linear layers and attention) use the CUDA tensor cores. Default 'highest'. */
  float32Precision?: 'tf32' | 'highest';
}

/** A norm layer of the configured kind. */
export function makeNorm(options: TransformerOptions): Norm {
  const o = transformerOptions(options, 'options');
  return o.norm === 'rmsnorm'
    ? new RMSNorm(o.dModel, { dtype: o.dtype, device: o.device })
    : new LayerNorm(o.dModel, { dtype: o.dtype, device: o.device, bias: o.bias });
}

/** Initial standard deviation of the projections into the residual stream (nanoGPT's c_proj). */
function residualStd(layers: number): number {
  return INIT_STD / Math.sqrt(2 * layers);
}

/**
 * Causal multi-head self-attention: one packed QKV projection `c_attn` (dModel → 3·dModel, read as
 * [B, S, 3, heads, headDim]; q, k and v are strided views of it, never copied), optional RoPE on q
 * and k (in place), FlashAttention-2 (causal, scale 1/√headDim; its backward writes dq, dk and dv
 * into the views of one packed gradient), and the output projection `c_proj`.
 */
export class CausalSelfAttention extends Module {
  /** The packed QKV projection, dModel → 3·dModel. */
  readonly c_attn: Linear;
  /** The output projection, dModel → dModel. */
  readonly c_proj: Linear;
  /** Attention heads (q, k and v alike). */
  readonly heads: number;
  /** dModel / heads. */
  readonly headDim: number;
  readonly #rope: boolean;
  readonly #ropeBase: number;
  readonly #precision: 'tf32' | 'highest';
  #saved: { qkv: Tensor; out: Tensor; lse: Tensor; y: Tensor } | null = null;

  constructor(options: TransformerOptions) {
    super();
    const o = transformerOptions(options, 'CausalSelfAttention options');
    this.heads = o.heads;
    this.headDim = o.dModel / o.heads;
    this.c_attn = this.addModule('c_attn', new Linear(o.dModel, 3 * o.dModel, innerLinear(o)));
    this.c_proj = this.addModule('c_proj', new Linear(o.dModel, o.dModel, innerLinear(o, { std: residualStd(o.layers) })));
    this.#rope = o.rope;
    this.#ropeBase = o.ropeBase ?? 10000;
    this.#precision = o.float32Precision ?? 'highest';
  }

  /**
   * The q, k and v views [B, S, H, D] (strides [S·3C, 3C, D, 1]) of a packed [B, S, 3·C] tensor read
   * as [B, S, 3, H, D]: attention reads and writes heads in place, without copies. The caller
   * disposes the views.
   */
  #heads(packed: Tensor): [Tensor, Tensor, Tensor] {
    const [B, S] = packed.shape;
    const five = packed.view([B, S, 3, this.heads, this.headDim]);
    try {
      return [five.select(2, 0), five.select(2, 1), five.select(2, 2)];
    } finally {
      five.dispose();
    }
  }

  /** @param x [B, S, dModel]; referenced until backward. @returns [B, S, dModel] (caller owns) */
  forward(x: Tensor): Tensor {
    this.releaseSaved();
    const [B, S, C] = x.shape;
    const qkv = this.c_attn.forward(x); // [B, S, 3C], read as [B, S, 3, H, D]
    const [q, k, v] = this.#heads(qkv);
    if (this.#rope) {
      // In place in the packed projection: the backward reads q and k rotated, as it needs them.
      applyRope(q, { base: this.#ropeBase });
      applyRope(k, { base: this.#ropeBase });
    }
    const { out, lse } = flashAttention(q, k, v, { causal: true, float32Precision: this.#precision });
    for (const t of [q, k, v]) t.dispose();
    const y = out.view([B, S, C]);
    const result = this.c_proj.forward(y);
    if (this.training) this.#saved = { qkv, out, lse, y };
    else for (const t of [qkv, out, lse, y]) t.dispose();
    return result;
  }

  /** Accumulates the projections' gradients; returns dx [B, S, dModel] (caller owns). */
  backward(dout: Tensor): Tensor {
    const { qkv, out, lse, y } = this.requireSaved(this.#saved, 'CausalSelfAttention');
    this.#saved = null;
    const [B, S, C] = dout.shape;
    const dy = this.c_proj.backward(dout) as Tensor; // [B, S, C]
    y.dispose();
    const dout4 = dy.view([B, S, this.heads, this.headDim]);
    const [q, k, v] = this.#heads(qkv);
    // dq, dk and dv are written straight into the packed gradient of c_attn's output.
    const dqkv = Tensor.empty([B, S, 3 * C], { dtype: dout.dtype, device: dout.device });
    const [dq, dk, dv] = this.#heads(dqkv);
    // deterministic: the same gradients on every run (--seed reproduces a CUDA run bit for bit).
    flashAttentionBackward(dout4, q, k, v, out, lse,
      { causal: true, float32Precision: this.#precision, deterministic: true, dq, dk, dv });
    if (this.#rope) {
      applyRope(dq, { base: this.#ropeBase, inverse: true });
      applyRope(dk, { base: this.#ropeBase, inverse: true });
    }
    for (const t of [dout4, dy, q, k, v, qkv, out, lse, dq, dk, dv]) t.dispose();
    try {
      return this.c_attn.backward(dqkv) as Tensor;
    } finally {
      dqkv.dispose();
    }
  }

  protected override releaseSaved(): void {
    if (this.#saved) for (const t of Object.values(this.#saved)) t.dispose();
    this.#saved = null;
  }
}

/**
 * The feed-forward network: 'gelu' is c_fc (dModel → hidden, GELU fused) then c_proj (hidden →
 * dModel); 'swiglu' is c_fc (dModel → 2·hidden: gate then value), silu(gate)·value, then c_proj.
 */
export class MLP extends Module {
  /** The first projection: dModel → hidden ('gelu', GELU fused) or dModel → 2·hidden ('swiglu'). */
  readonly c_fc: Linear;
  /** The projection back, hidden → dModel. */
  readonly c_proj: Linear;
  /** Which feed-forward network this is. */
  readonly kind: 'gelu' | 'swiglu';
  #saved: { u: Tensor | null; h: Tensor } | null = null;

  constructor(options: TransformerOptions) {
    super();
    const o = transformerOptions(options, 'MLP options');
    this.kind = o.mlp;
    const width = o.mlp === 'swiglu' ? 2 * o.mlpHidden : o.mlpHidden;
    this.c_fc = this.addModule('c_fc', new Linear(o.dModel, width, innerLinear(o, { activation: o.mlp === 'gelu' ? 'gelu' : 'none' })));
    this.c_proj = this.addModule('c_proj', new Linear(o.mlpHidden, o.dModel, innerLinear(o, { std: residualStd(o.layers) })));
  }

  /** @param x [B, S, dModel]; referenced until backward. @returns [B, S, dModel] (caller owns) */
  forward(x: Tensor): Tensor {
    this.releaseSaved();
    let u: Tensor | null = null;
    let h: Tensor;
    if (this.kind === 'swiglu') {
      u = this.c_fc.forward(x);
      h = swiglu(u);
    } else {
      h = this.c_fc.forward(x);
    }
    const out = this.c_proj.forward(h);
    if (this.training) this.#saved = { u, h };
    else {
      u?.dispose();
      h.dispose();
    }
    return out;
  }

  /** Accumulates the projections' gradients; returns dx (caller owns). */
  backward(dout: Tensor): Tensor {
    const { u, h } = this.requireSaved(this.#saved, 'MLP');
    this.#saved = null;
    const dh = this.c_proj.backward(dout) as Tensor;
    h.dispose();
    let dfc = dh;
    if (u) {
      dfc = swigluBackward(dh, u);
      dh.dispose();
      u.dispose();
    }
    try {
      return this.c_fc.backward(dfc) as Tensor;
    } finally {
      dfc.dispose();
    }
  }

  protected override releaseSaved(): void {
    if (this.#saved) {
      this.#saved.u?.dispose();
      this.#saved.h.dispose();
    }
    this.#saved = null;
  }
}

/** A pre-norm transformer block: x + attn(ln_1(x)), then r + mlp(ln_2(r)). */
export class Block extends Module {
  /** The norm before attention. */
  readonly ln_1: Norm;
  /** The causal self-attention. */
  readonly attn: CausalSelfAttention;
  /** The norm before the MLP. */
  readonly ln_2: Norm;
  /** The feed-forward network. */
  readonly mlp: MLP;
  #saved: { h1: Tensor; r: Tensor; h2: Tensor } | null = null;

  constructor(options: TransformerOptions) {
    super();
    const o = transformerOptions(options, 'Block options');
    this.ln_1 = this.addModule('ln_1', makeNorm(o));
    this.attn = this.addModule('attn', new CausalSelfAttention(o));
    this.ln_2 = this.addModule('ln_2', makeNorm(o));
    this.mlp = this.addModule('mlp', new MLP(o));
  }

  /** @param x [B, S, dModel]; referenced until backward. @returns [B, S, dModel] (caller owns) */
  forward(x: Tensor): Tensor {
    this.releaseSaved();
    const h1 = this.ln_1.forward(x);
    const a = this.attn.forward(h1);
    const r = add(x, a);
    a.dispose();
    const h2 = this.ln_2.forward(r);
    const m = this.mlp.forward(h2);
    addInPlace(m, r); // m = r + mlp(...): the block's output
    if (this.training) this.#saved = { h1, r, h2 };
    else {
      h1.dispose();
      r.dispose();
      h2.dispose();
    }
    return m;
  }

  /** Accumulates every gradient of the block; returns dx (caller owns). `dout` is left to the caller. */
  backward(dout: Tensor): Tensor {
    const { h1, r, h2 } = this.requireSaved(this.#saved, 'Block');
    this.#saved = null;
    const dh2 = this.mlp.backward(dout);
    h2.dispose();
    const dr = this.ln_2.backward(dh2);
    dh2.dispose();
    r.dispose();
    addInPlace(dr, dout); // the residual path
    const dh1 = this.attn.backward(dr);
    h1.dispose();
    const dx = this.ln_1.backward(dh1);
    dh1.dispose();
    addInPlace(dx, dr);
    dr.dispose();
    return dx;
  }

  protected override releaseSaved(): void {
    if (this.#saved) for (const t of Object.values(this.#saved)) t.dispose();
    this.#saved = null;
  }
}
