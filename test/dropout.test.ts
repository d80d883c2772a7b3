/**
 * lib/dropout.ts: Philox4x32-10 against Random123's known-answer vectors, the documented mapping of
 * dropoutKeep, its kept fraction's statistics, and its validation.
 */

import { dropoutKeep, philox4x32 } from '../lib/dropout';

const hex = (xs: ArrayLike<number>) => Array.from(xs, (x) => x.toString(16).padStart(8, '0')).join(' ');

describe('philox4x32', () => {
  // Random123 tests/kat_vectors, the three "philox4x32 10" lines: counter (4 words), key (2), output (4).
  test.each([
    ['00000000 00000000 00000000 00000000', '00000000 00000000', '6627e8d5 e169c58d bc57ac4c 9b00dbd8'],
    ['ffffffff ffffffff ffffffff ffffffff', 'ffffffff ffffffff', '408f276d 41c83b0e a20bc7c6 6d5451fd'],
    ['243f6a88 85a308d3 13198a2e 03707344', 'a4093822 299f31d0', 'd16cfe09 94fdcceb 5001e420 24126ea1'],
  ])('10 rounds of counter %s, key %s: %s (Random123 known answer)', (ctr, key, expected) => {
    const words = (s: string) => s.split(' ').map((w) => parseInt(w, 16));
    expect(hex(philox4x32(words(ctr), words(key)))).toBe(expected);
  });
});

describe('philox4x32 arguments', () => {
  test('refuses counters and keys of the wrong length or with words outside uint32, and bad round counts', () => {
    expect(() => philox4x32([0, 0, 0], [0, 0])).toThrow(new RangeError('Expected counter to be an array of 4 integers in [0, 2^32) but received 3 elements'));
    expect(() => philox4x32([0, 0, 0, 2 ** 32], [0, 0])).toThrow(new RangeError('Expected counter[3] to be an integer in [0, 2^32) but received 4294967296'));
    expect(() => philox4x32([0, 0, 0, 0], [0, -1])).toThrow(RangeError);
    expect(() => philox4x32([0, 0, 0, 0], null as never)).toThrow(new TypeError('Expected key to be an array of 2 integers in [0, 2^32) but received null'));
    expect(() => philox4x32([0, 0, 0, '1'] as never, [0, 0])).toThrow(TypeError);
    expect(() => philox4x32([0, 0, 0, 0], [0, 0], 0)).toThrow(new RangeError('Expected rounds to be an integer from 1 to 16 but received 0'));
    expect(Array.from(philox4x32(new Uint32Array(4), new Uint32Array(2)))).toEqual([0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
  });
});

describe('dropoutKeep', () => {
  const p = 0.3;
  const threshold = Math.floor(p * 2 ** 32);
  const word = (seed: number, offset: number, b: number, h: number, Hq: number, row: number, col: number) =>
    philox4x32([Math.floor(col / 4), row, b * Hq + h, offset], [seed % 2 ** 32, Math.floor(seed / 2 ** 32)])[col % 4];

  test('is the documented mapping: word col % 4 of Philox([col / 4, row, batch · headsQ + head, offset], seed) >= floor(p · 2^32)', () => {
    const seed = 2 ** 40 + 12345; // both key words non-zero
    let kept = 0;
    for (let b = 0; b < 2; b++)
      for (let h = 0; h < 3; h++)
        for (let row = 0; row < 5; row++)
          for (let col = 0; col < 11; col++) {
            const k = dropoutKeep({ p, seed, offset: 7 }, { batch: b, head: h, headsQ: 3, row, col });
            expect(k).toBe(word(seed, 7, b, h, 3, row, col) >= threshold);
            kept += Number(k);
          }
    expect(kept).toBeGreaterThan(0);
    expect(kept).toBeLessThan(2 * 3 * 5 * 11); // both outcomes occur
  });

  test('keeps a fraction 1 - p (within 5 standard deviations over 40,000 elements), and offsets give other masks', () => {
    const n = 40000;
    for (const q of [0.1, 0.5, 0.9]) {
      let kept = 0;
      let same = 0;
      for (let e = 0; e < n; e++) {
        const site = { batch: e % 3, head: e % 2, headsQ: 2, row: Math.floor(e / 200), col: e % 200 };
        const a = dropoutKeep({ p: q, seed: 99 }, site);
        const b = dropoutKeep({ p: q, seed: 99, offset: 1 }, site);
        kept += Number(a);
        same += Number(a === b);
      }
      const sd = Math.sqrt((q * (1 - q)) / n);
      expect(Math.abs(kept / n - (1 - q))).toBeLessThan(5 * sd);
      // Independent masks agree with probability p^2 + (1 - p)^2.
      const agree = q * q + (1 - q) * (1 - q);
      expect(Math.abs(same / n - agree)).toBeLessThan(5 * Math.sqrt((agree * (1 - agree)) / n));
    }
  });

  test('p = 0 keeps every element; the same arguments give the same answer', () => {
    for (let col = 0; col < 64; col++) {
      expect(dropoutKeep({ p: 0, seed: 1 }, { batch: 0, head: 0, headsQ: 1, row: 3, col })).toBe(true);
      const site = { batch: 1, head: 0, headsQ: 1, row: 2, col };
      expect(dropoutKeep({ p: 0.5, seed: 5 }, site)).toBe(dropoutKeep({ p: 0.5, seed: 5 }, site));
    }
  });

  test('refuses a probability outside [0, 1), a seed or offset that is not an integer in range, and bad sites', () => {
    const site = { batch: 0, head: 0, headsQ: 1, row: 0, col: 0 };
    expect(() => dropoutKeep({ p: 1, seed: 1 }, site)).toThrow(new RangeError('Expected dropout.p to be a probability in [0, 1) but received 1'));
    expect(() => dropoutKeep({ p: NaN, seed: 1 }, site)).toThrow(RangeError);
    expect(() => dropoutKeep({ p: '0.1' as unknown as number, seed: 1 }, site)).toThrow(TypeError);
    expect(() => dropoutKeep({ p: 0.1, seed: -1 }, site)).toThrow(new RangeError('Expected dropout.seed to be an integer in [0, 2^53) but received -1'));
    expect(() => dropoutKeep({ p: 0.1, seed: 1.5 }, site)).toThrow(RangeError);
    expect(() => dropoutKeep({ p: 0.1, seed: 1, offset: 2 ** 32 }, site)).toThrow(
      new RangeError('Expected dropout.offset to be an integer in [0, 2^32) but received 4294967296'));
    expect(() => dropoutKeep({ p: 0.1, seed: 1 }, { ...site, head: 1 })).toThrow(
      new RangeError('Expected site.head to be an integer from 0 to 0 but received 1'));
    expect(() => dropoutKeep({ p: 0.1, seed: 1 }, { ...site, row: -1 })).toThrow(RangeError);
    expect(() => dropoutKeep({ p: 0.1, seed: 1 }, { ...site, col: '3' as unknown as number })).toThrow(TypeError);
    expect(() => dropoutKeep({ p: 0.1, seed: 1, rate: 0.2 } as never, site)).toThrow(/rate/);
    expect(() => dropoutKeep({ p: 0.1, seed: 1 }, null as never)).toThrow(TypeError);
  });
});
