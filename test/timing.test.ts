/**
 * timeOnDevice: device time of queued work (CUDA events on CUDA, host time to completion on the CPU).
 * timeRepeatsOnDevice: the same for repeated calls, queued back to back on CUDA.
 */
import { flashAttention, Tensor, timeOnDevice, timeRepeatsOnDevice } from '../lib';
import { describeEachDevice, trackMemory } from './helpers/backend';
import { randn, rngFor } from './helpers/random';

trackMemory();

describeEachDevice('timeOnDevice', (device) => {
  // Enough work per call (tens of ms on 2 cores, a few on 16) that scheduling noise is small.
  const S = device === 'cpu' ? 2048 : 4096;
  let q: Tensor;
  beforeAll(() => {
    q = Tensor.fromFloat32Array(randn(S * 4 * 64, rngFor(`timing/${device}`)), [1, S, 4, 64], { device });
  });
  afterAll(() => q?.dispose());

  const attention = (): void => {
    const r = flashAttention(q, q, q);
    r.out.dispose();
    r.lse.dispose();
  };

  test('measures queued work: positive, finite, and longer for more work', async () => {
    await timeOnDevice(device, attention); // warm-up
    const fastest = async (fn: () => void): Promise<number> => {
      const t: number[] = [];
      for (let i = 0; i < 3; i++) t.push(await timeOnDevice(device, fn));
      return Math.min(...t);
    };
    const one = await fastest(attention);
    const four = await fastest(() => {
      for (let i = 0; i < 4; i++) attention();
    });
    expect(Number.isFinite(one) && one > 0).toBe(true);
    // Four times the work takes clearly longer than once (a loose bound: no speed is asserted).
    expect(four).toBeGreaterThan(1.5 * one);
  });

  test('an empty region measures (almost) nothing', async () => {
    const ms = await timeOnDevice(device, () => undefined);
    expect(ms).toBeGreaterThanOrEqual(0);
    expect(ms).toBeLessThan(50);
  });

  test('timeRepeatsOnDevice: one positive time per call, in call order, each covering its own call', async () => {
    let calls = 0;
    const times = await timeRepeatsOnDevice(device, () => {
      calls++;
      // Call 2 does four times the work: its own pair of marks must show it, not a neighbour's.
      for (let i = 0; i < (calls === 2 ? 4 : 1); i++) attention();
    }, 3);
    expect(calls).toBe(3);
    expect(times).toHaveLength(3);
    for (const t of times) expect(Number.isFinite(t) && t > 0).toBe(true);
    expect(times[1]).toBeGreaterThan(1.5 * Math.min(times[0], times[2]));
  });

  test("timeRepeatsOnDevice: fn's error stops the repeats and is rethrown", async () => {
    let calls = 0;
    await expect(timeRepeatsOnDevice(device, () => {
      if (++calls === 2) throw new RangeError('boom');
    }, 5)).rejects.toThrow(new RangeError('boom'));
    expect(calls).toBe(2);
  });

  test("fn's error is rethrown after the timer is released", async () => {
    await expect(timeOnDevice(device, () => {
      throw new RangeError('boom');
    })).rejects.toThrow(new RangeError('boom'));
  });
});

describe('timeOnDevice arguments', () => {
  test('rejects a bad device or fn', async () => {
    await expect(timeOnDevice('gpu' as never, () => undefined)).rejects.toThrow(
      new TypeError("Expected device to be 'cpu' or 'cuda' but received \"gpu\" of type string"),
    );
    await expect(timeOnDevice('cpu', 5 as never)).rejects.toThrow(
      new TypeError('Expected fn to be a function but received 5 of type number'),
    );
    await expect(timeRepeatsOnDevice('cpu', () => undefined, 0)).rejects.toThrow(
      new TypeError('Expected repeats to be a positive integer but received 0 of type number'),
    );
    await expect(timeRepeatsOnDevice('cuda', () => undefined, 2.5)).rejects.toThrow(
      new TypeError('Expected repeats to be a positive integer but received 2.5 of type number'),
    );
  });
});
