/**
 * FLOP counts as FlashAttention-2 reports them: forward 4·B·H·Sq·Sk·D (two matmuls), halved when
 * causal; backward 2.5× the forward (five matmuls, recomputing S); forward+backward 3.5×.
 * @packageDocumentation
 */

import type { ReferenceShape } from '../lib';

/** Which pass a measurement covers. */
export type Pass = 'fwd' | 'bwd' | 'fwdbwd';

/** The passes, in the order the benchmark runs and reports them. */
export const PASSES: readonly Pass[] = ['fwd', 'bwd', 'fwdbwd'];

/** The sizes a FLOP count needs, and whether the mask is causal. */
export interface AttentionShape extends Omit<ReferenceShape, 'headsKV'> {
  causal: boolean;
}

/** Forward FLOPs: 4·B·H·Sq·Sk·D, halved when causal. */
export function forwardFlops(s: AttentionShape): number {
  const full = 4 * s.batch * s.headsQ * s.seqlenQ * s.seqlenK * s.headDim;
  return s.causal ? full / 2 : full;
}

/** FLOPs of a pass: the forward count, ×2.5 for the backward, ×3.5 for forward+backward. */
export function passFlops(s: AttentionShape, pass: Pass): number {
  const f = forwardFlops(s);
  return pass === 'fwd' ? f : pass === 'bwd' ? 2.5 * f : 3.5 * f;
}

/** Throughput in TFLOP/s (10¹² FLOP per second) of `pass` on `s` done in `ms` milliseconds. */
export function tflopsPerSecond(s: AttentionShape, pass: Pass, ms: number): number {
  return passFlops(s, pass) / (ms * 1e-3) / 1e12;
}
