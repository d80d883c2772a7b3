/**
 * Token embedding: a row gather from a table, and its backward, a scatter-add into the table's
 * float32 gradient. CPU and CUDA, one API (csrc/common/op_params.h `EmbeddingParams`).
 * @packageDocumentation
 */
import { formatShape, rangeError } from '../errors';
import { binding } from '../native';
import { Tensor, wrapNative } from '../tensor';
import { arg, checkTensor, sameShape } from './common';

/**
 * Looks up one table row per id: `out[...i, :] = table[ids[...i], :]`.
 *
 * @param ids int32 `[...lead]` token ids, contiguous, on the table's device.
 * @param table `[V, C]` float32, float16 or bfloat16, contiguous.
 * @returns a new `[...lead, C]` tensor of the table's dtype on its device. An id outside `[0, V)`
 *   gives a row of NaN (nothing outside the table is read): check ids you did not produce yourself.
 * @throws TypeError / RangeError naming the argument for a wrong dtype, device, rank or layout.
 */
export function embedding(ids: Tensor, table: Tensor): Tensor {
  const i = checkTensor(ids, 'ids', { dtype: 'int32' });
  const t = checkTensor(table, 'table', { rank: 2, device: i.device });
  const [vocab, dim] = t.shape;
  const out = binding().embeddingForward(arg(i, 'ids'), arg(t, 'table'), i.numel, vocab, dim);
  return wrapNative(out, [...i.shape, dim], t.dtype, t.device);
}

/**
 * The backward of {@link embedding}: `dtable[ids[...i], :] += dout[...i, :]`, accumulated in float32
 * into `dtable` in place (so tied weights and micro-batches add up; zero it before a step). Rows whose
 * id is outside `[0, V)` add nothing. Deterministic: each row of dtable receives its contributions in
 * the order of the ids, on either backend.
 *
 * @param ids int32 `[...lead]`, as given to the forward.
 * @param dout `[...lead, C]` float32, float16 or bfloat16: the gradient of the forward's output.
 * @param dtable float32 `[V, C]`, updated in place (`+=`); it must not share storage with dout.
 * @throws TypeError / RangeError naming the argument; a refused call changes nothing.
 */
export function embeddingBackward(ids: Tensor, dout: Tensor, dtable: Tensor): void {
  const i = checkTensor(ids, 'ids', { dtype: 'int32' });
  const g = checkTensor(dtable, 'dtable', { dtype: 'float32', rank: 2, device: i.device });
  const d = checkTensor(dout, 'dout', { device: i.device });
  const [vocab, dim] = g.shape;
  const want = [...i.shape, dim];
  if (!sameShape(d.shape, want)) {
    throw rangeError(`dout to have shape ${formatShape(want)} (ids' shape, then dtable's columns)`, formatShape(d.shape));
  }
  binding().embeddingBackward(arg(i, 'ids'), arg(d, 'dout'), arg(g, 'dtable'), i.numel, vocab, dim);
}
