/**
 * A GPT (decoder-only transformer language model) from the layers of ./layers.ts: token embedding,
 * learned positions or RoPE, pre-norm blocks, a final norm, and an LM head tied to the token
 * embedding. The default configuration is nanoGPT's GPT-2 architecture.
 * @packageDocumentation
 */
import { describeValue, rangeError, refuseUnknownKeys, typeError } from '../errors';
import type { DType } from '../half';
import { crossEntropy } from '../ops/loss';
import { linear, linearBackward } from '../ops/linear';
import { addInPlace } from '../ops/elementwise';
import { embedding, embeddingBackward } from '../ops/embedding';
import { Device, Tensor } from '../tensor';
import { Block, Embedding, makeNorm, Norm, NormalSampler, TransformerOptions } from './layers';
import { Module } from './module';

/** A GPT's architecture and placement. */
export interface GPTConfig {
  /** Number of token ids. */
  vocabSize: number;
  /** Longest sequence (the learned position table's rows). */
  blockSize: number;
  /** Number of blocks. */
  layers: number;
  /** Attention heads per block. */
  heads: number;
  /** Model width; a multiple of heads. */
  dModel: number;
  /** 'layernorm' (default, GPT-2) or 'rmsnorm'. */
  norm?: 'layernorm' | 'rmsnorm';
  /** 'gelu' (default, GPT-2: tanh GELU, 4·dModel hidden) or 'swiglu'. */
  mlp?: 'gelu' | 'swiglu';
  /** MLP hidden width. Default 4·dModel for 'gelu'; for 'swiglu', 8·dModel/3 rounded up to a multiple of 64. */
  mlpHidden?: number;
  /** 'learned' (default, GPT-2: a [blockSize, dModel] table) or 'rope' (rotary q and k, no table). */
  positions?: 'learned' | 'rope';
  /** Biases in the linear layers and LayerNorms. Default true (nanoGPT's default). */
  bias?: boolean;
  /** dtype of the parameters and activations. Default 'float32'. */
  dtype?: DType;
  /**
   * How float32 products (linear layers, attention) use the CUDA tensor cores: 'highest' (default,
   * full float32 accuracy, as PyTorch with TF32 off) or 'tf32'. Ignored for float16/bfloat16.
   */
  float32Precision?: 'tf32' | 'highest';
  /** Device. Required. */
  device: Device;
}

/** A config with every default filled in. */
export type ResolvedGPTConfig = Required<GPTConfig>;

const MULTIPLE_OF = 64;

const CONFIG_KEYS = ['vocabSize', 'blockSize', 'layers', 'heads', 'dModel', 'norm', 'mlp', 'mlpHidden', 'positions', 'bias',
  'dtype', 'float32Precision', 'device'] as const satisfies readonly (keyof GPTConfig)[];

/** Fills in a config's defaults and checks it. Unknown keys are refused. */
export function resolveConfig(c: GPTConfig): ResolvedGPTConfig {
  if (c === null || typeof c !== 'object' || Array.isArray(c)) throw typeError('config to be an object', describeValue(c));
  refuseUnknownKeys(c, 'config', CONFIG_KEYS);
  for (const k of ['vocabSize', 'blockSize', 'layers', 'heads', 'dModel'] as const) {
    if (!Number.isSafeInteger(c[k]) || c[k] < 1) throw rangeError(`config.${k} to be a positive integer`, describeValue(c[k]));
  }
  if (c.dModel % c.heads !== 0) throw rangeError(`config.dModel to be a multiple of config.heads (${c.heads})`, `${c.dModel}`);
  const mlp = c.mlp ?? 'gelu';
  const hidden = c.mlpHidden ?? (mlp === 'gelu' ? 4 * c.dModel : Math.ceil((8 * c.dModel) / 3 / MULTIPLE_OF) * MULTIPLE_OF);
  return {
    vocabSize: c.vocabSize, blockSize: c.blockSize, layers: c.layers, heads: c.heads, dModel: c.dModel,
    norm: c.norm ?? 'layernorm', mlp, mlpHidden: hidden, positions: c.positions ?? 'learned', bias: c.bias ?? true,
    dtype: c.dtype ?? 'float32', float32Precision: c.float32Precision ?? 'highest', device: c.device,
  };
}

