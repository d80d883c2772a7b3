/**
 * One error factory for argument validation, so every message has the same shape:
 * "Expected <argument> to <expectation> but received <what was received>".
 * Wrong types are TypeErrors; values and shapes out of range are RangeErrors.
 * @packageDocumentation
 */

/** Describes a received value for an error message: `[2, 128, 64]`, `1.5 of type number`, `null`. */
export function describeValue(value: unknown): string {
  if (value === null) return 'null';
  if (value === undefined) return 'undefined';
  if (Array.isArray(value)) return `an Array of length ${value.length}`;
  if (ArrayBuffer.isView(value)) {
    const name = value.constructor.name;
    return `${/^[AEIO]/.test(name) ? 'an' : 'a'} ${name}`; // a Uint16Array, an Int16Array
  }
  switch (typeof value) {
    case 'number':
      return `${value} of type number`;
    case 'string':
      return `"${value}" of type string`;
    case 'boolean':
    case 'bigint':
      return `${String(value)} of type ${typeof value}`;
    case 'function':
      return 'a function';
    default: {
      const ctor = (value as object).constructor?.name;
      return ctor && ctor !== 'Object' ? `an instance of ${ctor}` : 'an object';
    }
  }
}

/** Formats a shape as `[2, 128, 64]`. */
export function formatShape(shape: readonly number[]): string {
  // Element by element: a shape passed in may hold anything (a Symbol would make join() throw).
  return `[${Array.from(shape, (d) => (typeof d === 'number' ? String(d) : describeValue(d))).join(', ')}]`;
}

/** A TypeError: `Expected ${what} but received ${received}`. */
export function typeError(what: string, received: string): TypeError {
  return new TypeError(`Expected ${what} but received ${received}`);
}

/** `'a'`, `'a' or 'b'`, `'a', 'b' or 'c'`: a list of choices for error messages. */
export function quoteList(list: readonly string[]): string {
  const q = list.map((d) => `'${d}'`);
  return q.length === 1 ? q[0] : `${q.slice(0, -1).join(', ')} or ${q[q.length - 1]}`;
}

/**
 * Refuses an options-like object (`arg`) with a key outside `allowed`: a typo must not silently fall
 * back to a default. The caller has checked that `value` is a non-null object.
 */
export function refuseUnknownKeys(value: object, arg: string, allowed: readonly string[]): void {
  for (const key of Object.keys(value)) {
    if (!allowed.includes(key)) throw typeError(`${arg} to have only the keys ${quoteList(allowed)}`, `unknown key '${key}'`);
  }
}

/** A RangeError: `Expected ${what} but received ${received}`. */
export function rangeError(what: string, received: string): RangeError {
  return new RangeError(`Expected ${what} but received ${received}`);
}
