// The overview (the landing page): runs active, tasks queued and in flight, succeeded and failed in
// the last hour, throughput, the longest waits and the cluster's health; its charts start from the
// space's event log (the last hour it keeps), then follow it live.

import { get, spacePath } from "../api";
import { useData, useLive } from "../live";
import { href } from "../router";
import { formatAge, Loadable, Page, StateBadge, Table } from "../ui";
import { depthHistory, eventRate, LineChart, useEventLog } from "./_charts";
import { type Mailbox, type SpaceWaits, TASK_ENDED_EVENTS, TASK_EVENTS, useEvery, useThrottled } from "./_shared";
import type { ClusterView } from "./Cluster";
import { RUN_EVENTS } from "./Runs";

const HOUR_MS = 3_600_000;
const THROUGHPUT_BUCKET_MS = 60_000; // tasks ended per minute
const THROUGHPUT_RECENT_MS = 10 * 60_000; // the tile's rate: over the last ten minutes
const RUNS_COUNTED_MAX = 500; // one page of active runs; past it the tile says "500+"
const LONGEST_WAITS_SHOWN = 5;
const RELOAD_MS_MIN = 3_000; // a busy space's events reload the overview at most this often
const REFRESH_MS = 10_000; // ages grow and nodes fail without an event

interface Now {
  runsActive: number;
  runsMore: boolean;
  mailboxes: Mailbox[];
  waits: SpaceWaits;
  cluster: ClusterView | null;
}

async function loadNow(signal: AbortSignal): Promise<Now> {
  const [runs, mailboxes, waits, cluster] = await Promise.all([
    get<{ scopes: unknown[]; nextCursor: string | null }>(spacePath("/scopes"), {
      query: { state: "ACTIVE", root: "true", limit: RUNS_COUNTED_MAX }, signal,
    }),
    get<{ mailboxes: Mailbox[] }>(spacePath("/mailboxes"), { signal }),
    get<SpaceWaits>(spacePath("/ops/waits"), { signal }),
    get<ClusterView>("/v1/cluster", { signal }).catch(() => null), // the tiles say "unknown"
  ]);
  return { runsActive: runs.scopes.length, runsMore: runs.nextCursor !== null, mailboxes: mailboxes.mailboxes, waits, cluster };
}

function Tile(props: { name: string; label: string; value: string | number; note?: string; link?: string }) {
  const body = (
    <>
      <span class="tile-value" data-tile-value>{props.value}</span>
      <span class="tile-label">{props.label}</span>
      {props.note ? <span class="tile-note muted">{props.note}</span> : null}
    </>
  );
  return props.link
    ? <a class="tile" data-tile={props.name} href={props.link}>{body}</a>
    : <div class="tile" data-tile={props.name}>{body}</div>;
}

function ClusterHealth(props: { cluster: ClusterView | null }) {
  const cluster = props.cluster;
  if (cluster === null) return <Tile name="cluster" label="cluster" value="unknown" note="GET /v1/cluster did not answer" link="#/cluster" />;
  const up = cluster.nodes.filter((node) => node.reachable).length;
  const healthy = cluster.leader !== null && up === cluster.nodes.length;
  return (
    <Tile name="cluster" label={healthy ? "cluster healthy" : cluster.leader === null ? "no leader" : "nodes down"}
      value={`${up} of ${cluster.nodes.length}`} note={`nodes answering; leader ${cluster.leader ?? "none"}`} link="#/cluster" />
  );
}

