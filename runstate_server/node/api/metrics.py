"""GET /metrics: this node's figures in Prometheus' text format (version 0.0.4), node-local.

What the replicated state holds now (queue depth, in flight, oldest waiting, waiters per resource)
is read under the node's read lock from counts the core keeps as it goes (state.QueueFigures, a
resource's `waiting` and line), never by a scan of the tasks. What the node observed (task latency
and attempts, lease expiries and takeovers, HTTP requests) comes from node/metrics.py; the Raft
figures from the replicated log. A follower answers with its own figures: never forwarded.

Permission: coordination_read. An operator admin key's caller sees every space's series; any other
key sees its own space's, and the node-wide figures (Raft, HTTP, task histograms)."""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from aiohttp import web

from runstate_server.actors import COMPILED, dispatch, limits
from runstate_server.histogram import HistogramView
from runstate_server.node.api.routes import READ, RouteTable, caller_of, node_of
from runstate_server.node.api.schemas import STRING
from runstate_server.node.certs import expiries
from runstate_server.node.tls import certificate_files

if TYPE_CHECKING:
    from runstate_server.actors.state import QueueFigures, State
    from runstate_server.node.caller import Caller
    from runstate_server.node.server import Node

routes = RouteTable()

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ROLES = ("leader", "candidate", "follower")

Labels = tuple[tuple[str, str], ...]


