/** Times and durations as the SDK takes them and the wire carries them. */

import { ConfigError } from './errors.js';

/** A point in time: a `Date`, or an ISO 8601 string (without an offset it is taken as UTC). */
export type DateLike = Date | string;

/** A duration: milliseconds as a number, or a string with a unit (`'500ms'`, `'60s'`, `'2m'`, `'1h'`). */
export type Duration = number | string;

const UNIT_MS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
const DURATION = /^\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h)?\s*$/i;

/**
 * A duration in whole milliseconds (at least 1). A number is milliseconds (as every `...Ms`
 * option); a string carries its unit, and a bare number in a string is seconds (as in Python).
 * ConfigError otherwise.
 */
export function durationMs(value: Duration, what: string): number {
  let ms: number;
  if (typeof value === 'number') {
    ms = value;
  } else if (typeof value === 'string') {
    const match = DURATION.exec(value);
    if (!match) throw new ConfigError(`${what} '${value}' is not a duration such as '500ms', '30s' or '2m'`);
    const unit = (match[2] ?? 's').toLowerCase();
    ms = Number(match[1]) * (UNIT_MS[unit] ?? 1000);
  } else {
    throw new ConfigError(`${what} must be milliseconds or a string such as '30s', got ${typeof value}`);
  }
  if (!Number.isFinite(ms)) throw new ConfigError(`${what} must be finite, got ${String(value)}`);
  const rounded = Math.round(ms);
  if (rounded < 1) throw new ConfigError(`${what} must be at least 1 ms, got ${String(value)}`);
  return rounded;
}

/** A time as the API writes it: `YYYY-MM-DDTHH:MM:SS.mmmZ`. ConfigError for an invalid one. */
export function formatTime(value: DateLike, what = 'time'): string {
  let date: Date;
  if (value instanceof Date) {
    date = value;
  } else if (typeof value === 'string') {
    const text = value.trim();
    // Without an offset, an ISO date-time is UTC (Date.parse would take it as local time).
    const hasOffset = /(Z|[+-]\d{2}:?\d{2})$/i.test(text) || !text.includes('T');
    date = new Date(hasOffset ? text : `${text}Z`);
  } else {
    throw new ConfigError(`${what} must be a Date or an ISO 8601 string, got ${typeof value}`);
  }
  if (Number.isNaN(date.getTime())) throw new ConfigError(`${what} '${String(value)}' is not a valid time`);
  return date.toISOString();
}

/** An API time as a `Date` (undefined for a missing or malformed one). */
export function parseTime(value: unknown): Date | undefined {
  if (typeof value !== 'string') return undefined;
  const date = new Date(value);
  return Number.isNaN(date.getTime()) ? undefined : date;
}

/** Sleep `ms`, ended early (resolved) by `signal`. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const timer = setTimeout(done, Math.max(0, ms));
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });
}

/** `ms` with +-`fraction` random jitter. */
export function jitter(ms: number, fraction = 0.1): number {
  return ms * (1 - fraction + Math.random() * 2 * fraction);
}
