/**
 * Bad calls of the training ops (lib/ops embedding, linear, loss, optim, reduce) and of their raw
 * native bindings: each throws the exact error (naming the argument, what was expected and what was
 * received), allocates nothing, and leaves in-place tensors unchanged.
 */

import { Tensor } from '../lib';
import { binding, NativeView } from '../lib/native';
import { embedding, embeddingBackward } from '../lib/ops/embedding';
import { linear, linearBackward, linearGelu } from '../lib/ops/linear';
import { crossEntropy } from '../lib/ops/loss';
import { adamwStep, gradNorm } from '../lib/ops/optim';
import { columnSum, sum } from '../lib/ops/reduce';
import { storageOf } from '../lib/tensor';
import { describeCuda, liveMemory, synchronizeAll } from './helpers/backend';

const device = 'cpu';
// The argument tensors (created by f32 / i32, also inside a refused call's closure), disposed at the end.
const tensors: Tensor[] = [];
let argumentBytes = 0;
// Taken before any argument exists (describe bodies create some while Jest collects the tests).
const atStart = liveMemory();
afterAll(async () => {
  for (const t of tensors) t.dispose();
  await synchronizeAll();
  expect(liveMemory()).toEqual(atStart);
});
function track(t: Tensor): Tensor {
  tensors.push(t);
  argumentBytes += t.bytes;
  return t;
}
function f32(shape: number[], dtype: 'float32' | 'float16' | 'bfloat16' = 'float32'): Tensor {
  const n = shape.reduce((a, b) => a * b, 1);
  const data = Float32Array.from({ length: n }, (_, i) => ((i * 37) % 11) - 5 + 0.25);
  return track(Tensor.fromFloat32Array(data, shape, { dtype, device }));
}
function i32(values: number[], shape = [values.length]): Tensor {
  return track(Tensor.fromInt32Array(Int32Array.from(values), shape, { device }));
}
const view = (t: Tensor): NativeView => storageOf(t, 't');

/**
 * Expects `fn` to throw `kind` with exactly `message`, with no tensor allocated or freed (apart from
 * the arguments `fn` creates with f32 / i32) and every tensor in `unchanged` holding the same values
 * afterwards.
 */
async function refused(
  fn: () => unknown, kind: typeof TypeError | typeof RangeError, message: string, unchanged: Tensor[] = [],
): Promise<void> {
  await synchronizeAll();
  const before = liveMemory();
  const values = await Promise.all(unchanged.map((t) => t.toFloat32Array()));
  const argumentsBefore = { tensors: tensors.length, bytes: argumentBytes };
  let thrown: unknown;
  try {
    fn();
  } catch (e) {
    thrown = e;
  }
  expect((thrown as Error)?.name).toBe(kind.name);
  expect((thrown as Error).message).toBe(message);
  await synchronizeAll();
  const after = liveMemory();
  after.cpu.tensors -= tensors.length - argumentsBefore.tensors;
  after.cpu.bytes -= argumentBytes - argumentsBefore.bytes;
  expect(after).toEqual(before);
  for (let i = 0; i < unchanged.length; i++) expect(await unchanged[i].toFloat32Array()).toEqual(values[i]);
}

describe('embedding refuses', () => {
  const table = f32([5, 4]);
  const ids = i32([0, 4, 2]);
  test('ids of a floating dtype', () =>
    refused(() => embedding(f32([3]), table), TypeError, "Expected ids to have dtype 'int32' but received 'float32'"));
  test('a table of rank 1', () =>
    refused(() => embedding(ids, f32([5])), RangeError, 'Expected table to have 2 dims but received [5]'));
  test('an int32 table', () =>
    refused(() => embedding(ids, i32([1, 2, 3, 4], [2, 2])), TypeError,
      "Expected table to have dtype 'float32', 'float16' or 'bfloat16' but received 'int32'"));
  test('a disposed table', () => {
    const t = f32([5, 4]);
    t.dispose();
    return refused(() => embedding(ids, t), TypeError, 'Expected table to be a live Tensor but received a disposed Tensor');
  });
  test('a dout whose shape does not follow ids and dtable', () => {
    const dtable = f32([5, 4]);
    return refused(() => embeddingBackward(ids, f32([3, 5]), dtable), RangeError,
      "Expected dout to have shape [3, 4] (ids' shape, then dtable's columns) but received [3, 5]", [dtable]);
  });
  test('a half dtable', () => {
    const dtable = f32([5, 4], 'bfloat16');
    return refused(() => embeddingBackward(ids, f32([3, 4]), dtable), TypeError,
      "Expected dtable to have dtype 'float32' but received 'bfloat16'", [dtable]);
  });
});

