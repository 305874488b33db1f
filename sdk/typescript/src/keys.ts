/**
 * Keys of `once` calls and queue jobs: `<name>:<first 32 hex digits of sha256(canonical JSON)>`.
 *
 * Canonical JSON is RFC 8785 (JCS): object members sorted by their names' UTF-16 code units, no
 * whitespace, strings and numbers as ECMAScript's JSON.stringify writes them. The Python SDK does
 * the same, so equal names and arguments give equal keys in both (`tests/key_vectors.json` of the
 * repository holds the shared vectors).
 *
 * What is hashed: for `once`, the call's arguments as passed, as a JSON list (trailing `undefined`
 * arguments dropped: an argument left out; defaults are not applied), or `key(...args)` as it is;
 * for a queue, `[input]`, or `key(input)`.
 *
 * Only JSON values are hashed, as the docs promise and the Python SDK does: strings, finite numbers,
 * booleans, null, arrays and plain objects (`{...}` or `Object.create(null)`). Anything else is a
 * ConfigError rather than what JSON.stringify would make of it: a `Date` (its ISO string would
 * collide with that string), any object with a `toJSON` method, Map, Set, class instances, typed
 * arrays and boxed primitives, a BigInt, function or symbol, NaN and the infinities, `undefined`
 * or a hole in an array (JSON.stringify writes null, which would collide with null), and an object
 * with symbol-named members. A plain object's member whose value is `undefined` is left out, as
 * JSON.stringify and the wire leave it out: `{ a: 1, b: undefined }` is `{ a: 1 }`, the object
 * TypeScript's optional members make.
 */

import { createHash } from 'node:crypto';
import { ConfigError } from './errors.js';

const HASH_HEX_CHARS = 32;
// Nesting deeper than this is refused rather than recursing without bound.
const DEPTH_MAX = 100;

/** A JSON value as the SDK carries it. */
export type JsonValue = null | boolean | number | string | JsonValue[] | { [key: string]: JsonValue };

function isPlainObject(value: object): boolean {
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

function checkText(text: string, path: string): void {
  if (!text.isWellFormed()) throw new ConfigError(`${path} holds a lone surrogate; it is not valid Unicode`);
}

function notJson(path: string, kind: string): ConfigError {
  return new ConfigError(
    `${path} is ${kind}, not a JSON value (use strings, numbers, booleans, null, arrays and plain objects, ` +
      `or pass key to choose what identifies the call)`,
  );
}

function kindOf(value: unknown): string {
  if (value === undefined) return 'undefined';
  if (typeof value !== 'object' || value === null) return `a ${typeof value}`;
  if (isPlainObject(value)) return 'an object';
  const name: unknown = value.constructor?.name;
  if (typeof name !== 'string' || !name) return 'an object that is not a plain one';
  return `${/^[AEIO]/i.test(name) ? 'an' : 'a'} ${name}`;
}

function write(value: unknown, path: string, depth: number, out: string[]): void {
  if (depth > DEPTH_MAX) throw new ConfigError(`${path} is nested more than ${DEPTH_MAX} levels deep`);
  if (value === null) {
    out.push('null');
  } else if (typeof value === 'boolean') {
    out.push(value ? 'true' : 'false');
  } else if (typeof value === 'string') {
    checkText(value, path);
    out.push(JSON.stringify(value));
  } else if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new ConfigError(`${path} is ${value}, which JSON cannot carry`);
    out.push(JSON.stringify(value)); // ECMAScript's Number::toString, as RFC 8785 requires; -0 is "0"
  } else if (typeof value !== 'object') {
    throw notJson(path, kindOf(value)); // undefined, bigint, function, symbol
  } else if (typeof (value as { toJSON?: unknown }).toJSON === 'function') {
    // A Date among them: JSON.stringify would send what toJSON returns, another value than this one.
    throw notJson(path, `${kindOf(value)} with a toJSON method`);
  } else if (Array.isArray(value)) {
    out.push('[');
    // An index loop, not forEach, so a hole is seen (and refused) rather than skipped.
    for (let index = 0; index < value.length; index += 1) {
      if (index) out.push(',');
      const item: unknown = value[index];
      if (item === undefined) throw notJson(`${path}[${index}]`, index in value ? 'undefined' : 'a hole');
      write(item, `${path}[${index}]`, depth + 1, out);
    }
    out.push(']');
  } else if (isPlainObject(value)) {
    const record = value as Record<string, unknown>;
    if (Object.getOwnPropertySymbols(record).some((symbol) => Object.prototype.propertyIsEnumerable.call(record, symbol))) {
      throw notJson(path, 'an object with symbol-named members');
    }
    // Array.prototype.sort compares strings by UTF-16 code units, as RFC 8785 (3.2.3) requires.
    const names = Object.keys(record).filter((name) => record[name] !== undefined).sort();
    out.push('{');
    names.forEach((name, index) => {
      checkText(name, path);
      if (index) out.push(',');
      out.push(JSON.stringify(name), ':');
      write(record[name], `${path}.${name}`, depth + 1, out);
    });
    out.push('}');
  } else {
    throw notJson(path, kindOf(value)); // Map, Set, a class instance, a typed array, a boxed primitive
  }
}

/** The RFC 8785 (JCS) text of a JSON value; ConfigError for anything that is not one. */
export function canonicalJson(value: unknown, what = 'value'): string {
  const out: string[] = [];
  write(value, what, 0, out);
  return out.join('');
}

/** The first 32 hex digits of sha256 of the canonical JSON of `value` (UTF-8). */
export function hashHex(value: unknown, what = 'value'): string {
  return createHash('sha256').update(canonicalJson(value, what), 'utf8').digest('hex').slice(0, HASH_HEX_CHARS);
}

/** `<name>:<hashHex(value)>`: the key of a once call or a queue job. */
export function makeKey(name: string, value: unknown, what = 'value'): string {
  return `${name}:${hashHex(value, what)}`;
}

/** The text a key function returns, used as it is after `<name>:` (the published clients' bound). */
export const KEY_TEXT_CHARS_MAX = 255;

/**
 * The key of what a `key` function returned: a string as it is (`<name>:<value>`, 1 to 255
 * characters), as the published clients have it; any other JSON value hashed (an extension).
 */
export function customKey(name: string, value: unknown, what = 'value'): string {
  if (typeof value === 'string') {
    canonicalJson(value, what); // a lone surrogate is refused as in any key
    if (value.length < 1 || value.length > KEY_TEXT_CHARS_MAX) {
      throw new ConfigError(`${what} must be 1 to ${KEY_TEXT_CHARS_MAX} characters, got ${value.length}`);
    }
    return `${name}:${value}`;
  }
  return makeKey(name, value, what);
}

/** The arguments of a once call as the list that is hashed: trailing `undefined`s dropped. */
export function argumentValues(args: readonly unknown[]): unknown[] {
  let end = args.length;
  while (end > 0 && args[end - 1] === undefined) end -= 1;
  return args.slice(0, end);
}