export function OverviewPage() {
  const now = useData(loadNow, []);
  const log = useEventLog(TASK_EVENTS, HOUR_MS);
  const reload = useThrottled(RELOAD_MS_MIN, () => {
    now.reload();
    log.reload();
  });
  useLive({ types: [...TASK_EVENTS, ...RUN_EVENTS] }, reload);
  useEvery(REFRESH_MS, reload);
  return (
    <Page name="overview" title="Overview">
      <Loadable loaded={now}>
        {(data) => {
          const events = log.data ?? [];
          const at = Date.now();
          const hourAgo = at - HOUR_MS;
          const ended = (type: string) => events.filter((event) => event.type === type && Date.parse(event.createdAt) >= hourAgo).length;
          const recent = events.filter((event) => TASK_ENDED_EVENTS.includes(event.type) && Date.parse(event.createdAt) >= at - THROUGHPUT_RECENT_MS).length;
          const queued = data.mailboxes.reduce((sum, mailbox) => sum + (mailbox.stats?.queued ?? 0), 0);
          const inFlight = data.mailboxes.reduce((sum, mailbox) => sum + (mailbox.stats?.inFlight ?? 0), 0);
          const depth = depthHistory(events, queued, inFlight);
          const waiting = data.mailboxes
            .filter((mailbox) => mailbox.stats?.oldestQueuedAgeSeconds != null)
            .sort((a, b) => (b.stats?.oldestQueuedAgeSeconds ?? 0) - (a.stats?.oldestQueuedAgeSeconds ?? 0))
            .slice(0, LONGEST_WAITS_SHOWN);
          return (
            <>
              <div class="tiles">
                <Tile name="runs-active" label="runs active" value={`${data.runsActive}${data.runsMore ? "+" : ""}`} note="top-level runs" link="#/runs" />
                <Tile name="queued" label="tasks queued" value={queued} link="#/queues" />
                <Tile name="in-flight" label="in flight" value={inFlight} link="#/workers" />
                <Tile name="succeeded" label="succeeded" value={ended("task.succeeded")} note="in the last hour" />
                <Tile name="failed" label="failed" value={ended("task.failed")} note="in the last hour" />
                <Tile name="throughput" label="tasks ended a minute" value={(recent / (THROUGHPUT_RECENT_MS / 60_000)).toFixed(1)} note="over the last 10 minutes" />
                <ClusterHealth cluster={data.cluster} />
              </div>
              <div class="charts" data-plot="overview">
                <LineChart name="throughput" title="Tasks ended per minute, last hour" windowMs={HOUR_MS}
                  lines={[{ name: "ended", label: "ended", points: eventRate(events.filter((event) => TASK_ENDED_EVENTS.includes(event.type)), THROUGHPUT_BUCKET_MS, HOUR_MS, at) }]} />
                <LineChart name="depth" title="Tasks queued and in flight, last hour" windowMs={HOUR_MS}
                  lines={[
                    { name: "queued", label: "queued", points: depth.queued, step: true },
                    { name: "inFlight", label: "in flight", points: depth.inFlight, step: true },
                  ]} />
              </div>
              <h2>Longest waits</h2>
              <Table<Mailbox>
                name="longest-waits"
                rows={waiting}
                rowId={(mailbox) => mailbox.id}
                empty="No task waits in a queue."
                columns={[
                  { title: "Mailbox", cell: (mailbox) => <a href={href("queues", mailbox.id)}>{mailbox.name}</a> },
                  { title: "Oldest waiting", class: "num", cell: (mailbox) => <span data-oldest>{formatAge((mailbox.stats?.oldestQueuedAgeSeconds ?? 0) * 1000)}</span> },
                  { title: "Queued", class: "num", cell: (mailbox) => mailbox.stats?.queued ?? "—" },
                  { title: "In flight", class: "num", cell: (mailbox) => mailbox.stats?.inFlight ?? "—" },
                ]}
              />
              <p class="notice" data-waiting={data.waits.waiting.length}>
                {data.waits.waiting.length === 0
                  ? "Nothing waits on a permit, an allowance or a budget."
                  : <>{data.waits.waiting.length}{data.waits.truncated ? "+" : ""} thing{data.waits.waiting.length === 1 ? "" : "s"} wait
                    {data.waits.waiting.length === 1 ? "s" : ""} on a permit, an allowance, a budget or a retry: <a href="#/waits">why</a>.</>}
              </p>
              {data.cluster && data.cluster.nodes.some((node) => !node.reachable) ? (
                <p class="notice" data-nodes-down>
                  Not answering: {data.cluster.nodes.filter((node) => !node.reachable).map((node) => <><StateBadge state="DOWN" /> {node.id} </>)}
                </p>
              ) : null}
            </>
          );
        }}
      </Loadable>
    </Page>
  );
}
