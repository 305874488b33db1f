// Runs: a filterable list (state, name, age) and a run's page (its tree of children with the
// workers and what each holds, its status, deadline, cancel and complete, its tasks).

import type { JSX, TargetedEvent } from "preact";
import { useState } from "preact/hooks";
import { get, hasPermission, post, spacePath } from "../api";
import { useData, useLive } from "../live";
import { href } from "../router";
import { Age, ConfirmButton, Empty, Fields, Filters, Loadable, Page, StateBadge, Table, Time } from "../ui";
import { type Task, useMoney, useThrottled, type Worker } from "./_shared";
import { TaskTable } from "./Queues";
import { Workers } from "./Waits";

export const RUN_EVENTS = ["scope.created", "scope.completed", "scope.cancelled", "scope.expired"];
const RUN_STATES = ["ACTIVE", "COMPLETED", "CANCELLED", "EXPIRED"];
const PAGE_LIMIT = 100;
// The age filter: runs created within this many seconds.
const AGES: [string, number | null][] = [["any age", null], ["last hour", 3600], ["last day", 86_400], ["last week", 604_800]];

export interface Run {
  id: string;
  name: string | null;
  parentId: string | null;
  storedState: string;
  effective: string;
  deadline: string | null;
  childLimit: number;
  children: number;
  createdAt: string;
  finishedAt: string | null;
  reason: string | null;
}

interface RunsPageAnswer {
  scopes: Run[];
  nextCursor: string | null;
}

export function RunsPage() {
  const [state, setState] = useState("");
  const [name, setName] = useState("");
  const [age, setAge] = useState<number | null>(null);
  const [rootOnly, setRootOnly] = useState(true);
  const [pages, setPages] = useState(1);
  const loaded = useData(
    async (signal) => {
      const runs: Run[] = [];
      let cursor: string | null = null;
      let more = false;
      for (let page = 0; page < pages; page++) {
        const answer: RunsPageAnswer = await get<RunsPageAnswer>(spacePath("/scopes"), {
          query: { state, name: name.trim(), root: rootOnly ? "true" : undefined, limit: PAGE_LIMIT, cursor },
          signal,
        });
        runs.push(...answer.scopes);
        cursor = answer.nextCursor;
        more = cursor !== null;
        if (!more) break;
      }
      return { runs, more };
    },
    [state, name, rootOnly, pages],
  );
  useLive({ types: RUN_EVENTS }, loaded.reload);
  const now = Date.now();
  return (
    <Page name="runs" title="Runs">
      <Filters>
        <label>
          State
          <select name="state" value={state} onChange={(event) => setState(event.currentTarget.value)}>
            <option value="">any</option>
            {RUN_STATES.map((value) => (
              <option value={value}>{value}</option>
            ))}
          </select>
        </label>
        <label>
          Name
          <input name="name" type="search" value={name} placeholder="part of the name"
            onInput={(event: TargetedEvent<HTMLInputElement>) => setName(event.currentTarget.value)} />
        </label>
        <label>
          Age
          <select name="age" value={age === null ? "" : String(age)}
            onChange={(event) => setAge(event.currentTarget.value ? Number(event.currentTarget.value) : null)}>
            {AGES.map(([label, seconds]) => (
              <option value={seconds === null ? "" : String(seconds)}>{label}</option>
            ))}
          </select>
        </label>
        <label class="check">
          <input type="checkbox" name="root" checked={rootOnly} onChange={() => setRootOnly(!rootOnly)} />
          top-level runs only
        </label>
      </Filters>
      <Loadable loaded={loaded}>
        {({ runs, more }) => {
          const shown = age === null ? runs : runs.filter((run) => now - Date.parse(run.createdAt) <= age * 1000);
          return (
            <>
              <RunTable name="runs" runs={shown} />
              {more ? (
                <button type="button" data-action="more" onClick={() => setPages(pages + 1)}>Load more</button>
              ) : null}
            </>
          );
        }}
      </Loadable>
    </Page>
  );
}

function RunTable(props: { name: string; runs: Run[] }) {
  return (
    <Table
      name={props.name}
      rows={props.runs}
      rowId={(run) => run.id}
      empty="No runs match."
      onRow={(run) => (location.hash = href("runs", run.id))}
      columns={[
        {
          title: "Run",
          cell: (run) => (run.name ? (
            <>
              <a href={href("runs", run.id)}>{run.name}</a>
              <div class="mono small muted">{run.id}</div>
            </>
          ) : (
            <a href={href("runs", run.id)} class="mono" data-unnamed>{run.id}</a>
          )),
        },
        { title: "State", cell: (run) => <RunState run={run} /> },
        { title: "Children", cell: (run) => run.children, class: "num" },
        { title: "Age", cell: (run) => <Age since={run.createdAt} /> },
        { title: "Deadline", cell: (run) => <Time value={run.deadline} /> },
      ]}
    />
  );
}

