/** Results of once functions and queue handlers: JSON values of at most 64 KB. */

import { ConfigError, ResultTooLargeError } from './errors.js';
import { encodeBody } from './transport.js';

// The server's bound on a result: compact JSON, UTF-8.
export const RESULT_BYTES_MAX = 64 * 1024;
// Error messages recorded with a failure (the server's bound is 2 KiB).
export const ERROR_MESSAGE_CHARS_MAX = 2_000;

/** `value` as the JSON value to record (undefined is null); ConfigError if it is not one, ResultTooLargeError over 64 KB. */
export function resultValue(value: unknown, what: string): unknown {
  if (value === undefined) return null;
  if (typeof value === 'function' || typeof value === 'symbol') throw new ConfigError(`${what} is a ${typeof value}, not a JSON value`);
  const text = encodeBody(value, what);
  const size = Buffer.byteLength(text, 'utf8');
  if (size > RESULT_BYTES_MAX) {
    throw new ResultTooLargeError(
      `${what} is ${size} bytes of JSON, over the ${RESULT_BYTES_MAX}-byte limit; store it elsewhere (e.g. object storage) and return a reference`,
      { status: null },
    );
  }
  return JSON.parse(text) as unknown;
}

/** An error as recorded with a failure: `Name: message`, bounded. */
export function describeError(error: unknown): string {
  const text = error instanceof Error ? `${error.name}: ${error.message}` : `Error: ${String(error)}`;
  return text.slice(0, ERROR_MESSAGE_CHARS_MAX);
}
