// Why is it waiting (#/waits): everything of the space that waits on a resource (GET /ops/waits),
// or with ?scopeId= a run's diagnostics (GET /ops/runs/{id}): its workers and what they hold, and
// what waits, for what, held by whom; each resource, holder, task and run linked.

import type { ComponentChildren } from "preact";
import { get, spacePath } from "../api";
import { useData, useLive } from "../live";
import { href } from "../router";
import { Empty, Fields, Filters, Loadable, Page, StateBadge, Table, Time } from "../ui";
import {
  formatMinor,
  formatMoney,
  hashParam,
  type Money,
  type Holder,
  ResourceLink,
  RunLink,
  type RunDiagnostics,
  type SpaceWaits,
  TaskKey,
  TaskLink,
  useEvery,
  useMoney,
  useThrottled,
  type Waiting,
  type WaitsFor,
  type Worker,
  WorkerLink,
} from "./_shared";

const REFRESH_MS = 5_000; // windows open and leases lapse without an event
const RELOAD_MS_MIN = 1_000; // every event of the space may change what waits: a view a second at most

function Holders(props: { holders: Holder[] | undefined }) {
  if (!props.holders?.length) return <span class="muted">nobody holds it</span>;
  return (
    <ul class="holders" data-holders>
      {props.holders.map((holder) => (
        <li data-holder={holder.holder ?? ""}>
          held by <WorkerLink holder={holder.holder} scopeId={holder.scopeId} />
          {holder.taskId ? <> for task <TaskLink id={holder.taskId} /></> : null}
          {" in run "}<RunLink id={holder.scopeId} />
          {` (${holder.units} unit${holder.units === 1 ? "" : "s"})`}
          {holder.leaseExpiresAt ? <>, lease until <Time value={holder.leaseExpiresAt} /></> : null}
        </li>
      ))}
    </ul>
  );
}

/** One thing a waiter waits for, with who holds it. */
export function WaitsForItem(props: { need: WaitsFor }) {
  const need = props.need;
  let body: ComponentChildren;
  switch (need.kind) {
    case "permit":
      body = (
        <>
          permit <ResourceLink kind="permits" id={need.permitId} name={need.name ?? "?"} />: {need.unitsInUse} of{" "}
          {need.unitsTotal} units in use{need.unitsSetAside ? `, ${need.unitsSetAside} set aside` : ""}
          {need.waitersInLine ? `, ${need.waitersInLine} in line` : ""}
          <Holders holders={need.heldBy} />
        </>
      );
      break;
    case "allowance":
      body = (
        <>
          allowance <ResourceLink kind="allowances" id={need.allowanceId} name={need.name ?? "?"} />: {need.units} units per{" "}
          {Math.round((need.windowMs ?? 0) / 1000)} s, next units <Time value={need.availableAt ?? null} />
          {need.cooldownUntil ? <> (cooldown until <Time value={need.cooldownUntil} />{need.cooldownReason ? `: ${need.cooldownReason}` : ""})</> : null}
        </>
      );
      break;
    case "budget":
      body = <>budget {need.name}: {formatMinor(need.remainingMinor, need.scale ?? 0, need.currency)} left</>;
      break;
    case "retry":
      body = <>its retry backoff, until <Time value={need.until ?? null} /></>;
      break;
    case "worker":
      body = <>a worker to take it from mailbox <code>{need.mailbox}</code>: nothing holds it back, no worker has asked</>;
      break;
    default:
      body = <code>{JSON.stringify(need)}</code>;
  }
  return <li class="waits-for" data-waits-for={need.kind}>{body}</li>;
}

/** Why one task (or waiter) waits; `null`: it does not wait on anything the node can name. */
export function WaitReasons(props: { entry: Waiting | null }) {
  if (props.entry === null) return <Empty>Nothing it waits for right now (it may be about to start).</Empty>;
  return <ul class="waits" data-waits>{(props.entry.waitsFor ?? []).map((need) => <WaitsForItem need={need} />)}</ul>;
}

function Who(props: { entry: Waiting }) {
  const entry = props.entry;
  switch (entry.kind) {
    case "task":
      return <>task <TaskLink id={entry.taskId} /> (mailbox <code>{entry.mailbox}</code>, attempt {entry.attempt})</>;
    case "permitWaiter":
      return <>{entry.holder ? <WorkerLink holder={entry.holder} scopeId={entry.scopeId} /> : "a waiter"} for {entry.units} unit(s) of {entry.permit}, #{(entry.position ?? 0) + 1} in line <StateBadge state={entry.state} /></>;
    case "allowanceWaiter":
      return <>{entry.holder ? <WorkerLink holder={entry.holder} scopeId={entry.scopeId} /> : "a waiter"} for {entry.units} unit(s) of {entry.allowance}, #{(entry.position ?? 0) + 1} in line</>;
    case "barrier":
      return <>barrier {entry.name ?? entry.barrierId}: {entry.arrivals} of {entry.target} arrived (epoch {entry.epoch})</>;
    case "timer":
      return <>timer <code>{entry.timerId}</code>, fires <Time value={entry.fireAt ?? null} /></>;
    default:
      return <code>{entry.kind}</code>;
  }
}

function entryId(entry: Waiting): string {
  return entry.taskId ?? entry.waiterId ?? entry.barrierId ?? entry.timerId ?? entry.kind;
}

