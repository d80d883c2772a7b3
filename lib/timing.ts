/**
 * Timing of queued device work, for benchmarks.
 * @packageDocumentation
 */
import { describeValue, typeError } from './errors';
import { binding, DEVICE_CODE } from './native';
import type { Device } from './tensor';

/**
 * Calls `fn`, which queues work on `device` (for example `flashAttention(...)`), and resolves with
 * the milliseconds that work took on the device.
 *
 * - CUDA: timing events recorded on the compute stream before and after the work `fn` queues, so
 *   the figure is GPU time, free of launch and host overheads that overlap with it. Warm up first
 *   and take the median of many calls; work queued before the call is not counted.
 * - CPU: host wall time from the call until the CPU executor has finished the queued work
 *   (including anything queued before the call: synchronize first).
 *
 * Rejects with the error of a queued operation that failed.
 */
export async function timeOnDevice(device: Device, fn: () => void): Promise<number> {
  if (device !== 'cpu' && device !== 'cuda') throw typeError("device to be 'cpu' or 'cuda'", describeValue(device));
  if (typeof fn !== 'function') throw typeError('fn to be a function', describeValue(fn));
  const b = binding();
  const timer = b.timerStart(DEVICE_CODE[device]);
  let threw = false;
  let error: unknown;
  try {
    fn();
  } catch (e) {
    threw = true;
    error = e;
  }
  // Stopped even when fn threw, so the CUDA events are released; the caller then sees fn's error.
  const elapsed = b.timerStop(timer);
  if (threw) {
    await elapsed.catch(() => undefined);
    throw error;
  }
  return elapsed;
}
