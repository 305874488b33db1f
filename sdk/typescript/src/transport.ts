/**
 * The HTTP transport: Node's fetch, the list of servers, failover and bounded retries.
 *
 * Retry rules (as the Python SDK's). A request that never reached a server (connection refused)
 * is retried on the next listed server, whatever it is. A request that may have reached a server
 * (a timeout, a dropped connection, a 502/503/504 answer) is retried only when the caller marked it
 * safe: a GET, or a call whose repetition changes nothing (a submit carries a key; cancel,
 * complete, renew, ...). An unsafe one (a receive, creating a run) raises OutcomeUnknownError
 * instead. A `408 REQUEST_TIMEOUT` answer (the node applied nothing) is retried whatever the call.
 * Every mutation carries an `Idempotency-Key`, fresh per logical call and the same on each retry,
 * so the server applies a retried mutation once. A retry goes to the next listed server at once
 * while some server has not been tried since the last pause; once every one has failed, retries
 * pause (RETRY_BACKOFF_MS_INITIAL, doubling up to RETRY_BACKOFF_MS_MAX) and stop after
 * `UNAVAILABLE_AFTER_MS` without an answer, with UnavailableError.
 */

import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { ConfigError, OutcomeUnknownError, RunstateError, UnavailableError, errorFromResponse } from './errors.js';
import { sleep } from './time.js';

export const BASE_URL_ENV = 'RUNSTATE_BASE_URL';
export const SPACE_ID_ENV = 'RUNSTATE_SPACE_ID';
export const API_KEY_ENV = 'RUNSTATE_API_KEY';
export const BASE_URL_DEFAULT = 'http://localhost:8080';
export const SDK_VERSION = '0.4.0-dev.0';

// How long the SDK keeps retrying without any answer before it raises UnavailableError.
const UNAVAILABLE_AFTER_MS = 5_000;
// The pause once every listed server failed since the last one (none before an untried server).
const RETRY_BACKOFF_MS_INITIAL = 50;
const RETRY_BACKOFF_MS_MAX = 500;
/** Total time of one ordinary request (not a long poll). */
export const REQUEST_TIMEOUT_MS_DEFAULT = 10_000;
// Added to a long poll's server-side wait for its client-side timeout.
const LONG_POLL_MARGIN_MS = 5_000;
// How much of an unexpected (non-JSON) answer goes into an error message.
const ERROR_BODY_CHARS_MAX = 500;
// The node did not receive the whole request in time and applied nothing: always safe to resend.
const NOT_RECEIVED_CODE = 'REQUEST_TIMEOUT';
// Set by a node that forwarded a call to the leader: the leader's API URL.
const LEADER_HEADER = 'x-runstate-leader';
const HOLDER_HEADER = 'X-Runstate-Holder';
// A path that does not start with this is relative to the client's space.
const API_ROOT = '/v1/';
// The wire's bound on a holder.
const HOLDER_CHARS_MAX = 128;

export type Json = Record<string, unknown>;

