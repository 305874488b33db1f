/**
 * Task groups: `run.groups.create(...)`, `run.groups.byId(id)`.
 *
 * A group decides once, under races, whether a set of member tasks is done (FIRST_ACCEPTED,
 * N_ACCEPTED with a threshold, ALL_TERMINAL) and stops its work in the same step. Members are
 * tasks of the group's own run (`(await group.status()).scopeId`), a child of `parentScopeId` when
 * given. The calls are the published protocol's `/task-groups` routes.
 */

import { requireInt } from './_checks.js';
import { WAIT_TIMEOUT_MS_DEFAULT, waitUntil } from './_waiting.js';
import { ConfigError } from './errors.js';
import { mailboxId } from './mailboxes.js';
import { type SubmitOptions, taskBody } from './mailbox.js';
import { Ticket } from './tickets.js';
import { type DateLike, formatTime } from './time.js';
import { type Json, type Transport, field, segment } from './transport.js';

export type GroupCondition = 'FIRST_ACCEPTED' | 'N_ACCEPTED' | 'ALL_TERMINAL';
const CONDITIONS: readonly string[] = ['FIRST_ACCEPTED', 'N_ACCEPTED', 'ALL_TERMINAL'];
// The server's bound on members, threshold and expectedMembers.
const GROUP_MEMBERS_MAX = 100;

export interface GroupMember {
  taskId: string;
  key: string;
  state: string;
  verdict: 'ACCEPTED' | 'REJECTED' | null;
  late: boolean;
  verdictBy: string | null;
}

export interface GroupView {
  id: string;
  groupId: string;
  scopeId: string;
  parentScopeId: string | null;
  condition: GroupCondition;
  state: 'OPEN' | 'SEALED' | 'FINALIZED';
  outcome: 'SUCCESS' | 'FAILURE' | null;
  outcomeReason: string | null;
  members: GroupMember[];
  [field: string]: unknown;
}

export interface GroupDecision {
  state: 'OPEN' | 'SEALED' | 'FINALIZED';
  outcome: 'SUCCESS' | 'FAILURE' | null;
  outcomeReason: string | null;
}

export interface Verdict {
  taskId: string;
  verdict: 'ACCEPTED' | 'REJECTED';
  verdictBy: string | null;
  late: boolean;
  groupState: 'OPEN' | 'SEALED' | 'FINALIZED';
  outcome: 'SUCCESS' | 'FAILURE' | null;
  outcomeReason: string | null;
}

function taskIdOf(task: string | { id: string }): string {
  const id = typeof task === 'string' ? task : task?.id;
  if (typeof id !== 'string' || !id) throw new ConfigError('task must be a task id or a ticket');
  return id;
}

export class Groups {
  constructor(
    private readonly transport: Transport,
    readonly scopeId: string,
  ) {}

  /**
   * Create a group from this run. `condition` is FIRST_ACCEPTED, N_ACCEPTED (needs `threshold`,
   * 1 to 100) or ALL_TERMINAL; `expectedMembers` closes it when that many joined; `deadline`
   * finalizes it with FAILURE if undecided by then; with `parentScopeId` its run is a child of
   * that run. NotFoundError if the mailbox or a run does not exist, ScopeCancelledError if a run
   * stopped.
   */
  async create(options: {
    mailbox: string;
    condition: GroupCondition;
    threshold?: number;
    expectedMembers?: number;
    deadline?: DateLike;
    parentScopeId?: string;
  }): Promise<Group> {
    if (!CONDITIONS.includes(options.condition)) throw new ConfigError(`condition must be one of ${CONDITIONS.join(', ')}, got ${String(options.condition)}`);
    segment(options.mailbox, 'mailbox');
    const body: Json = { mailboxId: null, condition: options.condition, scopeId: this.scopeId };
    if (options.threshold !== undefined) body.threshold = requireInt(options.threshold, 'threshold', 1, GROUP_MEMBERS_MAX);
    if (options.expectedMembers !== undefined) body.expectedMembers = requireInt(options.expectedMembers, 'expectedMembers', 1, GROUP_MEMBERS_MAX);
    if (options.deadline !== undefined) body.deadline = formatTime(options.deadline, 'deadline');
    if (options.parentScopeId !== undefined) body.parentScopeId = segment(options.parentScopeId, 'parentScopeId') && options.parentScopeId;
    body.mailboxId = await mailboxId(this.transport, options.mailbox);
    // Not repeated blindly: a lost answer might hide a group that was created.
    const view = (await this.transport.request('POST', '/task-groups', { body, safe: false })) as GroupView;
    return new Group(this.transport, field<string>(view, 'groupId'), view);
  }

