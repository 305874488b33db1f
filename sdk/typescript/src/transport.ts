/**
 * The HTTP transport: Node's own HTTP client, the list of servers, failover and bounded retries.
 *
 * Connections: each client keeps its connections to each server alive and reuses the most recent
 * idle one. Calls in flight are not capped (a long poll holds its connection for its whole wait,
 * and with a cap, waits could starve the very calls that end them); at most IDLE_CONNECTIONS_MAX
 * idle ones are kept per server, each closed after IDLE_REUSE_MS_MAX idle (a node closes idle ones
 * after 60 s, and a call sent on a connection the node is closing is lost). Idle connections never
 * keep the process alive. Node's fetch cost a call ~0.4 ms more of the client's CPU and latency.
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
 *
 * TLS. An https:// server's certificate is verified against Node's CAs, or only against `caFile`
 * when one is given; `clientCert` with `clientKey` is presented to a server that asks (mutual TLS).
 * A TLS failure that another attempt would meet again (the certificate does not verify, the server
 * refused the handshake, the port does not speak TLS) rejects with TlsError at once, not retried,
 * and the client's next call starts at the next listed server.
 */

import { randomBytes, randomFillSync } from 'node:crypto';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import { createSecureContext } from 'node:tls';
import type { Socket } from 'node:net';
import { hostname } from 'node:os';
import { urlToHttpOptions } from 'node:url';
import { ConfigError, OutcomeUnknownError, RunstateError, TlsError, UnavailableError, errorFromResponse } from './errors.js';
import { sleep } from './time.js';

