/** Work queues of the space (`rs.mailboxes`) and the name -> id look-up every queue call uses. */

import { requireInt } from './_checks.js';
import { ConflictError, NotFoundError } from './errors.js';
import { type Json, type Transport, field, segment } from './transport.js';

/** A mailbox's view. */
export interface MailboxView {
  id: string;
  name: string;
  mode: 'WORK' | 'INBOX' | string;
  created?: boolean;
  [field: string]: unknown;
}

async function findMailbox(transport: Transport, name: string): Promise<MailboxView | undefined> {
  const answer = await transport.request('GET', '/mailboxes', { query: { name }, safe: true });
  for (const view of field<MailboxView[]>(answer, 'mailboxes')) {
    if (view.name === name) {
      transport.mailboxIds.set(name, view.id);
      return view;
    }
  }
  return undefined;
}

/** The id of the mailbox `name`, asked once per client; NotFoundError if there is none. */
export async function mailboxId(transport: Transport, name: string): Promise<string> {
  const known = transport.mailboxIds.get(name);
  if (known !== undefined) return known;
  const view = await findMailbox(transport, name);
  if (view === undefined) throw new NotFoundError(`mailbox '${name}' not found; create it with mailboxes.ensure`);
  return view.id;
}

export class Mailboxes {
  constructor(private readonly transport: Transport) {}

  /**
   * Create the mailbox `name` if it does not exist; safe to call every time. `mode` is WORK (the
   * default) or INBOX; `backlogLimit` bounds its unfinished tasks. Returns its view with
   * `created`. ConflictError if it exists with another mode.
   */
  async ensure(name: string, options: { mode?: 'WORK' | 'INBOX'; backlogLimit?: number } = {}): Promise<MailboxView> {
    segment(name, 'mailbox name');
    const mode = options.mode ?? 'WORK';
    const body: Json = { name, mode };
    if (options.backlogLimit !== undefined) body.backlogLimit = requireInt(options.backlogLimit, 'backlogLimit', 1);
    let view: MailboxView;
    try {
      view = (await this.transport.request('POST', '/mailboxes', { body, safe: true })) as MailboxView;
    } catch (error) {
      if (!(error instanceof ConflictError)) throw error;
      const existing = await findMailbox(this.transport, name);
      if (existing === undefined) throw error;
      if (String(existing.mode).toUpperCase() !== mode.toUpperCase()) {
        throw new ConflictError(`mailbox '${name}' exists with mode ${existing.mode}, not ${mode}`);
      }
      return { ...existing, created: false };
    }
    this.transport.mailboxIds.set(name, field<string>(view, 'id'));
    return { ...view, created: true };
  }

  /**
   * Declare the work queue `name` (`PUT /mailboxes/by-name/{name}`): created when missing;
   * `maxAttempts` and `requirements` are stored when first declared. ConflictError when it was
   * declared with other settings.
   */
  async declare(name: string, options: { maxAttempts?: number; requirements?: Json } = {}): Promise<MailboxView> {
    const body: Json = {};
    if (options.maxAttempts !== undefined) body.maxAttempts = requireInt(options.maxAttempts, 'maxAttempts', 1, 100);
    if (options.requirements !== undefined) body.requirements = options.requirements;
    const view = (await this.transport.request('PUT', `/mailboxes/by-name/${segment(name, 'mailbox name')}`, {
      body,
      safe: true,
    })) as MailboxView;
    this.transport.mailboxIds.set(name, field<string>(view, 'id'));
    return view;
  }

  /** The mailbox's view; NotFoundError if there is no such queue. */
  async get(name: string): Promise<MailboxView> {
    segment(name, 'mailbox name');
    const view = await findMailbox(this.transport, name);
    if (view === undefined) throw new NotFoundError(`mailbox '${name}' not found`);
    return view;
  }
}