export interface RequestOptions {
  body?: Json;
  /** A body already encoded with `encodeBody` (instead of `body`). */
  encodedBody?: string;
  query?: Record<string, string | number | boolean | undefined>;
  /** Safe to repeat after it may have reached a server (see the module's comment). */
  safe: boolean;
  /** The server-side wait of a long poll, added to the request's timeout. */
  longPollMs?: number;
  /** Aborts the request (never retried then); the promise rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** The servers to talk to: the argument, else RUNSTATE_BASE_URL, else http://localhost:8080. */
export function parseBaseUrls(baseURL: string | readonly string[] | undefined): string[] {
  let raw: string | readonly string[] | undefined = baseURL;
  if (raw === undefined || (typeof raw === 'string' && !raw.trim())) {
    raw = process.env[BASE_URL_ENV]?.trim() || BASE_URL_DEFAULT;
  }
  const parts = typeof raw === 'string' ? raw.split(',') : [...raw];
  const urls: string[] = [];
  for (const part of parts) {
    if (typeof part !== 'string') throw new ConfigError(`baseURL entries must be strings, got ${typeof part}`);
    const candidate = part.trim().replace(/\/+$/, '');
    if (!candidate) continue;
    let parsed: URL;
    try {
      parsed = new URL(candidate);
    } catch {
      throw new ConfigError(`baseURL '${candidate}' is not a URL`);
    }
    if ((parsed.protocol !== 'http:' && parsed.protocol !== 'https:') || !parsed.hostname) {
      throw new ConfigError(`baseURL '${candidate}' must be an http:// or https:// URL with a host`);
    }
    if (!urls.includes(candidate)) urls.push(candidate);
  }
  if (urls.length === 0) throw new ConfigError('baseURL lists no URL');
  return urls;
}

/** The argument, else the environment variable; an empty string counts as unset. */
export function resolveOptional(value: string | undefined, env: string): string | undefined {
  const chosen = value ?? process.env[env];
  return chosen && chosen.trim() ? chosen.trim() : undefined;
}

/** The worker identity when none is given: `<hostname>:<pid>`. */
export function defaultHolder(): string {
  return `${hostname()}:${process.pid}`.slice(0, HOLDER_CHARS_MAX);
}

/** One path segment (a name or an id), percent-encoded; ConfigError if empty or not a string. */
export function segment(value: unknown, what: string): string {
  if (typeof value !== 'string' || !value) throw new ConfigError(`${what} must be a non-empty string, got ${String(value)}`);
  return encodeURIComponent(value);
}

/** Compact JSON for a request body; ConfigError for values JSON cannot carry. */
export function encodeBody(body: unknown, what = 'request body'): string {
  let text: string | undefined;
  try {
    text = JSON.stringify(body, (_key, value: unknown) => {
      if (typeof value === 'number' && !Number.isFinite(value)) throw new ConfigError(`${what} holds ${value}, which JSON cannot carry`);
      if (typeof value === 'bigint') throw new ConfigError(`${what} holds a bigint, which JSON cannot carry`);
      return value;
    });
  } catch (error) {
    if (error instanceof ConfigError) throw error;
    throw new ConfigError(`${what} is not JSON-serializable: ${(error as Error).message}`);
  }
  if (text === undefined) throw new ConfigError(`${what} is not JSON-serializable`);
  return text;
}

function errorFromBody(status: number, text: string, headers: Headers): RunstateError {
  let code: string | undefined;
  let message: string | undefined;
  let requestId: string | undefined;
  try {
    const parsed: unknown = text ? JSON.parse(text) : undefined;
    const error = (parsed as { error?: unknown } | undefined)?.error;
    if (error && typeof error === 'object') {
      const fields = error as Record<string, unknown>;
      if (typeof fields.code === 'string') code = fields.code;
      if (typeof fields.message === 'string') message = fields.message;
      if (typeof fields.requestId === 'string') requestId = fields.requestId;
    }
  } catch {
    // not JSON: the text itself is the message
  }
  if (message === undefined && text) message = text.slice(0, ERROR_BODY_CHARS_MAX);
  const error = errorFromResponse(status, code, message);
  error.requestId = requestId ?? headers.get('x-request-id') ?? undefined;
  const retryAfter = Number(headers.get('retry-after'));
  if (headers.get('retry-after') !== null && Number.isFinite(retryAfter)) error.retryAfterMs = retryAfter * 1000;
  return error;
}

function isConnectFailure(error: unknown): boolean {
  // Node's fetch: TypeError('fetch failed') with the socket error as its cause.
  const cause = (error as { cause?: { code?: string } } | undefined)?.cause;
  const code = cause?.code;
  return code === 'ECONNREFUSED' || code === 'ENOTFOUND' || code === 'EAI_AGAIN' || code === 'EHOSTUNREACH' || code === 'UND_ERR_CONNECT_TIMEOUT';
}

export function newIdempotencyKey(): string {
  return randomBytes(12).toString('hex');
}

/** One client's connection to the servers. */
export class Transport {
  readonly baseUrls: string[];
  spaceId: string | undefined;
  readonly holder: string;
  /** This client instance among the holder's: sent as `holderSession` on every lease. */
  readonly holderSession: string;
  readonly timeoutMs: number;
  /** Mailbox names this client resolved to ids (a mailbox is never renamed or removed). */
  readonly mailboxIds = new Map<string, string>();
  private readonly apiKey: string | undefined;
  private urlIndex = 0;
  private spacePromise: Promise<string> | undefined;