/** The stored state, and "INACTIVE" beside an ACTIVE one that a stopped parent or a passed
 * deadline ended (what `effective` says). */
function RunState(props: { run: { storedState: string; effective: string } }) {
  const { storedState, effective } = props.run;
  return (
    <span class="run-state" data-run-state={storedState}>
      <StateBadge state={storedState} />
      {storedState === "ACTIVE" && effective !== "ACTIVE" ? <> <StateBadge state={effective} /></> : null}
    </span>
  );
}

// ---- a run's page --------------------------------------------------------------------------------

interface TreeScope {
  id: string;
  name: string | null;
  parentId: string | null;
  storedState: string;
  effective: string;
}

interface OpsRun {
  rootScopeId: string;
  scopes: TreeScope[];
  workers: Worker[];
  waiting: unknown[];
  truncated: boolean;
}

const TASKS_PAGE = 500;
const TASKS_COUNTED_MAX = 5000; // a run's tasks read to count them: ten pages at most
const TASKS_SHOWN = 100;
const RELOAD_MS_MIN = 1000; // a busy run's events reload its page at most once a second
// The states a run's progress counts, in the order of its bar (EXPIRED shows when there are any).
const PROGRESS_STATES = ["SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED", "RUNNING", "QUEUED"];

interface RunTasks {
  tasks: Task[];
  complete: boolean; // false: the run has more than TASKS_COUNTED_MAX tasks (the counts are a floor)
}

async function runTasks(id: string, signal: AbortSignal): Promise<RunTasks> {
  const tasks: Task[] = [];
  let cursor: string | null = null;
  do {
    const page: { tasks: Task[]; nextCursor: string | null } = await get(spacePath("/tasks"), {
      query: { scopeId: id, includeDescendants: "true", limit: TASKS_PAGE, cursor }, signal,
    });
    tasks.push(...page.tasks);
    cursor = page.nextCursor;
  } while (cursor !== null && tasks.length < TASKS_COUNTED_MAX);
  return { tasks, complete: cursor === null };
}

/** The run's tasks counted by state, as numbers and as a bar; a count filters the table below. */
function Progress(props: { loaded: RunTasks; selected: string | null; select: (state: string | null) => void }) {
  const counts = new Map<string, number>();
  for (const task of props.loaded.tasks) counts.set(task.state, (counts.get(task.state) ?? 0) + 1);
  const total = props.loaded.tasks.length;
  const shown = PROGRESS_STATES.filter((state) => state !== "EXPIRED" || counts.get(state));
  const count = (state: string) => counts.get(state) ?? 0;
  return (
    <div class="progress" data-progress>
      <div class="progress-bar" role="img" aria-label={shown.map((state) => `${count(state)} ${state.toLowerCase()}`).join(", ")}>
        {shown.map((state) => (count(state) ? (
          <span class={`progress-part progress-${state.toLowerCase()}`} style={{ width: `${(100 * count(state)) / total}%` }} />
        ) : null))}
      </div>
      <div class="progress-counts">
        <span class="muted">{props.loaded.complete ? "" : "at least "}{total} task{total === 1 ? "" : "s"}:</span>
        {shown.map((state) => (
          <button type="button" class={props.selected === state ? "count selected" : "count"} data-count={state}
            aria-pressed={props.selected === state} onClick={() => props.select(props.selected === state ? null : state)}>
            <span class={`dot progress-${state.toLowerCase()}`} /> <span data-count-value>{count(state)}</span> {state.toLowerCase()}
          </button>
        ))}
      </div>
    </div>
  );
}

