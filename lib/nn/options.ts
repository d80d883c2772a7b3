/**
 * Validation of the layer constructors' arguments (./layers.ts): every options object must be a plain
 * object with only its interface's keys, each of the right type, read once into a snapshot that the
 * constructor uses afterwards (a getter that changes its answer cannot slip a second value past the
 * check). A refused constructor allocates nothing. Parameter's options and shape are checked here too.
 * @packageDocumentation
 */
import { refuseUnknownKeys, typeError, describeValue } from '../errors';
import type { DType } from '../half';
import { checkBoolean, checkChoice, checkNumber } from '../ops/common';
import { DEVICES, FLOAT_DTYPES, type Device } from '../tensor';
import type { LayerOptions, LinearLayerOptions, NormalSampler, NormOptions, TransformerOptions } from './layers';
import type { ParameterOptions } from './module';

/** A layer width or count: a safe integer >= 1. */
export function checkDim(value: unknown, arg: string): number {
  return checkNumber(value, arg, { integer: true, min: 1 });
}

/** The object itself (not undefined, an array or a primitive) with only `allowed` keys. */
function plainObject(options: unknown, arg: string, allowed: readonly string[]): Record<string, unknown> {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw typeError(`${arg} to be an object`, describeValue(options));
  }
  refuseUnknownKeys(options, arg, allowed);
  return options as Record<string, unknown>;
}

function optional<T>(value: unknown, check: (v: unknown) => T): T | undefined {
  return value === undefined ? undefined : check(value);
}

function sampler(value: unknown, arg: string): NormalSampler {
  if (typeof value !== 'function') throw typeError(`${arg} to be a function (n, std) => Float32Array`, describeValue(value));
  return value as NormalSampler;
}

function common(o: Record<string, unknown>, arg: string): { dtype?: DType; device: Device } {
  return {
    dtype: optional(o.dtype, (v) => checkChoice(v, `${arg}.dtype`, FLOAT_DTYPES)),
    device: checkChoice(o.device, `${arg}.device`, DEVICES),
  };
}

const LAYER_KEYS = ['dtype', 'device', 'normal'] as const;

/** {@link LayerOptions} (Embedding). */
export function layerOptions(options: unknown, arg: string): LayerOptions {
  const o = plainObject(options, arg, LAYER_KEYS);
  return { ...common(o, arg), normal: sampler(o.normal, `${arg}.normal`) };
}

const LINEAR_KEYS = [...LAYER_KEYS, 'bias', 'activation', 'std', 'float32Precision'] as const;

/** {@link LinearLayerOptions}. */
export function linearLayerOptions(options: unknown, arg: string): LinearLayerOptions {
  const o = plainObject(options, arg, LINEAR_KEYS);
  return {
    ...common(o, arg),
    normal: sampler(o.normal, `${arg}.normal`),
    bias: optional(o.bias, (v) => checkBoolean(v, `${arg}.bias`)),
    activation: optional(o.activation, (v) => checkChoice(v, `${arg}.activation`, ['none', 'gelu'] as const)),
    std: optional(o.std, (v) => checkNumber(v, `${arg}.std`, { min: 0 })),
    float32Precision: optional(o.float32Precision, (v) => checkChoice(v, `${arg}.float32Precision`, ['tf32', 'highest'] as const)),
  };
}

/** {@link NormOptions}, with `bias` where the layer has one (LayerNorm). */
export function normOptions(options: unknown, arg: string, withBias: boolean): NormOptions & { bias?: boolean } {
  const o = plainObject(options, arg, withBias ? ['dtype', 'device', 'eps', 'bias'] : ['dtype', 'device', 'eps']);
  return {
    ...common(o, arg),
    eps: optional(o.eps, (v) => checkNumber(v, `${arg}.eps`, { above: 0 })),
    bias: withBias ? optional(o.bias, (v) => checkBoolean(v, `${arg}.bias`)) : undefined,
  };
}

const TRANSFORMER_KEYS = [...LAYER_KEYS, 'dModel', 'heads', 'layers', 'norm', 'mlp', 'mlpHidden', 'bias', 'rope', 'ropeBase',
  'float32Precision'] as const;

/** {@link TransformerOptions} (CausalSelfAttention, MLP, Block); dModel a multiple of heads. */
export function transformerOptions(options: unknown, arg: string): TransformerOptions {
  const o = plainObject(options, arg, TRANSFORMER_KEYS);
  const t: TransformerOptions = {
    ...common(o, arg),
    normal: sampler(o.normal, `${arg}.normal`),
    dModel: checkDim(o.dModel, `${arg}.dModel`),
    heads: checkDim(o.heads, `${arg}.heads`),
    layers: checkDim(o.layers, `${arg}.layers`),
    norm: checkChoice(o.norm, `${arg}.norm`, ['layernorm', 'rmsnorm'] as const),
    mlp: checkChoice(o.mlp, `${arg}.mlp`, ['gelu', 'swiglu'] as const),
    mlpHidden: checkDim(o.mlpHidden, `${arg}.mlpHidden`),
    bias: checkBoolean(o.bias, `${arg}.bias`),
    rope: checkBoolean(o.rope, `${arg}.rope`),
    ropeBase: optional(o.ropeBase, (v) => checkNumber(v, `${arg}.ropeBase`, { above: 0 })),
    float32Precision: optional(o.float32Precision, (v) => checkChoice(v, `${arg}.float32Precision`, ['tf32', 'highest'] as const)),
  };
  if (t.dModel % t.heads !== 0) {
    throw new RangeError(`Expected ${arg}.dModel (${t.dModel}) to be a multiple of ${arg}.heads but received heads ${t.heads}`);
  }
  return t;
}

/** The options of a Linear inside a transformer layer: the shared keys, plus `extra`. */
export function innerLinear(o: TransformerOptions, extra: Partial<LinearLayerOptions> = {}): LinearLayerOptions {
  return { dtype: o.dtype, device: o.device, normal: o.normal, bias: o.bias, float32Precision: o.float32Precision, ...extra };
}

/** {@link ParameterOptions}. */
export function parameterOptions(options: unknown, arg: string): ParameterOptions {
  const o = plainObject(options, arg, ['dtype', 'device', 'decay']);
  return { ...common(o, arg), decay: optional(o.decay, (v) => checkBoolean(v, `${arg}.decay`)) };
}

/** A shape: an Array of dims (safe integers >= 1), copied once. */
export function checkShape(shape: unknown, arg: string): number[] {
  if (!Array.isArray(shape)) throw typeError(`${arg} to be an Array of dims`, describeValue(shape));
  const dims = [...shape] as unknown[];
  return dims.map((d, i) => checkDim(d, `${arg}[${i}]`));
}
