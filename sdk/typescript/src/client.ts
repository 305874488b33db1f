/** The client: `new Runstate({...})` and its handles on runs (the wire calls them scopes). */

import { requireInt } from './_checks.js';
import { Barriers } from './barriers.js';
import { ConfigError } from './errors.js';
import { Groups } from './groups.js';
import { Mailbox } from './mailbox.js';
import { Mailboxes } from './mailboxes.js';
import { Budgets, Limits, Pools, type Reservation, ScopeBudgets, ScopeLimits, ScopePools, type SlotLease, holdBudget, holdSlot } from './resources.js';
import { type OnceFunction, type OnceOptions, onceOn } from './once.js';
import { type Queue, type QueueOptions, type ServeOptions, queueOn, serveOn } from './queue.js';
import { Runtime } from './runtime.js';
import { type Duration, durationMs } from './time.js';
import { Ticket } from './tickets.js';
import { Timers } from './timers.js';
import { type DateLike, formatTime } from './time.js';
import {
  API_KEY_ENV,
  type Json,
  REQUEST_TIMEOUT_MS_DEFAULT,
  SPACE_ID_ENV,
  Transport,
  defaultHolder,
  field,
  parseBaseUrls,
  readTlsFiles,
  resolveOptional,
  segment,
} from './transport.js';

export interface RunstateOptions {
  /** Names this client on leases and verdicts (default `<hostname>:<pid>`). */
  holder?: string;
  /** The server, or a comma-separated list (or array) of cluster nodes. Default RUNSTATE_BASE_URL, else http://localhost:8080. */
  baseURL?: string | readonly string[];
  /** The space; default RUNSTATE_SPACE_ID, else the API key's space. */
  spaceId?: string;
  /** The API key; default RUNSTATE_API_KEY. */
  apiKey?: string;
  /** A PEM file of the CA(s) an https:// server's certificate must chain to, instead of Node's; default RUNSTATE_CA_FILE. */
  caFile?: string;
  /** A PEM certificate presented to a server that requires one (mutual TLS), with `clientKey`; default RUNSTATE_CLIENT_CERT. */
  clientCert?: string;
  /** The PEM private key of `clientCert`; default RUNSTATE_CLIENT_KEY. */
  clientKey?: string;
  /** Bound on one ordinary request in milliseconds (long polls get their wait on top); default 10 000. */
  timeoutMs?: number;
  /** `timeoutMs` as a duration (`'10s'`), as the published clients take it. */
  timeout?: Duration;
  /** `holder`, as the published clients name it. */
  worker?: string;
  /** `baseURL`, as the published clients name it. */
  baseUrl?: string | readonly string[];
  /** The run of this client's `once`, `queue` and `serve`: else RUNSTATE_SCOPE_ID. */
  scopeId?: string;
  /** The named run of this client's `once`, `queue` and `serve` when no run id is given: else RUNSTATE_RUN, else `default`. */
  run?: string;
}

/** A run's view. */
export interface RunView {
  id: string;
  name: string | null;
  parentId: string | null;
  storedState: 'ACTIVE' | 'CANCELLED' | 'COMPLETED';
  effective: 'ACTIVE' | 'INACTIVE';
  deadline: string | null;
  [field: string]: unknown;
}

export interface RunOptions {
  /** A label; `status()` returns it, but runs are never looked up by name. */
  name?: string;
  /** New work is refused with DEADLINE_EXCEEDED once it passes. */
  deadline?: DateLike;
  /** How many child runs it can have (default 1000). */
  childLimit?: number;
}

function runBody(options: RunOptions): Json {
  const body: Json = {};
  if (options.name !== undefined) {
    if (typeof options.name !== 'string' || !options.name) throw new ConfigError('name must be a non-empty string');
    body.name = options.name;
  }
  if (options.deadline !== undefined) body.deadline = formatTime(options.deadline, 'deadline');
  if (options.childLimit !== undefined) body.childLimit = requireInt(options.childLimit, 'childLimit', 0);
  return body;
}

/** Runs of the space: `rs.scopes`. */
export class Scopes {
  constructor(private readonly transport: Transport) {}

  /**
   * Open a new run; every call creates a new one. With `parentScopeId`, a child run cancelled
   * along with its parent. ScopeCancelledError / DeadlineExceededError if the parent is inactive,
   * LimitExceededError at its child limit, NotFoundError for an unknown parent.
   */
  async create(options: RunOptions & { parentScopeId?: string } = {}): Promise<Scope> {
    const body = runBody(options);
    if (options.parentScopeId !== undefined) body.parentId = segment(options.parentScopeId, 'parentScopeId') && options.parentScopeId;
    // Not retried after it may have reached the server: a repeat could open a second run.
    const view = (await this.transport.request('POST', '/scopes', { body, safe: false })) as RunView;
    return new Scope(this.transport, field<string>(view, 'id'), view);
  }