describe('linear refuses', () => {
  const x = f32([2, 3, 4]);
  const w = f32([5, 4]);
  test('a weight of another dtype', () =>
    refused(() => linear(x, f32([5, 4], 'bfloat16')), TypeError, "Expected weight to have dtype 'float32' but received 'bfloat16'"));
  test("a weight whose columns are not x's last dim", () =>
    refused(() => linear(x, f32([4, 5])), RangeError,
      "Expected weight to have shape [outFeatures, 4] (x's last dim) but received [4, 5]"));
  test('a bias of the wrong length', () =>
    refused(() => linearGelu(x, w, f32([4])), RangeError, 'Expected bias to have shape [5] but received [4]'));
  test('an unknown option key', () =>
    refused(() => linear(x, w, null, { precision: 'tf32' } as never), TypeError,
      "Expected options to have only the keys 'float32Precision' but received unknown key 'precision'"));
  test('an unknown float32Precision', () =>
    refused(() => linear(x, w, null, { float32Precision: 'fast' as never }), TypeError,
      "Expected options.float32Precision to be 'tf32' or 'highest' but received \"fast\" of type string"));
  test('a dy whose shape does not match', () =>
    refused(() => linearBackward(f32([2, 3, 4]), x, w, {}), RangeError,
      "Expected dy to have shape [2, 3, 5] (x's leading dims, weight's first dim) but received [2, 3, 4]"));
  test('a transposed dweight, leaving it unchanged', () => {
    const dweight = f32([4, 5]);
    return refused(() => linearBackward(f32([2, 3, 5]), x, w, { dweight }), RangeError,
      'Expected grads.dweight to have shape [5, 4] but received [4, 5]', [dweight]);
  });
  test('an unknown grads key', () =>
    refused(() => linearBackward(f32([2, 3, 5]), x, w, { dw: null } as never), TypeError,
      "Expected grads to have only the keys 'dweight', 'dbias' or 'dx' but received unknown key 'dw'"));
  test('missing grads', () =>
    refused(() => linearBackward(f32([2, 3, 5]), x, w, undefined as never), TypeError,
      'Expected grads to be an object { dweight?, dbias?, dx? } but received undefined'));
  test('a dweight sharing storage with weight', () => {
    const sq = f32([4, 4]);
    return refused(() => linearBackward(f32([2, 3, 4]), x, sq, { dweight: sq }), RangeError,
      'Expected dweight and weight to be different tensors (storages) but received the same storage for both', [sq]);
  });
});

describe('crossEntropy refuses', () => {
  const logits = f32([3, 7]);
  const targets = i32([0, 6, 2]);
  test('logits of rank 1', () =>
    refused(() => crossEntropy(f32([7]), targets), RangeError, 'Expected logits to have at least 2 dims but received [7]'));
  test("targets that do not match the logits' leading dims", () =>
    refused(() => crossEntropy(logits, i32([0, 1])), RangeError,
      "Expected targets to have shape [3] (logits' leading dims) but received [2]"));
  test('an unknown reduction', () =>
    refused(() => crossEntropy(logits, targets, { reduction: 'avg' as never }), TypeError,
      "Expected options.reduction to be 'mean', 'sum' or 'none' but received \"avg\" of type string"));
  test('a fractional ignoreIndex', () =>
    refused(() => crossEntropy(logits, targets, { ignoreIndex: 1.5 }), RangeError,
      'Expected options.ignoreIndex to be an integer >= -2147483648 <= 2147483647 but received 1.5'));
  test('an unknown option key', () =>
    refused(() => crossEntropy(logits, targets, { ignore_index: 3 } as never), TypeError,
      "Expected options to have only the keys 'ignoreIndex', 'reduction', 'grad' or 'gradScale' but received unknown key 'ignore_index'"));
  test('a non-boolean grad', () =>
    refused(() => crossEntropy(logits, targets, { grad: 1 as never }), TypeError,
      'Expected options.grad to be a boolean but received 1 of type number'));
});