export const BASE_URL_ENV = 'RUNSTATE_BASE_URL';
export const SPACE_ID_ENV = 'RUNSTATE_SPACE_ID';
export const API_KEY_ENV = 'RUNSTATE_API_KEY';
export const BASE_URL_DEFAULT = 'http://localhost:8080';
export const CA_FILE_ENV = 'RUNSTATE_CA_FILE';
export const CLIENT_CERT_ENV = 'RUNSTATE_CLIENT_CERT';
export const CLIENT_KEY_ENV = 'RUNSTATE_CLIENT_KEY';
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
// Idle connections one client keeps to one server at most.
export const IDLE_CONNECTIONS_MAX = 100;
// An idle connection older than this is closed, not reused (a node closes idle ones at 60 s).
export const IDLE_REUSE_MS_MAX = 15_000;
// The largest answer the client reads; past it the call fails as a lost answer.
export const ANSWER_BYTES_MAX = 256 * 1024 * 1024;
// Random bytes in one idempotency key (24 hex digits).
const IDEMPOTENCY_KEY_BYTES = 12;
// Idempotency keys drawn from one fill of the random pool: one call into the CSPRNG per this many
// keys instead of one per call (a randomBytes call cost ~5% of a call's CPU).
const IDEMPOTENCY_KEYS_PER_FILL = 256;
const USER_AGENT = `runstate-sdk-typescript/${SDK_VERSION}`;
// A request path that `new URL` leaves as it is: only characters it never percent-encodes (no
// query, fragment or backslash) ...
const PLAIN_PATH = /^\/[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*$/;
// ... and no `.` or `..` segment (also percent-encoded), which it would resolve.
const DOT_SEGMENT = /\/(?:\.|%2e){1,2}(?:\/|$)/i;

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

/** What a client's https:// connections trust and present, read from its files. */
export interface TlsFiles {
  ca?: Buffer;
  cert?: Buffer;
  key?: Buffer;
}

/**
 * A client's TLS files: the options, else RUNSTATE_CA_FILE, RUNSTATE_CLIENT_CERT and
 * RUNSTATE_CLIENT_KEY (an option wins over its variable); undefined when none names a file (Node's
 * CAs then). ConfigError naming the file for one that is missing, unreadable or not PEM, or a key
 * that does not match its certificate.
 */
export function readTlsFiles(options: { caFile?: string; clientCert?: string; clientKey?: string }): TlsFiles | undefined {
  const caFile = resolveOptional(options.caFile, CA_FILE_ENV);
  const clientCert = resolveOptional(options.clientCert, CLIENT_CERT_ENV);
  const clientKey = resolveOptional(options.clientKey, CLIENT_KEY_ENV);
  if (caFile === undefined && clientCert === undefined && clientKey === undefined) return undefined;
  if ((clientCert === undefined) !== (clientKey === undefined)) {
    throw new ConfigError(`clientCert (${CLIENT_CERT_ENV}) and clientKey (${CLIENT_KEY_ENV}) go together: give both, or neither`);
  }
  const read = (path: string | undefined, what: string): Buffer | undefined => {
    if (path === undefined) return undefined;
    try {
      return readFileSync(path);
    } catch (error) {
      throw new ConfigError(`cannot read ${what} ${path}: ${(error as Error).message}`);
    }
  };
  const files: TlsFiles = {};
  const ca = read(caFile, 'caFile');
  const cert = read(clientCert, 'clientCert');
  const key = read(clientKey, 'clientKey');
  if (ca !== undefined) {
    files.ca = ca;
    try {
      createSecureContext({ ca });
    } catch (error) {
      throw new ConfigError(`caFile ${caFile}: not PEM CA certificates (${(error as Error).message})`);
    }
    if (!ca.includes('-----BEGIN CERTIFICATE-----')) throw new ConfigError(`caFile ${caFile}: not PEM CA certificates (no certificate in it)`);
  }
  if (cert !== undefined && key !== undefined) {
    files.cert = cert;
    files.key = key;
    try {
      createSecureContext({ cert, key });
    } catch (error) {
      throw new ConfigError(
        `clientCert ${clientCert} with clientKey ${clientKey}: not a PEM certificate and its matching private key (${(error as Error).message})`,
      );
    }
  }
  return files;
}

// Node's codes of a server certificate that does not verify: OpenSSL's verification results
// (UNABLE_TO_GET_ISSUER_CERT_LOCALLY, SELF_SIGNED_CERT_IN_CHAIN, CERT_HAS_EXPIRED, ...) and Node's
// own host check.
const CERT_NOT_VERIFIED = /^(?:UNABLE_TO_|CERT_|CRL_|DEPTH_ZERO_SELF_SIGNED_CERT$|SELF_SIGNED_CERT_IN_CHAIN$|INVALID_CA$|INVALID_PURPOSE$|PATH_LENGTH_EXCEEDED$|HOSTNAME_MISMATCH$|ERR_TLS_CERT_ALTNAME_INVALID$)/;
// OpenSSL's reasons that the server ended the handshake on purpose (an alert it sent: no client
// certificate, one of another CA, no protocol in common) or does not speak TLS. Anything else (a
// reset or an EOF mid-handshake: a node restarting, a handshake cap) may pass and is retried.
const REFUSED = /^ERR_SSL_(?:.*_ALERT_.*|WRONG_VERSION_NUMBER)$/;

/** What failed, in words, when `error` is a TLS failure that a retry would meet again. */
function tlsRefusal(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | undefined)?.code;
  if (typeof code !== 'string') return undefined;
  const message = (error as Error).message;
  if (CERT_NOT_VERIFIED.test(code)) return `the server's certificate does not verify: ${message} (${code})`;
  if (!REFUSED.test(code)) return undefined;
  const reason = code.slice('ERR_SSL_'.length);
  if (reason === 'WRONG_VERSION_NUMBER') return `the server does not speak TLS on this port (${reason})`;
  const hint = /CERTIFICATE|UNKNOWN_CA/.test(reason) ? ': it requires a client certificate that its client CA signed (clientCert, clientKey)' : '';
  return `the server refused the TLS handshake (${reason})${hint}`;
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
  // JSON.stringify runs several times faster without a replacer. A body JSON cannot carry either
  // fails that or has a non-finite number written as `null`: only then is it encoded again with
  // the replacer that names what is wrong.
  let text: string | undefined;
  try {
    text = JSON.stringify(body);
  } catch {
    text = undefined;
  }
  if (text !== undefined && !text.includes('null')) return text;
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

function errorFromBody(status: number, text: string, headers: Pick<Answer, 'header'>): RunstateError {
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
  error.requestId = requestId ?? headers.header('x-request-id') ?? undefined;
  const retryAfter = Number(headers.header('retry-after'));
  if (headers.header('retry-after') !== null && Number.isFinite(retryAfter)) error.retryAfterMs = retryAfter * 1000;
  return error;
}

/** One answer: its status, body and headers (names in lower case). */
class Answer {
  constructor(
    readonly status: number,
    readonly text: string,
    private readonly response: http.IncomingMessage,
  ) {}

  header(name: string): string | null {
    // Most answers carry none of the headers asked for: a look at the raw list spares building
    // the answer's header object (Node builds it on first use).
    const raw = this.response.rawHeaders;
    let present = false;
    for (let index = 0; index < raw.length && !present; index += 2) {
      const rawName = raw[index] as string;
      present = rawName.length === name.length && rawName.toLowerCase() === name;
    }
    if (!present) return null;
    const value = this.response.headers[name];
    return value === undefined ? null : Array.isArray(value) ? value.join(', ') : value;
  }
}

/**
 * A call that got no whole answer. `sent` is false when its connection was never made (refused, an
 * unknown host, a failed TLS handshake, a timeout while connecting): no server can have applied it.
 */
class WireError extends Error {
  readonly sent: boolean;

  constructor(message: string, options: { sent: boolean; cause?: unknown }) {
    super(message, { cause: options.cause });
    this.name = 'WireError';
    this.sent = options.sent;
  }
}

/** The error a request is destroyed with when aborted (as Node's own for an aborted request). */
class AbortError extends Error {
  readonly code = 'ABORT_ERR';

  constructor(reason: unknown) {
    super('The operation was aborted', { cause: reason });
    this.name = 'AbortError';
  }
}

function agents(tls: TlsFiles | undefined): { 'http:': http.Agent; 'https:': https.Agent } {
  const options = { keepAlive: true, maxFreeSockets: IDLE_CONNECTIONS_MAX, timeout: IDLE_REUSE_MS_MAX, scheduling: 'lifo' as const };
  return { 'http:': new http.Agent(options), 'https:': new https.Agent({ ...options, ...tls }) };
}

/** What `http.request` takes of one server's URL, worked out once per server. */
interface Server {
  agent: http.Agent;
  secure: boolean;
  protocol: string;
  hostname: string;
  port: number | undefined;
  /**
   * The base URL's path, which `base + path` starts with (`''` for none), or undefined when the
   * base is not written as `new URL` writes it (then every request URL goes through `new URL`).
   */
  prefix: string | undefined;
}

function describeServer(base: string, agents: { 'http:': http.Agent; 'https:': https.Agent }): Server | undefined {
  let url: URL;
  try {
    url = new URL(base);
  } catch {
    return undefined; // each request parses `base + path` and fails as it does
  }
  const protocol = url.protocol;
  if (protocol !== 'http:' && protocol !== 'https:') return undefined;
  const { hostname, port, auth } = urlToHttpOptions(url);
  const rest = base.startsWith(url.origin) ? base.slice(url.origin.length) : undefined;
  const plain =
    auth === undefined &&
    url.search === '' &&
    url.hash === '' &&
    (rest === '' || (rest === url.pathname && PLAIN_PATH.test(rest) && !DOT_SEGMENT.test(rest)));
  return {
    agent: agents[protocol],
    secure: protocol === 'https:',
    protocol,
    hostname: hostname as string,
    port: port === undefined ? undefined : Number(port),
    prefix: plain ? rest : undefined,
  };
}

const EXCHANGE = Symbol('runstate.exchange');
type Carrier = { [EXCHANGE]?: Exchange };

/**
 * One request in flight and its promise, settled once: with the whole answer (at most
 * `answerBytesMax` bytes) or a WireError. Per call it costs one timer and no AbortController (one
 * per call, with its signal handed to Node, cost ~10% of a call's CPU) nor closures: the request's
 * and answer's listeners are module functions that find it on them (`[EXCHANGE]`), and it listens
 * to the caller's signal itself (`handleEvent`).
 */
class Exchange {
  /** The request may have reached the server from here on. */
  connected = false;
  private readonly chunks: Buffer[] = [];
  private size = 0;
  private settled = false;
  private readonly timer: NodeJS.Timeout;

  constructor(
    private readonly request: http.ClientRequest,
    readonly secure: boolean,
    private readonly resolve: (answer: Answer) => void,
    private readonly reject: (error: WireError) => void,
    timeoutMs: number,
    private readonly signal: AbortSignal | undefined,
    private readonly answerBytesMax: number,
  ) {
    this.timer = setTimeout(onTimeout, timeoutMs, this);
    signal?.addEventListener('abort', this, { once: true });
  }

  /** The caller's signal aborted: end the request with its reason. */
  handleEvent(): void {
    this.abort(this.signal?.reason);
  }

  abort(reason: unknown): void {
    this.request.destroy(new AbortError(reason));
  }

  data(response: http.IncomingMessage, chunk: Buffer): void {
    this.size += chunk.length;
    if (this.size > this.answerBytesMax) {
      response.destroy();
      this.fail(`the answer is larger than ${this.answerBytesMax} bytes`);
      return;
    }
    this.chunks.push(chunk);
  }

  end(response: http.IncomingMessage): void {
    if (!this.finish()) return;
    const text = this.chunks.length === 1 ? (this.chunks[0] as Buffer).toString('utf8') : Buffer.concat(this.chunks).toString('utf8');
    this.resolve(new Answer(response.statusCode ?? 0, text, response));
  }

  fail(message: string, cause?: unknown): void {
    if (this.finish()) this.reject(new WireError(message, { sent: this.connected, cause }));
  }

  /** True the first time only: the timer and the signal's listener are done with. */
  private finish(): boolean {
    if (this.settled) return false;
    this.settled = true;
    clearTimeout(this.timer);
    this.signal?.removeEventListener('abort', this);
    return true;
  }
}

function onTimeout(exchange: Exchange): void {
  exchange.abort(new DOMException('the request timed out', 'TimeoutError'));
}

function exchangeOf(emitter: object): Exchange {
  return (emitter as Carrier)[EXCHANGE] as Exchange;
}

function onResponse(this: http.ClientRequest, response: http.IncomingMessage): void {
  (response as Carrier)[EXCHANGE] = exchangeOf(this);
  response.on('data', onAnswerData);
  response.on('end', onAnswerEnd);
  response.on('error', onAnswerError);
  response.on('close', onAnswerClose);
}

function onAnswerData(this: http.IncomingMessage, chunk: Buffer): void {
  exchangeOf(this).data(this, chunk);
}

function onAnswerEnd(this: http.IncomingMessage): void {
  exchangeOf(this).end(this);
}

function onAnswerError(this: http.IncomingMessage, error: Error): void {
  exchangeOf(this).fail(error.message, error);
}

function onAnswerClose(this: http.IncomingMessage): void {
  if (!this.complete) exchangeOf(this).fail('the connection closed before the whole answer came');
}

function onSocket(this: http.ClientRequest, socket: Socket): void {
  const exchange = exchangeOf(this);
  if (!socket.connecting) {
    exchange.connected = true; // a kept-alive connection
    return;
  }
  socket.once(exchange.secure ? 'secureConnect' : 'connect', onConnect.bind(exchange));
}

function onConnect(this: Exchange): void {
  this.connected = true;
}

function onRequestError(this: http.ClientRequest, error: Error): void {
  exchangeOf(this).fail(error.message, error);
}

/**
 * Send one request on a kept-alive connection and read its whole answer (at most answerBytesMax),
 * ended by `timeoutMs` or the caller's signal. `options` names the method, headers and agent, and
 * the server and path unless `url` does.
 */
function send(
  url: URL | undefined,
  options: http.RequestOptions,
  secure: boolean,
  body: string | undefined,
  timeoutMs: number,
  signal: AbortSignal | undefined,
  answerBytesMax: number,
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const module = secure ? https : http;
    const request = url === undefined ? module.request(options, onResponse) : module.request(url, options, onResponse);
    request.on('socket', onSocket);
    request.on('error', onRequestError);
    request.end(body);
    // Node emits the request's events from the next tick on: its listeners find the exchange.
    (request as Carrier)[EXCHANGE] = new Exchange(request, secure, resolve, reject, timeoutMs, signal, answerBytesMax);
  });
}