  /** A handle on group `groupId`, e.g. after a restart (no request). */
  byId(groupId: string): Group {
    return new Group(this.transport, groupId);
  }
}

export class Group {
  readonly id: string;
  /** The last group view seen (undefined until a call fetched one). */
  view: GroupView | undefined;
  private readonly path: string;

  constructor(
    private readonly transport: Transport,
    groupId: string,
    view?: GroupView,
  ) {
    this.path = `/task-groups/${segment(groupId, 'group id')}`;
    this.id = groupId;
    this.view = view;
  }

  /** The group's own run (where workers take its members), once a view was fetched. */
  get scopeId(): string | undefined {
    return this.view?.scopeId;
  }

  /**
   * Submit a member task; returns its Ticket (`created` false for an existing member). ConflictError
   * ConflictError (CONFLICT) for a new member of a closed group, KeyConflictError for a key with another input.
   */
  async submit(input: unknown, options: Omit<SubmitOptions, 'keyOnly'> = {}): Promise<Ticket> {
    const answer = await this.transport.request('POST', `${this.path}/tasks`, { body: taskBody(input, options), safe: true });
    return new Ticket(this.transport, field<string>(answer, 'taskId'), {
      ...(typeof answer.taskKey === 'string' ? { key: answer.taskKey } : {}),
      ...(typeof answer.created === 'boolean' ? { created: answer.created } : {}),
      ...(typeof answer.state === 'string' ? { state: answer.state } : {}),
    });
  }

  /** Add an existing task of the group's run; returns `{taskId, joined, groupState}`. */
  async joinTask(task: string | { id: string }): Promise<Json> {
    return this.transport.request('POST', `${this.path}/join-task`, { body: { taskId: taskIdOf(task) }, safe: true });
  }

  /** No new members; the group is evaluated at once. Returns `{state, outcome, outcomeReason}`. Safe to repeat. */
  async close(): Promise<GroupDecision> {
    return (await this.transport.request('POST', `${this.path}/close`, { body: {}, safe: true })) as unknown as GroupDecision;
  }

  /** The group's view with every member's task state, verdict and late flag. */
  async status(): Promise<GroupView> {
    this.view = (await this.transport.request('GET', this.path, { safe: true })) as GroupView;
    return this.view;
  }

  /** Accept a SUCCEEDED member (a task id or its ticket). Idempotent; ConflictError otherwise. */
  async accept(task: string | { id: string }): Promise<Verdict> {
    return this.judge('accept', task);
  }

  /** Reject a finished member. Idempotent; ConflictError while it is unfinished or if accepted. */
  async reject(task: string | { id: string }): Promise<Verdict> {
    return this.judge('reject', task);
  }

  private async judge(kind: string, task: string | { id: string }): Promise<Verdict> {
    const path = `${this.path}/tasks/${segment(taskIdOf(task), 'task id')}/${kind}`;
    return (await this.transport.request('POST', path, { body: { holder: this.transport.holder }, safe: true })) as unknown as Verdict;
  }

  /** Wait until the group is FINALIZED; returns its view. WaitTimeoutError after `timeoutMs` (default 60 s). */
  async wait(options: { timeoutMs?: number } = {}): Promise<GroupView> {
    const view = await waitUntil(
      (waitMs) => this.transport.request('GET', `${this.path}/wait`, { query: { waitMs }, safe: true, longPollMs: waitMs }),
      (answer) => answer.state === 'FINALIZED',
      options.timeoutMs ?? WAIT_TIMEOUT_MS_DEFAULT,
      `the decision of group ${this.id}`,
    );
    this.view = view as GroupView;
    return this.view;
  }
}
