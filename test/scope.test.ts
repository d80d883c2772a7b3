/**
 * tidy / keep (lib/scope.ts): what a scope disposes and what it hands back, nesting, throwing and
 * async callbacks, with the live-memory counts as the judge.
 */

import { keep, tidy } from '../lib/scope';
import { Device, Tensor } from '../lib/tensor';
import { describeEachDevice, liveMemory, synchronizeAll, trackMemory } from './helpers/backend';

trackMemory();

async function liveTensors(device: Device): Promise<number> {
  await synchronizeAll();
  return liveMemory()[device].tensors;
}

describeEachDevice('tidy', (device: Device) => {
  test('disposes what the callback created (views included) except what it returns', async () => {
    const before = await liveTensors(device);
    let inner: Tensor[] = [];
    const out = tidy(() => {
      const a = Tensor.zeros([4, 6], { device });
      const b = Tensor.full([4, 6], 2, { device });
      const v = a.narrow(0, 1, 2).select(1, 3); // two views; neither returned
      inner = [a, v];
      return { kept: [b.view([24])], map: new Map([['x', b]]) };
    });
    expect(inner.every((t) => t.disposed)).toBe(true);
    const [flat] = out.kept;
    const b = out.map.get('x') as Tensor;
    expect(flat.disposed || b.disposed).toBe(false);
    expect(Array.from(await flat.toFloat32Array())).toEqual(new Array(24).fill(2));
    flat.dispose();
    b.dispose();
    expect(await liveTensors(device)).toBe(before);
  });

  test('keep() exempts a tensor; nested scopes hand returned tensors to the parent', async () => {
    const before = await liveTensors(device);
    let escapedInner: Tensor | undefined;
    let kept: Tensor | undefined;
    const result = tidy(() => {
      kept = keep(Tensor.zeros([3], { device }));
      escapedInner = tidy(() => {
        Tensor.zeros([5], { device });
        return Tensor.full([2], 7, { device });
      });
      expect(escapedInner.disposed).toBe(false);
      return 42; // the inner result is not returned: the outer scope disposes it
    });
    expect(result).toBe(42);
    expect(escapedInner?.disposed).toBe(true);
    expect(kept?.disposed).toBe(false);
    kept?.dispose();
    expect(await liveTensors(device)).toBe(before);
  });

  test('a throwing callback still disposes; an async one is refused and cleaned up', async () => {
    const before = await liveTensors(device);
    expect(() => tidy(() => {
      Tensor.zeros([8], { device });
      throw new Error('boom');
    })).toThrow('boom');
    expect(await liveTensors(device)).toBe(before);
    expect(() => tidy(async () => {
      Tensor.zeros([8], { device });
      await Promise.resolve();
    })).toThrow(new TypeError(
      'Expected fn to be synchronous (tidy disposes what fn created when fn returns; tensors created after an ' +
      'await would escape the scope, so async functions are refused) but received a function that returned a Promise'));
    expect(await liveTensors(device)).toBe(before);
    expect(() => tidy(1 as unknown as () => void)).toThrow(new TypeError(
      'Expected fn to be a function but received 1 of type number'));
    expect(() => keep({} as Tensor)).toThrow(new TypeError('Expected t to be a Tensor but received an object'));
    // Outside any scope nothing is tracked: the tensor stays until disposed.
    const free = Tensor.zeros([2], { device });
    tidy(() => undefined);
    expect(free.disposed).toBe(false);
    free.dispose();
  });
});