function isConnectFailure(error: unknown): boolean {
  return error instanceof WireError && !error.sent;
}

// Random bytes for idempotency keys, filled IDEMPOTENCY_KEYS_PER_FILL keys at a time.
const keyPool = Buffer.alloc(IDEMPOTENCY_KEY_BYTES * IDEMPOTENCY_KEYS_PER_FILL);
let keyPoolOffset = keyPool.length;

export function newIdempotencyKey(): string {
  if (keyPoolOffset === keyPool.length) {
    randomFillSync(keyPool);
    keyPoolOffset = 0;
  }
  const start = keyPoolOffset;
  keyPoolOffset += IDEMPOTENCY_KEY_BYTES;
  return keyPool.toString('hex', start, keyPoolOffset);
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
  /** The Authorization header's value, if any. */
  private readonly authorization: string | undefined;
  private readonly agents: { 'http:': http.Agent; 'https:': https.Agent };
  /** What requests need of each base URL, worked out on its first request. */
  private readonly servers = new Map<string, Server | undefined>();
  private readonly answerBytesMax: number;
  private urlIndex = 0;
  private spacePromise: Promise<string> | undefined;

  constructor(options: {
    baseUrls: string[];
    spaceId?: string;
    apiKey?: string;
    holder: string;
    timeoutMs: number;
    answerBytesMax?: number;
    /** What https:// connections trust and present (`readTlsFiles`); Node's CAs without. */
    tls?: TlsFiles;
  }) {
    if (options.baseUrls.length === 0) throw new ConfigError('baseURL lists no URL');
    if (!(options.timeoutMs > 0)) throw new ConfigError(`timeoutMs must be positive, got ${options.timeoutMs}`);
    if (options.holder.length > HOLDER_CHARS_MAX) throw new ConfigError(`holder is longer than ${HOLDER_CHARS_MAX} characters`);
    this.baseUrls = options.baseUrls;
    this.spaceId = options.spaceId;
    this.authorization = options.apiKey !== undefined ? `Bearer ${options.apiKey}` : undefined;
    this.holder = options.holder;
    this.holderSession = randomBytes(8).toString('hex');
    this.timeoutMs = options.timeoutMs;
    this.answerBytesMax = options.answerBytesMax ?? ANSWER_BYTES_MAX;
    this.agents = agents(options.tls);
  }

  /**
   * Send one call and return its JSON object (`{}` for a 204). A `path` outside `/v1/` is relative
   * to the client's space. Rejects with the mapped RunstateError for an error answer,
   * OutcomeUnknownError when an unsafe call may have been applied without an answer,
   * UnavailableError when no server answered within a few seconds.
   */
  async request(method: string, path: string, options: RequestOptions): Promise<Json> {
    const data = options.body !== undefined ? encodeBody(options.body) : options.encodedBody; // ConfigError first
    if (!path.startsWith(API_ROOT)) path = `/v1/spaces/${encodeURIComponent(this.spaceId ?? (await this.space()))}${path}`;
    // A path `new URL` would leave as it is goes to http.request as it is, without parsing a URL.
    const plain = PLAIN_PATH.test(path) && !DOT_SEGMENT.test(path);
    if (options.query) {
      const params = new URLSearchParams();
      for (const [name, value] of Object.entries(options.query)) if (value !== undefined) params.set(name, String(value));
      const text = params.toString();
      if (text) path = `${path}?${text}`;
    }
    const headers: Record<string, string> = { accept: 'application/json', 'user-agent': USER_AGENT, [HOLDER_HEADER]: this.holder };
    if (this.authorization !== undefined) headers.authorization = this.authorization;
    if (data !== undefined) headers['content-type'] = 'application/json';
    if (method !== 'GET') headers['idempotency-key'] = newIdempotencyKey();
    if (data !== undefined) headers['content-length'] = String(Buffer.byteLength(data));
    const timeoutMs = this.timeoutMs + (options.longPollMs && options.longPollMs > 0 ? options.longPollMs + LONG_POLL_MARGIN_MS : 0);
    let giveUpAt: number | undefined;
    let backoffMs = RETRY_BACKOFF_MS_INITIAL;
    const failedSincePause = new Set<string>();
    for (;;) {
      options.signal?.throwIfAborted();
      const base = this.baseUrls[this.urlIndex] as string;
      let failure: string;
      let lastStatus: number | undefined;
      try {
        const server = this.server(base);
        let response: Answer;
        if (plain && server?.prefix !== undefined) {
          const { protocol, hostname, port, agent, secure } = server;
          const target = { protocol, hostname, port, path: server.prefix + path, method, headers, agent };
          response = await send(undefined, target, secure, data, timeoutMs, options.signal, this.answerBytesMax);
        } else {
          const url = new URL(base + path);
          const agent = this.agents[url.protocol as 'http:' | 'https:'];
          response = await send(url, { method, headers, agent }, url.protocol === 'https:', data, timeoutMs, options.signal, this.answerBytesMax);
        }
        const text = response.text;
        this.followLeader(response.header(LEADER_HEADER));
        if (response.status >= 200 && response.status < 300) return decode(response.status, text, method, path);
        const error = errorFromBody(response.status, text, response);
        const notReceived = error.code === NOT_RECEIVED_CODE;
        if (!notReceived && (!(error instanceof UnavailableError) || !options.safe)) throw error;
        failure = `${base} answered ${error.code}: ${error.message}`;
        lastStatus = response.status;
      } catch (error) {
        if (error instanceof RunstateError) throw error;
        if (options.signal?.aborted) throw options.signal.reason;
        const refusal = error instanceof WireError ? tlsRefusal(error.cause) : undefined;
        if (refusal !== undefined) {
          // Another attempt would fail the same way: say so now. The next call starts at the next
          // listed server (one node with a bad certificate does not stop a cluster's client).
          this.movePast(base);
          throw new TlsError(base, refusal, { cause: error });
        }
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
      }
      const now = Date.now();
      giveUpAt ??= now + UNAVAILABLE_AFTER_MS;
      if (now >= giveUpAt) {
        throw new UnavailableError(
          `${method} ${path}: no server answered within ${UNAVAILABLE_AFTER_MS / 1000} s (tried ${this.baseUrls.join(', ')}); last: ${failure}`,
          { status: lastStatus ?? null },
        );
      }
      this.movePast(base);
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

  private server(base: string): Server | undefined {
    if (!this.servers.has(base)) this.servers.set(base, describeServer(base, this.agents));
    return this.servers.get(base);
  }

  /** Move on from the server `base` that failed, unless a concurrent call already did. */
  private movePast(base: string): void {
    if (this.baseUrls[this.urlIndex] === base) this.urlIndex = (this.urlIndex + 1) % this.baseUrls.length;
  }

  private followLeader(leaderUrl: string | null): void {
    if (leaderUrl && this.baseUrls.includes(leaderUrl)) this.urlIndex = this.baseUrls.indexOf(leaderUrl);
  }
}

function describeCause(error: unknown): string {
  if (error instanceof WireError) {
    const code = (error.cause as { code?: unknown } | undefined)?.code;
    return typeof code === 'string' && !error.message.includes(code) ? `${code}: ${error.message}` : error.message;
  }
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
