/** `runstate.context()`: what a `once` function or a queue handler knows about its own call. */

import { AsyncLocalStorage } from 'node:async_hooks';

/** The call being run. */
export interface Context {
  /**
   * Aborted when this call's work will not be recorded any more: its lease was taken over or
   * lapsed, the run stopped, or the worker is stopping. Check it in long work
   * (`signal.throwIfAborted()`) and pass it to what you call.
   */
  readonly signal: AbortSignal;
  /** 1 for the first attempt, n for the n-th (a failure or a lapsed lease counts). */
  readonly attempt: number;
  /** The once key or the job's key, `<name>:<hash>`. */
  readonly key: string;
  /** The run the call belongs to. */
  readonly runId: string;
  /**
   * In a queue handler: report `amount` more spent of the job's budget reservation (a decimal);
   * the sum is charged when the job completes, the rest returns to the budget. Without it the
   * whole reservation counts as spent. ConfigError outside a queue handler.
   */
  spend(amount: number): void;
}

const storage = new AsyncLocalStorage<Context>();

/** The Context of the once function or queue handler running here, or undefined anywhere else. */
export function context(): Context | undefined {
  return storage.getStore();
}

/** Run `fn` with `current` as its context. */
export function runInContext<R>(current: Context, fn: () => R): R {
  return storage.run(current, fn);
}
