/**
 * Dense peak TFLOP/s per GPU and dtype (vendor datasheets, without sparsity), for the "% of peak"
 * column. float32 inputs are compared with the plain fp32 (non-tensor-core) peak; tf32 is listed for
 * reference. An unknown device, or the CPU, has no peak (the column stays blank).
 * @packageDocumentation
 */
import type { DType } from '../lib';

/** Dense peaks of one GPU, TFLOP/s. */
export interface DevicePeak {
  /** Matched against the CUDA device name (first match wins, so specific names come first). */
  pattern: RegExp;
  label: string;
  bf16: number;
  fp16: number;
  tf32: number;
  fp32: number;
}

/** The table, most specific names first. */
export const DEVICE_PEAKS: readonly DevicePeak[] = [
  { pattern: /H200 NVL/i, label: 'H200 NVL', bf16: 835, fp16: 835, tf32: 418, fp32: 60 },
  { pattern: /H200/i, label: 'H200 SXM', bf16: 989, fp16: 989, tf32: 494, fp32: 67 },
  { pattern: /H100 NVL/i, label: 'H100 NVL', bf16: 835, fp16: 835, tf32: 418, fp32: 60 },
  { pattern: /H100 PCIe/i, label: 'H100 PCIe', bf16: 756, fp16: 756, tf32: 378, fp32: 51 },
  { pattern: /H100/i, label: 'H100 SXM', bf16: 989, fp16: 989, tf32: 494, fp32: 67 },
  { pattern: /A100/i, label: 'A100', bf16: 312, fp16: 312, tf32: 156, fp32: 19.5 },
  { pattern: /L40S/i, label: 'L40S', bf16: 362, fp16: 362, tf32: 183, fp32: 91.6 },
  { pattern: /RTX 4090/i, label: 'RTX 4090', bf16: 165, fp16: 165, tf32: 82.6, fp32: 82.6 },
  { pattern: /\bA10\b/i, label: 'A10', bf16: 125, fp16: 125, tf32: 62.5, fp32: 31.2 },
];

/** The row of `deviceName`, or null when the device is not in the table. */
export function findDevicePeak(deviceName: string | null | undefined): DevicePeak | null {
  if (!deviceName) return null;
  return DEVICE_PEAKS.find((p) => p.pattern.test(deviceName)) ?? null;
}

/** Dense peak TFLOP/s of `deviceName` for `dtype`, or null (unknown device, or the CPU: pass null). */
export function peakTflops(deviceName: string | null | undefined, dtype: DType): number | null {
  const p = findDevicePeak(deviceName);
  if (!p) return null;
  return dtype === 'bfloat16' ? p.bf16 : dtype === 'float16' ? p.fp16 : p.fp32;
}
