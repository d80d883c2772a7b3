/**
 * Which devices the suites run on, decided once at module load (Jest collects tests synchronously),
 * plus the per-file hygiene every device test shares: poisoned outputs and a leak check.
 *
 * - `DEVICES` is `['cpu']`, plus `'cuda'` when `cudaDeviceCount() > 0`. `describeEachDevice()` runs
 *   one suite per device; without CUDA it registers a skipped `[cuda]` test whose name says why
 *   (`backends().cuda.reason`) and prints the reason once per file. `describeCuda()` does the same
 *   for a suite that exists only on CUDA.
 * - `usePoisonedOutputs()`: every output an operation allocates starts as NaN (0xff bytes), so a
 *   test can check that the kernel wrote every element; switched off after the file.
 * - `trackMemory()`: snapshots `memory()` before the file's tests and, after them, synchronizes
 *   every device and asserts that the live tensor count and bytes are back to that snapshot.
 */

import { backends, cudaDeviceCount, Device, memory, synchronize } from '../../lib';
import { debug } from '../../lib/testing';

/** Number of usable CUDA devices (0 when the addon has no CUDA, no driver or no device). */
export const CUDA_DEVICE_COUNT: number = cudaDeviceCount();

/** Whether the CUDA suites run. */
export const HAS_CUDA: boolean = CUDA_DEVICE_COUNT > 0;

/** The devices the suites run on: always 'cpu', plus 'cuda' when a device is usable. */
export const DEVICES: readonly Device[] = HAS_CUDA ? ['cpu', 'cuda'] : ['cpu'];

let cachedReason: string | undefined;

/** Why CUDA is not tested here (first line of `backends().cuda.reason`), or '' when it is. */
export function cudaSkipReason(): string {
  if (HAS_CUDA) return '';
  if (cachedReason === undefined) {
    const reason = backends().cuda.reason ?? 'cudaDeviceCount() returned 0';
    cachedReason = reason.split('\n')[0];
  }
  return cachedReason;
}

let reasonPrinted = false;

/** Registers `test.skip('<name> [cuda] skipped: <reason>')` and prints the reason once per file. */
function skipCuda(name: string): void {
  const reason = cudaSkipReason();
  if (!reasonPrinted) {
    reasonPrinted = true;
    console.log(`CUDA suites skipped: ${reason}`);
  }
  test.skip(`${name} [cuda] skipped: ${reason}`, () => undefined);
}

/**
 * Defines `fn`'s tests once per device in {@link DEVICES}, each in a `describe('<name> [<device>]')`.
 * Without CUDA, adds `test.skip('<name> [cuda] skipped: <reason>')` so the report says why.
 */
export function describeEachDevice(name: string, fn: (device: Device) => void): void {
  for (const device of DEVICES) describe(`${name} [${device}]`, () => fn(device));
  if (!HAS_CUDA) skipCuda(name);
}

/**
 * Defines `fn`'s tests in `describe('<name> [cuda]')` when CUDA is usable (a suite of CUDA-only
 * kernels); otherwise adds `test.skip('<name> [cuda] skipped: <reason>')` and prints the reason, as
 * {@link describeEachDevice} does.
 */
export function describeCuda(name: string, fn: () => void): void {
  if (HAS_CUDA) describe(`${name} [cuda]`, fn);
  else skipCuda(name);
}

/** Waits for everything queued on every tested device. */
export async function synchronizeAll(): Promise<void> {
  for (const d of DEVICES) await synchronize(d);
}

/** Live tensors and bytes per tested device. */
export interface LiveMemory {
  cpu: { tensors: number; bytes: number };
  cuda: { tensors: number; bytes: number };
}

/** The live-tensor part of `memory()` (peaks and pool counters left out: they legitimately move). */
export function liveMemory(): LiveMemory {
  const m = memory();
  return {
    cpu: { tensors: m.cpu.tensors, bytes: m.cpu.bytes },
    cuda: { tensors: m.cuda.tensors, bytes: m.cuda.bytes },
  };
}

/**
 * Registers a `beforeAll` that records {@link liveMemory} (after synchronizing) and an `afterAll`
 * that synchronizes every device and expects the same counts: every tensor the file created was
 * disposed. Call once at the top of a test file.
 */
export function trackMemory(): void {
  let start: LiveMemory | undefined;
  beforeAll(async () => {
    await synchronizeAll();
    start = liveMemory();
  });
  afterAll(async () => {
    await synchronizeAll();
    expect(liveMemory()).toEqual(start);
  });
}

/**
 * Registers a `beforeEach` that turns output poisoning on (every output an operation allocates is
 * filled with NaN first) and an `afterAll` that turns it off again.
 */
export function usePoisonedOutputs(): void {
  beforeEach(() => debug.poisonOutputs(true));
  afterAll(() => debug.poisonOutputs(false));
}
