/**
 * Fused softmax cross-entropy over the last dim, with an ignore index and the gradient in the same
 * pass (csrc/common/op_params.h `CrossEntropyParams`). CPU and CUDA, one API.
 * @packageDocumentation
 */
import { formatShape, rangeError } from '../errors';
import { binding, REDUCTION_CODE } from '../native';
import { Tensor, wrapNative } from '../tensor';
import { arg, checkBoolean, checkChoice, checkNumber, checkOptions, checkTensor, sameShape } from './common';

/** How the per-row losses are reduced. */
export type LossReduction = 'mean' | 'sum' | 'none';

/** Options of {@link crossEntropy}. */
export interface CrossEntropyOptions {
  /**
   * Rows whose target equals this value have loss 0 and a zero gradient row, and are not counted
   * by 'mean' (PyTorch's `ignore_index`). An int32. Default -100.
   */
  ignoreIndex?: number;
  /**
   * 'mean' (default): the sum over counted rows divided by their number (NaN when every row is
   * ignored, as PyTorch); 'sum': the sum; 'none': one loss per row (0 for ignored rows).
   */
  reduction?: LossReduction;
  /** Also compute `dlogits`, the gradient of the reduced loss. Default false. */
  grad?: boolean;
  /**
   * The upstream gradient of the reduced loss (a finite number, e.g. 1 / gradient-accumulation
   * steps, or a loss scale): dlogits is multiplied by it. Default 1.
   */
  gradScale?: number;
}

/** Output of {@link crossEntropy}. */
export interface CrossEntropyOutput {
  /** float32 `[1]` for 'mean' and 'sum'; float32 `[...lead]` for 'none'. */
  loss: Tensor;
  /**
   * With `grad: true`: `[...lead, V]` in the logits' dtype,
   * `dlogits[r, j] = gradScale · w · (softmax(logits[r])[j] − [j == target[r]])` with `w = 1 / count`
   * for 'mean' (count: the rows not ignored) and 1 otherwise; zero rows for ignored targets. Else null.
   */
  dlogits: Tensor | null;
}

const REDUCTIONS: readonly LossReduction[] = ['mean', 'sum', 'none'];
const INT32_MIN = -2147483648;
const INT32_MAX = 2147483647;
/** The largest finite float32 (gradScale is used as a float32). */
const FLOAT32_MAX = 3.4028234663852886e38;

/**
 * Softmax cross-entropy of each row of `logits` against its target class:
 * `loss[r] = logsumexp(logits[r, :]) − logits[r, targets[r]]`, computed in float32 (max-subtracted).
 *
 * A target outside `[0, V)` that is not `ignoreIndex` gives a NaN loss for its row (so a 'mean' or
 * 'sum' of NaN) and a NaN dlogits row; nothing outside the row is read. A NaN logit makes its row's
 * loss and gradient NaN.
 *
 * @param logits `[...lead, V]` float32, float16 or bfloat16, contiguous, at least 2 dims.
 * @param targets int32 `[...lead]` class indices on the logits' device.
 * @param options see {@link CrossEntropyOptions}.
 * @returns new tensors (see {@link CrossEntropyOutput}).
 * @throws TypeError / RangeError naming the argument; a refused call changes nothing.
 */
export function crossEntropy(logits: Tensor, targets: Tensor, options?: CrossEntropyOptions): CrossEntropyOutput {
  const l = checkTensor(logits, 'logits', { minRank: 2 });
  const t = checkTensor(targets, 'targets', { dtype: 'int32', device: l.device });
  const lead = l.shape.slice(0, -1);
  if (!sameShape(t.shape, lead)) {
    throw rangeError(`targets to have shape ${formatShape(lead)} (logits' leading dims)`, formatShape(t.shape));
  }
  const o = checkOptions<CrossEntropyOptions>(options, 'options', ['ignoreIndex', 'reduction', 'grad', 'gradScale']);
  const ignoreIndex = o.ignoreIndex === undefined ? -100
    : checkNumber(o.ignoreIndex, 'options.ignoreIndex', { integer: true, min: INT32_MIN, max: INT32_MAX });
  const reduction = o.reduction === undefined ? 'mean' : checkChoice(o.reduction, 'options.reduction', REDUCTIONS);
  const grad = o.grad === undefined ? false : checkBoolean(o.grad, 'options.grad');
  const gradScale = o.gradScale === undefined ? 1 : checkNumber(o.gradScale, 'options.gradScale', { min: -FLOAT32_MAX, max: FLOAT32_MAX });
  const vocab = l.shape[l.shape.length - 1];
  const [loss, dlogits] = binding().crossEntropy(
    arg(l, 'logits'), arg(t, 'targets'), t.numel, vocab, ignoreIndex, REDUCTION_CODE[reduction], grad, gradScale,
  );
  return {
    loss: wrapNative(loss, reduction === 'none' ? lead : [1], 'float32', l.device),
    dlogits: dlogits ? wrapNative(dlogits, l.shape, l.dtype, l.device) : null,
  };
}
