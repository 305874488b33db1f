// Capacity: the space's permits, allowances and budgets, each with its usage now, a sparkline of
// its usage over the last minutes (sampled while the page is open) and what waits for it
// (GET /ops/waits); a page per permit, allowance and budget with its holders and waiters.

import type { ComponentChildren } from "preact";
import { useEffect } from "preact/hooks";
import { get, spacePath } from "../api";
import { useData, useLive } from "../live";
import { href } from "../router";
import type { Params } from "../routes";
import { Empty, Fields, Loadable, Page, StateBadge, Table, Time } from "../ui";
import { type Point, Sparkline, useSeries, useSeriesMap } from "./_charts";
import {
  formatMinor,
  ResourceLink,
  RunLink,
  type SpaceWaits,
  TaskLink,
  useEvery,
  useThrottled,
  type Waiting,
  WorkerLink,
} from "./_shared";
import { WaitingTable } from "./Waits";

const SPARK_WINDOW_MS = 5 * 60_000;
const SAMPLE_EVERY_MS = 5_000; // allowance windows slide and leases lapse without an event
const DETAILS_MAX = 50; // allowances and budgets read one by one for their usage: the first 50
const RELOAD_MS_MIN = 2_000; // a reload reads up to 2 + 2 x DETAILS_MAX views: not more often than this
const CAPACITY_EVENTS = [
  "permit.granted", "permit.released", "permit.lease_lost", "permit.waiter_signaled",
  "allowance.consumed", "allowance.settled", "allowance.cooldown",
  "budget.reserved", "budget.settled", "budget.voided", "budget.stale",
  "task.running", "task.succeeded", "task.failed", "task.cancelled", "task.expired", "task.queued",
];

type Kind = "permits" | "allowances" | "budgets";

interface Permit {
  id: string;
  name: string;
  unitsTotal: number;
  unitsInUse: number;
  waiting: number;
  grants?: { grantId: string; units: number; holder: string | null; scopeId: string; taskId: string | null; leaseExpiresAt: string }[];
  waiters?: { waiterId: string; units: number; holder: string | null; scopeId: string; state: string }[];
}

interface Allowance {
  id: string;
  name: string;
  unitsLimit: number;
  windowSeconds: number;
  remaining?: number;
  windowStart?: string;
  cooldownUntil?: string | null;
  cooldownReason?: string | null;
  waiting?: number;
  waiters?: { waiterId: string; units: number; holder: string | null; scopeId: string }[];
}

interface Budget {
  id: string;
  name: string;
  currency: string;
  scale: number;
  limitMinor: string;
  reservedMinor?: string;
  settledMinor?: string;
  remainingMinor?: string;
  waiting?: number;
  reservations?: {
    id: string; scopeId: string; holder: string | null; taskId: string | null; reservedMinor: string;
    settledMinor: string; state: string; settleBy: string;
  }[];
}

interface Capacity {
  permits: Permit[];
  allowances: Allowance[];
  budgets: Budget[];
  waits: SpaceWaits;
}

async function details<T extends { id: string }>(kind: Kind, rows: T[], signal: AbortSignal): Promise<T[]> {
  return Promise.all(rows.map((row, index) => (index < DETAILS_MAX
    ? get<T>(spacePath(`/${kind}/${encodeURIComponent(row.id)}`), { signal }).catch(() => row)
    : Promise.resolve(row))));
}

async function loadCapacity(signal: AbortSignal): Promise<Capacity> {
  const [permits, allowances, budgets, waits] = await Promise.all([
    get<{ permits: Permit[] }>(spacePath("/permits"), { signal }),
    get<{ allowances: Allowance[] }>(spacePath("/allowances"), { signal }),
    get<{ budgets: Budget[] }>(spacePath("/budgets"), { signal }),
    get<SpaceWaits>(spacePath("/ops/waits"), { signal }),
  ]);
  return {
    permits: permits.permits,
    allowances: await details("allowances", allowances.allowances, signal),
    budgets: await details("budgets", budgets.budgets, signal),
    waits,
  };
}

function allowanceUsed(allowance: Allowance): number | null {
  return allowance.remaining === undefined ? null : allowance.unitsLimit - allowance.remaining;
}

function budgetUsedMinor(budget: Budget): number | null {
  if (budget.remainingMinor === undefined) return null;
  return Number(budget.limitMinor) - Number(budget.remainingMinor);
}

