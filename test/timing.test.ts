/**
 * timeOnDevice: device time of queued work (CUDA events on CUDA, host time to completion on the CPU).
 */
import { flashAttention, Tensor, timeOnDevice } from '../lib';
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
  afterAll(() => q.dispose());

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
  });
});
