/**
 * The layer API's foundation: {@link Parameter} (a value, its float32 gradient and, for float16 or
 * bfloat16 values, a float32 master copy) and {@link Module} (a tree of layers that owns
 * parameters).
 *
 * Design: layers have an explicit `forward` and `backward`, as llm.c's layers do, instead of a tape
 * autograd. In training mode `forward` keeps the activations its `backward` needs; `backward`
 * consumes them and disposes them. So the order of the kernels and the memory held between the
 * forward and the backward are visible in the code, there is no graph bookkeeping, and every tensor
 * has exactly one owner:
 * - a layer owns the tensors it creates and keeps (statistics, pre-activations) and frees them in
 *   `backward` (or {@link Module.release});
 * - a layer only references its input: the caller, which created it, keeps it alive until the
 *   layer's `backward` has run and then disposes it;
 * - `forward` returns a new tensor the caller owns; `backward(dout)` leaves `dout` to the caller and
 *   returns a new input gradient the caller owns.
 * Parameter gradients are accumulated (+=) by `backward`; {@link Module.zeroGrad} clears them.
 * @packageDocumentation
 */
import { describeValue, formatShape, rangeError, typeError } from '../errors';
import type { DType } from '../half';
import { Device, Tensor } from '../tensor';
import { checkShape, parameterOptions } from './options';

/** Options of a new {@link Parameter}. */
export interface ParameterOptions {
  /** dtype of the value (the model's dtype). Default 'float32'. */
  dtype?: DType;
  /** Device of every tensor of the parameter. Required. */
  device: Device;
  /**
   * Whether AdamW applies weight decay to it. Default: true for a parameter of 2 or more dims
   * (matrices and embeddings), false for vectors (biases, norm weights), as nanoGPT groups them.
   */
  decay?: boolean;
}

/**
 * A trainable tensor: `value` in the model's dtype, `grad` (float32, same shape, accumulated by the
 * layers' backward), and `master` (float32) when the value is float16 or bfloat16, which the
 * optimizer updates and rounds into `value`. The optimizer's moment estimates live in the optimizer.
 */
export class Parameter implements Disposable {
  /** dtype of {@link value}. */
  readonly dtype: DType;
  /** Device of every tensor of the parameter. */
  readonly device: Device;
  /** Shape of the value, the gradient and the master. */
  readonly shape: readonly number[];
  /** Whether AdamW applies weight decay to it. */
  readonly decay: boolean;
  #value: Tensor;
  #grad: Tensor;
  #master: Tensor | null;
  #group: ParameterGroup | null = null;

  /** A parameter holding `data` (float32 values, rounded to `dtype` for the value), gradient zero. */
  constructor(data: Float32Array, shape: readonly number[], options: ParameterOptions) {
    if (!(data instanceof Float32Array)) throw typeError('data to be a Float32Array', describeValue(data));
    const dims = checkShape(shape, 'shape');
    const o = parameterOptions(options, 'options');
    this.dtype = o.dtype ?? 'float32';
    this.device = o.device;
    this.shape = Object.freeze(dims);
    this.decay = o.decay ?? dims.length >= 2;
    const n = dims.reduce((a, b) => a * b, 1);
    if (data.length !== n) throw rangeError(`data to have ${n} elements for shape ${formatShape(dims)}`, `${data.length}`);
    this.#value = Tensor.fromFloat32Array(data, shape, { dtype: this.dtype, device: this.device });
    this.#grad = Tensor.zeros(shape, { dtype: 'float32', device: this.device });
    this.#master = this.dtype === 'float32' ? null : Tensor.fromFloat32Array(data, shape, { dtype: 'float32', device: this.device });
  }

  /** The value, in the model's dtype (read by the forward and the backward). */
  get value(): Tensor {
    return this.#value;
  }

  /** float32 gradient, accumulated (+=) by backward passes. */
  get grad(): Tensor {
    return this.#grad;
  }

  /** float32 master copy of the value (float16/bfloat16 parameters), or null (float32). */
  get master(): Tensor | null {
    return this.#master;
  }

