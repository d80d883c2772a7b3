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

/**
 * Calls `fn` `repeats` times and resolves with the device milliseconds of each call, in call order.
 *
 * - CUDA: the calls are queued back to back, each between its own pair of timing events, and awaited
 *   together at the end, the way PyTorch benchmarks are usually timed (and bench/torch_sdpa.py times
 *   SDPA). While the GPU is busy with call i the host prepares call i + 1, so the host's per-call
 *   work (argument checks, allocation, launch) is not counted unless it is slower than the kernel.
 *   {@link timeOnDevice} instead starts each call on an idle stream and so counts that work.
 * - CPU: `repeats` sequential calls of {@link timeOnDevice}.
 *
 * Rejects with the first error thrown by `fn` or raised by its queued work (after every queued timer
 * was stopped, so no CUDA events leak).
 */
export async function timeRepeatsOnDevice(device: Device, fn: () => void, repeats: number): Promise<number[]> {
  if (device !== 'cpu' && device !== 'cuda') throw typeError("device to be 'cpu' or 'cuda'", describeValue(device));
  if (typeof fn !== 'function') throw typeError('fn to be a function', describeValue(fn));
  if (!Number.isSafeInteger(repeats) || repeats < 1) throw typeError('repeats to be a positive integer', describeValue(repeats));
  if (device === 'cpu') {
    const times: number[] = [];
    for (let i = 0; i < repeats; i++) times.push(await timeOnDevice(device, fn));
    return times;
  }
  const b = binding();
  const pending: Promise<number>[] = [];
  let error: unknown;
  let threw = false;
  for (let i = 0; i < repeats && !threw; i++) {
    const timer = b.timerStart(DEVICE_CODE[device]);
    try {
      fn();
    } catch (e) {
      threw = true;
      error = e;
    }
    pending.push(b.timerStop(timer));
  }
  const settled = await Promise.allSettled(pending);
  if (threw) throw error;
  const failed = settled.find((s): s is PromiseRejectedResult => s.status === 'rejected');
  if (failed) throw failed.reason;
  return settled.map((s) => (s as PromiseFulfilledResult<number>).value);
}
