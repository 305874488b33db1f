/**
 * runstate: coordination for swarms of agents and workers.
 *
 *     import runstate from 'runstate-sdk';
 *     const research = runstate.once(researchCompany);      // run once per run and arguments
 *     export const work = runstate.queue('work', handler);   // hand work to workers
 *     await runstate.serve();                                // a worker: run every queue
 *
 *     import { Runstate } from 'runstate-sdk';              // the HTTP client
 *     const rs = new Runstate({ holder: 'producer' });
 */

import { close, configure } from './runtime.js';
import { context } from './context.js';
import { once } from './once.js';
import { queue, serve } from './queue.js';
import { Runstate } from './client.js';
import {
  BacklogFullError,
  ClaimHeldError,
  ConfigError,
  ConflictError,
  CursorExpiredError,
  DeadlineExceededError,
  ForbiddenError,
  KeyConflictError,
  LeaseLostError,
  LimitExceededError,
  NotFoundError,
  OnceFailedError,
  OutcomeUnknownError,
  ResultTimeoutError,
  ResultTooLargeError,
  RunstateError,
  ScopeCancelledError,
  TaskFailedError,
  TlsError,
  UnauthenticatedError,
  UnavailableError,
  ValidationError,
  WaitTimeoutError,
} from './errors.js';

export { Runstate, Scope, Scopes } from './client.js';
export type { RunstateOptions, RunOptions, RunView } from './client.js';
export { Mailboxes } from './mailboxes.js';
export { Budgets, Limits, Pools, Reservation, ScopeBudgets, ScopeLimits, ScopePools, SlotLease } from './resources.js';
export type { Needs } from './resources.js';
export type { MailboxView } from './mailboxes.js';
export { Mailbox } from './mailbox.js';
export type { SubmitOptions } from './mailbox.js';
export { Delivery } from './delivery.js';
export type { ConsumeOptions, Handler } from './consume.js';
export { Ticket } from './tickets.js';
export type { TaskView } from './tickets.js';
export { Group, Groups } from './groups.js';
export type { GroupCondition, GroupDecision, GroupMember, GroupView, Verdict } from './groups.js';
export { Barrier, Barriers } from './barriers.js';
export type { BarrierView } from './barriers.js';
export { Timer, Timers } from './timers.js';
export type { TimerView } from './timers.js';
export { once } from './once.js';
export type { OnceFunction, OnceOptions } from './once.js';
export { Job, queue, serve } from './queue.js';
export type { GatherOptions, Queue, QueueOptions, ServeOptions } from './queue.js';
export { context } from './context.js';
export type { Context } from './context.js';
export { close, configure } from './runtime.js';
export type { Settings } from './runtime.js';
export { canonicalJson, makeKey } from './keys.js';
export type { JsonValue } from './keys.js';
export type { DateLike, Duration } from './time.js';
export {
  BacklogFullError,
  ClaimHeldError,
  ConfigError,
  ConflictError,
  CursorExpiredError,
  DeadlineExceededError,
  ForbiddenError,
  KeyConflictError,
  LeaseLostError,
  LimitExceededError,
  NotFoundError,
  OnceFailedError,
  OutcomeUnknownError,
  ResultTimeoutError,
  ResultTooLargeError,
  RunstateError,
  ScopeCancelledError,
  TaskFailedError,
  TlsError,
  UnauthenticatedError,
  UnavailableError,
  ValidationError,
  WaitTimeoutError,
} from './errors.js';

/** The module-level API: `runstate.once`, `runstate.queue`, `runstate.serve`, `runstate.context()`, ... */
const runstate = {
  once,
  queue,
  serve,
  context,
  configure,
  close,
  Runstate,
  BacklogFullError,
  ClaimHeldError,
  ConfigError,
  ConflictError,
  CursorExpiredError,
  DeadlineExceededError,
  ForbiddenError,
  KeyConflictError,
  LeaseLostError,
  LimitExceededError,
  NotFoundError,
  OnceFailedError,
  OutcomeUnknownError,
  ResultTimeoutError,
  ResultTooLargeError,
  RunstateError,
  ScopeCancelledError,
  TaskFailedError,
  TlsError,
  UnauthenticatedError,
  UnavailableError,
  ValidationError,
  WaitTimeoutError,
};

export default runstate;