  constructor(options: { baseUrls: string[]; spaceId?: string; apiKey?: string; holder: string; timeoutMs: number }) {
    if (options.baseUrls.length === 0) throw new ConfigError('baseURL lists no URL');
    if (!(options.timeoutMs > 0)) throw new ConfigError(`timeoutMs must be positive, got ${options.timeoutMs}`);
    if (options.holder.length > HOLDER_CHARS_MAX) throw new ConfigError(`holder is longer than ${HOLDER_CHARS_MAX} characters`);
    this.baseUrls = options.baseUrls;
    this.spaceId = options.spaceId;
    this.apiKey = options.apiKey;
    this.holder = options.holder;
    this.holderSession = randomBytes(8).toString('hex');
    this.timeoutMs = options.timeoutMs;
  }

  /**
   * Send one call and return its JSON object (`{}` for a 204). A `path` outside `/v1/` is relative
   * to the client's space. Rejects with the mapped RunstateError for an error answer,
   * OutcomeUnknownError when an unsafe call may have been applied without an answer,
   * UnavailableError when no server answered within a few seconds.
   */
  async request(method: string, path: string, options: RequestOptions): Promise<Json> {
    const data = options.body !== undefined ? encodeBody(options.body) : options.encodedBody; // ConfigError first
    if (!path.startsWith(API_ROOT)) path = `/v1/spaces/${encodeURIComponent(await this.space())}${path}`;
    if (options.query) {
      const params = new URLSearchParams();
      for (const [name, value] of Object.entries(options.query)) if (value !== undefined) params.set(name, String(value));
      const text = params.toString();
      if (text) path = `${path}?${text}`;
    }
    const headers: Record<string, string> = {
      accept: 'application/json',
      'user-agent': `runstate-sdk-typescript/${SDK_VERSION}`,
      [HOLDER_HEADER]: this.holder,
    };
    if (this.apiKey !== undefined) headers.authorization = `Bearer ${this.apiKey}`;
    if (data !== undefined) headers['content-type'] = 'application/json';
    if (method !== 'GET') headers['idempotency-key'] = newIdempotencyKey();
    const timeoutMs = this.timeoutMs + (options.longPollMs && options.longPollMs > 0 ? options.longPollMs + LONG_POLL_MARGIN_MS : 0);
    let giveUpAt: number | undefined;
    let backoffMs = RETRY_BACKOFF_MS_INITIAL;
    const failedSincePause = new Set<string>();
    for (;;) {
      options.signal?.throwIfAborted();
      const base = this.baseUrls[this.urlIndex] as string;
      let failure: string;
      let lastStatus: number | undefined;
      // One controller per attempt, aborted by its timeout or the caller's signal (AbortSignal.any
      // is Node 20.3+).
      const attempt = new AbortController();
      const timer = setTimeout(() => attempt.abort(new DOMException('the request timed out', 'TimeoutError')), timeoutMs);
      const onAbort = (): void => attempt.abort(options.signal?.reason);
      options.signal?.addEventListener('abort', onAbort, { once: true });
      const signal = attempt.signal;
      try {
        const response = await fetch(base + path, { method, headers, body: data ?? null, signal });
        const text = await response.text();
        this.followLeader(response.headers.get(LEADER_HEADER));
        if (response.status >= 200 && response.status < 300) return decode(response.status, text, method, path);
        const error = errorFromBody(response.status, text, response.headers);
        const notReceived = error.code === NOT_RECEIVED_CODE;
        if (!notReceived && (!(error instanceof UnavailableError) || !options.safe)) throw error;
        failure = `${base} answered ${error.code}: ${error.message}`;
        lastStatus = response.status;
      } catch (error) {
        if (error instanceof RunstateError) throw error;
        if (options.signal?.aborted) throw options.signal.reason;
        if (isConnectFailure(error)) {
          failure = `cannot connect to ${base} (${describeCause(error)})`;
        } else {
          failure = `no answer from ${base} (${describeCause(error)})`;
          if (!options.safe) {
            throw new OutcomeUnknownError(`${method} ${path}: ${failure}; the call may or may not have been applied`, {
              status: null,
              cause: error,
            });
          }
        }
      } finally {
        clearTimeout(timer);
        options.signal?.removeEventListener('abort', onAbort);
      }
      const now = Date.now();
      giveUpAt ??= now + UNAVAILABLE_AFTER_MS;
      if (now >= giveUpAt) {
        throw new UnavailableError(
          `${method} ${path}: no server answered within ${UNAVAILABLE_AFTER_MS / 1000} s (tried ${this.baseUrls.join(', ')}); last: ${failure}`,
          { status: lastStatus ?? null },
        );
      }
      // Move on from the node that failed, unless a concurrent call already did.
      if (this.baseUrls[this.urlIndex] === base) this.urlIndex = (this.urlIndex + 1) % this.baseUrls.length;
      failedSincePause.add(base);
      if (failedSincePause.has(this.baseUrls[this.urlIndex] as string)) {
        // Every server failed since the last pause (or the next one just did): pause before going
        // round again. Before a server not yet tried, a pause would only add delay.
        await sleep(Math.min(backoffMs, giveUpAt - now), options.signal);
        backoffMs = Math.min(backoffMs * 2, RETRY_BACKOFF_MS_MAX);
        failedSincePause.clear();
      }
    }
  }