describe('adamwStep refuses, leaving every tensor unchanged', () => {
  const param = f32([3, 4]);
  const grad = f32([12]);
  const m = f32([12]);
  const v = f32([12]);
  const all = [param, m, v];
  test('master weights for a float32 param', () => {
    const master = f32([12]);
    return refused(() => adamwStep({ param, grad, m, v, master }, { lr: 1, step: 1 }), TypeError,
      'Expected state.master to be null or absent for a float32 param (it is its own master weight) but received an instance of Tensor',
      [...all, master]);
  });
  test('a half param without master weights', () => {
    const half = f32([12], 'bfloat16');
    return refused(() => adamwStep({ param: half, grad, m, v }, { lr: 1, step: 1 }), TypeError,
      'Expected state.master (float32 master weights) for a bfloat16 param but received undefined', [half, m, v]);
  });
  test("a grad without param's element count", () =>
    refused(() => adamwStep({ param, grad: f32([11]), m, v }, { lr: 1, step: 1 }), RangeError,
      'Expected state.grad to have 12 elements (like state.param) but received 11', all));
  test('a half m', () =>
    refused(() => adamwStep({ param, grad, m: f32([12], 'float16'), v }, { lr: 1, step: 1 }), TypeError,
      "Expected state.m to have dtype 'float32' but received 'float16'", all));
  test('step 0', () =>
    refused(() => adamwStep({ param, grad, m, v }, { lr: 1, step: 0 }), RangeError,
      'Expected options.step to be an integer >= 1 but received 0', all));
  test('beta1 = 1', () =>
    refused(() => adamwStep({ param, grad, m, v }, { lr: 1, step: 1, beta1: 1 }), RangeError,
      'Expected options.beta1 to be a number >= 0 and < 1 (as a float32) but received 1', all));
  test('a negative lr', () =>
    refused(() => adamwStep({ param, grad, m, v }, { lr: -1, step: 1 }), RangeError,
      'Expected options.lr to be a finite number >= 0 <= 3.4028234663852886e+38 but received -1', all));
  test('a gradScale beyond float32', () =>
    refused(() => adamwStep({ param, grad, m, v }, { lr: 1, step: 1, gradScale: 1e39 }), RangeError,
      'Expected options.gradScale to be a finite number >= -3.4028234663852886e+38 <= 3.4028234663852886e+38 but received 1e+39', all));
  test('a missing lr', () =>
    refused(() => adamwStep({ param, grad, m, v }, { step: 1 } as never), TypeError,
      'Expected options.lr to be a number but received undefined', all));
  test('an unknown option key', () =>
    refused(() => adamwStep({ param, grad, m, v }, { lr: 1, step: 1, weight_decay: 0.1 } as never), TypeError,
      "Expected options to have only the keys 'lr', 'beta1', 'beta2', 'eps', 'weightDecay', 'step', 'gradScale' or 'clip' but received unknown key 'weight_decay'",
      all));
  test('a clip norm of the wrong shape', () =>
    refused(() => adamwStep({ param, grad, m, v }, { lr: 1, step: 1, clip: { norm: f32([2]), maxNorm: 1 } }), RangeError,
      'Expected options.clip.norm to have shape [1] but received [2]', all));
  test('a clip maxNorm of 0', () =>
    refused(() => adamwStep({ param, grad, m, v }, { lr: 1, step: 1, clip: { norm: f32([1]), maxNorm: 0 } }), RangeError,
      'Expected options.clip.maxNorm to be a finite number > 0 <= 3.4028234663852886e+38 but received 0', all));
  test('m and v on one storage', () =>
    refused(() => adamwStep({ param, grad, m, v: m }, { lr: 1, step: 1 }), RangeError,
      'Expected m and v to be different tensors (storages) but received the same storage for both', all));
});

