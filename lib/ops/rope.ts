/**
 * Rotary position embeddings (RoPE), applied in place to a strided `[B, S, H, D]` view, on the CPU
 * and CUDA backends (csrc/common/op_params.h `RopeParams`). Rotate-half pairing (GPT-NeoX, Llama):
 * for `i < D/2` and position `p = positionOffset + s`, `θ_i = base^(−2i/D)` and
 * `(x_i, x_{i+D/2}) ← (x_i cos pθ_i − x_{i+D/2} sin pθ_i, x_i sin pθ_i + x_{i+D/2} cos pθ_i)`.
 * The angle is `float32(p) · float32(θ_i)` with `θ_i` from double precision and sin/cos in float32,
 * so both backends rotate by the same angles.
 * @packageDocumentation
 */
import { formatShape, rangeError } from '../errors';
import { binding } from '../native';
import type { Tensor } from '../tensor';
import { arg, checkBoolean, checkNumber, checkOptions, checkTensor } from './common';

/** The default `base` of {@link applyRope}. */
export const DEFAULT_ROPE_BASE = 10000;
/** The largest `positionOffset` (positions are int32 in the kernels). */
export const MAX_ROPE_POSITION = 2147483647;
/** The largest finite float32: `base` is used as a float32. */
const MAX_FLOAT32 = 3.4028234663852886e38;
/** RoPE's 4 dims: batch, sequence, heads, head dim. */
const ROPE_RANK = 4;

/** Options of {@link applyRope}. */
export interface RopeOptions {
  /** The base of the frequencies `θ_i = base^(−2i/D)`. Finite, > 1. Default 10000. */
  base?: number;
  /** The position of sequence row 0: row `s` is at `positionOffset + s` (e.g. a decoding step). Integer >= 0. Default 0. */
  positionOffset?: number;
  /** Rotate by the negative angles instead: undoes the forward, and is the backward of RoPE applied to dq / dk. Default false. */
  inverse?: boolean;
}

/**
 * Rotates `x` in place by its positions (see the module notes). `x` may be a strided view, e.g. the
 * q or k slice of a packed `[B, S, 3, H, D]` projection: any batch, row and head strides whose
 * `[D]` vectors do not overlap, with the last stride 1.
 * @param x `[B, S, H, D]` view (D even), float32, float16 or bfloat16, on 'cpu' or 'cuda'; modified in place.
 * @param options `base` (default 10000), `positionOffset` (default 0), `inverse` (default false).
 * @throws TypeError / RangeError naming the argument for a bad call (x is unchanged then).
 */
export function applyRope(x: Tensor, options?: RopeOptions): void {
  const X = checkTensor(x, 'x', { rank: ROPE_RANK, contiguous: false });
  const [B, S, H, D] = X.shape;
  const [sb, ss, sh, sd] = X.strides;
  if (D % 2 !== 0) throw rangeError('x to have an even last dim (head dim)', formatShape(X.shape));
  if (sd !== 1) throw rangeError('x to have a last stride of 1', `strides ${formatShape(X.strides)}`);
  checkNoOverlap(X.shape, X.strides);
  const o = checkOptions<RopeOptions>(options, 'options', ['base', 'positionOffset', 'inverse']);
  const base = o.base === undefined ? DEFAULT_ROPE_BASE : checkNumber(o.base, 'options.base', { above: 1, max: MAX_FLOAT32 });
  const positionOffset = o.positionOffset === undefined ? 0
    : checkNumber(o.positionOffset, 'options.positionOffset', { integer: true, min: 0, max: MAX_ROPE_POSITION });
  const inverse = o.inverse === undefined ? false : checkBoolean(o.inverse, 'options.inverse');
  binding().rope(arg(X, 'x'), [B, S, H, D], [sb, ss, sh], base, positionOffset, inverse);
}

/**
 * Refuses a view in which two `[D]` vectors share an element (each is rotated once, in place):
 * sorted by stride, every dim of size > 1 must step over everything the dims inside it reach.
 */
function checkNoOverlap(shape: readonly number[], strides: readonly number[]): void {
  const dims = [0, 1, 2].filter((d) => shape[d] > 1).sort((a, b) => strides[a] - strides[b]);
  let extent = shape[3];
  for (const d of dims) {
    if (strides[d] < extent) {
      throw rangeError('x to be a view whose [headDim] vectors do not overlap', `strides ${formatShape(strides)} for shape ${formatShape(shape)}`);
    }
    extent += (shape[d] - 1) * strides[d];
  }
}
