// A task's page (#/tasks/<id>): its fields, why it waits (when it is queued) and its history from
// the space's event log.

import type { ComponentChildren } from "preact";
import { get, spacePath } from "../api";
import { useData, useLive } from "../live";
import type { Params } from "../routes";
import { Empty, Fields, formatAge, Loadable, Page, StateBadge, Table, Time, useNow } from "../ui";
import {
  JsonBlock,
  JsonPreview,
  MailboxLink,
  RunLink,
  type RunDiagnostics,
  type Task,
  TASK_ENDED_EVENTS,
  TaskKey,
  WorkerLink,
} from "./_shared";
import { WaitReasons } from "./Waits";
import { LOG_PAGE, LOG_PAGES_MAX, type LogEvent } from "./_charts";

type Event = LogEvent;

/** Every event of the aggregate the log still keeps, oldest first. */
async function history(aggregate: string, signal: AbortSignal): Promise<Event[]> {
  const found: Event[] = [];
  let cursor: string | null = null;
  for (let pages = 0; pages < LOG_PAGES_MAX; pages++) {
    const page: { events: Event[]; nextCursor: string } = await get(spacePath("/events"), {
      query: { aggregate, cursor, limit: LOG_PAGE }, signal,
    });
    found.push(...page.events);
    cursor = page.nextCursor;
    if (page.events.length < LOG_PAGE) break;
  }
  return found;
}

// Payload fields the other columns (or the page itself) already show.
const SHOWN_ELSEWHERE = new Set(["taskId", "state", "attempt"]);

/** What an event's payload adds to its row: "holder: worker-1", never its raw JSON. */
function EventDetails(props: { event: Event }) {
  const extra = Object.entries(props.event.payload).filter(([name, value]) => !SHOWN_ELSEWHERE.has(name) && value !== null && value !== undefined);
  if (!extra.length) return null;
  return (
    <span class="event-details" data-event-details>
      {extra.map(([name, value], index) => (
        <>{index ? ", " : null}<span class="muted">{name}:</span> {typeof value === "string" ? value : JSON.stringify(value)}</>
      ))}
    </span>
  );
}

export function EventTable(props: { events: Event[]; empty: string }) {
  return (
    <Table<Event>
      name="history"
      rows={props.events}
      rowId={(event) => event.eventId}
      empty={props.empty}
      columns={[
        { title: "When", cell: (event) => <Time value={event.createdAt} /> },
        { title: "Event", cell: (event) => <code data-event-type={event.type}>{event.type}</code> },
        { title: "State", cell: (event) => (typeof event.payload.state === "string" ? <StateBadge state={event.payload.state} /> : null) },
        { title: "Attempt", class: "num", cell: (event) => (event.payload.attempt as number | undefined) ?? "" },
        { title: "Details", cell: (event) => <EventDetails event={event} /> },
      ]}
    />
  );
}

interface Attempt {
  attempt: number;
  startedAt: number;
  endedAt: number | null; // null: running now
  holder: string | null; // null: not recorded (the log names a holder only when a lease lapses)
  ended: string; // how it ended: SUCCEEDED, FAILED, "lease lapsed", "queued again", CANCELLED...
}

/** The task's attempts from its events: each task.running opens one; a lapsed lease, a task.queued
 * (a retry or a release) or the task's end closes it. The holder of the last one is the task's
 * own (`holder` while it runs, `finishedBy` once a worker finished it). */
function attempts(events: Event[], task: Task): Attempt[] {
  const found: Attempt[] = [];
  let open: Attempt | null = null;
  for (const event of events) {
    const at = Date.parse(event.createdAt);
    if (event.type === "task.running") {
      open = { attempt: Number(event.payload.attempt), startedAt: at, endedAt: null, holder: null, ended: "running" };
      found.push(open);
    } else if (open && event.type === "delivery.lease_lost") {
      open.holder = typeof event.payload.holder === "string" ? event.payload.holder : null;
      open.ended = "lease lapsed";
      open.endedAt = at;
    } else if (open && event.type === "task.queued") {
      if (open.endedAt === null) {
        open.ended = "queued again";
        open.endedAt = at;
      }
      open = null;
    } else if (open && TASK_ENDED_EVENTS.includes(event.type)) {
      if (open.endedAt === null || open.ended === "lease lapsed") {
        open.ended = open.endedAt === null ? String(event.payload.state) : `lease lapsed, ${String(event.payload.state)}`;
        open.endedAt = open.endedAt ?? at;
      }
      open = null;
    }
  }
  const last = found[found.length - 1];
  if (last && last.holder === null && last.attempt === task.attempt) last.holder = task.holder ?? task.finishedBy;
  return found;
}

const ENDED_CLASS: Record<string, string> = { SUCCEEDED: "ok", FAILED: "bad", running: "info" };

