// Small shared components. Test hooks: a page's root has data-page, a table data-table with rows
// data-row, action buttons data-action, error boxes data-error.

import type { ComponentChildren, TargetedEvent } from "preact";
import { useEffect, useState } from "preact/hooks";
import { describe } from "./api";
import type { Loaded } from "./live";

export function Page(props: { name: string; title: ComponentChildren; actions?: ComponentChildren; children?: ComponentChildren }) {
  return (
    <section class="page" data-page={props.name}>
      <header class="page-head">
        <h1>{props.title}</h1>
        {props.actions ? <div class="page-actions">{props.actions}</div> : null}
      </header>
      {props.children}
    </section>
  );
}

export interface Column<T> {
  title: string;
  cell: (row: T) => ComponentChildren;
  class?: string;
}

export function Table<T>(props: {
  name: string;
  rows: T[];
  rowId: (row: T) => string;
  columns: Column<T>[];
  empty?: ComponentChildren;
  onRow?: (row: T) => void;
}) {
  if (props.rows.length === 0) return <Empty>{props.empty ?? "Nothing here yet."}</Empty>;
  return (
    <div class="table-wrap">
      <table data-table={props.name}>
        <thead>
          <tr>
            {props.columns.map((column) => (
              <th class={column.class}>{column.title}</th>
            ))}
          </tr>
        </thead>
        <tbody>
          {props.rows.map((row) => (
            <tr data-row={props.rowId(row)} key={props.rowId(row)} class={props.onRow ? "clickable" : undefined}
              onClick={props.onRow ? () => props.onRow!(row) : undefined}>
              {props.columns.map((column) => (
                <td class={column.class}>{column.cell(row)}</td>
              ))}
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** Key-value rows (a run's status, a task's fields). */
export function Fields(props: { name?: string; rows: [string, ComponentChildren][] }) {
  return (
    <dl class="fields" data-fields={props.name}>
      {props.rows.map(([label, value]) => (
        <div class="field" data-field={label}>
          <dt>{label}</dt>
          <dd>{value ?? "—"}</dd>
        </div>
      ))}
    </dl>
  );
}

const SECOND = 1000;

export function formatAge(ms: number): string {
  const s = Math.max(0, Math.round(ms / SECOND));
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${m % 60}m`;
  return `${Math.floor(h / 24)}d ${h % 24}h`;
}

/** Re-renders every `ms` (for ages that grow while the page is open). */
export function useNow(ms = SECOND): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const id = window.setInterval(() => setNow(Date.now()), ms);
    return () => window.clearInterval(id);
  }, [ms]);
  return now;
}

/** An ISO time as local time, with its age (or time left) on hover and beside it. */
export function Time(props: { value: string | null | undefined; relative?: boolean }) {
  const now = useNow();
  if (!props.value) return <span class="muted">—</span>;
  const at = Date.parse(props.value);
  if (Number.isNaN(at)) return <span>{props.value}</span>;
  const delta = at - now;
  const relative = delta >= 0 ? `in ${formatAge(delta)}` : `${formatAge(-delta)} ago`;
  return (
    <time dateTime={props.value} title={props.value}>
      {new Date(at).toLocaleString()} <span class="muted">({relative})</span>
    </time>
  );
}

/** How long ago an ISO time was ("12s", "3m 4s"). */
export function Age(props: { since: string | null | undefined }) {
  const now = useNow();
  if (!props.since) return <span class="muted">—</span>;
  const at = Date.parse(props.since);
  if (Number.isNaN(at)) return <span>{props.since}</span>;
  return <span title={props.since}>{formatAge(now - at)}</span>;
}

const STATE_CLASS: Record<string, string> = {
  INACTIVE: "warn", REVOKED: "bad", ACTIVE: "info", RUNNING: "info", QUEUED: "muted", PENDING: "muted", WAITING: "warn", IN_FLIGHT: "info", DELIVERED: "info",
  COMPLETED: "ok", SUCCEEDED: "ok", DONE: "ok", RELEASED: "ok", FIRED: "ok", OPEN: "info",
  CANCELLED: "bad", FAILED: "bad", EXPIRED: "bad", DEAD: "bad", DOWN: "bad", TIMED_OUT: "bad",
  LEADER: "ok", FOLLOWER: "muted", CANDIDATE: "warn", UP: "ok",
  // pages: groups, barriers, timers, capacity, messages
  SUCCESS: "ok", FAILURE: "bad", ACCEPTED: "ok", REJECTED: "bad", FINALIZED: "ok", SEALED: "warn", ARMED: "info",
  ACKED: "ok", LEASED: "info", SIGNALED: "info", GRANTED: "ok", SETTLED: "ok", VOIDED: "muted", STALE: "warn",
};

export function StateBadge(props: { state: string | null | undefined }) {
  const state = props.state ?? "—";
  const kind = STATE_CLASS[state.toUpperCase()] ?? "muted";
  return <span class={`badge badge-${kind}`} data-state={state}>{state}</span>;
}

export function Empty(props: { children?: ComponentChildren }) {
  return <p class="empty" data-empty>{props.children ?? "Nothing here yet."}</p>;
}

export function Loading() {
  return <p class="loading" data-loading>Loading…</p>;
}

export function ErrorBox(props: { error: unknown; children?: ComponentChildren }) {
  if (!props.error) return null;
  return (
    <div class="error-box" role="alert" data-error>
      {describe(props.error)}
      {props.children}
    </div>
  );
}

/** Loading, error or the data (an error with data kept shows both: the last data and the box). */
export function Loadable<T>(props: { loaded: Loaded<T>; children: (data: T) => ComponentChildren }) {
  const { data, error, loading, reload } = props.loaded;
  if (data === undefined) {
    if (error) {
      return (
        <ErrorBox error={error}>
          {" "}
          <button type="button" class="retry" data-action="retry" onClick={reload}>Retry</button>
        </ErrorBox>
      );
    }
    if (loading) return <Loading />;
    return <Empty />;
  }
  return (
    <>
      {error ? <ErrorBox error={error} /> : null}
      {props.children(data)}
    </>
  );
}

/** A button that asks once more before it acts; shows the action's error next to it. */
export function ConfirmButton(props: {
  action: string;
  label: ComponentChildren;
  question: ComponentChildren;
  onConfirm: () => Promise<unknown>;
  danger?: boolean;
  disabled?: boolean;
}) {
  const [asking, setAsking] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(null);
  const confirm = async () => {
    setBusy(true);
    setError(null);
    try {
      await props.onConfirm();
      setAsking(false);
    } catch (failure) {
      setError(failure);
    } finally {
      setBusy(false);
    }
  };
  return (
    <span class="confirm">
      {asking ? (
        <span class="confirm-ask" data-confirm={props.action}>
          <span>{props.question}</span>
          <button type="button" class={props.danger ? "danger" : "primary"} data-action="confirm" disabled={busy} onClick={confirm}>
            {busy ? "Working…" : "Yes"}
          </button>
          <button type="button" data-action="dismiss" disabled={busy} onClick={() => setAsking(false)}>
            No
          </button>
        </span>
      ) : (
        <button type="button" class={props.danger ? "danger" : undefined} data-action={props.action}
          disabled={props.disabled} onClick={() => setAsking(true)}>
          {props.label}
        </button>
      )}
      {error ? <ErrorBox error={error} /> : null}
    </span>
  );
}

export function CopyButton(props: { text: string }) {
  const [copied, setCopied] = useState(false);
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(props.text);
      setCopied(true);
    } catch {
      setCopied(false);
    }
  };
  return (
    <button type="button" data-action="copy" onClick={copy}>
      {copied ? "Copied" : "Copy"}
    </button>
  );
}

/** A search/filter row above a list. */
export function Filters(props: { children: ComponentChildren }) {
  return <form class="filters" onSubmit={(event: TargetedEvent<HTMLFormElement>) => event.preventDefault()}>{props.children}</form>;
}