  /** The space: `spaceId` if given, else the API key's (asked once from `GET /v1/whoami`). */
  async space(): Promise<string> {
    if (this.spaceId !== undefined) return this.spaceId;
    this.spacePromise ??= this.request('GET', '/v1/whoami', { safe: true }).then(
      (identity) => {
        const space = identity.space;
        if (typeof space !== 'string' || !space) {
          throw new RunstateError('GET /v1/whoami did not name the key\'s space', { code: 'INVALID_RESPONSE', status: null });
        }
        this.spaceId = space;
        return space;
      },
      (error: unknown) => {
        this.spacePromise = undefined;
        throw error;
      },
    );
    return this.spacePromise;
  }

  private followLeader(leaderUrl: string | null): void {
    if (leaderUrl && this.baseUrls.includes(leaderUrl)) this.urlIndex = this.baseUrls.indexOf(leaderUrl);
  }
}

function describeCause(error: unknown): string {
  const err = error as { name?: string; message?: string; cause?: { code?: string; message?: string } };
  const cause = err.cause ? ` ${err.cause.code ?? ''} ${err.cause.message ?? ''}`.trimEnd() : '';
  return `${err.name ?? 'Error'}: ${err.message ?? String(error)}${cause}`;
}

function decode(status: number, text: string, method: string, path: string): Json {
  if (!text) return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = undefined;
  }
  if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw new RunstateError(`${method} ${path}: expected a JSON object, got ${text.slice(0, ERROR_BODY_CHARS_MAX)}`, {
      code: 'INVALID_RESPONSE',
      status,
    });
  }
  return parsed as Json;
}

/** A field the answer must have; RunstateError INVALID_RESPONSE otherwise. */
export function field<T = unknown>(answer: Json, name: string): T {
  if (!(name in answer)) {
    throw new RunstateError(`the server's answer lacks '${name}': ${JSON.stringify(answer).slice(0, ERROR_BODY_CHARS_MAX)}`, {
      code: 'INVALID_RESPONSE',
      status: null,
    });
  }
  return answer[name] as T;
}
