// Workers (#/workers): every holder the space has seen lately, what each holds now and when it was
// last seen. Read from what the node keeps: the newest tasks (a running task's holder, a finished
// one's finishedBy and finishedAt), the event log's last hour (lapsed leases, permit grants and
// releases, allowance units: each names its holder) and, for the runs with running tasks, the run's
// diagnostics (the keys, grants and reservations each holder has).

import { get, spacePath } from "../api";
import { useData, useLive } from "../live";
import { Age, Loadable, Page, Table, Time } from "../ui";
import { useEventLog } from "./_charts";
import {
  formatMoney,
  ResourceLink,
  type RunDiagnostics,
  type Task,
  TASK_EVENTS,
  TaskKey,
  TaskLink,
  useEvery,
  useMoney,
  useThrottled,
  type Worker as Holding,
  WorkerLink,
} from "./_shared";

const HOUR_MS = 3_600_000;
const TASKS_READ = 500; // the newest tasks of the space: one page
const RUNS_READ_MAX = 20; // runs with running tasks whose diagnostics are read
const HOLDER_EVENTS = ["delivery.lease_lost", "permit.granted", "permit.released", "permit.lease_lost", "allowance.consumed"];
const RELOAD_MS_MIN = 2_000;
const REFRESH_MS = 10_000; // leases lapse without an event

interface Seen {
  holder: string;
  running: Task[];
  holding: Holding | null;
  lastSeenAt: number | null; // null: holds a lease now
  succeeded: number;
  failed: number;
  leasesLost: number;
}

async function loadWorkers(signal: AbortSignal): Promise<{ tasks: Task[]; diagnostics: RunDiagnostics[] }> {
  const [newest, running] = await Promise.all([
    get<{ tasks: Task[] }>(spacePath("/tasks"), { query: { limit: TASKS_READ }, signal }),
    get<{ tasks: Task[] }>(spacePath("/tasks"), { query: { state: "RUNNING", limit: TASKS_READ }, signal }),
  ]);
  const runs = [...new Set(running.tasks.map((task) => task.scopeId))].slice(0, RUNS_READ_MAX);
  const diagnostics = await Promise.all(runs.map((run) =>
    get<RunDiagnostics>(spacePath(`/ops/runs/${encodeURIComponent(run)}`), { signal }).catch(() => null)));
  const byId = new Map([...newest.tasks, ...running.tasks].map((task) => [task.id, task]));
  return { tasks: [...byId.values()], diagnostics: diagnostics.filter((view): view is RunDiagnostics => view !== null) };
}

function merge(into: Holding | null, more: Holding): Holding {
  if (into === null) return { ...more };
  const union = <T,>(a: T[], b: T[], key: (item: T) => string) => [...new Map([...a, ...b].map((item) => [key(item), item])).values()];
  return {
    holder: into.holder,
    sessions: union(into.sessions, more.sessions, String),
    keys: union(into.keys, more.keys, String),
    tasks: union(into.tasks, more.tasks, String),
    grants: union(into.grants, more.grants, (grant) => grant.grantId),
    reservations: union(into.reservations, more.reservations, (row) => row.reservationId),
    earliestLeaseExpiry: [into.earliestLeaseExpiry, more.earliestLeaseExpiry].filter(Boolean).sort()[0] ?? null,
  };
}

