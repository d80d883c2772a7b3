/**
 * flash-attn-node: FlashAttention-2 forward and backward for Node.js.
 *
 * ```ts
 * import { Tensor, flashAttention, flashAttentionWithGrad } from 'flash-attn-node';
 * const q = Tensor.fromFloat32Array(data, [batch, seqlen, heads, headDim], { dtype: 'bfloat16' });
 * const { out, lse } = flashAttention(q, k, v, { causal: true });
 * ```
 *
 * Around attention: device tensors with views (lib/tensor.ts, lib/scope.ts), the ops a GPT trains
 * with (lib/ops: embedding, linear, norms, RoPE, activations, cross-entropy, AdamW, reductions), a
 * layer API with explicit forward and backward (lib/nn), and safetensors checkpoints.
 * @packageDocumentation
 */
export {
  Tensor, DTYPES, FLOAT_DTYPES, DEVICES, dtypeSize, contiguousStrides, defaultDevice, memory, resetPeakMemory, synchronize, emptyCache,
} from './tensor';
export type { Device, DType, TensorDType, TensorOptions, DeviceMemory, MemoryReport, ReadRange } from './tensor';
export {
  flashAttention, flashAttentionBackward, flashAttentionWithGrad, AttentionContext,
} from './attention';
export type {
  AttentionKernel, AttentionOptions, AttentionBackwardOptions, AttentionOutput, AttentionGradients, BackwardAlgorithm, Float32Precision,
  KernelFamily, KernelPlan,
} from './attention';
export { backends, cudaDeviceCount } from './backends';
export { timeOnDevice, timeRepeatsOnDevice } from './timing';
export type { BackendInfo, CpuBackendInfo, CpuSimd, CudaBackendInfo, BackendsReport } from './backends';
export { NativeLoadError } from './native';
export { referenceAttention, referenceAttentionBackward, roundToTf32 } from './reference';
export { dropoutKeep, philox4x32 } from './dropout';
export type { DropoutParams, DropoutSite } from './dropout';
export type {
  ReferenceShape, ReferenceOptions, ReferenceInput, ReferenceForwardResult, ReferenceBackwardResult, ReferencePrecision,
} from './reference';
export {
  f32ToBf16Bits, bf16BitsToF32, f32ToF16Bits, f16BitsToF32, float32ToHalfBits, halfBitsToFloat32, roundToDtype,
  dtypeRounder,
} from './half';
export type { HalfDType } from './half';
export { tidy, keep } from './scope';
export { exportTensor, importTensor } from './interop';
export type { ExportedTensor, ImportOptions } from './interop';
export type { GradientTargets } from './attention';

export { embedding, embeddingBackward } from './ops/embedding';
export { linear, linearGelu, linearBackward } from './ops/linear';
export type { LinearOptions, LinearGeluOutput, LinearGrads } from './ops/linear';
export { crossEntropy } from './ops/loss';
export type { CrossEntropyOptions, CrossEntropyOutput, LossReduction } from './ops/loss';
export { adamwStep, gradNorm } from './ops/optim';
export type { AdamWState, AdamWOptions as AdamWStepOptions, AdamWClip } from './ops/optim';
export { sum, columnSum } from './ops/reduce';
export { rmsNorm, rmsNormBackward, layerNorm, layerNormBackward, DEFAULT_NORM_EPS } from './ops/norm';
export type { NormOptions, RmsNormResult, LayerNormResult, RmsNormGrads, LayerNormGrads } from './ops/norm';
export { applyRope, DEFAULT_ROPE_BASE, MAX_ROPE_POSITION } from './ops/rope';
export type { RopeOptions } from './ops/rope';
export { gelu, geluBackward, swiglu, swigluBackward } from './ops/activation';
export { add, addInPlace } from './ops/elementwise';
export type { AddOptions } from './ops/elementwise';
export {
  referenceEmbedding, referenceEmbeddingBackward, referenceLinear, referenceLinearBackward, referenceCrossEntropy,
  referenceAdamW, referenceGradNorm, referenceSum, referenceColumnSum,
} from './ops/reference/train';
export type {
  TrainReferenceInput, TrainReferencePrecision, TrainPrecisionOption, ReferenceLinearOptions,
  ReferenceLinearBackwardOptions, ReferenceCrossEntropyOptions, ReferenceAdamWState, ReferenceAdamWOptions,
  ReferenceColumnSumOptions,
} from './ops/reference/train';
export {
  referenceRmsNorm, referenceRmsNormBackward, referenceLayerNorm, referenceLayerNormBackward, referenceRope,
  referenceGelu, referenceGeluBackward, referenceSwiglu, referenceSwigluBackward, referenceAdd,
} from './ops/reference/nn';
export type {
  NnPrecision, NnInput, RowsCols, RopeDims, NnReferenceOptions, NormReferenceOptions, RopeReferenceOptions,
  AddReferenceOptions, NormReferenceResult, NormBackwardReferenceResult,
} from './ops/reference/nn';

export {
  Module, Parameter, ParameterGroup, packParameters, Embedding, Linear, LayerNorm, RMSNorm, CausalSelfAttention, MLP,
  Block, makeNorm, INIT_STD, GPT, resolveConfig, AdamW,
} from './nn';
export type {
  NamedParameter, ParameterOptions, LayerOptions, LinearLayerOptions, Norm, NormalSampler,
  NormOptions as NormLayerOptions, TransformerOptions, GPTConfig, GPTForwardOptions, ResolvedGPTConfig,
  AdamWOptions,
} from './nn';
export { save, load, loadWithMetadata, encodeSafetensors, decodeSafetensors, MAX_HEADER_BYTES } from './safetensors';
export type { LoadOptions, SafetensorsMetadata, SafetensorsContents } from './safetensors';