describe('reductions refuse', () => {
  test('an empty gradNorm list', () =>
    refused(() => gradNorm([]), TypeError, 'Expected tensors to be a non-empty Array of tensors but received an Array of length 0'));
  test('an int32 tensor in the gradNorm list', () =>
    refused(() => gradNorm([f32([3]), i32([1])]), TypeError,
      "Expected tensors[1] to have dtype 'float32', 'float16' or 'bfloat16' but received 'int32'"));
  test('sum of an int32 tensor', () =>
    refused(() => sum(i32([1, 2])), TypeError, "Expected x to have dtype 'float32', 'float16' or 'bfloat16' but received 'int32'"));
  test('a columnSum out of the wrong length, leaving it unchanged', () => {
    const out = f32([4]);
    return refused(() => columnSum(f32([3, 5]), out), RangeError, 'Expected out to have shape [5] but received [4]', [out]);
  });
  test('a half columnSum out', () =>
    refused(() => columnSum(f32([3, 5]), f32([5], 'float16')), TypeError, "Expected out to have dtype 'float32' but received 'float16'"));
});

describe('the raw bindings re-check what lib/ checked', () => {
  const b = binding();
  const table = f32([5, 4]);
  const ids = i32([0, 4, 2]);
  test('a string for a tensor', () =>
    refused(() => b.embeddingForward('ids' as never, view(table), 3, 5, 4), TypeError,
      'Expected ids to be a native buffer but received "ids" of type string'));
  test('more rows than the ids hold', () =>
    refused(() => b.embeddingForward(view(ids), view(table), 4, 5, 4), RangeError,
      'Expected ids to reach 4 elements from offset 0 inside its storage of 3 elements but it does not'));
  test('a vocabulary larger than the table', () =>
    refused(() => b.embeddingForward(view(ids), view(table), 3, 6, 4), RangeError,
      'Expected table to reach 24 elements from offset 0 inside its storage of 20 elements but it does not'));
  test('an offset outside the storage', () =>
    refused(() => b.embeddingForward([view(ids)[0], 3], view(table), 1, 5, 4), RangeError,
      'Expected ids offset to be an integer in [0, 2] but received 3 of type number'));
  test('a fractional size', () =>
    refused(() => b.sum(view(table), 2.5), RangeError, 'Expected numel to be an integer in [1, 9007199254740991] but received 2.5 of type number'));
  test('sizes whose product overflows', () =>
    refused(() => b.linearForward(view(table), view(table), null, 2 ** 40, 2 ** 40, 1, false, 0), RangeError,
      'Expected x to have fewer than 2^60 elements but received [1099511627776, 1099511627776]'));
  test('an unknown reduction code', () =>
    refused(() => b.crossEntropy(view(f32([3, 7])), view(ids), 3, 7, -100, 7, false, 1), RangeError,
      'Expected reduction to be an integer in [0, 2] but received 7 of type number'));
  test('an int32 dtable', () =>
    refused(() => b.embeddingBackward(view(ids), view(f32([3, 4])), view(i32(new Array(20).fill(0))), 3, 5, 4), TypeError,
      'Expected dtable to have dtype float32 but received int32'));
  test('a NaN lr', () => {
    const p = f32([4]);
    return refused(() => b.adamwStep(view(p), view(f32([4])), view(f32([4])), view(f32([4])), null, 4, NaN, 0.9, 0.999, 1e-8, 0, 1, 1, null, 0),
      RangeError, 'Expected lr to be a finite float32 >= 0 but received NaN of type number', [p]);
  });
  test('a gradScale beyond float32', () =>
    refused(() => b.crossEntropy(view(f32([3, 7])), view(ids), 3, 7, -100, 2, true, 1e39), RangeError,
      'Expected gradScale to be a finite float32 but received 1e+39 of type number'));
  test('a float32 param with master weights', () => {
    const p = f32([4]);
    return refused(() => b.adamwStep(view(p), view(f32([4])), view(f32([4])), view(f32([4])), view(f32([4])), 4, 1, 0.9, 0.999, 1e-8, 0, 1, 1, null, 0),
      TypeError, 'Expected master to be null for a float32 param (it is its own master weight) but received a tensor', [p]);
  });
  test('a half param without master weights', () =>
    refused(() => b.adamwStep(view(f32([4], 'bfloat16')), view(f32([4])), view(f32([4])), view(f32([4])), null, 4, 1, 0.9, 0.999, 1e-8, 0, 1, 1, null, 0),
      TypeError, 'Expected master (float32 master weights) for a bfloat16 param but received null'));
  test('param and grad on one storage', () => {
    const p = f32([4]);
    return refused(() => b.adamwStep(view(p), view(p), view(f32([4])), view(f32([4])), null, 4, 1, 0.9, 0.999, 1e-8, 0, 1, 1, null, 0),
      RangeError, 'Expected param and grad to be different tensors (storages) but received the same storage for both', [p]);
  });
  test('beta2 that rounds to 1 in float32', () =>
    refused(() => b.adamwStep(view(f32([4])), view(f32([4])), view(f32([4])), view(f32([4])), null, 4, 1, 0.9, 0.99999999, 1e-8, 0, 1, 1, null, 0),
      RangeError, 'Expected beta2 to be a number >= 0 and < 1 (as a float32) but received 0.99999999 of type number'));
  test('an empty gradNorm list', () =>
    refused(() => b.gradNorm([], []), TypeError, 'Expected tensors to be a non-empty Array of tensors but received an Array of length 0'));
  test('gradNorm sizes that do not match the list', () =>
    refused(() => b.gradNorm([view(table)], [20, 1]), TypeError,
      'Expected numels to be an Array of 1 element counts but received an Array of length 2'));
  test('a columnSum out that is x', () => {
    const x = f32([5]);
    return refused(() => b.columnSum(view(x), 1, 5, view(x)), RangeError,
      'Expected out and x to be different tensors (storages) but received the same storage for both', [x]);
  });
  test('a non-boolean gelu flag', () =>
    refused(() => b.linearForward(view(table), view(table), null, 5, 4, 5, 1 as never, 0), TypeError,
      'Expected gelu to be a boolean but received 1 of type number'));
  test('an unknown float32Precision code', () =>
    refused(() => b.linearBackward(view(f32([2, 5])), view(f32([2, 4])), view(table), null, null, true, 2, 4, 5, 2), RangeError,
      'Expected float32Precision to be an integer in [0, 1] but received 2 of type number'));
});

describeCuda('tensors on two devices', () => {
  test('are refused, naming the argument on the other device', async () => {
    const ids = Tensor.fromInt32Array(Int32Array.from([0, 1]), [2], { device: 'cuda' });
    const onCuda = Tensor.fromFloat32Array(new Float32Array([1, 2, 3]), [3], { device: 'cuda' });
    try {
      await refused(() => embedding(ids, f32([4, 3])), TypeError, "Expected table to be on device 'cuda' but received 'cpu'");
      await refused(() => gradNorm([onCuda, f32([3])]), TypeError, "Expected tensors[1] to be on device 'cuda' but received 'cpu'");
      await refused(() => binding().sum(view(onCuda), 4), RangeError,
        'Expected x to reach 4 elements from offset 0 inside its storage of 3 elements but it does not');
    } finally {
      ids.dispose();
      onCuda.dispose();
    }
  });
});