export function WorkersPage() {
  const loaded = useData(loadWorkers, []);
  const log = useEventLog([...HOLDER_EVENTS, ...TASK_EVENTS], HOUR_MS);
  const money = useMoney();
  const reload = useThrottled(RELOAD_MS_MIN, () => {
    loaded.reload();
    log.reload();
  });
  useLive({ types: [...HOLDER_EVENTS, ...TASK_EVENTS] }, reload);
  useEvery(REFRESH_MS, reload);
  return (
    <Page name="workers" title="Workers">
      <p class="muted small">Every holder seen in the last hour: the newest {TASKS_READ} tasks, the event log and the diagnostics of the runs with running tasks.</p>
      <Loadable loaded={loaded}>
        {({ tasks, diagnostics }) => {
          const seen = new Map<string, Seen>();
          const entry = (holder: string): Seen => {
            let found = seen.get(holder);
            if (!found) {
              found = { holder, running: [], holding: null, lastSeenAt: 0, succeeded: 0, failed: 0, leasesLost: 0 };
              seen.set(holder, found);
            }
            return found;
          };
          const saw = (found: Seen, at: number) => {
            if (found.lastSeenAt !== null && at > found.lastSeenAt) found.lastSeenAt = at;
          };
          for (const task of tasks) {
            if (task.state === "RUNNING" && task.holder) {
              const found = entry(task.holder);
              found.running.push(task);
              found.lastSeenAt = null;
            } else if (task.finishedBy && task.finishedAt) {
              const found = entry(task.finishedBy);
              saw(found, Date.parse(task.finishedAt));
              if (task.state === "SUCCEEDED") found.succeeded += 1;
              if (task.state === "FAILED") found.failed += 1;
            }
          }
          for (const event of log.data ?? []) {
            const holder = event.payload.holder;
            if (typeof holder !== "string" || !holder) continue;
            const found = entry(holder);
            saw(found, Date.parse(event.createdAt));
            if (event.type === "delivery.lease_lost") found.leasesLost += 1;
          }
          for (const view of diagnostics) {
            for (const holding of view.workers) {
              const found = entry(holding.holder);
              found.holding = merge(found.holding, holding);
              found.lastSeenAt = null;
            }
          }
          const rows = [...seen.values()].sort((a, b) => (a.lastSeenAt ?? Infinity) === (b.lastSeenAt ?? Infinity)
            ? a.holder.localeCompare(b.holder) : (b.lastSeenAt ?? Infinity) - (a.lastSeenAt ?? Infinity));
          return (
            <Table<Seen>
              name="workers"
              rows={rows}
              rowId={(row) => row.holder}
              empty="No worker seen in the last hour (a worker shows once it takes a task, a permit or allowance units)."
              columns={[
                { title: "Worker", cell: (row) => <WorkerLink holder={row.holder} scopeId={row.running[0]?.scopeId ?? null} /> },
                {
                  title: "Last seen",
                  cell: (row) => (row.lastSeenAt === null
                    ? <span class="badge badge-info" data-last-seen="now">holds a lease now</span>
                    : <span data-last-seen="before"><Age since={new Date(row.lastSeenAt).toISOString()} /> ago</span>),
                },
                {
                  title: "Running",
                  cell: (row) => (row.running.length
                    ? row.running.map((task) => <div><TaskLink id={task.id}><TaskKey value={task.taskKey} /></TaskLink></div>)
                    : <span class="muted">—</span>),
                },
                {
                  title: "Holds",
                  cell: (row) => {
                    const holding = row.holding;
                    const parts = [
                      ...(holding?.grants ?? []).map((grant) => <div>permit <ResourceLink kind="permits" id={grant.permitId} name={grant.permit} /> × {grant.units}</div>),
                      ...(holding?.reservations ?? []).map((reservation) => <div data-reservation>{reservation.budget}: {formatMoney(money, reservation.budget, reservation.heldMinor)}</div>),
                      ...(holding?.keys ?? []).filter((key) => !row.running.some((task) => task.taskKey === key)).map((key) => <div>key <TaskKey value={key} /></div>),
                    ];
                    return parts.length ? parts : <span class="muted">—</span>;
                  },
                },
                { title: "Lease until", cell: (row) => (row.holding?.earliestLeaseExpiry ? <Time value={row.holding.earliestLeaseExpiry} /> : <span class="muted">—</span>) },
                { title: "Succeeded", class: "num", cell: (row) => <span data-succeeded>{row.succeeded}</span> },
                { title: "Failed", class: "num", cell: (row) => row.failed },
                { title: "Leases lapsed", class: "num", cell: (row) => row.leasesLost },
              ]}
            />
          );
        }}
      </Loadable>
    </Page>
  );
}
