// Queues: every mailbox with its depth, deliveries in flight, oldest waiting age, attempts and
// outcomes, and a plot of throughput and depth that starts from the event log's last minutes; a mailbox's page lists its tasks (filterable
// by state) and its newest messages.

import { useEffect } from "preact/hooks";
import { get, spacePath } from "../api";
import { useData, useLive } from "../live";
import { href } from "../router";
import type { Params } from "../routes";
import { Age, Fields, Filters, formatAge, Loadable, Page, StateBadge, Table } from "../ui";
import { depthHistory, LineChart, useEventLog, useEventRate, useSeries } from "./_charts";
import {
  ErrorText,
  hashParam,
  JsonPreview,
  type Mailbox,
  MailboxLink,
  RunLink,
  type Task,
  TASK_ENDED_EVENTS,
  TASK_EVENTS,
  TASK_STATES,
  TaskKey,
  TaskLink,
  useEvery,
  usePaged,
  withHashParam,
  WorkerLink,
} from "./_shared";

const PLOT_WINDOW_MS = 5 * 60_000; // the live plot shows the last five minutes
const THROUGHPUT_BUCKET_MS = 10_000; // tasks ended per 10 s
const SAMPLE_EVERY_MS = 5_000; // without events, the page still samples depth (and ages grow)

function Stat(props: { name: string; value: number | string | null | undefined }) {
  return <span data-stat={props.name}>{props.value ?? "—"}</span>;
}

export function QueuesPage() {
  const loaded = useData((signal) => get<{ mailboxes: Mailbox[] }>(spacePath("/mailboxes"), { signal }), []);
  useLive({ types: TASK_EVENTS }, loaded.reload);
  useEvery(SAMPLE_EVERY_MS, loaded.reload);
  const queued = useSeries(PLOT_WINDOW_MS);
  const inFlight = useSeries(PLOT_WINDOW_MS);
  const ended = useEventRate(TASK_ENDED_EVENTS, THROUGHPUT_BUCKET_MS, PLOT_WINDOW_MS);
  // Read once: the depth before the page opened, worked back from its first sample through the log.
  const log = useEventLog(TASK_EVENTS, PLOT_WINDOW_MS);
  const firstQueued = queued.points[0];
  const firstInFlight = inFlight.points[0];
  const before = log.data && firstQueued && firstInFlight
    ? depthHistory(log.data.filter((event) => Date.parse(event.createdAt) < firstQueued.at), firstQueued.value, firstInFlight.value)
    : { queued: [], inFlight: [] };
  const mailboxes = loaded.data?.mailboxes;
  useEffect(() => {
    if (!mailboxes) return;
    queued.add(mailboxes.reduce((sum, mailbox) => sum + (mailbox.stats?.queued ?? 0), 0));
    inFlight.add(mailboxes.reduce((sum, mailbox) => sum + (mailbox.stats?.inFlight ?? 0), 0));
  }, [mailboxes]);
  return (
    <Page name="queues" title="Queues">
      <Loadable loaded={loaded}>
        {(data) => (
          <>
            <Table<Mailbox>
              name="mailboxes"
              rows={data.mailboxes}
              rowId={(mailbox) => mailbox.id}
              empty="No mailboxes yet: submitting a task or declaring a queue makes one."
              columns={[
                { title: "Mailbox", cell: (mailbox) => <a href={href("queues", mailbox.id)}>{mailbox.name}</a> },
                { title: "Mode", cell: (mailbox) => mailbox.mode },
                { title: "Queued", class: "num", cell: (mailbox) => <Stat name="queued" value={mailbox.stats?.queued} /> },
                { title: "In flight", class: "num", cell: (mailbox) => <Stat name="inFlight" value={mailbox.stats?.inFlight} /> },
                {
                  title: "Oldest waiting", class: "num",
                  cell: (mailbox) => mailbox.stats?.oldestQueuedAgeSeconds == null
                    ? <span class="muted">—</span>
                    : <span data-stat="oldest">{formatAge(mailbox.stats.oldestQueuedAgeSeconds * 1000)}</span>,
                },
                { title: "Succeeded", class: "num", cell: (mailbox) => <Stat name="succeeded" value={mailbox.stats?.succeeded} /> },
                { title: "Failed", class: "num", cell: (mailbox) => <Stat name="failed" value={mailbox.stats?.failed} /> },
                { title: "Attempts", class: "num", cell: (mailbox) => <Stat name="attempts" value={mailbox.stats?.attemptsTotal} /> },
                { title: "Max attempts", class: "num", cell: (mailbox) => mailbox.maxAttempts ?? "—" },
              ]}
            />
            {data.mailboxes.length > 0 && data.mailboxes[0].stats === undefined ? (
              <p class="muted">This node does not report queue statistics yet (it needs a newer node).</p>
            ) : null}
          </>
        )}
      </Loadable>
      <div class="charts" data-plot="queues">
        <LineChart
          name="throughput"
          title={`Throughput: tasks ended per ${THROUGHPUT_BUCKET_MS / 1000} s`}
          windowMs={PLOT_WINDOW_MS}
          lines={[{ name: "ended", label: `ended (${ended.total} seen)`, points: ended.points }]}
        />
        <LineChart
          name="depth"
          title="Queue depth, all mailboxes"
          windowMs={PLOT_WINDOW_MS}
          lines={[
            { name: "queued", label: "queued", points: [...before.queued, ...queued.points], step: true },
            { name: "inFlight", label: "in flight", points: [...before.inFlight, ...inFlight.points], step: true },
          ]}
        />
      </div>
    </Page>
  );
}