  /**
   * The active root run called `name` (`PUT /runs/{name}`), created when there is none: once it
   * stopped, the next call of any process gets the same fresh run. Safe to repeat.
   */
  async named(name: string, options: { deadline?: DateLike } = {}): Promise<Scope> {
    const body: Json = options.deadline !== undefined ? { deadline: formatTime(options.deadline, 'deadline') } : {};
    const view = (await this.transport.request('PUT', `/runs/${segment(name, 'run name')}`, { body, safe: true })) as RunView;
    return new Scope(this.transport, field<string>(view, 'id'), view);
  }

  /** The run's view; NotFoundError if unknown. */
  async status(scopeId: string): Promise<RunView> {
    return (await this.transport.request('GET', `/scopes/${segment(scopeId, 'scope id')}`, { safe: true })) as RunView;
  }

  /** Cancel the run and every run below it; idempotent on a cancelled run, ConflictError on a completed one. */
  async cancel(scopeId: string, reason?: string): Promise<RunView> {
    const body = reason === undefined ? {} : { reason };
    return (await this.transport.request('POST', `/scopes/${segment(scopeId, 'scope id')}/cancel`, { body, safe: true })) as RunView;
  }

  /** Close the run as finished normally; idempotent on a completed run, ConflictError on a cancelled one. */
  async complete(scopeId: string): Promise<RunView> {
    return (await this.transport.request('POST', `/scopes/${segment(scopeId, 'scope id')}/complete`, { body: {}, safe: true })) as RunView;
  }
}

/** A handle on one run. `view` is the last view the SDK saw. */
export class Scope {
  readonly id: string;
  view: RunView | undefined;
  readonly groups: Groups;
  readonly barriers: Barriers;
  readonly timers: Timers;
  /** Take slots of pools under this run. */
  readonly pools: ScopePools;
  /** Take units of rate limits under this run. */
  readonly limits: ScopeLimits;
  /** Reserve amounts of spend budgets under this run. */
  readonly budgets: ScopeBudgets;
  private readonly scopes: Scopes;

  constructor(
    private readonly transport: Transport,
    scopeId: string,
    view?: RunView,
  ) {
    segment(scopeId, 'scope id');
    this.id = scopeId;
    this.view = view;
    this.scopes = new Scopes(transport);
    this.groups = new Groups(transport, scopeId);
    this.barriers = new Barriers(transport, scopeId);
    this.timers = new Timers(transport, scopeId);
    this.pools = new ScopePools(transport, scopeId);
    this.limits = new ScopeLimits(transport, scopeId);
    this.budgets = new ScopeBudgets(transport, scopeId);
  }

  /**
   * Reserve `amount` of budget `name` while `fn(reservation)` runs; settled afterwards with what
   * `reservation.spend()` reported (else the whole reservation), or released if `fn` threw first.
   */
  async budget<T>(name: string, amount: number, fn: (reservation: Reservation) => T | Promise<T>, options: { leaseMs?: number; timeoutMs?: number } = {}): Promise<T> {
    return holdBudget(this.budgets, name, amount, fn, options);
  }

  /**
   * Hold a slot of pool `name` while `fn(lease)` runs (taken waiting up to `timeoutMs`, renewed,
   * released afterwards); `lease.signal` aborts if the lease is lost or the run stops, and the
   * refusal is thrown once `fn` returns.
   */
  async slot<T>(name: string, fn: (lease: SlotLease) => T | Promise<T>, options: { leaseMs?: number; timeoutMs?: number } = {}): Promise<T> {
    return holdSlot(this.pools, name, fn, options);
  }

  /** The run's current view: `storedState` (ACTIVE, CANCELLED, COMPLETED) and `effective` (ACTIVE or INACTIVE). */
  async status(): Promise<RunView> {
    this.view = await this.scopes.status(this.id);
    return this.view;
  }

  /** Cancel this run and everything below it. */
  async cancel(reason?: string): Promise<RunView> {
    this.view = await this.scopes.cancel(this.id, reason);
    return this.view;
  }

  /** Close this run as finished normally. */
  async complete(): Promise<RunView> {
    this.view = await this.scopes.complete(this.id);
    return this.view;
  }

