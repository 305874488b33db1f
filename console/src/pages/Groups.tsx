// Task groups, barriers and timers, of the space or of one run (?scopeId=, linked from a run's
// page): a group's members with their verdicts and late flags and its outcome; barriers with their
// arrivals of the target and epoch; timers with their fire time and state.

import type { ComponentChildren } from "preact";
import { get, spacePath } from "../api";
import { useData, useLive } from "../live";
import { href } from "../router";
import type { Params } from "../routes";
import { Fields, Filters, Loadable, Page, StateBadge, Table, Time } from "../ui";
import { hashParam, MailboxLink, RunLink, TaskLink, TASK_EVENTS, useEvery, usePaged, withHashParam } from "./_shared";

const REFRESH_MS = 5_000; // arrivals and armed timers change without an event of their own

interface Member {
  taskId: string;
  key: string;
  state: string;
  verdict: string | null;
  late: boolean;
  verdictBy: string | null;
}

interface Group {
  id: string;
  groupId: string;
  scopeId: string;
  parentScopeId: string | null;
  mailboxId: string | null;
  mailbox: string;
  condition: string;
  threshold: number | null;
  expectedMembers: number | null;
  state: string;
  outcome: string | null;
  outcomeReason: string | null;
  deadline: string | null;
  createdAt: string;
  finalizedAt: string | null;
  members: Member[];
}

interface Barrier {
  id: string;
  scopeId: string;
  name: string | null;
  target: number;
  arrivals: number;
  epoch: number;
  state: string;
  releasedAt: string | null;
  createdAt: string;
}

interface Timer {
  id: string;
  scopeId: string;
  name: string | null;
  state: string;
  fireAt: string;
  firedAt: string | null;
  createdAt: string;
}

/** A list read of this page, reloaded on `types` events of its run and every REFRESH_MS. */
function useList<T>(path: string, field: string, query: Record<string, string | null>, types: string[]) {
  const list = usePaged<T>(path, field, query);
  useLive({ types, scopeId: query.scopeId ?? undefined }, list.loaded.reload);
  useEvery(REFRESH_MS, list.loaded.reload);
  return list;
}

/** The tabs between the three pages, keeping the run filter. */
function Tabs(props: { current: "groups" | "barriers" | "timers"; scopeId: string | null }) {
  const query = props.scopeId ? `?scopeId=${encodeURIComponent(props.scopeId)}` : "";
  const tab = (name: "groups" | "barriers" | "timers", label: string) => (
    <a href={`#/${name}${query}`} class={props.current === name ? "tab active" : "tab"} data-tab={name}>{label}</a>
  );
  return (
    <nav class="tabs">
      {tab("groups", "Task groups")}
      {tab("barriers", "Barriers")}
      {tab("timers", "Timers")}
    </nav>
  );
}