interface Message {
  id: string;
  scopeId: string;
  state: string;
  attempt: number;
  workKey: string;
  payload: unknown;
  createdAt: string;
}

/** Tasks by key. `scopeId`: the table of that run's page (a Mailbox column; the run's own tasks
 * say "this run", a child run's name their run). */
export function TaskTable(props: { tasks: Task[]; empty: string; scopeId?: string }) {
  const inRun = props.scopeId !== undefined;
  return (
    <Table<Task>
      name="tasks"
      rows={props.tasks}
      rowId={(task) => task.id}
      empty={props.empty}
      columns={[
        { title: "Task", cell: (task) => <TaskLink id={task.id}><TaskKey value={task.taskKey} /></TaskLink> },
        { title: "State", cell: (task) => <StateBadge state={task.state} /> },
        ...(inRun ? [{ title: "Mailbox", cell: (task: Task) => <MailboxLink id={task.mailboxId} name={task.mailbox} /> }] : []),
        { title: "Attempt", class: "num", cell: (task) => `${task.attempt}${task.attempts ? ` / ${task.attempts}` : ""}` },
        { title: "Holder", cell: (task) => <WorkerLink holder={task.holder ?? task.finishedBy} scopeId={task.scopeId} /> },
        { title: "Error", cell: (task) => <ErrorText value={task.error} /> },
        { title: "Result", cell: (task) => <JsonPreview value={task.outcome} /> },
        {
          title: "Run",
          cell: (task) => (inRun && task.scopeId === props.scopeId ? <span class="muted">this run</span> : <RunLink id={task.scopeId} />),
        },
        { title: "Age", class: "num", cell: (task) => <Age since={task.createdAt} /> },
      ]}
    />
  );
}

/** A message's state in the message list as its task's: a completed message is ACKED, a leased one LEASED. */
function messageState(state: string): string {
  return state === "ACKED" ? "SUCCEEDED" : state === "LEASED" ? "RUNNING" : state;
}

export function StateFilter(props: { value: string | null }) {
  return (
    <Filters>
      <label>
        State{" "}
        <select data-filter="state" value={props.value ?? ""}
          onChange={(event) => { location.hash = withHashParam("state", (event.target as HTMLSelectElement).value || null); }}>
          <option value="">any</option>
          {TASK_STATES.map((state) => <option value={state}>{state}</option>)}
        </select>
      </label>
    </Filters>
  );
}

export function MailboxPage(props: { params: Params }) {
  const id = props.params.id;
  const state = hashParam("state");
  const mailbox = useData((signal) => get<Mailbox>(spacePath(`/mailboxes/${encodeURIComponent(id)}`), { signal }), [id]);
  const list = usePaged<Task>("/tasks", "tasks", { mailboxId: id, state });
  const messages = useData(
    (signal) => get<{ messages: Message[] }>(spacePath(`/mailboxes/${encodeURIComponent(id)}/messages`), { signal }), [id],
  );
  const reload = () => {
    mailbox.reload();
    list.loaded.reload();
    messages.reload();
  };
  useLive({ types: TASK_EVENTS }, reload);
  useEvery(SAMPLE_EVERY_MS, mailbox.reload);
  const name = mailbox.data?.name ?? id;
  return (
    <Page name="mailbox" title={<><a href="#/queues">Queues</a> / {name}</>}>
      <Loadable loaded={mailbox}>
        {(data) => (
          <Fields name="mailbox" rows={[
            ["Id", <code>{data.id}</code>],
            ["Mode", data.mode],
            ["Queued", <Stat name="queued" value={data.stats?.queued} />],
            ["In flight", <Stat name="inFlight" value={data.stats?.inFlight} />],
            ["Oldest waiting", data.stats?.oldestQueuedAgeSeconds == null ? null : formatAge(data.stats.oldestQueuedAgeSeconds * 1000)],
            ["Succeeded / failed", data.stats ? `${data.stats.succeeded} / ${data.stats.failed}` : null],
            ["Cancelled / expired", data.stats ? `${data.stats.cancelled} / ${data.stats.expired}` : null],
            ["Attempts", <Stat name="attempts" value={data.stats?.attemptsTotal} />],
            ["Max attempts", data.maxAttempts],
            ["Backlog limit", data.backlogLimit],
            ["Requirements", data.requirements ? <JsonPreview value={data.requirements} maxChars={120} /> : null],
          ]} />
        )}
      </Loadable>
      <h2>Tasks</h2>
      <StateFilter value={state} />
      <Loadable loaded={list.loaded}>
        {(tasks) => (
          <>
            <TaskTable tasks={list.rows(tasks)} empty={state ? `No ${state} tasks.` : "No tasks in this mailbox."} />
            {list.footer}
          </>
        )}
      </Loadable>
      <h2>Messages</h2>
      <Loadable loaded={messages}>
        {(data) => (
          <Table<Message>
            name="messages"
            rows={[...data.messages].reverse().filter((message) => !state || messageState(message.state) === state)}
            rowId={(message) => message.id}
            empty={state ? `No ${state} messages among the newest.` : "No messages."}
            columns={[
              { title: "Message", cell: (message) => <TaskLink id={message.id}><TaskKey value={message.workKey} /></TaskLink> },
              { title: "State", cell: (message) => <StateBadge state={message.state} /> },
              { title: "Attempt", class: "num", cell: (message) => message.attempt },
              { title: "Payload", cell: (message) => <JsonPreview value={message.payload} /> },
              { title: "Run", cell: (message) => <RunLink id={message.scopeId} /> },
              { title: "Age", class: "num", cell: (message) => <Age since={message.createdAt} /> },
            ]}
          />
        )}
      </Loadable>
    </Page>
  );
}