  /** Open a sub-run, cancelled along with this one. */
  async child(options: RunOptions = {}): Promise<Scope> {
    return this.scopes.create({ ...options, parentScopeId: this.id });
  }

  /** The work queue `name` as seen from this run (no request). */
  mailbox(name: string): Mailbox {
    return new Mailbox(this.transport, this.id, name);
  }

  /** Re-attach to a task by id, e.g. after a restart (no request). */
  task(taskId: string): Ticket {
    return new Ticket(this.transport, taskId);
  }
}

/**
 * The client. Options fall back to the environment: `baseURL` to RUNSTATE_BASE_URL (default
 * http://localhost:8080), `spaceId` to RUNSTATE_SPACE_ID, `apiKey` to RUNSTATE_API_KEY, and the
 * TLS files `caFile`, `clientCert`, `clientKey` to RUNSTATE_CA_FILE, RUNSTATE_CLIENT_CERT,
 * RUNSTATE_CLIENT_KEY. Throws ConfigError for a malformed setting or a TLS file that cannot be read;
 * calls reject with UnavailableError when no server answers for a few seconds, and with TlsError
 * at once, not retried, when TLS with a server fails (its certificate does not verify, or it
 * refused the client's).
 */
export class Runstate {
  readonly mailboxes: Mailboxes;
  readonly scopes: Scopes;
  /** Pools of slots (on the wire: permits). */
  readonly pools: Pools;
  /** Rate limits (on the wire: allowances). */
  readonly limits: Limits;
  /** Spend budgets. */
  readonly budgets: Budgets;
  /** @internal */
  readonly transport: Transport;

  private readonly settings: RunstateOptions;
  private runtimeInstance: Runtime | undefined;

  constructor(options: RunstateOptions = {}) {
    const holder = options.holder ?? options.worker;
    if (holder !== undefined && (typeof holder !== 'string' || !holder.trim())) throw new ConfigError('holder must be a non-empty string');
    const spaceId = resolveOptional(options.spaceId, SPACE_ID_ENV);
    const apiKey = resolveOptional(options.apiKey, API_KEY_ENV);
    const tls = readTlsFiles(options);
    this.transport = new Transport({
      baseUrls: parseBaseUrls(options.baseURL ?? options.baseUrl),
      ...(spaceId !== undefined ? { spaceId } : {}),
      ...(apiKey !== undefined ? { apiKey } : {}),
      ...(tls !== undefined ? { tls } : {}),
      holder: holder?.trim() || defaultHolder(),
      timeoutMs: options.timeoutMs ?? (options.timeout !== undefined ? durationMs(options.timeout, 'timeout') : REQUEST_TIMEOUT_MS_DEFAULT),
    });
    this.settings = { ...options };
    this.mailboxes = new Mailboxes(this.transport);
    this.scopes = new Scopes(this.transport);
    this.pools = new Pools(this.transport);
    this.limits = new Limits(this.transport);
    this.budgets = new Budgets(this.transport);
  }

  get holder(): string {
    return this.transport.holder;
  }

  get baseUrls(): string[] {
    return [...this.transport.baseUrls];
  }

  /** A handle on the run `scopeId`, without a request. */
  scope(scopeId: string): Scope {
    return new Scope(this.transport, scopeId);
  }

  /** Re-attach to a task by id (no request). */
  task(taskId: string): Ticket {
    return new Ticket(this.transport, taskId);
  }

  /** The runtime of this client's `once`, `queue` and `serve` (made on first use). */
  private runtime(): Runtime {
    this.runtimeInstance ??= new Runtime(this.settings, this);
    return this.runtimeInstance;
  }

  /** `runstate.once` on this client and its run (see `once`). */
  once<A extends unknown[], R>(fn: (...args: A) => R | Promise<R>, options: OnceOptions<A> = {}): OnceFunction<A, Awaited<R>> {
    return onceOn(() => this.runtime(), fn, options);
  }

  /** `runstate.queue` on this client and its run; without a handler, a producer-only queue. */
  queue<I = unknown, O = unknown>(name: string, handler?: (input: I) => O | Promise<O>, options: QueueOptions<I> = {}): Queue<I, Awaited<O>> {
    return queueOn(() => this.runtime(), this.runtime().queues, name, handler, options);
  }

  /** `runstate.serve` for the queues defined on this client (see `serve`). */
  async serve(options: ServeOptions = {}): Promise<void> {
    return serveOn(this.runtime(), this.runtime().queues, options);
  }

  /** The space's default run, the run named `default` (created on first use). */
  async defaultScope(): Promise<Scope> {
    return this.scopes.named('default');
  }
}
