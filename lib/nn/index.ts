/**
 * The layer API: layers with explicit forward and backward ({@link Module}, {@link Parameter}),
 * the GPT model, and the AdamW optimizer. See ./module.ts for the design and the ownership rules.
 * @packageDocumentation
 */
export { Module, packParameters, Parameter, ParameterGroup } from './module';
export type { NamedParameter, ParameterOptions } from './module';
export {
  Block, CausalSelfAttention, Embedding, INIT_STD, LayerNorm, Linear, makeNorm, MLP, RMSNorm,
} from './layers';
export type { LayerOptions, LinearLayerOptions, Norm, NormalSampler, NormOptions, TransformerOptions } from './layers';
export { GPT, resolveConfig } from './gpt';
export type { GPTConfig, GPTForwardOptions, ResolvedGPTConfig } from './gpt';
export { AdamW } from './optim';
export type { AdamWOptions } from './optim';
