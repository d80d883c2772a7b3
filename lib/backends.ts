/**
 * What this installation can run, and why not where it cannot.
 * @packageDocumentation
 */
import { binding, nativeStatus } from './native';
import type { AttentionKernel } from './attention';

/** One backend (device) and its state. */
export interface BackendInfo {
  /** Whether tensors can be created and attention run on this device. */
  available: boolean;
  /** Why not, when unavailable; null otherwise. */
  reason: string | null;
  /**
   * Kernels that run on this device. 'auto' picks the first one that supports the call (the
   * results' `kernel` field says which ran).
   */
  kernels: Exclude<AttentionKernel, 'auto'>[];
}

/** The CPU backend: FlashAttention-2 in C++, multithreaded, fp32 compute. */
export interface CpuBackendInfo extends BackendInfo {
  /** Threads the CPU kernels use (the machine's hardware concurrency). */
  threads: number;
}

/** The CUDA backend (device 0). */
export interface CudaBackendInfo extends BackendInfo {
  /** Whether the addon was compiled with the CUDA sources (nvcc was found at build time). */
  compiled: boolean;
  /**
   * True once a sticky CUDA error (an illegal address in a kernel, for example) has lost this
   * process's CUDA context: `available` is then false, `reason` carries CUDA's error, and every CUDA
   * call fails at once with it until the process restarts. CPU work carries on.
   */
  contextLost: boolean;
  /** The device, when available. Memory in bytes; versions as "major.minor". */
  device: {
    name: string;
    computeCapability: string;
    multiprocessors: number;
    totalMemoryBytes: number;
    freeMemoryBytes: number;
    driverVersion: string;
    runtimeVersion: string;
  } | null;
}

/** Everything {@link backends} reports. */
export interface BackendsReport {
  /** Whether the native addon loaded, from where, and the loader's error if it did not. */
  native: { loaded: boolean; path: string | null; error: string | null };
  cpu: CpuBackendInfo;
  cuda: CudaBackendInfo;
}

/**
 * Reports the backends: whether the addon loaded, the CPU backend, and the CUDA device (or why it is
 * unusable: not compiled in, no driver, no device...). Never throws. The first call initialises
 * CUDA when it is available (about 0.1-0.5 s).
 */
export function backends(): BackendsReport {
  const native = nativeStatus();
  if (!native.loaded) {
    const reason = native.error ?? 'the native addon did not load';
    return {
      native,
      cpu: { available: false, reason, kernels: [], threads: 0 },
      cuda: { available: false, reason, kernels: [], compiled: false, contextLost: false, device: null },
    };
  }
  const b = binding();
  const status = b.cudaStatus();
  const d = status.device;
  return {
    native,
    cpu: { available: true, reason: null, kernels: ['flash'], threads: b.cpuThreads },
    cuda: {
      available: status.available,
      reason: status.reason,
      // 'auto' takes 'flash' (the FA2 kernels on sm_80+) wherever it exists for the call, and 'naive'
      // otherwise (the float32 backward): the first entry is the default.
      kernels: status.available ? ['flash', 'naive'] : [],
      compiled: b.cudaCompiled,
      contextLost: status.contextLost,
      device: d
        ? {
            name: d.name,
            computeCapability: d.computeCapability,
            multiprocessors: d.multiprocessors,
            totalMemoryBytes: d.totalMemoryBytes,
            freeMemoryBytes: d.freeMemoryBytes,
            driverVersion: d.driverVersion,
            runtimeVersion: d.runtimeVersion,
          }
        : null,
    },
  };
}

/**
 * Number of usable CUDA devices, synchronously and without creating a CUDA context: 0 when the
 * addon has no CUDA, there is no driver or no device (test suites gate on this at load time).
 */
export function cudaDeviceCount(): number {
  try {
    return binding().cudaDeviceCount().count;
  } catch {
    return 0;
  }
}
