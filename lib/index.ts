/**
 * flash-attn-node: FlashAttention-2 forward and backward for Node.js.
 *
 * ```ts
 * import { Tensor, flashAttention, flashAttentionWithGrad } from 'flash-attn-node';
 * const q = Tensor.fromFloat32Array(data, [batch, seqlen, heads, headDim], { dtype: 'bfloat16' });
 * const { out, lse } = flashAttention(q, k, v, { causal: true });
 * ```
 * @packageDocumentation
 */
export {
  Tensor, DTYPES, FLOAT_DTYPES, DEVICES, dtypeSize, contiguousStrides, defaultDevice, memory, resetPeakMemory, synchronize, emptyCache, debug,
} from './tensor';
export type { Device, DType, TensorDType, TensorOptions, DeviceMemory, MemoryReport, ReadRange } from './tensor';
export {
  flashAttention, flashAttentionBackward, flashAttentionWithGrad, AttentionContext,
} from './attention';
export type {
  AttentionKernel, AttentionOptions, AttentionBackwardOptions, AttentionOutput, AttentionGradients, BackwardAlgorithm, Float32Precision,
} from './attention';
export { backends, cudaDeviceCount } from './backends';
export { timeOnDevice, timeRepeatsOnDevice } from './timing';
export type { BackendInfo, CpuBackendInfo, CudaBackendInfo, BackendsReport } from './backends';
export { NativeLoadError } from './native';
export { referenceAttention, referenceAttentionBackward, roundToTf32 } from './reference';
export type {
  ReferenceShape, ReferenceOptions, ReferenceInput, ReferenceForwardResult, ReferenceBackwardResult, ReferencePrecision,
} from './reference';
export {
  f32ToBf16Bits, bf16BitsToF32, f32ToF16Bits, f16BitsToF32, float32ToHalfBits, halfBitsToFloat32, roundToDtype,
  dtypeRounder,
} from './half';
export type { HalfDType } from './half';