/** The waiting entries (tasks and waiters) that wait for this resource. */
function waitingFor(waits: SpaceWaits, kind: Kind, id: string, name: string): Waiting[] {
  return waits.waiting.filter((entry) => (entry.waitsFor ?? []).some((need) =>
    (kind === "permits" && need.kind === "permit" && need.permitId === id)
    || (kind === "allowances" && need.kind === "allowance" && need.allowanceId === id)
    || (kind === "budgets" && need.kind === "budget" && need.name === name)));
}

function Waiters(props: { entries: Waiting[] }) {
  if (!props.entries.length) return <span class="muted">none</span>;
  return (
    <span data-waiters={props.entries.length}>
      {props.entries.slice(0, 5).map((entry) => (
        <div>
          {entry.kind === "task"
            ? <>task <TaskLink id={entry.taskId} /></>
            : <><WorkerLink holder={entry.holder} scopeId={entry.scopeId} /> ({entry.units})</>}
        </div>
      ))}
      {props.entries.length > 5 ? <div class="muted">and {props.entries.length - 5} more</div> : null}
    </span>
  );
}

function Usage(props: { used: number | null; total: number; label?: string }) {
  if (props.used === null) return <span class="muted">—</span>;
  const share = props.total > 0 ? Math.min(1, props.used / props.total) : 0;
  return (
    <span class="usage" data-usage={props.used}>
      <span class="usage-bar"><span style={{ width: `${Math.round(share * 100)}%` }} /></span>
      {props.label ?? `${props.used} / ${props.total}`}
    </span>
  );
}

function Section(props: { title: string; children: ComponentChildren }) {
  return (
    <section class="capacity-section">
      <h2>{props.title}</h2>
      {props.children}
    </section>
  );
}

export function CapacityPage() {
  const loaded = useData(loadCapacity, []);
  const reload = useThrottled(RELOAD_MS_MIN, loaded.reload);
  useLive({ types: CAPACITY_EVENTS }, reload);
  useEvery(SAMPLE_EVERY_MS, reload);
  const usage = useSeriesMap(SPARK_WINDOW_MS);
  useEffect(() => {
    const data = loaded.data;
    if (!data) return;
    const values: Record<string, number> = {};
    for (const permit of data.permits) values[`permit:${permit.id}`] = permit.unitsInUse;
    for (const allowance of data.allowances) {
      const used = allowanceUsed(allowance);
      if (used !== null) values[`allowance:${allowance.id}`] = used;
    }
    for (const budget of data.budgets) {
      const used = budgetUsedMinor(budget);
      if (used !== null) values[`budget:${budget.id}`] = used;
    }
    usage.add(values);
  }, [loaded.data]);
  const spark = (key: string, max: number, label: string) => (
    <Sparkline name={key} points={usage.series[key] ?? ([] as Point[])} max={max} windowMs={SPARK_WINDOW_MS}
      label={`${label}, last ${SPARK_WINDOW_MS / 60_000} minutes`} />
  );
  return (
    <Page name="capacity" title="Capacity">
      <Loadable loaded={loaded}>
        {(data) => (
          <>
            <Section title="Permits">
              <Table<Permit>
                name="permits"
                rows={data.permits}
                rowId={(permit) => permit.id}
                empty="No permits."
                columns={[
                  { title: "Permit", cell: (permit) => <ResourceLink kind="permits" id={permit.id} name={permit.name} /> },
                  { title: "In use", cell: (permit) => <Usage used={permit.unitsInUse} total={permit.unitsTotal} /> },
                  { title: "Last minutes", cell: (permit) => spark(`permit:${permit.id}`, permit.unitsTotal, `${permit.name} units in use`) },
                  { title: "Waiting", cell: (permit) => <Waiters entries={waitingFor(data.waits, "permits", permit.id, permit.name)} /> },
                ]}
              />
            </Section>
            <Section title="Allowances">
              <Table<Allowance>
                name="allowances"
                rows={data.allowances}
                rowId={(allowance) => allowance.id}
                empty="No allowances."
                columns={[
                  { title: "Allowance", cell: (allowance) => <ResourceLink kind="allowances" id={allowance.id} name={allowance.name} /> },
                  { title: "Used in window", cell: (allowance) => <Usage used={allowanceUsed(allowance)} total={allowance.unitsLimit}
                    label={`${allowanceUsed(allowance) ?? "?"} / ${allowance.unitsLimit} per ${allowance.windowSeconds} s`} /> },
                  { title: "Last minutes", cell: (allowance) => spark(`allowance:${allowance.id}`, allowance.unitsLimit, `${allowance.name} units used`) },
                  { title: "Cooldown", cell: (allowance) => allowance.cooldownUntil ? <Time value={allowance.cooldownUntil} /> : <span class="muted">—</span> },
                  { title: "Waiting", cell: (allowance) => <Waiters entries={waitingFor(data.waits, "allowances", allowance.id, allowance.name)} /> },
                ]}
              />
            </Section>
            <Section title="Budgets">
              <Table<Budget>
                name="budgets"
                rows={data.budgets}
                rowId={(budget) => budget.id}
                empty="No budgets."
                columns={[
                  { title: "Budget", cell: (budget) => <ResourceLink kind="budgets" id={budget.id} name={budget.name} /> },
                  { title: "Spent + reserved", cell: (budget) => <Usage used={budgetUsedMinor(budget)} total={Number(budget.limitMinor)}
                    label={`${formatMinor(budget.settledMinor, budget.scale)} + ${formatMinor(budget.reservedMinor, budget.scale)} of ${formatMinor(budget.limitMinor, budget.scale, budget.currency)}`} /> },
                  { title: "Last minutes", cell: (budget) => spark(`budget:${budget.id}`, Number(budget.limitMinor), `${budget.name} spent and reserved`) },
                  { title: "Waiting", cell: (budget) => <Waiters entries={waitingFor(data.waits, "budgets", budget.id, budget.name)} /> },
                ]}
              />
            </Section>
          </>
        )}
      </Loadable>
    </Page>
  );
}