  /** Number of elements. */
  get numel(): number {
    return this.#value.numel;
  }

  /** The weights as the optimizer sees them: the master when there is one, else the value (float32). */
  get weights(): Tensor {
    return this.#master ?? this.#value;
  }

  /** Sets the gradient to zero (in place, queued on the device). */
  zeroGrad(): void {
    this.#grad.fill(0);
  }

  /**
   * Overwrites the value (and master) with `data` (float32, rounded to the dtype for the value), in
   * place: a parameter packed into a {@link ParameterGroup} stays a view of the group's storage.
   */
  setData(data: Float32Array): void {
    if (!(data instanceof Float32Array) || data.length !== this.numel) {
      throw typeError(`data to be a Float32Array of ${this.numel} elements`, describeValue(data));
    }
    const src = Tensor.fromFloat32Array(data, this.shape, { dtype: 'float32', device: this.device });
    try {
      this.#value.copyFrom(src);
      this.#master?.copyFrom(src);
    } finally {
      src.dispose();
    }
  }

  /** The group whose flat storage holds this parameter, or null (its own tensors). */
  get group(): ParameterGroup | null {
    return this.#group;
  }

  /**
   * @internal Moves the parameter into `group`: copies value and master into the given views, zeroes
   * nothing (the group's gradient storage starts at zero), and frees the parameter's own tensors.
   */
  adopt(group: ParameterGroup, value: Tensor, grad: Tensor, master: Tensor | null): void {
    value.copyFrom(this.#value);
    if (master) master.copyFrom(this.weights);
    grad.copyFrom(this.#grad);
    this.#value.dispose();
    this.#grad.dispose();
    this.#master?.dispose();
    this.#value = value;
    this.#grad = grad;
    this.#master = master;
    this.#group = group;
  }

  /** Frees the value, the gradient and the master (views of a group: the group frees the storage). */
  dispose(): void {
    this.#value.dispose();
    this.#grad.dispose();
    this.#master?.dispose();
  }

  /** Same as {@link dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}

/** An Array of Parameters, copied once (a TypeError naming `arg` for anything else). */
export function checkParameterList(value: unknown, arg: string): Parameter[] {
  if (!Array.isArray(value)) throw typeError(`${arg} to be an Array of Parameters`, describeValue(value));
  const list = [...value] as unknown[];
  list.forEach((p, i) => {
    if (!(p instanceof Parameter)) throw typeError(`${arg}[${i}] to be a Parameter`, describeValue(p));
  });
  return list as Parameter[];
}

/**
 * Parameters of one dtype, device and weight-decay setting packed into flat storages: `value`
 * [numel] (the model's dtype), `grad` [numel] float32 and `master` [numel] float32 (float16 and
 * bfloat16 values). Each parameter's tensors are views of them, so clearing every gradient is one
 * fill, and the optimizer's gradient norm and AdamW update are one launch per group.
 */
export class ParameterGroup implements Disposable {
  /** The parameters, in storage order. */
  readonly parameters: readonly Parameter[];
  /** Whether AdamW applies weight decay to the group. */
  readonly decay: boolean;
  /** Flat storage of the values (the model's dtype); each parameter's value is a view of it. */
  readonly value: Tensor;
  /** Flat float32 storage of the gradients; each parameter's grad is a view of it. */
  readonly grad: Tensor;
  /** Flat float32 master weights for 16-bit parameters, or null for float32 ones. */
  readonly master: Tensor | null;

  /** Packs `parameters` (one dtype, device and decay setting; each at most in one group). */
  constructor(parameters: readonly Parameter[]) {
    parameters = checkParameterList(parameters, 'parameters');
    if (parameters.length === 0) throw rangeError('at least one parameter in a group', 'none');
    const [first] = parameters;
    for (const p of parameters) {
      if (p.dtype !== first.dtype || p.device !== first.device || p.decay !== first.decay) {
        throw rangeError('the parameters of a group to share dtype, device and decay', `${p.dtype} ${p.device} decay ${p.decay}`);
      }
      if (p.group) throw rangeError('parameters that are in no group yet', 'a parameter already packed');
    }
    this.parameters = Object.freeze([...parameters]);
    this.decay = first.decay;
    const numel = parameters.reduce((a, p) => a + p.numel, 0);
    const device = first.device;
    this.value = Tensor.empty([numel], { dtype: first.dtype, device });
    this.grad = Tensor.zeros([numel], { dtype: 'float32', device });
    this.master = first.master ? Tensor.empty([numel], { dtype: 'float32', device }) : null;
    let offset = 0;
    for (const p of parameters) {
      const slice = (flat: Tensor): Tensor => {
        const part = flat.narrow(0, offset, p.numel);
        try {
          return part.view(p.shape);
        } finally {
          part.dispose();
        }
      };
      p.adopt(this, slice(this.value), slice(this.grad), this.master ? slice(this.master) : null);
      offset += p.numel;
    }
  }

  /** Total elements. */
  get numel(): number {
    return this.value.numel;
  }

  /** Sets the gradients of every parameter of the group to zero (one fill). */
  zeroGrad(): void {
    this.grad.fill(0);
  }

  /** Frees the flat storages (after the parameters' views are disposed, the memory is returned). */
  dispose(): void {
    this.value.dispose();
    this.grad.dispose();
    this.master?.dispose();
  }

  /** Same as {@link dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}

/**
 * Packs `parameters` into groups by (dtype, device, decay): 2-D weights and embeddings in one, the
 * vectors (biases, norm weights) in another, as AdamW treats them. Returns the groups (the caller
 * owns them; {@link Module.packParameters} keeps them with the module).
 */
export function packParameters(parameters: readonly Parameter[]): ParameterGroup[] {
  const byKey = new Map<string, Parameter[]>();
  for (const p of new Set(checkParameterList(parameters, 'parameters'))) {
    const key = `${p.dtype}/${p.device}/${p.decay}`;
    const list = byKey.get(key) ?? [];
    list.push(p);
    byKey.set(key, list);
  }
  return [...byKey.values()].map((list) => new ParameterGroup(list));
}

/** A parameter with its dotted name in the module tree (e.g. 'transformer.h.0.attn.c_attn.weight'). */
export interface NamedParameter {
  /** Its dotted path in the module tree (e.g. `transformer.h.0.attn.c_attn.weight`). */
  name: string;
  /** The parameter itself. */
  parameter: Parameter;
}

/**
 * A layer or a tree of layers. Subclasses register their parameters and child modules under
 * names (nanoGPT's, so that checkpoints map one to one onto its state_dict) and implement
 * `forward`/`backward` with the signatures that fit them.
 */
export abstract class Module implements Disposable {
  readonly #params: [string, Parameter][] = [];
  readonly #children: [string, Module][] = [];
  #training = true;
  #groups: ParameterGroup[] = [];

  /** Registers a parameter under `name`; returns it. */
  protected addParameter(name: string, p: Parameter): Parameter {
    this.#params.push([name, p]);
    return p;
  }

  /** Registers a child module under `name`; returns it. */
  protected addModule<M extends Module>(name: string, m: M): M {
    this.#children.push([name, m]);
    return m;
  }

  /** Whether forward passes keep what the backward needs (training mode, the default). */
  get training(): boolean {
    return this.#training;
  }

  /**
   * Training mode (`true`, default): `forward` keeps what `backward` needs. Evaluation mode
   * (`false`): `forward` keeps nothing and `backward` throws. Applies to the whole tree. Also
   * releases anything kept from a forward without a backward.
   */
  train(mode = true): this {
    this.release();
    this.#training = mode;
    for (const [, c] of this.#children) c.train(mode);
    return this;
  }

  /** Same as `train(false)`. */
  eval(): this {
    return this.train(false);
  }

  /** Every parameter of the tree with its dotted name, in registration order (depth first). */
  namedParameters(prefix = ''): NamedParameter[] {
    const out: NamedParameter[] = this.#params.map(([n, parameter]) => ({ name: prefix + n, parameter }));
    for (const [n, c] of this.#children) out.push(...c.namedParameters(`${prefix}${n}.`));
    return out;
  }

  /** Every parameter of the tree (each once). */
  parameters(): Parameter[] {
    return [...new Set(this.namedParameters().map((p) => p.parameter))];
  }

  /** Total number of parameter elements. */
  numParameters(): number {
    return this.parameters().reduce((a, p) => a + p.numel, 0);
  }

  /**
   * Packs every parameter of the tree into flat storages ({@link packParameters}): two groups for a
   * model of one dtype (decayed weights, the rest). The module keeps and frees the groups. Idempotent.
   */
  packParameters(): readonly ParameterGroup[] {
    if (this.#groups.length === 0) this.#groups = packParameters(this.parameters());
    return this.#groups;
  }

  /** The groups from {@link packParameters} (empty before). */
  get parameterGroups(): readonly ParameterGroup[] {
    return this.#groups;
  }

  /** Sets every parameter gradient to zero (queued on the device; one fill per group when packed). */
  zeroGrad(): void {
    const grouped = new Set(this.#groups.flatMap((g) => g.parameters));
    for (const g of this.#groups) g.zeroGrad();
    for (const p of this.parameters()) if (!grouped.has(p)) p.zeroGrad();
  }

  /**
   * Frees what this layer kept from a `forward` whose `backward` will not run. Subclasses that keep
   * activations override {@link releaseSaved}; this recurses into the children.
   */
  release(): void {
    this.releaseSaved();
    for (const [, c] of this.#children) c.release();
  }

  /** Frees this layer's own saved activations (not the children's). Default: nothing kept. */
  protected releaseSaved(): void {}

  /** Throws unless in training mode: `backward` needs what a training-mode forward kept. */
  protected requireSaved<T>(saved: T | null, layer: string): T {
    if (saved === null) {
      throw new Error(`${layer}.backward() needs a forward() in training mode first (and runs once per forward)`);
    }
    return saved;
  }

  /**
   * The parameters as float32 tensors by dotted name (the masters of float16/bfloat16 parameters,
   * else the values): what a checkpoint stores. The tensors are the parameters' own (not copies).
   */
  stateDict(): Record<string, Tensor> {
    const out: Record<string, Tensor> = {};
    for (const { name, parameter } of this.namedParameters()) out[name] = parameter.weights;
    return out;
  }

  /**
   * Loads every parameter from `state` (tensors by dotted name, any dtype and device, e.g. from
   * `load()` of lib/safetensors): reads each to the host and replaces the parameter's value (and
   * master). Throws, changing nothing, when a name is missing or extra, or a shape differs.
   */
  async loadStateDict(state: Record<string, Tensor>): Promise<void> {
    const named = this.namedParameters();
    const names = new Set(named.map((p) => p.name));
    for (const key of Object.keys(state)) {
      if (!names.has(key)) throw rangeError(`state to hold only this model's parameters`, `an extra '${key}'`);
    }
    for (const { name, parameter } of named) {
      const t = state[name];
      if (!(t instanceof Tensor)) throw typeError(`state['${name}'] to be a Tensor`, describeValue(t));
      if (t.shape.length !== parameter.shape.length || t.shape.some((d, i) => d !== parameter.shape[i])) {
        throw rangeError(`state['${name}'] to have shape ${formatShape(parameter.shape)}`, formatShape(t.shape));
      }
    }
    const data = await Promise.all(named.map(({ name }) => state[name].toFloat32Array()));
    // Copied into this realm's Float32Array (the addon's arrays may come from another, e.g. Jest's vm).
    named.forEach(({ parameter }, i) => parameter.setData(new Float32Array(data[i])));
  }

  /** Frees every parameter and anything kept from a forward. The module is unusable afterwards. */
  dispose(): void {
    this.release();
    for (const p of this.parameters()) p.dispose();
    for (const g of this.#groups) g.dispose();
    this.#groups = [];
  }

  /** Same as {@link dispose}. */
  [Symbol.dispose](): void {
    this.dispose();
  }
}
