/** Argument checks shared by the handles: each raises ConfigError before any request. */

import { ConfigError } from './errors.js';

export function requireInt(value: unknown, what: string, minimum: number, maximum?: number): number {
  if (typeof value !== 'number' || !Number.isInteger(value)) throw new ConfigError(`${what} must be an integer, got ${String(value)}`);
  if (value < minimum || (maximum !== undefined && value > maximum)) {
    const bound = maximum !== undefined ? `between ${minimum} and ${maximum}` : `at least ${minimum}`;
    throw new ConfigError(`${what} must be ${bound}, got ${value}`);
  }
  return value;
}

/** A lease of `leaseMs` as the wire's `leaseSeconds` (fractions allowed; the server takes 0.1 to 3600 s). */
export function leaseSeconds(leaseMs: number): number {
  return requireInt(leaseMs, 'leaseMs', 1) / 1000;
}

/** `body` without its `undefined` members (the server treats absent and null differently). */
export function compact<T extends Record<string, unknown>>(body: T): T {
  return Object.fromEntries(Object.entries(body).filter(([, value]) => value !== undefined)) as T;
}
