// What the Queues, Tasks, Groups, Capacity and Waits pages share: the views they read (as the API
// answers them), links from one entity to another, and small renderers.

import type { ComponentChildren } from "preact";
import { useEffect, useRef, useState } from "preact/hooks";
import { get, spacePath } from "../api";
import { type Loaded, useData } from "../live";
import { href } from "../router";
import { ErrorBox } from "../ui";

// ---- the API's views (only the fields the pages read) -------------------------------------------

export interface MailboxStats {
  queued: number;
  inFlight: number;
  oldestQueuedAgeSeconds: number | null;
  succeeded: number;
  failed: number;
  cancelled: number;
  expired: number;
  attemptsTotal: number;
}

export interface Mailbox {
  id: string;
  name: string;
  mode: string;
  backlogLimit: number | null;
  maxAttempts: number | null;
  requirements: unknown;
  stats?: MailboxStats;
}

export interface Task {
  id: string;
  scopeId: string;
  mailboxId: string | null;
  mailbox: string;
  taskKey: string;
  state: string;
  done: boolean;
  attempt: number;
  attempts: number;
  input: unknown;
  outcome: unknown;
  outcomeReason: string | null;
  error: string | null;
  holder: string | null;
  holderSession: string | null;
  leaseExpiresAt: string | null;
  deadline: string | null;
  subscribers: string[];
  createdAt: string;
  finishedAt: string | null;
  finishedBy: string | null;
  needs: unknown;
}

export interface Paged {
  nextCursor: string | null;
}

export interface Holder {
  holder: string | null;
  units: number;
  scopeId: string;
  taskId: string | null;
  leaseExpiresAt: string | null;
}

/** What something waits for (GET /ops/...): a permit, an allowance, a budget, a retry, a worker. */
export interface WaitsFor {
  kind: string;
  name?: string;
  permitId?: string;
  allowanceId?: string;
  unitsTotal?: number;
  unitsInUse?: number;
  unitsSetAside?: number;
  waitersInLine?: number;
  heldBy?: Holder[];
  units?: number;
  windowMs?: number;
  availableAt?: string | null;
  cooldownUntil?: string | null;
  cooldownReason?: string | null;
  remainingMinor?: string;
  scale?: number;
  currency?: string;
  until?: string;
  mailbox?: string;
}

/** One thing that waits (GET /ops/waits, GET /ops/runs/{id}). */
export interface Waiting {
  kind: string; // task, permitWaiter, allowanceWaiter, barrier, timer
  taskId?: string;
  waiterId?: string;
  barrierId?: string;
  timerId?: string;
  scopeId?: string;
  mailbox?: string;
  attempt?: number;
  holder?: string | null;
  units?: number;
  state?: string;
  position?: number;
  permit?: string;
  allowance?: string;
  name?: string | null;
  arrivals?: number;
  target?: number;
  epoch?: number;
  fireAt?: string;
  waitsFor?: WaitsFor[];
}

export interface Worker {
  holder: string;
  sessions: string[];
  keys: string[];
  tasks: string[];
  grants: { grantId: string; permit: string; permitId: string; units: number }[];
  reservations: { reservationId: string; budget: string; heldMinor: string; state: string }[];
  earliestLeaseExpiry: string | null;
}

export interface RunDiagnostics {
  rootScopeId: string;
  scopes: { id: string; name: string | null; parentId: string | null; storedState: string; effective: string }[];
  workers: Worker[];
  waiting: Waiting[];
  truncated: boolean;
}

export interface SpaceWaits {
  waiting: Waiting[];
  truncated: boolean;
}

// Task events: the live pages reload on them; the ones that end a task count as throughput.
export const TASK_ENDED_EVENTS = ["task.succeeded", "task.failed", "task.cancelled", "task.expired"];
export const TASK_EVENTS = ["task.created", "task.queued", "task.running", "delivery.lease_lost", ...TASK_ENDED_EVENTS];
export const TASK_STATES = ["QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"];

// ---- links ----------------------------------------------------------------------------------------

export function RunLink(props: { id: string | null | undefined }) {
  if (!props.id) return <span class="muted">—</span>;
  return <a href={href("runs", props.id)} data-link="run" class="mono">{props.id}</a>;
}

export function TaskLink(props: { id: string | null | undefined; children?: ComponentChildren }) {
  if (!props.id) return <span class="muted">—</span>;
  return <a href={href("tasks", props.id)} data-link="task" class="mono">{props.children ?? props.id}</a>;
}

