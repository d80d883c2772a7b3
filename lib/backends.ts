/**
 * What this installation can run, and why not where it cannot.
 * @packageDocumentation
 */
import { binding, cpuOnlyReasonText, nativeStatus } from './native';
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

/**
 * An instruction-set variant of the CPU kernels:
 * - 'avx512': AVX-512F (with AVX2, FMA and F16C), 16 fp32 lanes;
 * - 'avx2': AVX2 with FMA and F16C, 8 fp32 lanes;
 * - 'generic': the compiler's baseline vectors (SSE2 on x86-64; the only variant on other
 *   architectures), 4 fp32 lanes.
 */
export type CpuSimd = 'avx512' | 'avx2' | 'generic';

/** The CPU backend: FlashAttention-2 in C++, multithreaded, fp32 compute. */
export interface CpuBackendInfo extends BackendInfo {
  /** Threads the CPU kernels use (the machine's hardware concurrency). */
  threads: number;
  /**
   * The instruction-set variant the CPU attention (forward and backward) and matmul kernels run: the
   * widest one this CPU and its OS support, detected once when the addon loads. Every variant is
   * compiled into the addon, so a portable build still runs AVX-512 where the CPU has it. Results
   * differ slightly between variants (bit-identical across runs on one machine). null when the addon
   * did not load.
   */
  simd: CpuSimd | null;
}

/** The CUDA backend (device 0). */
export interface CudaBackendInfo extends BackendInfo {
  /**
   * Whether the addon was compiled with the CUDA sources. When not, `reason` says why (FA_CUDA=0 at
   * build time, no nvcc, no static CUDA runtime) and how to get a CUDA build.
   */
  compiled: boolean;
  /**
   * True once a sticky CUDA error (an illegal address in a kernel, for example) has lost this
   * process's CUDA context: `available` is then false, `reason` carries CUDA's error, and every CUDA
   * call fails at once with it until the process restarts. CPU work carries on.
   */
  contextLost: boolean;
  /** The device, when available. Memory in bytes; versions as "major.minor". */
  device: {
    /** The device's name, e.g. "NVIDIA H100 80GB HBM3". */
    name: string;
    /** Compute capability, e.g. "9.0". */
    computeCapability: string;
    /** Streaming multiprocessors. */
    multiprocessors: number;
    /** The device's memory. */
    totalMemoryBytes: number;
    /** Its free memory when {@link backends} was called. */
    freeMemoryBytes: number;
    /** The CUDA version the installed driver supports. */
    driverVersion: string;
    /** The CUDA runtime the addon was built with. */
    runtimeVersion: string;
  } | null;
}

/** Everything {@link backends} reports. */
export interface BackendsReport {
  /** Whether the native addon loaded, from where, and the loader's error if it did not. */
  native: {
    /** Whether the addon loaded. */
    loaded: boolean;
    /** The file it loaded from, or null. */
    path: string | null;
    /** Why it did not load, or null. */
    error: string | null;
  };
  /** The CPU backend. */
  cpu: CpuBackendInfo;
  /** The CUDA backend and its device. */
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
      cpu: { available: false, reason, kernels: [], threads: 0, simd: null },
      cuda: { available: false, reason, kernels: [], compiled: false, contextLost: false, device: null },
    };
  }
  const b = binding();
  const status = b.cudaStatus();
  const d = status.device;
  return {
    native,
    cpu: { available: true, reason: null, kernels: ['flash'], threads: b.cpuThreads, simd: b.cpuSimd },
    cuda: {
      available: status.available,
      // Without the CUDA sources, the reason the build recorded (FA_CUDA=0, no nvcc...) and what to do.
      reason: b.cudaCompiled ? status.reason : cpuOnlyReasonText(b.cpuOnlyReason),
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
