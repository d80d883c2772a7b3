/**
 * FlashAttention-2's FLOP count (bench/flops.ts) on hand-computed numbers.
 */
import { forwardFlops, passFlops, tflopsPerSecond } from '../bench/flops';

describe('FA2 FLOP count', () => {
  // B2 H4 Sq128 Sk256 D64: 4 * 2 * 4 * 128 * 256 * 64 = 67,108,864.
  const shape = { batch: 2, headsQ: 4, seqlenQ: 128, seqlenK: 256, headDim: 64, causal: false };

  test('forward is 4·B·H·Sq·Sk·D', () => {
    expect(forwardFlops(shape)).toBe(67_108_864);
    expect(forwardFlops({ batch: 1, headsQ: 1, seqlenQ: 1, seqlenK: 1, headDim: 8, causal: false })).toBe(32);
  });

  test('causal halves it', () => {
    expect(forwardFlops({ ...shape, causal: true })).toBe(33_554_432);
  });

  test('backward is 2.5x, forward+backward 3.5x', () => {
    expect(passFlops(shape, 'fwd')).toBe(67_108_864);
    expect(passFlops(shape, 'bwd')).toBe(167_772_160);
    expect(passFlops(shape, 'fwdbwd')).toBe(234_881_024);
    expect(passFlops({ ...shape, causal: true }, 'bwd')).toBe(83_886_080);
    expect(passFlops({ ...shape, causal: true }, 'fwdbwd')).toBe(117_440_512);
  });

  test('the FA2 paper grid: 16k tokens x width 2048 gives the same forward count at every head dim', () => {
    // B·S = 16384, H·D = 2048: 4 · 16384 · S · 2048 at seqlen S, whatever D is.
    const at = (seqlen: number, headDim: number): number => forwardFlops({
      batch: 16384 / seqlen, headsQ: 2048 / headDim, seqlenQ: seqlen, seqlenK: seqlen, headDim, causal: false,
    });
    expect(at(2048, 64)).toBe(4 * 16384 * 2048 * 2048);
    expect(at(2048, 128)).toBe(at(2048, 64));
    expect(at(8192, 64)).toBe(4 * at(2048, 64));
  });

  test('TFLOP/s is FLOPs per second / 1e12', () => {
    // The fp32-memory-wall preset's case: B4 H1 S8192 D64 forward = 68,719,476,736 FLOPs; in 5.75 ms: 11.95 TFLOP/s.
    const wall = { batch: 4, headsQ: 1, seqlenQ: 8192, seqlenK: 8192, headDim: 64, causal: false };
    expect(forwardFlops(wall)).toBe(68_719_476_736);
    expect(tflopsPerSecond(wall, 'fwd', 5.75)).toBeCloseTo(11.951, 3);
    expect(tflopsPerSecond(shape, 'fwd', 1)).toBeCloseTo(0.067108864, 12);
  });
});
