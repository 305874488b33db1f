/**
 * The process-wide client behind `runstate.once`, `runstate.queue` and `runstate.serve`.
 *
 * One client per process, created on first use from `runstate.configure(...)` or the environment
 * (RUNSTATE_BASE_URL, RUNSTATE_SPACE_ID, RUNSTATE_API_KEY, RUNSTATE_SCOPE_ID, RUNSTATE_RUN).
 *
 * Which run: `configure({ scopeId })`, else RUNSTATE_SCOPE_ID, else the active run named
 * `configure({ run })`, RUNSTATE_RUN or `default` (`PUT /runs/{name}`), asked once and cached.
 * When a call answers SCOPE_CANCELLED, DEADLINE_EXCEEDED or NOT_FOUND for the cached default run,
 * the SDK asks for the default run again (the server has replaced it by then) and retries the call
 * once, so after a stop the next call of every process lands in the same fresh run.
 */

import { Runstate, type RunstateOptions } from './client.js';
import { ConfigError, DeadlineExceededError, NotFoundError, ScopeCancelledError } from './errors.js';
import type { Json } from './transport.js';

export const SCOPE_ID_ENV = 'RUNSTATE_SCOPE_ID';
export const RUN_ENV = 'RUNSTATE_RUN';
export const DEFAULT_RUN_NAME = 'default';
const RUN_NAME_CHARS_MAX = 256;

export interface Settings extends RunstateOptions {
  /** The run to use (else RUNSTATE_SCOPE_ID, else the named run). */
  scopeId?: string;
  /** The named run to join when no run id is given (else RUNSTATE_RUN, else `default`). */
  run?: string;
}

/** The runtime's queues with a handler, by name (the last definition of a name wins): what `serve()` runs. */
export type QueueRegistry = Map<string, unknown>;

export class Runtime {
  /** Queues defined on this runtime's client (`rs.queue(...)`); the module-level ones are global. */
  readonly queues: QueueRegistry = new Map();
  readonly client: Runstate;
  readonly explicitScopeId: string | undefined;
  readonly runName: string;
  private defaultScopeId: Promise<string> | undefined;
  private readonly declared = new Set<string>();

  constructor(settings: Settings, client?: Runstate) {
    this.client = client ?? new Runstate(settings);
    const explicit = settings.scopeId ?? process.env[SCOPE_ID_ENV];
    this.explicitScopeId = explicit?.trim() || undefined;
    const named = settings.run ?? process.env[RUN_ENV];
    this.runName = named?.trim() || DEFAULT_RUN_NAME;
  }

  /** The run to use and whether it is the default (named) run. */
  async scopeId(): Promise<[string, boolean]> {
    if (this.explicitScopeId !== undefined) return [this.explicitScopeId, false];
    this.defaultScopeId ??= this.client.scopes.named(this.runName).then(
      (scope) => scope.id,
      (error: unknown) => {
        this.defaultScopeId = undefined;
        throw error;
      },
    );
    return [await this.defaultScopeId, true];
  }

  /** `operation(run id)`, asking for a fresh default run and retrying once if the cached default run stopped. */
  async inRun<T>(operation: (scopeId: string) => Promise<T>): Promise<T> {
    const [scopeId, isDefault] = await this.scopeId();
    try {
      return await operation(scopeId);
    } catch (error) {
      if (!isDefault || !(error instanceof ScopeCancelledError || error instanceof DeadlineExceededError || error instanceof NotFoundError)) throw error;
      this.forgetDefault(scopeId);
      const [fresh] = await this.scopeId();
      return operation(fresh);
    }
  }

  /**
   * If `scopeId` is the cached default run and it is no longer active, throw ScopeCancelledError
   * (so `inRun` moves to the fresh default run). For answers given whether or not the run is
   * active: a once entry already DONE or FAILED.
   */
  async checkDefaultActive(scopeId: string, effective: unknown): Promise<void> {
    if (this.explicitScopeId !== undefined || this.defaultScopeId === undefined) return;
    if ((await this.defaultScopeId.catch(() => undefined)) !== scopeId) return;
    const state = typeof effective === 'string' ? effective : (await this.client.scopes.status(scopeId)).effective;
    if (state !== 'ACTIVE') throw new ScopeCancelledError(`the default run ${scopeId} is no longer active`, { status: null });
  }

  /** The default run `scopeId` stopped: the next call asks for the current one. */
  forgetDefault(scopeId: string): void {
    const current = this.defaultScopeId;
    if (current === undefined) return;
    void current.then(
      (id) => {
        if (id === scopeId && this.defaultScopeId === current) this.defaultScopeId = undefined;
      },
      () => undefined,
    );
    this.defaultScopeId = undefined;
  }

  /** Declare the work queue `name` once per process (created when missing). */
  async declareQueue(name: string, options: { maxAttempts?: number; requirements?: Json } = {}): Promise<void> {
    const tag = `${name}:${options.maxAttempts ?? ''}:${JSON.stringify(options.requirements ?? null)}`;
    if (this.declared.has(tag)) return;
    await this.client.mailboxes.declare(name, options);
    this.declared.add(tag);
  }
}

let settings: Settings = {};
let current: Runtime | undefined;

/** The process-wide runtime, created on first use. */
export function runtime(): Runtime {
  current ??= new Runtime(settings);
  return current;
}

/**
 * Set what `once`, `queue` and `serve` connect to, instead of (or over) the environment:
 * `baseURL`, `spaceId`, `apiKey`, `caFile`, `clientCert`, `clientKey`, `holder`, `scopeId` (the run to
 * use) or `run` (the named run).
 * The next call uses a new client. ConfigError for a malformed setting.
 */
export function configure(next: Settings = {}): void {
  if (next.run !== undefined && (typeof next.run !== 'string' || !next.run.trim() || next.run.length > RUN_NAME_CHARS_MAX)) {
    throw new ConfigError(`run must be a name of 1 to ${RUN_NAME_CHARS_MAX} characters`);
  }
  new Runstate(next); // validate now, not at the first call
  settings = { ...next };
  current = undefined;
}

/** Forget the process-wide client; the next call opens a new one. */
export function close(): void {
  current = undefined;
}
