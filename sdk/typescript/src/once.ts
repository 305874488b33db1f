/**
 * `runstate.once`: run a function once per run and key; every caller, in any process, gets the
 * one result.
 *
 *     const research = runstate.once(researchCompany, { attempts: 5, lease: '60s' });
 *     const report = await research('acme');
 *
 * A call computes its key (`<name>:<hash of the arguments>`, or of `key(...args)`) and acquires the
 * once entry of that key in the run:
 * - DONE: the recorded result comes back at once;
 * - HELD by another caller: wait (long poll) until it is not, then look again;
 * - GRANTED: this caller runs the function under a lease renewed every third of it. The return
 *   value is recorded and returned; an error is recorded as a failed attempt and thrown to this
 *   caller only (the next waiting caller tries); a renewal refused aborts `context().signal`, and a
 *   result the server refuses because the lease was taken over throws LeaseLostError;
 * - FAILED (out of attempts): OnceFailedError, until the run ends.
 */

import { requireInt } from './_checks.js';
import { describeError, resultValue } from './_results.js';
import { runInContext } from './context.js';
import {
  ConfigError,
  DeadlineExceededError,
  LeaseLostError,
  NotFoundError,
  OnceFailedError,
  ResultTooLargeError,
  RunstateError,
  ScopeCancelledError,
} from './errors.js';
import { argumentValues, customKey, makeKey } from './keys.js';
import { type Runtime, runtime } from './runtime.js';
import { type Duration, durationMs } from './time.js';
import type { Json } from './transport.js';

export const ONCE_ATTEMPTS_DEFAULT = 3;
const ATTEMPTS_MAX = 100;
const LEASE_DEFAULT = '30s';
// One long poll of GET /once; the server's own bound.
const ONCE_WAIT_MS = 30_000;
// Renewing: a third of the lease, but not more often than this.
const RENEW_INTERVAL_MS_MIN = 50;

export interface OnceOptions<A extends unknown[]> {
  /** The key's prefix; default the function's name. Equal names and arguments give equal keys in every SDK. */
  name?: string;
  /** What identifies the call, instead of all the arguments (e.g. leave out a client object). */
  key?: (...args: A) => unknown;
  /** Failed attempts before every caller gets OnceFailedError; 1 to 100, default 3. */
  attempts?: number;
  /** How long a crashed caller holds the work before another takes it over: ms or `'30s'`; default 30 s. */
  lease?: Duration;
}

/** A once-wrapped function: call it like the function; `onceKey(...args)` gives a call's key. */
export interface OnceFunction<A extends unknown[], R> {
  (...args: A): Promise<R>;
  readonly onceName: string;
  readonly onceAttempts: number;
  readonly onceLeaseMs: number;
  onceKey(...args: A): string;
}

type Grant = { kind: 'grant'; scopeId: string; token: string; attempt: number };
type Done = { kind: 'done'; result: unknown };

function failed(key: string, view: Json): OnceFailedError {
  const attempts = Number(view.attempts ?? 0);
  const error = typeof view.lastError === 'string' && view.lastError ? view.lastError : 'no error message recorded';
  return new OnceFailedError(`${key} failed after ${attempts} attempts: ${error}`, { attempts, key });
}

function warn(message: string): void {
  if (process.env.RUNSTATE_SDK_QUIET !== '1') console.warn(`runstate: ${message}`);
}

class OnceSpec<A extends unknown[], R> {
  readonly leaseSeconds: number;

  constructor(
    readonly getRuntime: () => Runtime,
    readonly fn: (...args: A) => R | Promise<R>,
    readonly name: string,
    readonly keyFunction: ((...args: A) => unknown) | undefined,
    readonly attempts: number,
    readonly leaseMs: number,
  ) {
    // Sent in whole seconds, as the published clients do: rounded up, at least one.
    this.leaseSeconds = Math.max(1, Math.ceil(leaseMs / 1000));
  }

  key(args: A): string {
    if (this.keyFunction) return customKey(this.name, this.keyFunction(...args), `the key of ${this.name}`);
    return makeKey(this.name, argumentValues(args), `the arguments of ${this.name}`);
  }

  private post(rt: Runtime, action: string, body: Json): Promise<Json> {
    return rt.client.transport.request('POST', `/once/${action}`, { body, safe: true });
  }

  async acquire(rt: Runtime, key: string): Promise<Grant | Done> {
    const transport = rt.client.transport;
    return rt.inRun(async (scopeId) => {
      for (;;) {
        let view = await this.post(rt, 'acquire', {
          scopeId,
          key,
          holder: transport.holder,
          holderSession: transport.holderSession,
          leaseSeconds: this.leaseSeconds,
          maxAttempts: this.attempts,
        });
        if (view.state === 'GRANTED') return { kind: 'grant', scopeId, token: String(view.token), attempt: Number(view.attempts ?? 0) + 1 };
        // A stopped run still answers its recorded outcomes; the default run's are not this call's once it stopped.
        if (view.state === 'DONE' || view.state === 'FAILED') await rt.checkDefaultActive(scopeId, view.scopeEffective);
        for (;;) {
          if (view.state === 'DONE') return { kind: 'done', result: view.result };
          if (view.state === 'FAILED') throw failed(key, view);
          if (view.state !== 'HELD' || (view.scopeEffective ?? 'ACTIVE') !== 'ACTIVE') break; // OPEN: acquire again
          view = await transport.request('GET', '/once', {
            query: { scopeId, key, waitMs: ONCE_WAIT_MS },
            safe: true,
            longPollMs: ONCE_WAIT_MS,
          });
        }
      }
    });
  }