export function MailboxLink(props: { id: string | null | undefined; name: string }) {
  if (!props.id) return <span>{props.name}</span>;
  return <a href={href("queues", props.id)} data-link="mailbox">{props.name}</a>;
}

/** A worker (holder) is shown in its run's diagnostics, where its leases are listed. */
export function WorkerLink(props: { holder: string | null | undefined; scopeId: string | null | undefined }) {
  if (!props.holder) return <span class="muted">—</span>;
  if (!props.scopeId) return <span class="mono">{props.holder}</span>;
  const query = new URLSearchParams({ scopeId: props.scopeId, holder: props.holder });
  return <a href={`#/waits?${query}`} data-link="worker" class="mono">{props.holder}</a>;
}

export function ResourceLink(props: { kind: "permits" | "allowances" | "budgets"; id: string | null | undefined; name: string }) {
  if (!props.id) return <span>{props.name}</span>;
  return <a href={href(props.kind, props.id)} data-link={props.kind.slice(0, -1)}>{props.name}</a>;
}

// ---- renderers ------------------------------------------------------------------------------------

/** A JSON value, shortened to `maxChars` in a table cell (the whole value on hover). */
export function JsonPreview(props: { value: unknown; maxChars?: number }) {
  if (props.value === null || props.value === undefined) return <span class="muted">—</span>;
  const text = JSON.stringify(props.value);
  const max = props.maxChars ?? 60;
  return <code class="json-preview" title={text.length > max ? text : undefined}>{text.length > max ? `${text.slice(0, max)}…` : text}</code>;
}

export function JsonBlock(props: { value: unknown; name?: string }) {
  if (props.value === null || props.value === undefined) return <span class="muted">—</span>;
  return <pre class="json" data-json={props.name}>{JSON.stringify(props.value, null, 2)}</pre>;
}

/** Minor units (a decimal-digit string) as an exact amount of `scale` decimals, zeros past the
 * second decimal dropped: "12345", 2 -> "123.45"; "1250000", 6 -> "1.25". */
export function formatMinor(minor: string | null | undefined, scale: number, currency?: string): string {
  if (minor === null || minor === undefined) return "—";
  const digits = minor.replace(/^0+(?=\d)/, "").padStart(scale + 1, "0");
  const fraction = scale > 0 ? digits.slice(-scale).replace(/0+$/, "").padEnd(Math.min(2, scale), "0") : "";
  const amount = fraction ? `${digits.slice(0, digits.length - scale)}.${fraction}` : digits.slice(0, digits.length - scale);
  return currency ? `${amount} ${currency}` : amount;
}

/** What the money of each budget is counted in, by the budget's name (GET /budgets), for the views
 * that name a budget with an amount of minor units only (a worker's reservations). */
export type Money = Map<string, { scale: number; currency: string }>;

export function useMoney(): Money {
  const loaded = useData(async (signal) => {
    const found = await get<{ budgets: { name: string; scale: number; currency: string }[] }>(spacePath("/budgets"), { signal });
    return new Map(found.budgets.map((budget) => [budget.name, { scale: budget.scale, currency: budget.currency }]));
  }, []);
  return loaded.data ?? new Map();
}

/** An amount of minor units of the budget `name` as money ("3.50 USD"); the bare number only while
 * the budget's scale is not known. */
export function formatMoney(money: Money, name: string, minor: string): string {
  const unit = money.get(name);
  return unit ? formatMinor(minor, unit.scale, unit.currency) : minor;
}

// A task with no key of its own is keyed by the SHA-256 of its input (64 hex digits); `once` and
// `queue` keys end in the first 32 hex digits of their arguments' hash.
const INPUT_HASH = /^[0-9a-f]{64}$/;
const NAMED_HASH = /^(.+):([0-9a-f]{32})$/;
const HASH_SHOWN_CHARS = 8;
const KEY_SHOWN_CHARS_MAX = 48;

/** A task's key as a reader tells it apart: "unkeyed" (and the start of its input's hash) for a
 * task submitted without a key, `name:1a2b3c4d…` for a once or queue key, the whole key on hover. */
export function TaskKey(props: { value: string | null | undefined }) {
  const key = props.value;
  if (!key) return <span class="muted">—</span>;
  if (INPUT_HASH.test(key)) {
    return <span class="task-key" title={`no key: the hash of its input, ${key}`} data-task-key="unkeyed">
      <span class="muted">unkeyed</span> <code class="muted">{key.slice(0, HASH_SHOWN_CHARS)}</code></span>;
  }
  const named = NAMED_HASH.exec(key);
  const shown = named ? `${named[1]}:${named[2].slice(0, HASH_SHOWN_CHARS)}…`
    : key.length > KEY_SHOWN_CHARS_MAX ? `${key.slice(0, KEY_SHOWN_CHARS_MAX)}…` : key;
  return <code class="task-key" title={shown === key ? undefined : key} data-task-key={key}>{shown}</code>;
}