export function WaitingTable(props: { waiting: Waiting[]; empty: string }) {
  return (
    <Table<Waiting>
      name="waiting"
      rows={props.waiting}
      rowId={entryId}
      empty={props.empty}
      columns={[
        { title: "What waits", cell: (entry) => <Who entry={entry} /> },
        { title: "Run", cell: (entry) => <RunLink id={entry.scopeId} /> },
        { title: "Waits for", cell: (entry) => (entry.waitsFor?.length
          ? <ul class="waits">{entry.waitsFor.map((need) => <WaitsForItem need={need} />)}</ul>
          : <span class="muted">{entry.kind === "barrier" ? "more arrivals" : entry.kind === "timer" ? "its time" : "—"}</span>) },
      ]}
    />
  );
}

/** A run's workers and what each holds (GET /ops/runs/{id}); the run's page shows it too. */
export function Workers(props: { workers: Worker[]; selected: string | null; money: Money }) {
  return (
    <Table<Worker>
      name="workers"
      rows={props.workers}
      rowId={(worker) => worker.holder}
      empty="No worker holds anything in this run."
      columns={[
        { title: "Worker", cell: (worker) => <strong class={worker.holder === props.selected ? "selected" : undefined} data-worker={worker.holder}>{worker.holder}</strong> },
        { title: "Tasks", cell: (worker) => worker.tasks.length ? worker.tasks.map((id) => <div><TaskLink id={id} /></div>) : <span class="muted">—</span> },
        { title: "Keys held", cell: (worker) => worker.keys.length ? worker.keys.map((key) => <div><TaskKey value={key} /></div>) : <span class="muted">—</span> },
        { title: "Grants", cell: (worker) => worker.grants.length ? worker.grants.map((grant) => <div><ResourceLink kind="permits" id={grant.permitId} name={grant.permit} /> × {grant.units}</div>) : <span class="muted">—</span> },
        { title: "Reservations", cell: (worker) => worker.reservations.length ? worker.reservations.map((row) => <div data-reservation>{row.budget}: {formatMoney(props.money, row.budget, row.heldMinor)} <StateBadge state={row.state} /></div>) : <span class="muted">—</span> },
        { title: "Earliest lease expiry", cell: (worker) => <Time value={worker.earliestLeaseExpiry} /> },
      ]}
    />
  );
}

/** A run's diagnostics (GET /ops/runs/{id}), live: its workers and what they hold (only `holder`'s
 * when given) and what waits in it. Embeddable: a run's page may show it. */
export function RunWaits(props: { scopeId: string; holder: string | null }) {
  const loaded = useData(
    (signal) => get<RunDiagnostics>(spacePath(`/ops/runs/${encodeURIComponent(props.scopeId)}`), { signal }), [props.scopeId],
  );
  const money = useMoney();
  const reload = useThrottled(RELOAD_MS_MIN, loaded.reload);
  useLive({ scopeId: props.scopeId }, reload);
  useEvery(REFRESH_MS, reload);
  return (
    <Loadable loaded={loaded}>
      {(view) => {
        const workers = props.holder ? view.workers.filter((worker) => worker.holder === props.holder) : view.workers;
        return (
          <>
            <Fields name="run" rows={[
              ["Run", <RunLink id={view.rootScopeId} />],
              ["Runs in view", view.scopes.length],
              ["Worker", props.holder ? <>{props.holder} (<a href={`#/waits?scopeId=${encodeURIComponent(props.scopeId)}`}>all workers</a>)</> : null],
            ]} />
            {view.truncated ? <p class="muted">The view is truncated: the run has more than the node lists.</p> : null}
            <h2>{props.holder ? `What ${props.holder} holds` : "Workers and what they hold"}</h2>
            {props.holder && workers.length === 0
              ? <Empty>{props.holder} holds nothing in this run now.</Empty>
              : <Workers workers={workers} selected={props.holder} money={money} />}
            <h2>What waits</h2>
            <WaitingTable waiting={view.waiting} empty="Nothing in this run waits." />
          </>
        );
      }}
    </Loadable>
  );
}

function SpaceWaitsView() {
  const loaded = useData((signal) => get<SpaceWaits>(spacePath("/ops/waits"), { signal }), []);
  const reload = useThrottled(RELOAD_MS_MIN, loaded.reload);
  useLive({}, reload);
  useEvery(REFRESH_MS, reload);
  return (
    <Loadable loaded={loaded}>
      {(view) => (
        <>
          {view.truncated ? <p class="muted">Truncated: more waits than the node lists.</p> : null}
          <WaitingTable waiting={view.waiting}
            empty="Nothing waits on a permit, an allowance or a budget. (Tasks that wait only for a worker, barriers and timers show in a run's view.)" />
        </>
      )}
    </Loadable>
  );
}

export function WaitsPage() {
  const scopeId = hashParam("scopeId");
  const holder = hashParam("holder");
  return (
    <Page name="waits" title={scopeId ? <>Why is it waiting: run <code>{scopeId}</code></> : "Why is it waiting"}>
      <Filters>
        <label>
          Run{" "}
          <input data-filter="scopeId" placeholder="run id (empty: the whole space)" value={scopeId ?? ""}
            onChange={(event) => {
              const value = (event.target as HTMLInputElement).value.trim();
              location.hash = value ? `#/waits?scopeId=${encodeURIComponent(value)}` : "#/waits";
            }} />
        </label>
        {scopeId ? <a href={href("runs", scopeId)}>the run's page</a> : null}
      </Filters>
      {scopeId ? <RunWaits scopeId={scopeId} holder={holder} /> : <SpaceWaitsView />}
    </Page>
  );
}