class Exposition:
    """Prometheus' text format: per metric `# HELP`, `# TYPE`, then its samples."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str, samples: Iterable[tuple[Labels, float]]) -> None:
        self._lines.append(f"# HELP {name} {_escape_help(help_text)}")
        self._lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self._lines.append(f"{name}{_labels(labels)} {_number(value)}")

    def histogram(self, name: str, help_text: str, views: Iterable[tuple[Labels, HistogramView]]) -> None:
        self._lines.append(f"# HELP {name} {_escape_help(help_text)}")
        self._lines.append(f"# TYPE {name} histogram")
        for labels, view in views:
            for bound, count in zip((*view.bounds, math.inf), view.cumulative, strict=True):
                self._lines.append(f"{name}_bucket{_labels((*labels, ('le', _number(bound))))} {count}")
            self._lines.append(f"{name}_sum{_labels(labels)} {_number(view.total)}")
            self._lines.append(f"{name}_count{_labels(labels)} {view.count}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape_label(value)}"' for name, value in labels) + "}"


def _number(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


# -- the figures ---------------------------------------------------------------------------------


def queue_now(figures: QueueFigures | None, now_ms: int) -> tuple[int, int, float | None]:
    """(depth, in flight, oldest QUEUED task's age in s or None) of a mailbox's QueueFigures (None:
    it holds no QUEUED or RUNNING task): the queue series here and a mailbox's stats show the same."""
    if figures is None:
        return 0, 0, None
    oldest_ms = next(iter(figures.queued.values()), None)
    age_s = None if oldest_ms is None else max(now_ms - oldest_ms, 0) / 1000
    return len(figures.queued), figures.running, age_s


def _queue_rows(state: State, spaces: set[str] | None, now_ms: int) -> tuple[list[tuple[Labels, int, int, float]], int]:
    """(labels, depth, in flight, oldest age in s) of the mailboxes with QUEUED or RUNNING tasks,
    the deepest metrics_series_max of them; and how many were dropped."""
    figures = [
        (key, value) for key, value in state.queue_figures.items() if spaces is None or key[0] in spaces
    ]
    kept = heapq.nlargest(
        limits.metrics_series_max, figures, key=lambda item: (len(item[1].queued), item[1].running, item[0])
    )
    rows: list[tuple[Labels, int, int, float]] = []
    for (space, mailbox), value in sorted(kept, key=lambda item: item[0]):
        depth, running, age_s = queue_now(value, now_ms)
        rows.append(((("space", space), ("mailbox", mailbox)), depth, running, 0.0 if age_s is None else age_s))
    return rows, len(figures) - len(kept)


def _waiter_rows(state: State, spaces: set[str] | None) -> tuple[list[tuple[Labels, int]], int]:
    """(labels, waiters) of the resources something waits on: QUEUED jobs whose needs name it, and
    permit and allowance waiters in its line; the metrics_series_max with the most waiters."""
    rows: list[tuple[Labels, int]] = []
    for kind, table in (("permit", state.pools), ("allowance", state.rate_limits), ("budget", state.budgets)):
        for resource in table.values():
            if spaces is not None and resource.space not in spaces:
                continue
            line = len(getattr(resource, "waiters", ()))
            for waiter, count in (("job", resource.waiting), ("line", line)):
                if count:
                    labels = (("space", resource.space), ("kind", kind), ("name", resource.name), ("waiter", waiter))
                    rows.append((labels, count))
    kept = heapq.nlargest(limits.metrics_series_max, rows, key=lambda row: (row[1], row[0]))
    return sorted(kept), len(rows) - len(kept)


def render(node: Node, caller: Caller) -> str:
    spaces = None if caller.operator else {caller.space}
    now_ms = int(time.time() * 1000)
    with node.read() as state:
        queues, queues_dropped = _queue_rows(state, spaces, now_ms)
        waiters, waiters_dropped = _waiter_rows(state, spaces)
    out = Exposition()
    out.metric("runstate_queue_depth", "gauge", "Tasks QUEUED in a mailbox (backoffs included), all runs",
               [(labels, depth) for labels, depth, _, _ in queues])
    out.metric("runstate_queue_in_flight", "gauge", "Tasks RUNNING under a delivery lease in a mailbox",
               [(labels, running) for labels, _, running, _ in queues])
    out.metric("runstate_queue_oldest_age_seconds", "gauge",
               "How long the mailbox's longest-waiting QUEUED task has waited since it last became QUEUED",
               [(labels, age) for labels, _, _, age in queues])
    out.metric("runstate_resource_waiters", "gauge",
               "What waits on a resource: QUEUED jobs that need it (waiter=job), waiters in its line (waiter=line)",
               waiters)
    out.metric("runstate_series_dropped", "gauge",
               f"Series left out past the bound of {limits.metrics_series_max} per metric family",
               [((("family", "queue"),), queues_dropped), ((("family", "resource_waiters"),), waiters_dropped)])
    observed = node.metrics
    out.histogram("runstate_task_latency_seconds", "Seconds from a task's submit to its end, as this node applied it",
                  [((("state", name),), histogram.view()) for name, histogram in observed.task_latency_seconds.items()])
    out.histogram("runstate_task_attempts", "Attempts of a task when it ended, as this node applied it",
                  [((("state", name),), histogram.view()) for name, histogram in observed.task_attempts.items()])
    out.metric("runstate_lease_expiries_total", "counter", "Task delivery leases that lapsed, as this node applied them",
               [((), observed.lease_expiries)])
    out.metric("runstate_takeovers_total", "counter",
               "Lapsed task deliveries whose task went back to its queue for another worker", [((), observed.takeovers)])
    out.metric("runstate_long_polls", "gauge", "Long polls parked on this node now, waiting for a change",
               [((), len(node.waiters))])
    raft = node.log
    role = raft.role
    out.metric("runstate_raft_role", "gauge", "This node's Raft role (1 for the role it has)",
               [((("role", name),), 1 if name == role else 0) for name in ROLES])
    out.metric("runstate_raft_term", "gauge", "This node's Raft term", [((), raft.term)])
    out.metric("runstate_raft_commit_index", "gauge", "The highest log index this node knows committed",
               [((), raft.commit_index)])
    out.metric("runstate_raft_applied_index", "gauge", "The highest log index this node applied", [((), raft.applied_index)])
    out.metric("runstate_raft_apply_lag", "gauge", "Committed entries this node has not applied yet",
               [((), max(raft.commit_index - raft.applied_index, 0))])
    out.metric("runstate_raft_messages_total", "counter",
               "Raft messages this node sent and received, by direction and type (none on a single node)",
               [((("direction", direction), ("type", kind)), count)
                for (direction, kind), count in sorted(raft.raft_messages().items())])
    out.metric("runstate_raft_frames_sealed_total", "counter",
               "Raft frames this node sealed, by format: fernet (to a peer of an earlier release, or before "
               "a peer told its formats) or aead (AES-GCM); none on a single node",
               [((("format", name),), count) for name, count in sorted(raft.raft_frames_sealed().items())])
    transport = raft.raft_transport_counts()
    out.metric("runstate_raft_connections_refused_total", "counter",
               "Connections to this node's Raft port it closed before they named a peer, by reason: cap (too many "
               "in their handshake), handshake_timeout (not done within 2 s), tls (a peer certificate that does not "
               "verify against --peer-tls-ca or does not name the peer's host, or no TLS spoken; also counts the "
               "node's own dials refused so); none on a single node",
               [((("reason", reason),), transport[key]) for reason, key in
                (("cap", "refused"), ("handshake_timeout", "handshakes_timed_out"), ("tls", "tls_refused"))
                if key in transport])
    out.metric("runstate_raft_commands_proposed_total", "counter",
               "Commands this node proposed to the Raft log while it led (a batch submit is one command at "
               "command level 2, one per task below)", [((), raft.counters.commands_proposed)])
    out.metric("runstate_core_compiled", "gauge",
               "1 when this node's core (the rules it applies the log with) runs compiled, 0 when interpreted",
               [((), 1 if COMPILED else 0)])
    out.metric("runstate_command_level", "gauge",
               "The highest command level this node proposes at: the lowest its peers told (1 for a peer not "
               "connected or of an older release), or the level its log proves every node applies, whichever "
               "is higher", [((), node.proposal_level())])
    with node.read() as state:
        proven = dispatch.proven_level(state)
    out.metric("runstate_command_level_proven", "gauge",
               "The command level the applied log proves every node applies (state.level, or 3 once creation "
               "numbers started)", [((), proven)])
    out.metric("runstate_raft_peers_connected", "gauge",
               "Peers this node is connected to now (that told their command level); none on a single node",
               [((), raft.connected_peers())])
    # Damaged data at start (cluster/DESIGN.md "Checksums and damaged data").
    out.metric("runstate_local_data_discarded_total", "counter",
               "Times this node found its Raft journal or dump damaged at start and discarded them to catch up "
               "from the leader (since it started)", [((), raft.counters.local_data_discarded)])
    out.metric("runstate_raft_catching_up", "gauge",
               "1 while this node, after discarding damaged data, catches up from the leader and grants no vote",
               [((), 1 if raft.catching_up else 0)])
    fsync = raft.fsync_seconds
    out.histogram("runstate_raft_fsync_seconds", "Seconds per fsync of the Raft journal (none without a data dir)",
                  [] if fsync is None else [((), fsync)])
    backups = node.backups.figures  # scheduled backups (node/backup.py)
    out.metric("runstate_backup_last_success_timestamp_seconds", "gauge",
               "When this node last finished a scheduled backup (Unix time; 0: none since it started)",
               [((), (backups.last_success_ms or 0) / 1000)])
    out.metric("runstate_backup_last_size_bytes", "gauge", "The size of this node's last scheduled backup",
               [((), backups.last_size_bytes)])
    out.metric("runstate_backup_last_duration_seconds", "gauge",
               "How long this node's last scheduled backup took, from the fork to the file in place",
               [((), backups.last_duration_s)])
    out.metric("runstate_backups_total", "counter", "Scheduled backups this node finished", [((), backups.successes)])
    out.metric("runstate_backup_failures_total", "counter", "Scheduled backups of this node that failed (logged)",
               [((), backups.failures)])
    out.metric("runstate_http_requests_total", "counter",
               "HTTP requests this node answered, by method, route template and status",
               [((("method", method), ("route", route), ("status", status)), count)
                for (method, route, status), count in sorted(observed.http_requests.items())])
    _replica_checks(out, node)
    if node.tls.any:
        now_s = time.time()
        out.metric("runstate_tls_certificate_expiry_seconds", "gauge",
                   "Seconds until a TLS certificate this node serves or trusts expires (negative: expired), by "
                   "certificate: api (--tls-cert), client_ca (--tls-client-ca), ca (--tls-ca), peer (--peer-tls-cert), "
                   "peer_ca (--peer-tls-ca)",
                   [((("certificate", name),), expires_s - now_s)
                    for name, expires_s in expiries(certificate_files(node.config)).items()])
        out.metric("runstate_tls_reloads_total", "counter",
                   "Reloads of the TLS files (SIGHUP or a file changed), by result: done (every context replaced), "
                   "kept (a file could not be used: that part kept the certificate in use; logged)",
                   [((("result", "done"),), node.tls.reloads), ((("result", "kept"),), node.tls.reload_failures)])
    return out.text()


def _replica_checks(out: Exposition, node: Node) -> None:
    """The replica checks' figures (node/replicas.py; README, "Replica checks")."""
    checker = node.replicas
    out.metric("runstate_replica_diverged", "gauge",
               "1 when a replica check found this node's state differs from the one a majority of the voters "
               "agree on (it then refuses calls with REPLICA_DIVERGED until an operator replaces its data)",
               [((), 1 if checker.diverged is not None else 0)])
    out.metric("runstate_replica_check_undecided", "gauge",
               "1 when the last replica check every voter answered found no majority agreeing on a digest",
               [((), 1 if checker.undecided is not None else 0)])
    out.metric("runstate_replica_checks_total", "counter",
               "Replica checks this node computed, by outcome: agreed, diverged, undecided (no majority), "
               "unverified (too few voters answered in time), skipped (its child of an earlier check still ran)",
               [((("outcome", outcome),), count) for outcome, count in checker.counts.items()])
    out.metric("runstate_replica_checks_proposed_total", "counter", "Replica checks this node asked for while it led",
               [((), checker.proposed)])
    out.metric("runstate_replica_check_fork_seconds", "gauge",
               "How long the last replica check's fork stopped this node's apply",
               [] if checker.last_fork_s is None else [((), checker.last_fork_s)])
    out.metric("runstate_replica_check_child_seconds", "gauge",
               "How long the last replica check's child took to hash the state",
               [] if checker.last_child_s is None else [((), checker.last_child_s)])


@routes(
    "GET", "/metrics",
    "This node's metrics in Prometheus' text format (version 0.0.4): queues, resource waiters, task "
    "latency and attempts, lease expiries, Raft and HTTP figures. An operator admin key sees every "
    "space's series, another key its own space's; never forwarded to the leader",
    permission=READ, answer=STRING, media_type="text/plain",
)
async def metrics(request: web.Request) -> web.Response:
    text = render(node_of(request), caller_of(request))
    return web.Response(body=text.encode(), headers={"Content-Type": CONTENT_TYPE})