  /** Renew every third of the lease until stopped; abort `controller` once a renewal is refused. */
  startRenewing(rt: Runtime, grant: Grant, key: string, controller: AbortController): () => void {
    let renewing = false;
    const timer = setInterval(() => {
      if (renewing || controller.signal.aborted) return;
      renewing = true;
      this.post(rt, 'renew', { scopeId: grant.scopeId, key, token: grant.token, leaseSeconds: this.leaseSeconds }).then(
        () => {
          renewing = false;
        },
        (error: unknown) => {
          renewing = false;
          if (error instanceof LeaseLostError || error instanceof NotFoundError || error instanceof ScopeCancelledError || error instanceof DeadlineExceededError) {
            warn(`once ${this.name}: renewing the lease was refused: ${describeError(error)}`);
            controller.abort(error instanceof LeaseLostError ? error : new LeaseLostError(`${key}: ${(error as RunstateError).message}`, { status: null }));
          } else {
            warn(`once ${this.name}: renewing the lease failed: ${describeError(error)}`);
          }
        },
      );
    }, Math.max((this.leaseSeconds * 1000) / 3, RENEW_INTERVAL_MS_MIN));
    return () => clearInterval(timer);
  }

  async call(args: A): Promise<R> {
    const key = this.key(args);
    const rt = this.getRuntime();
    const grant = await this.acquire(rt, key);
    if (grant.kind === 'done') return grant.result as R;
    const controller = new AbortController();
    const stopRenewing = this.startRenewing(rt, grant, key, controller);
    const entry = { scopeId: grant.scopeId, key, token: grant.token };
    let value: R;
    try {
      const context = {
        signal: controller.signal,
        attempt: grant.attempt,
        key,
        runId: grant.scopeId,
        spend: () => {
          throw new ConfigError('context().spend() is only available inside a queue handler');
        },
      };
      value = await runInContext(context, () => this.fn(...args));
    } catch (error) {
      stopRenewing();
      await this.post(rt, 'fail', { ...entry, error: describeError(error), maxAttempts: this.attempts }).catch((refused: unknown) =>
        warn(`once ${this.name}: recording the failure was refused: ${describeError(refused)}`),
      );
      throw error;
    }
    stopRenewing();
    let result: unknown;
    try {
      result = resultValue(value, `the result of ${this.name}`);
    } catch (error) {
      if (error instanceof ConfigError || error instanceof ResultTooLargeError) {
        await this.post(rt, 'fail', { ...entry, error: describeError(error), maxAttempts: this.attempts }).catch(() => undefined);
      }
      throw error;
    }
    try {
      await this.post(rt, 'complete', { ...entry, result });
    } catch (error) {
      if (error instanceof LeaseLostError) {
        controller.abort(error);
        throw new LeaseLostError(`${key}: the lease was taken over before the result was recorded; it is rejected (${error.message})`, {
          status: error.status ?? null,
        });
      }
      throw error;
    }
    return result as R;
  }
}

/**
 * Make `fn` run once per run for the same arguments; every caller, in any process, gets the one
 * result. Options: `name` (default the function's name), `key` (a function of the same arguments
 * whose return value is hashed instead), `attempts` (default 3), `lease` (default `'30s'`).
 *
 * A call resolves to the recorded result (as JSON carried it) or rejects with: the function's own
 * error (to the caller whose attempt it was), OnceFailedError (`attempts`, the last error in its
 * message) once the attempts are used, LeaseLostError when this caller's lease was taken over
 * before its result was recorded, ResultTooLargeError for a result over 64 KB, ConfigError for
 * arguments or a result that are not JSON values.
 */
export function once<A extends unknown[], R>(fn: (...args: A) => R | Promise<R>, options: OnceOptions<A> = {}): OnceFunction<A, Awaited<R>> {
  return onceOn(runtime, fn, options);
}

/** `once` on the runtime `getRuntime` gives (the process-wide one, or a client's). */
export function onceOn<A extends unknown[], R>(
  getRuntime: () => Runtime,
  fn: (...args: A) => R | Promise<R>,
  options: OnceOptions<A> = {},
): OnceFunction<A, Awaited<R>> {
  if (typeof fn !== 'function') throw new ConfigError('once() wraps a function');
  if (options.key !== undefined && typeof options.key !== 'function') throw new ConfigError('key must be a function of the same arguments');
  const name = options.name ?? fn.name;
  if (typeof name !== 'string' || !name || name === 'anonymous') throw new ConfigError('give once() a name for an anonymous function');
  const attempts = requireInt(options.attempts ?? ONCE_ATTEMPTS_DEFAULT, 'attempts', 1, ATTEMPTS_MAX);
  const spec = new OnceSpec<A, Awaited<R>>(getRuntime, fn as (...args: A) => Awaited<R>, name, options.key, attempts, durationMs(options.lease ?? LEASE_DEFAULT, 'lease'));
  const wrapper = (...args: A): Promise<Awaited<R>> => spec.call(args);
  return Object.assign(wrapper, {
    onceName: name,
    onceAttempts: attempts,
    onceLeaseMs: spec.leaseMs,
    onceKey: (...args: A) => spec.key(args),
  });
}