/** Options of {@link GPT.forward}. */
export interface GPTForwardOptions {
  /** int32 [B, S] next-token targets; with them the forward returns the mean cross-entropy loss. */
  targets?: Tensor;
}

/**
 * A GPT language model. Parameter names are nanoGPT's ('transformer.wte.weight',
 * 'transformer.h.0.attn.c_attn.weight', ...; the LM head is the token embedding, so
 * 'lm_head.weight' is not stored separately), so a checkpoint maps one to one onto nanoGPT's
 * state_dict.
 *
 * Training step:
 * ```ts
 * model.zeroGrad();                                  // or the optimizer's zeroGrad
 * const loss = model.forward(ids, { targets });     // float32 [1], caller owns
 * model.backward();                                  // gradients of the mean loss
 * ```
 */
export class GPT extends Module {
  /** The architecture, every default filled in. */
  readonly config: ResolvedGPTConfig;
  /** The token embedding [vocabSize, dModel], tied to the lm head. */
  readonly wte: Embedding;
  /** The learned position embedding [blockSize, dModel], or null with rotary positions. */
  readonly wpe: Embedding | null;
  /** The transformer blocks, in order. */
  readonly h: Block[];
  /** The final norm before the lm head. */
  readonly ln_f: Norm;
  #positions: Tensor | null = null;
  readonly #linearOptions: { float32Precision: 'tf32' | 'highest' };
  #saved: { ids: Tensor; xs: Tensor[]; xf: Tensor; dlogits: Tensor } | null = null;

  /**
   * @param config the architecture (see {@link GPTConfig})
   * @param normal source of normal samples for the initial weights: nanoGPT's init (normal(0, 0.02),
   *   residual projections 0.02/√(2·layers), zero biases, unit norm weights)
   */
  constructor(config: GPTConfig, normal: NormalSampler) {
    super();
    const c = resolveConfig(config);
    this.config = c;
    this.#linearOptions = { float32Precision: c.float32Precision };
    const o: TransformerOptions = {
      dtype: c.dtype, device: c.device, normal, dModel: c.dModel, heads: c.heads, layers: c.layers, norm: c.norm,
      mlp: c.mlp, mlpHidden: c.mlpHidden, bias: c.bias, rope: c.positions === 'rope',
      float32Precision: c.float32Precision,
    };
    const e = { dtype: c.dtype, device: c.device, normal };
    this.wte = this.addModule('transformer.wte', new Embedding(c.vocabSize, c.dModel, e));
    this.wpe = c.positions === 'learned' ? this.addModule('transformer.wpe', new Embedding(c.blockSize, c.dModel, e)) : null;
    this.h = [];
    for (let i = 0; i < c.layers; i += 1) this.h.push(this.addModule(`transformer.h.${i}`, new Block(o)));
    this.ln_f = this.addModule('transformer.ln_f', makeNorm(o));
    // Flat storages: zeroGrad is one fill per group, gradNorm and AdamW one launch per group.
    this.packParameters();
  }