export function RunPage(props: { params: { id: string } }) {
  const id = props.params.id;
  const run = useData((signal) => get<Run>(spacePath(`/scopes/${encodeURIComponent(id)}`), { signal }), [id]);
  const ops = useData((signal) => get<OpsRun>(spacePath(`/ops/runs/${encodeURIComponent(id)}`), { signal }), [id]);
  const tasks = useData((signal) => runTasks(id, signal), [id]);
  const money = useMoney();
  const [stateShown, setStateShown] = useState<string | null>(null);
  useLive({ scopeId: id }, useThrottled(RELOAD_MS_MIN, () => {
    run.reload();
    ops.reload();
    tasks.reload();
  }));
  const canWrite = hasPermission("coordination_write");
  const [reason, setReason] = useState("");
  const stop = async (verb: "cancel" | "complete") => {
    await post(spacePath(`/scopes/${encodeURIComponent(id)}/${verb}`), verb === "cancel" && reason.trim() ? { reason: reason.trim() } : {});
    run.reload();
    ops.reload();
    tasks.reload();
  };
  return (
    <Page name="run" title={<>Run {run.data?.name ? <span>{run.data.name}</span> : <span class="mono">{id}</span>}</>}>
      <p class="crumbs"><a href="#/runs">← Runs</a></p>
      <Loadable loaded={tasks}>
        {(data) => <Progress loaded={data} selected={stateShown} select={setStateShown} />}
      </Loadable>
      <Loadable loaded={run}>
        {(data) => (
          <>
            <Fields
              name="run"
              rows={[
                ["Id", <span class="mono">{data.id}</span>],
                ["Stored state", <span data-stored={data.storedState}><StateBadge state={data.storedState} /></span>],
                ["Effective", <span data-effective={data.effective}><StateBadge state={data.effective} /></span>],
                ["Parent", data.parentId ? <a href={href("runs", data.parentId)} class="mono">{data.parentId}</a> : "none (a top-level run)"],
                ["Deadline", <Time value={data.deadline} />],
                ["Created", <Time value={data.createdAt} />],
                ["Finished", <Time value={data.finishedAt} />],
                ["Reason", data.reason],
                ["Children", `${data.children} (at most ${data.childLimit})`],
              ]}
            />
            {data.effective === "ACTIVE" && canWrite ? (
              <div class="actions">
                <label>
                  Reason <input name="reason" value={reason} placeholder="optional"
                    onInput={(event: TargetedEvent<HTMLInputElement>) => setReason(event.currentTarget.value)} />
                </label>
                <ConfirmButton action="cancel" label="Cancel run" danger
                  question="Cancel this run, its child runs and their unfinished tasks?" onConfirm={() => stop("cancel")} />
                <ConfirmButton action="complete" label="Complete run"
                  question="Complete this run (its child runs stop too)?" onConfirm={() => stop("complete")} />
              </div>
            ) : null}
          </>
        )}
      </Loadable>
      <h2>Tree</h2>
      <Loadable loaded={ops}>{(data) => <RunTree ops={data} current={id} />}</Loadable>
      <p class="crumbs" data-run-links>
        In this run:{" "}
        {(["groups", "barriers", "timers", "waits"] as const).map((page, index) => (
          <>
            {index > 0 ? " · " : null}
            <a href={`#/${page}?scopeId=${encodeURIComponent(id)}`} data-link={`run-${page}`}>
              {page === "groups" ? "task groups" : page === "waits" ? "why it waits" : page}
            </a>
          </>
        ))}
      </p>
      <h2>Workers</h2>
      <Loadable loaded={ops}>
        {(data) => (
          <>
            <Workers workers={data.workers} selected={null} money={money} />
            {data.waiting.length > 0 ? (
              <p class="notice" data-waiting={data.waiting.length}>
                {data.waiting.length} thing{data.waiting.length === 1 ? "" : "s"} in this run wait{data.waiting.length === 1 ? "s" : ""} for a
                resource or a worker: see <a href={`#/waits?scopeId=${encodeURIComponent(id)}`} data-link="run-waits">why they wait</a> or each task's page.
              </p>
            ) : null}
          </>
        )}
      </Loadable>
      <h2>Tasks</h2>
      <Loadable loaded={tasks}>
        {(data) => {
          const matching = stateShown ? data.tasks.filter((task) => task.state === stateShown) : data.tasks;
          return (
            <>
              <TaskTable tasks={matching.slice(0, TASKS_SHOWN)} scopeId={id}
                empty={stateShown ? `No ${stateShown} tasks in this run.` : "No tasks in this run."} />
              {matching.length > TASKS_SHOWN ? (
                <p class="muted small">The newest {TASKS_SHOWN} of {matching.length}{data.complete ? "" : "+"} shown: a mailbox's page lists them all.</p>
              ) : null}
            </>
          );
        }}
      </Loadable>
    </Page>
  );
}

function RunTree(props: { ops: OpsRun; current: string }) {
  const byParent = new Map<string | null, TreeScope[]>();
  for (const scope of props.ops.scopes) {
    const siblings = byParent.get(scope.parentId) ?? [];
    siblings.push(scope);
    byParent.set(scope.parentId, siblings);
  }
  const root = props.ops.scopes.find((scope) => scope.id === props.ops.rootScopeId);
  if (!root) return <Empty>No tree.</Empty>;
  const node = (scope: TreeScope, depth: number): JSX.Element => (
    <li data-tree-node={scope.id} key={scope.id}>
      <span class={scope.id === props.current ? "tree-label current" : "tree-label"}>
        <a href={href("runs", scope.id)}>{scope.name ?? scope.id}</a> <RunState run={scope} />
      </span>
      {(byParent.get(scope.id) ?? []).length > 0 ? <ul>{(byParent.get(scope.id) ?? []).map((child) => node(child, depth + 1))}</ul> : null}
    </li>
  );
  return (
    <div class="tree" data-tree>
      <ul>{node(root, 0)}</ul>
      {props.ops.truncated ? <p class="muted small">The tree is cut short (too large to show whole).</p> : null}
    </div>
  );
}