// ---- one permit, allowance or budget ------------------------------------------------------------

const TITLES: Record<Kind, string> = { permits: "Permit", allowances: "Allowance", budgets: "Budget" };

function ResourcePage(props: { kind: Kind; id: string }) {
  const { kind, id } = props;
  const loaded = useData(async (signal) => {
    const [view, waits] = await Promise.all([
      get<Permit & Allowance & Budget>(spacePath(`/${kind}/${encodeURIComponent(id)}`), { signal }),
      get<SpaceWaits>(spacePath("/ops/waits"), { signal }),
    ]);
    return { view, waits };
  }, [kind, id]);
  const reload = useThrottled(RELOAD_MS_MIN, loaded.reload);
  useLive({ types: CAPACITY_EVENTS }, reload);
  useEvery(SAMPLE_EVERY_MS, reload);
  const usage = useSeries(SPARK_WINDOW_MS);
  useEffect(() => {
    const view = loaded.data?.view;
    if (!view) return;
    const used = kind === "permits" ? view.unitsInUse : kind === "allowances" ? allowanceUsed(view) : budgetUsedMinor(view);
    if (used !== null && used !== undefined) usage.add(used);
  }, [loaded.data]);
  const name = loaded.data?.view.name ?? id;
  return (
    <Page name={kind.slice(0, -1)} title={<><a href="#/capacity">Capacity</a> / {TITLES[kind]} {name}</>}>
      <Loadable loaded={loaded}>
        {({ view, waits }) => {
          const max = kind === "permits" ? view.unitsTotal : kind === "allowances" ? view.unitsLimit : Number(view.limitMinor);
          return (
            <>
              <Fields name={kind.slice(0, -1)} rows={[
                ["Id", <code>{view.id}</code>],
                ...(kind === "permits" ? [
                  ["Units in use", <Usage used={view.unitsInUse} total={view.unitsTotal} />],
                ] as [string, ComponentChildren][] : []),
                ...(kind === "allowances" ? [
                  ["Used in window", <Usage used={allowanceUsed(view)} total={view.unitsLimit}
                    label={`${allowanceUsed(view)} / ${view.unitsLimit} per ${view.windowSeconds} s`} />],
                  ["Cooldown", view.cooldownUntil ? <><Time value={view.cooldownUntil} /> {view.cooldownReason}</> : null],
                ] as [string, ComponentChildren][] : []),
                ...(kind === "budgets" ? [
                  ["Limit", formatMinor(view.limitMinor, view.scale, view.currency)],
                  ["Settled", formatMinor(view.settledMinor, view.scale, view.currency)],
                  ["Reserved", formatMinor(view.reservedMinor, view.scale, view.currency)],
                  ["Remaining", formatMinor(view.remainingMinor, view.scale, view.currency)],
                ] as [string, ComponentChildren][] : []),
                ["Last minutes", <Sparkline name={`${kind}:${view.id}`} points={usage.points} max={max} windowMs={SPARK_WINDOW_MS}
                  label={`usage over the last ${SPARK_WINDOW_MS / 60_000} minutes`} />],
              ]} />
              {kind === "permits" ? (
                <>
                  <h2>Held by</h2>
                  <Table
                    name="grants"
                    rows={view.grants ?? []}
                    rowId={(grant) => grant.grantId}
                    empty="Nobody holds a unit."
                    columns={[
                      { title: "Holder", cell: (grant) => <WorkerLink holder={grant.holder} scopeId={grant.scopeId} /> },
                      { title: "Units", class: "num", cell: (grant) => grant.units },
                      { title: "Task", cell: (grant) => <TaskLink id={grant.taskId} /> },
                      { title: "Run", cell: (grant) => <RunLink id={grant.scopeId} /> },
                      { title: "Lease until", cell: (grant) => <Time value={grant.leaseExpiresAt} /> },
                      { title: "Grant", cell: (grant) => <code>{grant.grantId}</code> },
                    ]}
                  />
                  <h2>Waiters in line</h2>
                  <Table
                    name="waiters"
                    rows={(view as Permit).waiters ?? []}
                    rowId={(waiter) => waiter.waiterId}
                    empty="Nobody is in line."
                    columns={[
                      { title: "Holder", cell: (waiter) => <WorkerLink holder={waiter.holder} scopeId={waiter.scopeId} /> },
                      { title: "Units", class: "num", cell: (waiter) => waiter.units },
                      { title: "State", cell: (waiter) => <StateBadge state={waiter.state} /> },
                      { title: "Run", cell: (waiter) => <RunLink id={waiter.scopeId} /> },
                    ]}
                  />
                </>
              ) : null}
              {kind === "allowances" ? (
                <>
                  <h2>Waiters in line</h2>
                  <Table
                    name="waiters"
                    rows={(view as Allowance).waiters ?? []}
                    rowId={(waiter) => waiter.waiterId}
                    empty="Nobody is in line."
                    columns={[
                      { title: "Holder", cell: (waiter) => <WorkerLink holder={waiter.holder} scopeId={waiter.scopeId} /> },
                      { title: "Units", class: "num", cell: (waiter) => waiter.units },
                      { title: "Run", cell: (waiter) => <RunLink id={waiter.scopeId} /> },
                    ]}
                  />
                </>
              ) : null}
              {kind === "budgets" ? (
                <>
                  <h2>Reservations</h2>
                  <Table
                    name="reservations"
                    rows={view.reservations ?? []}
                    rowId={(row) => row.id}
                    empty="No reservations."
                    columns={[
                      { title: "Holder", cell: (row) => <WorkerLink holder={row.holder} scopeId={row.scopeId} /> },
                      { title: "Reserved", class: "num", cell: (row) => formatMinor(row.reservedMinor, view.scale, view.currency) },
                      { title: "Settled", class: "num", cell: (row) => formatMinor(row.settledMinor, view.scale, view.currency) },
                      { title: "State", cell: (row) => <StateBadge state={row.state} /> },
                      { title: "Task", cell: (row) => <TaskLink id={row.taskId} /> },
                      { title: "Run", cell: (row) => <RunLink id={row.scopeId} /> },
                      { title: "Settle by", cell: (row) => <Time value={row.settleBy} /> },
                    ]}
                  />
                </>
              ) : null}
              <h2>What waits for it</h2>
              {(() => {
                const entries = waitingFor(waits, kind, view.id, view.name);
                return entries.length
                  ? <WaitingTable waiting={entries} empty="" />
                  : <Empty>Nothing waits for it.</Empty>;
              })()}
              <p><a href={href("capacity")}>All capacity</a></p>
            </>
          );
        }}
      </Loadable>
    </Page>
  );
}

export const PermitPage = (props: { params: Params }) => <ResourcePage kind="permits" id={props.params.id} />;
export const AllowancePage = (props: { params: Params }) => <ResourcePage kind="allowances" id={props.params.id} />;
export const BudgetPage = (props: { params: Params }) => <ResourcePage kind="budgets" id={props.params.id} />;