  /** int32 [B, S] position ids 0..S-1 per row (cached for the last shape). */
  #positionIds(B: number, S: number): Tensor {
    const p = this.#positions;
    if (p && p.shape[0] === B && p.shape[1] === S) return p;
    p?.dispose();
    const ids = new Int32Array(B * S);
    for (let i = 0; i < ids.length; i += 1) ids[i] = i % S;
    this.#positions = Tensor.fromInt32Array(ids, [B, S], { device: this.config.device });
    return this.#positions;
  }

  /** Token plus position embeddings of ids [B, S]: [B, S, dModel] (caller owns). */
  #embed(ids: Tensor): Tensor {
    const [B, S] = ids.shape;
    const x = embedding(ids, this.wte.weight.value);
    if (this.wpe) {
      const pos = embedding(this.#positionIds(B, S), this.wpe.weight.value);
      addInPlace(x, pos);
      pos.dispose();
    }
    return x;
  }

  #checkIds(ids: Tensor, arg: string): void {
    if (!(ids instanceof Tensor) || ids.dtype !== 'int32' || ids.shape.length !== 2) {
      throw typeError(`${arg} to be an int32 Tensor [batch, seqlen]`, ids instanceof Tensor ? ids.toString() : describeValue(ids));
    }
    if (ids.shape[1] > this.config.blockSize) {
      throw rangeError(`${arg} to have at most blockSize (${this.config.blockSize}) positions`, `${ids.shape[1]}`);
    }
  }

  /** Runs the blocks and the final norm; keeps the block inputs in training mode. */
  #trunk(ids: Tensor): { xs: Tensor[]; xf: Tensor } {
    const xs: Tensor[] = [];
    let x = this.#embed(ids);
    for (const block of this.h) {
      xs.push(x);
      const y = block.forward(x);
      if (!this.training) x.dispose();
      x = y;
    }
    xs.push(x);
    const xf = this.ln_f.forward(x);
    if (!this.training) {
      x.dispose();
      xs.length = 0;
    }
    return { xs, xf };
  }

  /**
   * Logits of every position (no loss), in evaluation mode: [B, S, vocabSize] in the model's dtype
   * (caller owns). For sampling and evaluation; keeps nothing.
   */
  logits(ids: Tensor): Tensor {
    this.#checkIds(ids, 'ids');
    const mode = this.training;
    if (mode) this.eval();
    try {
      const { xf } = this.#trunk(ids);
      try {
        return linear(xf, this.wte.weight.value, null, this.#linearOptions);
      } finally {
        xf.dispose();
      }
    } finally {
      if (mode) this.train(true);
    }
  }

  /**
   * The mean next-token cross-entropy of ids [B, S] against `targets` [B, S] (float32 [1], caller
   * owns). In training mode the gradient of the logits is computed in the same fused kernel and
   * kept, with the activations, for {@link backward}; the logits themselves are freed at once.
   */
  forward(ids: Tensor, options: GPTForwardOptions): Tensor {
    this.#checkIds(ids, 'ids');
    const targets = options.targets;
    if (!(targets instanceof Tensor) || targets.dtype !== 'int32' || targets.shape.length !== 2
      || targets.shape[0] !== ids.shape[0] || targets.shape[1] !== ids.shape[1]) {
      throw typeError(`options.targets to be an int32 Tensor of the shape of ids [${ids.shape.join(', ')}]`,
        targets instanceof Tensor ? targets.toString() : describeValue(targets));
    }
    this.release();
    const { xs, xf } = this.#trunk(ids);
    const logits = linear(xf, this.wte.weight.value, null, this.#linearOptions); // [B, S, V]: the LM head tied to wte
    const { loss, dlogits } = crossEntropy(logits, targets, { grad: this.training });
    logits.dispose();
    if (this.training) this.#saved = { ids, xs, xf, dlogits: dlogits as Tensor };
    else xf.dispose();
    return loss;
  }

  /**
   * Backpropagates the mean loss of the last training-mode {@link forward}: accumulates (+=) every
   * parameter's gradient (the tied wte.weight gets the LM head's and the embedding's) and frees what
   * the forward kept.
   */
  backward(): void {
    const { ids, xs, xf, dlogits } = this.requireSaved(this.#saved, 'GPT');
    this.#saved = null;
    const dxf = linearBackward(dlogits, xf, this.wte.weight.value, { dweight: this.wte.weight.grad }, this.#linearOptions) as Tensor;
    dlogits.dispose();
    xf.dispose();
    let dx = this.ln_f.backward(dxf);
    dxf.dispose();
    (xs.pop() as Tensor).dispose();
    for (let i = this.h.length - 1; i >= 0; i -= 1) {
      const d = this.h[i].backward(dx);
      dx.dispose();
      (xs.pop() as Tensor).dispose();
      dx = d;
    }
    embeddingBackward(ids, dx, this.wte.weight.grad);
    if (this.wpe) {
      const [B, S] = ids.shape;
      embeddingBackward(this.#positionIds(B, S), dx, this.wpe.weight.grad);
    }
    dx.dispose();
  }

  protected override releaseSaved(): void {
    if (this.#saved) {
      const { xs, xf, dlogits } = this.#saved;
      for (const t of [...xs, xf, dlogits]) t.dispose();
    }
    this.#saved = null;
  }

  /** Frees the parameters, the cached position ids and anything kept from a forward. */
  override dispose(): void {
    super.dispose();
    this.#positions?.dispose();
    this.#positions = null;
  }
}