function RunFilter(props: { scopeId: string | null; state?: { value: string | null; options: string[] } }) {
  return (
    <Filters>
      <label>
        Run{" "}
        <input data-filter="scopeId" placeholder="run id (empty: the whole space)" value={props.scopeId ?? ""}
          onChange={(event) => { location.hash = withHashParam("scopeId", (event.target as HTMLInputElement).value.trim() || null); }} />
      </label>
      {props.scopeId ? <a href={href("runs", props.scopeId)}>the run's page</a> : null}
      {props.state ? (
        <label>
          State{" "}
          <select data-filter="state" value={props.state.value ?? ""}
            onChange={(event) => { location.hash = withHashParam("state", (event.target as HTMLSelectElement).value || null); }}>
            <option value="">any</option>
            {props.state.options.map((option) => <option value={option}>{option}</option>)}
          </select>
        </label>
      ) : null}
    </Filters>
  );
}

function Title(props: { what: string; scopeId: string | null }): ComponentChildren {
  return props.scopeId ? <>{props.what} of run <code>{props.scopeId}</code></> : props.what;
}

function verdicts(group: Group): string {
  const accepted = group.members.filter((member) => member.verdict === "ACCEPTED").length;
  const rejected = group.members.filter((member) => member.verdict === "REJECTED").length;
  return `${accepted} accepted, ${rejected} rejected`;
}

function condition(group: Group): string {
  return group.threshold !== null ? `${group.condition} (${group.threshold})` : group.condition;
}

/** The task groups of a run (`scopeId`: created from it or its own) or of the space (null), live.
 * Embeddable: a run's page may show it. */
export function GroupsList(props: { scopeId: string | null; state?: string | null }) {
  const list = useList<Group>("/task-groups", "taskGroups", { scopeId: props.scopeId, state: props.state ?? null },
    ["group.finalized", ...TASK_EVENTS]);
  return (
    <Loadable loaded={list.loaded}>
      {(groups) => (
        <>
          <Table<Group>
            name="groups"
            rows={list.rows(groups)}
            rowId={(group) => group.id}
            empty="No task groups."
            columns={[
              { title: "Group", cell: (group) => <a href={href("groups", group.id)} class="mono">{group.id}</a> },
              { title: "State", cell: (group) => <StateBadge state={group.state} /> },
              { title: "Condition", cell: condition },
              { title: "Members", class: "num", cell: (group) => `${group.members.length}${group.expectedMembers ? ` of ${group.expectedMembers}` : ""}` },
              { title: "Verdicts", cell: verdicts },
              { title: "Outcome", cell: (group) => group.outcome ? <><StateBadge state={group.outcome} /> {group.outcomeReason}</> : <span class="muted">—</span> },
              { title: "Run", cell: (group) => <RunLink id={group.parentScopeId ?? group.scopeId} /> },
              { title: "Created", cell: (group) => <Time value={group.createdAt} /> },
            ]}
          />
          {list.footer}
        </>
      )}
    </Loadable>
  );
}

export function GroupsPage() {
  const scopeId = hashParam("scopeId");
  const state = hashParam("state");
  return (
    <Page name="groups" title={<Title what="Task groups" scopeId={scopeId} />}>
      <Tabs current="groups" scopeId={scopeId} />
      <RunFilter scopeId={scopeId} state={{ value: state, options: ["OPEN", "SEALED", "FINALIZED"] }} />
      <GroupsList scopeId={scopeId} state={state} />
    </Page>
  );
}

export function GroupPage(props: { params: Params }) {
  const id = props.params.id;
  const loaded = useData((signal) => get<Group>(spacePath(`/task-groups/${encodeURIComponent(id)}`), { signal }), [id]);
  useLive({ scopeId: loaded.data?.scopeId ?? undefined, types: ["group.finalized", ...TASK_EVENTS] }, loaded.reload);
  useEvery(REFRESH_MS, loaded.reload);
  return (
    <Page name="group" title={<><a href="#/groups">Task groups</a> / <code>{id}</code></>}>
      <Loadable loaded={loaded}>
        {(group) => (
          <>
            <Fields name="group" rows={[
              ["State", <StateBadge state={group.state} />],
              ["Outcome", group.outcome ? <><StateBadge state={group.outcome} /> {group.outcomeReason}</> : null],
              ["Condition", condition(group)],
              ["Members", `${group.members.length}${group.expectedMembers ? ` of ${group.expectedMembers} expected` : ""}`],
              ["Verdicts", verdicts(group)],
              ["Mailbox", <MailboxLink id={group.mailboxId} name={group.mailbox} />],
              ["Run", <RunLink id={group.parentScopeId} />],
              ["Group's own run", <RunLink id={group.scopeId} />],
              ["Deadline", group.deadline ? <Time value={group.deadline} /> : null],
              ["Created", <Time value={group.createdAt} />],
              ["Finalized", group.finalizedAt ? <Time value={group.finalizedAt} /> : null],
            ]} />
            <h2>Members</h2>
            <Table<Member>
              name="members"
              rows={group.members}
              rowId={(member) => member.taskId}
              empty="No members yet."
              columns={[
                { title: "Task", cell: (member) => <TaskLink id={member.taskId}>{member.key || member.taskId}</TaskLink> },
                { title: "State", cell: (member) => <StateBadge state={member.state} /> },
                { title: "Verdict", cell: (member) => member.verdict ? <span data-verdict={member.verdict}><StateBadge state={member.verdict} /></span> : <span class="muted">—</span> },
                { title: "Late", cell: (member) => (member.late ? <span class="badge badge-warn" data-late>late</span> : <span class="muted">no</span>) },
                { title: "Verdict by", cell: (member) => member.verdictBy ?? <span class="muted">—</span> },
              ]}
            />
          </>
        )}
      </Loadable>
    </Page>
  );
}

/** The barriers of a run or of the space (null), with their arrivals; embeddable. */
export function BarriersList(props: { scopeId: string | null }) {
  const list = useList<Barrier>("/barriers", "barriers", { scopeId: props.scopeId }, ["barrier.released"]);
  return (
    <Loadable loaded={list.loaded}>
      {(barriers) => (
        <>
          <Table<Barrier>
            name="barriers"
            rows={list.rows(barriers)}
            rowId={(barrier) => barrier.id}
            empty="No barriers."
            columns={[
              { title: "Barrier", cell: (barrier) => barrier.name ?? <code>{barrier.id}</code> },
              { title: "State", cell: (barrier) => <StateBadge state={barrier.state} /> },
              { title: "Arrivals", class: "num", cell: (barrier) => <span data-arrivals={barrier.arrivals}>{barrier.arrivals} of {barrier.target}</span> },
              { title: "Epoch", class: "num", cell: (barrier) => barrier.epoch },
              { title: "Run", cell: (barrier) => <RunLink id={barrier.scopeId} /> },
              { title: "Released", cell: (barrier) => <Time value={barrier.releasedAt} /> },
              { title: "Created", cell: (barrier) => <Time value={barrier.createdAt} /> },
            ]}
          />
          {list.footer}
        </>
      )}
    </Loadable>
  );
}

export function BarriersPage() {
  const scopeId = hashParam("scopeId");
  return (
    <Page name="barriers" title={<Title what="Barriers" scopeId={scopeId} />}>
      <Tabs current="barriers" scopeId={scopeId} />
      <RunFilter scopeId={scopeId} />
      <BarriersList scopeId={scopeId} />
    </Page>
  );
}

/** The timers of a run or of the space (null), with their fire times; embeddable. */
export function TimersList(props: { scopeId: string | null; state?: string | null }) {
  const list = useList<Timer>("/timers", "timers", { scopeId: props.scopeId, state: props.state ?? null }, ["timer.fired"]);
  return (
    <Loadable loaded={list.loaded}>
      {(timers) => (
        <>
          <Table<Timer>
            name="timers"
            rows={list.rows(timers)}
            rowId={(timer) => timer.id}
            empty="No timers."
            columns={[
              { title: "Timer", cell: (timer) => timer.name ?? <code>{timer.id}</code> },
              { title: "State", cell: (timer) => <StateBadge state={timer.state} /> },
              { title: "Fires", cell: (timer) => <Time value={timer.fireAt} /> },
              { title: "Fired", cell: (timer) => <Time value={timer.firedAt} /> },
              { title: "Run", cell: (timer) => <RunLink id={timer.scopeId} /> },
              { title: "Created", cell: (timer) => <Time value={timer.createdAt} /> },
            ]}
          />
          {list.footer}
        </>
      )}
    </Loadable>
  );
}

export function TimersPage() {
  const scopeId = hashParam("scopeId");
  const state = hashParam("state");
  return (
    <Page name="timers" title={<Title what="Timers" scopeId={scopeId} />}>
      <Tabs current="timers" scopeId={scopeId} />
      <RunFilter scopeId={scopeId} state={{ value: state, options: ["ARMED", "FIRED", "ACKED", "CANCELLED"] }} />
      <TimersList scopeId={scopeId} state={state} />
    </Page>
  );
}
