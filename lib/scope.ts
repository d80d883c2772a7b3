/**
 * Scopes for tensor lifetimes: {@link tidy} disposes every tensor created while its callback runs,
 * except the ones the callback returns and the ones passed to {@link keep}.
 *
 * Tracking goes through the Tensor constructor (every factory, op output and view is seen), so a
 * scope also catches intermediates the caller never named: `x.narrow(0, 1, 4).select(1, 0)` creates
 * two views, and both are disposed unless returned. Disposing is always safe for queued work (see
 * tensor.ts): the storage lives until the work that reads it is done.
 * @packageDocumentation
 */
import { describeValue, typeError } from './errors';
import { setCreationHook, Tensor } from './tensor';

/** One open {@link tidy} call: the tensors created inside it, in creation order. */
interface Scope {
  tracked: Tensor[];
}

const scopes: Scope[] = [];
const kept = new WeakSet<Tensor>();

function track(t: Tensor): void {
  const top = scopes[scopes.length - 1];
  if (top) top.tracked.push(t);
}

/** Tensors reachable from a return value: itself, array items, Map keys and values, own enumerable properties. */
function collectReturned(value: unknown, out: Set<Tensor>, seen: Set<object>): void {
  if (value === null || typeof value !== 'object') return;
  if (seen.has(value)) return;
  seen.add(value);
  if (value instanceof Tensor) {
    out.add(value);
    return;
  }
  if (Array.isArray(value)) {
    for (const item of value) collectReturned(item, out, seen);
    return;
  }
  if (value instanceof Map) {
    for (const [k, v] of value) {
      collectReturned(k, out, seen);
      collectReturned(v, out, seen);
    }
    return;
  }
  if (value instanceof Set) {
    for (const item of value) collectReturned(item, out, seen);
    return;
  }
  for (const key of Object.keys(value)) collectReturned((value as Record<string, unknown>)[key], out, seen);
}

/**
 * Runs `fn` synchronously and disposes every tensor created while it ran (factories, op outputs and
 * views alike), except those reachable from its return value (the value itself, arrays, Maps, Sets
 * and plain objects, searched recursively) and those passed to {@link keep}. Tensors that escape are
 * handed to the enclosing `tidy` (if any), which disposes them unless they escape it too. Scopes
 * nest. If `fn` throws, everything it created is disposed and the error is rethrown.
 *
 * `fn` must be synchronous: a function that returns a Promise (an `async` function) is refused with
 * a TypeError after it returns, and what it created so far is disposed. Tensors created after an
 * `await` would belong to no scope, or to whichever scope happened to be open at the time, so the
 * scope could not know which tensors are its own.
 *
 * @returns what `fn` returned.
 * @example
 * const loss = tidy(() => {
 *   const h = linear(x, w);           // disposed at the end
 *   return crossEntropy(h, targets).loss;  // kept: returned
 * });
 */
export function tidy<T>(fn: () => T): T {
  if (typeof fn !== 'function') throw typeError('fn to be a function', describeValue(fn));
  const scope: Scope = { tracked: [] };
  scopes.push(scope);
  if (scopes.length === 1) setCreationHook(track);
  let result: T;
  try {
    result = fn();
    if (result instanceof Promise || (result !== null && typeof result === 'object' &&
        typeof (result as { then?: unknown }).then === 'function')) {
      // The promise keeps running; its later tensors are not ours, so none of them is disposed here.
      (result as unknown as Promise<unknown>).then(undefined, () => undefined);
      throw typeError(
        'fn to be synchronous (tidy disposes what fn created when fn returns; tensors created after an await ' +
          'would escape the scope, so async functions are refused)',
        'a function that returned a Promise',
      );
    }
  } catch (err) {
    close(scope, new Set());
    throw err;
  }
  const returned = new Set<Tensor>();
  collectReturned(result, returned, new Set());
  close(scope, returned);
  return result;
}

/** Pops `scope`, disposes what it tracked except `escaping` and kept tensors, and hands those up. */
function close(scope: Scope, escaping: Set<Tensor>): void {
  scopes.pop();
  const parent = scopes[scopes.length - 1];
  if (!parent) setCreationHook(null);
  for (const t of scope.tracked) {
    if (kept.has(t)) continue;
    if (escaping.has(t)) {
      if (parent) parent.tracked.push(t);
      continue;
    }
    t.dispose();
  }
}

/**
 * Marks `t` so that no {@link tidy} disposes it (the caller owns it, and disposes it). Returns `t`,
 * for `const w = keep(Tensor.zeros(...))` inside a scope.
 */
export function keep<T extends Tensor>(t: T): T {
  if (!(t instanceof Tensor)) throw typeError('t to be a Tensor', describeValue(t));
  kept.add(t);
  return t;
}