const ERROR_SHOWN_CHARS_MAX = 160;

/** An error message in a table cell: wrapped in a readable width, cut past 160 characters (the whole
 * message on hover and on the task's page). */
export function ErrorText(props: { value: string | null | undefined }) {
  if (!props.value) return <span class="muted">—</span>;
  const text = props.value;
  const cut = text.length > ERROR_SHOWN_CHARS_MAX;
  return <span class="error-text error-cell" title={cut ? text : undefined} data-error-text>
    {cut ? `${text.slice(0, ERROR_SHOWN_CHARS_MAX)}…` : text}</span>;
}

/** The hash query's value of `name` ("#/groups?scopeId=x"). */
export function hashParam(name: string): string | null {
  const at = location.hash.indexOf("?");
  return new URLSearchParams(at < 0 ? "" : location.hash.slice(at + 1)).get(name);
}

/** The hash with `name` set to `value` (or removed when empty), for filters kept in the URL. */
export function withHashParam(name: string, value: string | null): string {
  const at = location.hash.indexOf("?");
  const base = at < 0 ? location.hash : location.hash.slice(0, at);
  const query = new URLSearchParams(at < 0 ? "" : location.hash.slice(at + 1));
  if (value) query.set(name, value);
  else query.delete(name);
  const text = query.toString();
  return text ? `${base}?${text}` : base;
}

/** Calls `action` every `ms` while the page is open (things that change without an event: ages,
 * rate windows, barrier arrivals). */
export function useEvery(ms: number, action: () => void): void {
  const ref = useRef(action);
  ref.current = action;
  useEffect(() => {
    const id = window.setInterval(() => ref.current(), ms);
    return () => window.clearInterval(id);
  }, [ms]);
}

/** `action`, called at most once every `ms` (a call within that time runs once it has passed):
 * for pages whose reload costs many requests or a scan (capacity, waits) in a busy space. */
export function useThrottled(ms: number, action: () => void): () => void {
  const ref = useRef(action);
  ref.current = action;
  const last = useRef(0);
  const pending = useRef<number | null>(null);
  useEffect(() => () => {
    if (pending.current !== null) window.clearTimeout(pending.current);
  }, []);
  return () => {
    if (pending.current !== null) return;
    const wait = last.current + ms - Date.now();
    const run = () => {
      pending.current = null;
      last.current = Date.now();
      ref.current();
    };
    if (wait <= 0) run();
    else pending.current = window.setTimeout(run, wait);
  };
}

const LIST_PAGE = 100;

/** A page of a list read (GET /tasks, /task-groups, /barriers, /timers: newest first, `field` the
 * list, `nextCursor` to resume) for the filters in `query`, and a "More" footer that appends the
 * next page. Reloading (a live update) starts again from the newest page. */
export function usePaged<T>(path: string, field: string, query: Record<string, string | null>): {
  loaded: Loaded<T[]>;
  rows: (first: T[]) => T[];
  footer: ComponentChildren;
} {
  const [more, setMore] = useState<T[]>([]);
  const [cursor, setCursor] = useState<string | null>(null);
  const [moreError, setMoreError] = useState<unknown>(null);
  const fetchPage = (after: string | null, signal?: AbortSignal) =>
    get<Paged & Record<string, T[]>>(spacePath(path), { query: { ...query, limit: LIST_PAGE, cursor: after }, signal });
  const loaded = useData(async (signal) => {
    const page = await fetchPage(null, signal);
    setMore([]);
    setCursor(page.nextCursor);
    return page[field] as T[];
  }, [path, JSON.stringify(query)]);
  const loadMore = async () => {
    if (!cursor) return;
    try {
      const page = await fetchPage(cursor);
      setMore((old) => [...old, ...(page[field] as T[])]);
      setCursor(page.nextCursor);
      setMoreError(null);
    } catch (error) {
      setMoreError(error);
    }
  };
  const footer = (
    <>
      {cursor ? <button type="button" data-action="more" onClick={loadMore}>More</button> : null}
      <ErrorBox error={moreError} />
    </>
  );
  return { loaded, rows: (first) => [...first, ...more], footer };
}
