/**
 * Test hooks, imported from `flash-attn-node/testing` (not from the package's main entry): NaN-filled
 * outputs, so a test can tell that a kernel wrote every element, and a deliberately broken CUDA
 * context, to test the handling of sticky errors. Not for production use.
 * @packageDocumentation
 */
import { describeValue, typeError } from './errors';
import { binding } from './native';

/** The test hooks. */
export const debug = {
  /**
   * When enabled, every output tensor an operation allocates is first filled with NaN (0xff bytes),
   * so a test can check that the kernel wrote every element.
   */
  poisonOutputs(enabled: boolean): void {
    if (typeof enabled !== 'boolean') throw typeError('enabled to be a boolean', describeValue(enabled));
    binding().setPoison(enabled);
  },
  /**
   * Breaks this process's CUDA context on purpose, to test the handling of sticky errors: enqueues a
   * store to an unmapped address. The next synchronisation (a read, `synchronize`, or the next call
   * that checks the stream) fails with CUDA's cudaErrorIllegalAddress, and every later CUDA call of
   * the process fails at once with a message saying that the context is lost; the CPU backend keeps
   * working. Only kind 'illegal-address' exists. Throws if CUDA is not usable.
   */
  injectCudaFault(kind: 'illegal-address'): void {
    if (kind !== 'illegal-address') throw typeError("kind to be 'illegal-address'", describeValue(kind));
    binding().injectCudaFault(kind);
  },
};