/** A task's attempts on one time axis: who held each, when, for how long and how it ended. */
function Timeline(props: { events: Event[]; task: Task }) {
  const now = useNow();
  const rows = attempts(props.events, props.task);
  if (!rows.length) return <Empty>No attempt yet (no worker has taken it, or the log no longer keeps it).</Empty>;
  const from = rows[0].startedAt;
  const to = Math.max(now, ...rows.map((row) => row.endedAt ?? now));
  const span = Math.max(1, to - from);
  return (
    <div class="timeline" data-timeline>
      {rows.map((row) => {
        const end = row.endedAt ?? now;
        return (
          <div class="timeline-row" data-attempt={row.attempt} key={row.attempt + ":" + row.startedAt}>
            <span class="timeline-label">
              <strong>#{row.attempt}</strong>{" "}
              {row.holder ? <WorkerLink holder={row.holder} scopeId={props.task.scopeId} /> : <span class="muted" title="the event log names a holder only when its lease lapses">holder not recorded</span>}
            </span>
            <span class="timeline-track">
              <span class={`timeline-bar timeline-${ENDED_CLASS[row.ended] ?? (row.ended.startsWith("lease") ? "warn" : "muted")}`}
                style={{ left: `${(100 * (row.startedAt - from)) / span}%`, width: `max(3px, ${(100 * (end - row.startedAt)) / span}%)` }} />
            </span>
            <span class="timeline-text">
              <Time value={new Date(row.startedAt).toISOString()} />, {formatAge(end - row.startedAt)}{row.endedAt === null ? " so far" : ""}:{" "}
              <span data-ended={row.ended}>{row.ended.startsWith("lease") || row.ended.startsWith("queued") || row.ended === "running" ? row.ended : <StateBadge state={row.ended} />}</span>
            </span>
          </div>
        );
      })}
    </div>
  );
}

const ALWAYS_SHOWN = new Set(["Id", "State", "Key", "Mailbox", "Run", "Attempt"]);

/** The task's fields without the empty optional ones (a queued task has no holder, no result...). */
function shown(rows: [string, ComponentChildren][]): [string, ComponentChildren][] {
  return rows.filter(([label, value]) => ALWAYS_SHOWN.has(label) || (value !== null && value !== undefined && value !== ""));
}

export function TaskPage(props: { params: Params }) {
  const id = props.params.id;
  const task = useData((signal) => get<Task>(spacePath(`/tasks/${encodeURIComponent(id)}`), { signal }), [id]);
  const events = useData((signal) => history(`task:${id}`, signal), [id]);
  const queued = task.data?.state === "QUEUED";
  const scopeId = task.data?.scopeId ?? null;
  const diagnostics = useData(
    async (signal) => (queued && scopeId
      ? get<RunDiagnostics>(spacePath(`/ops/runs/${encodeURIComponent(scopeId)}`), { signal })
      : null),
    [queued, scopeId, task.data],
  );
  useLive({ aggregate: `task:${id}` }, () => {
    task.reload();
    events.reload();
  });
  // What a queued task waits for changes with other tasks' events (a grant released): follow its run.
  useLive(queued && scopeId ? { scopeId } : null, diagnostics.reload);
  return (
    <Page name="task" title={<>Task <code>{id}</code></>}>
      <Loadable loaded={task}>
        {(data) => (
          <>
            {data.state === "QUEUED" ? (
              <section class="why-waiting" data-section="why-waiting">
                <h2>Why is it waiting?</h2>
                <Loadable loaded={diagnostics}>
                  {(view) => <WaitReasons entry={view?.waiting.find((entry) => entry.kind === "task" && entry.taskId === id) ?? null} />}
                </Loadable>
              </section>
            ) : null}
            <Fields name="task" rows={shown([
              ["Id", <code data-task-id>{data.id}</code>],
              ["State", <StateBadge state={data.state} />],
              ["Key", <TaskKey value={data.taskKey} />],
              ["Mailbox", <MailboxLink id={data.mailboxId} name={data.mailbox} />],
              ["Run", <RunLink id={data.scopeId} />],
              ["Attempt", `${data.attempt}${data.attempts ? ` of ${data.attempts}` : ""}`],
              ["Holder", data.holder ? <WorkerLink holder={data.holder} scopeId={data.scopeId} /> : null],
              ["Lease expires", data.leaseExpiresAt ? <Time value={data.leaseExpiresAt} /> : null],
              ["Error", data.error ? <span class="error-text" data-task-error>{data.error}</span> : null],
              ["Outcome reason", data.outcomeReason],
              ["Finished by", data.finishedBy],
              ["Deadline", data.deadline ? <Time value={data.deadline} /> : null],
              ["Created", <Time value={data.createdAt} />],
              ["Finished", data.finishedAt ? <Time value={data.finishedAt} /> : null],
              ["Subscribers", data.subscribers.length ? data.subscribers.join(", ") : null],
              ["Needs", data.needs ? <JsonPreview value={data.needs} maxChars={120} /> : null],
            ])} />
            <div class="two-columns">
              <div>
                <h2>Input</h2>
                <JsonBlock value={data.input} name="input" />
              </div>
              <div>
                <h2>Result</h2>
                <JsonBlock value={data.outcome} name="outcome" />
              </div>
            </div>
          </>
        )}
      </Loadable>
      <h2>Attempts</h2>
      <Loadable loaded={events}>
        {(found) => (task.data ? <Timeline events={found} task={task.data} /> : null)}
      </Loadable>
      <h2>History</h2>
      <Loadable loaded={events}>
        {(found) => <EventTable events={found} empty="The event log keeps no event of this task (it keeps the last hour)." />}
      </Loadable>
    </Page>
  );
}
