"""Replica checks: the nodes compare a digest of their state at the same log entry (issue 41, item 5).

Every `--replica-check-every` (5 min by default; 0: never) and after each compaction of its log,
the leader proposes a `replica.check` entry (actors/integrity.py, command level 5). Each node, as
it applies that entry, forks right there, in the tick thread under the log's lock (`CheckedCore`):
the child (`_dumper.ForkedWrite`) sees the state exactly as it is after that command, hashes it as
`GET /v1/cluster/digest` does (SHA-256 of the msgpack snapshot) and writes the hex digest to a file;
the apply stops only for the fork. The node publishes its last digests in `GET /v1/health`
(`replicaCheck.digests`: log index and digest) and reads its peers' there: when a majority of the
voters agree on a digest at an index, a node whose own differs is *diverged*. The rules
(docs/replica-checks.md has them with the reasons):

- A diverged node logs an ERROR, shows `runstate_replica_diverged 1`, answers its health with
  status "diverged" (503), and refuses every call but its health, /metrics and the operator's
  /v1/cluster routes with 503 REPLICA_DIVERGED, until an operator replaces its data. It records
  so in its data dir (`replica-diverged.json`), so a restart on the same data does not clear it.
- A diverged leader hands leadership to another voter (it has no answer a client may trust), and
  hands it over again whenever it leads.
- When every voter answered for an index and no majority agrees, nobody knows which copy is right:
  every node logs an ERROR and shows `runstate_replica_check_undecided 1` and `undecided` in its
  health, and serves on (refusing everywhere would stop the cluster on a question only the operator
  can answer). A later check a majority agrees on clears it.
- A check some voters never answer for (down, or still busy with an earlier check's child) within
  COMPARE_TIMEOUT_S counts as `unverified`; nothing is decided from fewer than a majority.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import msgpack

from runstate_server.actors import dispatch, integrity
from runstate_server.actors.context import Effect
from runstate_server.actors.state import State, to_snapshot
from runstate_server.cluster._dumper import ForkedWrite
from runstate_server.cluster.log import DUMP_FILE_NAME, LogUnavailable, NotLeader
from runstate_server.cluster.private_files import open_private
from runstate_server.node.errors import ApiError
from runstate_server.node.members import peer_health
from runstate_server.node.tls import PeerSession

if TYPE_CHECKING:
    from runstate_server.cluster.log import ReplicatedLog
    from runstate_server.node.server import Node

log = logging.getLogger(__name__)

LOOP_PERIOD_S = 0.5  # how often a node reaps its check's child, compares, and a leader looks at its clock
DIGESTS_KEPT = 4  # a node's last digests, published in its health for its peers to compare with
PEER_HEALTH_TIMEOUT_S = 1.0  # a peer's answer to GET /v1/health
# A check that a majority of the voters did not answer for within this long is given up
# (`unverified`): a peer down, or one that skipped it while its child of an earlier check ran.
COMPARE_TIMEOUT_S = 60.0
DIVERGED_FILE_NAME = "replica-diverged.json"  # in the data dir, once this node's state diverged
_CHECK_FILE_PREFIX = "replica-check."  # the children's digest files (removed once read, and at start)
_DIGEST_HEX_CHARS = 64
# Outcomes of a check this node computed (runstate_replica_checks_total{outcome}).
OUTCOMES = ("agreed", "diverged", "undecided", "unverified", "skipped")


def snapshot_digest(snapshot: dict[str, Any]) -> str:
    """SHA-256 of the msgpack snapshot: what GET /v1/cluster/digest and the checks compare."""
    return hashlib.sha256(msgpack.packb(snapshot, use_bin_type=True)).hexdigest()


def state_digest(state: State) -> bytes:
    """The check's child: the state's digest, as hex bytes (what it writes to its file)."""
    return snapshot_digest(to_snapshot(state)).encode()


class CheckedCore:
    """The state machine the log drives: the core, plus the fork of a check as its entry applies.
    (The core is compiled with mypyc: wrapped, not subclassed.)"""

    def __init__(self, core: dispatch.Core, checker: ReplicaChecker) -> None:
        self.core = core
        self.checker = checker
        self.log: ReplicatedLog | None = None  # set once the log is made (it needs this first)

    @property
    def clock_ms(self) -> int:
        return self.core.clock_ms

    def apply(self, command: dict[str, Any], now_ms: int, epoch: int) -> tuple[Any, list[Effect]]:
        result, effects = self.core.apply(command, now_ms, epoch)
        if type(command) is dict and command.get("type") == integrity.CHECK_KIND and "check" in result:
            # Tick thread, under the log's lock: the state is exactly that after this command.
            self.checker.start_check(self, result["check"], result["reason"])
        return result, effects

    def unknown_kind(self, command: Any) -> str | None:
        return self.core.unknown_kind(command)

    def snapshot(self) -> dict[str, Any]:
        return self.core.snapshot()

    def restore(self, snapshot: dict[str, Any]) -> None:
        self.core.restore(snapshot)


@dataclass
class Check:
    """One check as this node computed it."""

    check_id: str
    index: int  # the log index of its entry
    reason: str
    started_at: float  # time.monotonic() when the fork started
    fork_s: float
    child: ForkedWrite | None
    digest: str | None = None
    outcome: str | None = None  # one of OUTCOMES once decided


class ReplicaChecker:
    def __init__(self, node: Node) -> None:
        self._node = node
        config = node.config
        self.every_ms = config.replica_check_every_ms
        self.enabled = config.clustered
        # Why this node serves nothing of its state, None while its digests agree (or were never compared).
        self.diverged: str | None = None
        self.undecided: str | None = None  # the last no-majority alarm, None once a later check agreed
        # By index, the last DIGESTS_KEPT: the tick thread adds, the loop reads and decides (under _lock).
        self.checks: OrderedDict[int, Check] = OrderedDict()
        self._lock = threading.Lock()
        self.counts = dict.fromkeys(OUTCOMES, 0)
        self.proposed = 0  # checks this node proposed while it led
        self.last_fork_s: float | None = None
        self.last_child_s: float | None = None
        self.agreed_index: int | None = None  # the last index a majority agreed with this node at
        self._started = 0
        self._files_dir = Path(config.data_dir) if config.data_dir is not None else Path(tempfile.gettempdir())
        self._file_prefix = _CHECK_FILE_PREFIX if config.data_dir is not None else f"runstate-{_CHECK_FILE_PREFIX}"
        if config.data_dir is not None:
            for leftover in glob.glob(glob.escape(str(self._files_dir / _CHECK_FILE_PREFIX)) + "*"):
                with contextlib.suppress(OSError):
                    os.remove(leftover)
            self._load_diverged(Path(config.data_dir) / DIVERGED_FILE_NAME)

    # -- the tick thread ---------------------------------------------------------------------------

    def start_check(self, checked: CheckedCore, check_id: str, reason: str) -> None:
        """Fork the check's child now (tick thread, under the lock). One child at a time: a check
        that finds one still running is skipped (its peers decide it without this node)."""
        if not self.enabled or checked.log is None:
            return
        index = checked.log.applied_index + 1  # pysyncobj counts an entry applied after its apply
        with self._lock:
            self._start_check(checked, check_id, reason, index)

    def _start_check(self, checked: CheckedCore, check_id: str, reason: str, index: int) -> None:
        if index <= 1 or index in self.checks:
            return  # a replay before the log knows its index, or the same entry again
        if any(check.child is not None and check.digest is None and check.outcome is None for check in self.checks.values()):
            self.counts["skipped"] += 1
            log.info("replica check %s at index %d skipped: the child of an earlier check still runs", check_id, index)
            return
        self._started += 1
        path = str(self._files_dir / f"{self._file_prefix}{os.getpid()}-{self._started}")
        state = checked.core.state
        started = time.monotonic()
        try:
            child = ForkedWrite(path, lambda: state_digest(state), fsync=False, what=f"replica check {check_id}")
        except OSError:
            log.exception("cannot fork for replica check %s", check_id)
            self.counts["skipped"] += 1
            return
        fork_s = time.monotonic() - started
        self.last_fork_s = fork_s
        self.checks[index] = Check(check_id, index, reason, started, fork_s, child)
        while len(self.checks) > DIGESTS_KEPT:
            _, dropped = self.checks.popitem(last=False)
            if dropped.child is not None and dropped.digest is None:
                dropped.child.abort()

    # -- what the node shows -------------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        """`replicaCheck` of GET /v1/health: this node's verdict and its last digests."""
        status = "diverged" if self.diverged else "undecided" if self.undecided else "ok" if self.enabled else "off"
        return {
            "status": status,
            "message": self.diverged or self.undecided,
            "agreedIndex": self.agreed_index,
            "digests": [
                {"index": check.index, "digest": check.digest}
                for check in self._checks() if check.digest is not None
            ],
        }

    def _checks(self) -> list[Check]:
        with self._lock:
            return list(self.checks.values())

    def refuse_if_diverged(self) -> None:
        if self.diverged is not None:
            raise ApiError("REPLICA_DIVERGED", self.diverged)

    # -- the loop ------------------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        proposed_at = loop.time()
        dump_seen = self._dump_stamp()
        timeout = aiohttp.ClientTimeout(total=PEER_HEALTH_TIMEOUT_S)
        async with PeerSession(self._node.tls, timeout) as sessions:
            while True:
                await asyncio.sleep(LOOP_PERIOD_S)
                try:
                    self._reap()
                    await self._compare(await sessions.get())
                    node = self._node
                    if not node.log.is_leader:
                        continue
                    if self.diverged is not None:
                        await self._hand_leadership_over()
                        continue
                    dump_now = self._dump_stamp()
                    reason = None
                    if dump_now != dump_seen and dump_now is not None:
                        reason = "compaction"
                    elif self.every_ms > 0 and (loop.time() - proposed_at) * 1000 >= self.every_ms:
                        reason = "period"
                    dump_seen = dump_now
                    if reason is not None and node.proposal_level() >= dispatch.INTEGRITY_LEVEL:
                        proposed_at = loop.time()
                        await node.propose_system(integrity.CHECK_KIND, {"reason": reason})
                        self.proposed += 1
                except (ApiError, NotLeader, LogUnavailable) as error:
                    log.info("replica check: %s (again in %s s)", error, LOOP_PERIOD_S)
                except Exception:  # never let the checker die: the next round tries again
                    log.exception("replica check: a round failed (again in %s s)", LOOP_PERIOD_S)

    def _dump_stamp(self) -> tuple[int, int] | None:
        """The leader's dump as a file (a compaction renames a new one into place), None for none."""
        data_dir = self._node.config.data_dir
        if data_dir is None:
            return None
        try:
            status = os.stat(Path(data_dir) / DUMP_FILE_NAME)
        except OSError:
            return None
        return status.st_ino, status.st_mtime_ns

    def _reap(self) -> None:
        for check in self._checks():
            child = check.child
            if child is None or check.digest is not None or check.outcome is not None:
                continue
            done = child.poll()
            if done is None:
                continue
            check.child = None
            self.last_child_s = time.monotonic() - check.started_at
            digest = None
            if done:
                try:
                    digest = Path(child.path).read_text().strip()
                except OSError:
                    log.exception("cannot read the digest of replica check %s", check.check_id)
                with contextlib.suppress(OSError):
                    os.remove(child.path)
            if digest is None or len(digest) != _DIGEST_HEX_CHARS:
                self._decide(check, "skipped")
                continue
            check.digest = digest
            log.info("replica check %s (%s) at index %d: digest %s (fork %.4f s, child %.3f s)", check.check_id,
                     check.reason, check.index, digest[:16], check.fork_s, self.last_child_s)

    async def _compare(self, session: aiohttp.ClientSession) -> None:
        pending = [check for check in self._checks() if check.digest is not None and check.outcome is None]
        if not pending:
            return
        node = self._node
        voters = node.members()
        others = [member for member in voters if member.address != node.raft_address and member.api_url]
        self_votes = any(member.address == node.raft_address for member in voters) and not node.log.learner
        views = await asyncio.gather(*(_digests(session, str(member.api_url)) for member in others))
        majority = len(voters) // 2 + 1
        for check in pending:
            assert check.digest is not None
            votes: dict[str, int] = {check.digest: 1} if self_votes else {}
            answered = 1 if self_votes else 0
            for view in views:
                digest = view.get(check.index) if view is not None else None
                if digest is not None:
                    votes[digest] = votes.get(digest, 0) + 1
                    answered += 1
            agreed = next((digest for digest, count in votes.items() if count >= majority), None)
            if agreed is not None:
                if agreed == check.digest:
                    self._agree(check)
                else:
                    self._diverge(check, agreed, votes[agreed], len(voters))
            elif answered >= len(voters):
                self._no_majority(check, votes, len(voters))
            elif time.monotonic() - check.started_at > COMPARE_TIMEOUT_S:
                log.warning("replica check %s at index %d unverified: %d of %d voters answered in %s s", check.check_id,
                            check.index, answered, len(voters), COMPARE_TIMEOUT_S)
                self._decide(check, "unverified")

    def _decide(self, check: Check, outcome: str) -> None:
        check.outcome = outcome
        self.counts[outcome] += 1

    def _agree(self, check: Check) -> None:
        self._decide(check, "agreed")
        self.agreed_index = check.index
        if self.undecided is not None:
            log.warning("replica check at index %d: a majority agrees again; the undecided alarm is cleared", check.index)
            self.undecided = None

    def _diverge(self, check: Check, agreed: str, agreeing: int, voters: int) -> None:
        self._decide(check, "diverged")
        if self.diverged is not None:
            return
        node = self._node
        self.diverged = (
            f"{node.config.node_id}'s state at log index {check.index} differs from the one {agreeing} of {voters} voters "
            f"agree on (digest {check.digest} against {agreed}): it serves none of its state until an operator replaces "
            f"it: remove it (runstate cluster remove {node.config.node_id}), wipe its data dir and start it with --join "
            "(README, \"Replica checks\")"
        )
        log.error("REPLICA DIVERGED: %s", self.diverged)
        data_dir = node.config.data_dir
        if data_dir is not None:
            record = {"message": self.diverged, "index": check.index, "digest": check.digest, "agreed": agreed}
            try:
                _write_private_json(Path(data_dir) / DIVERGED_FILE_NAME, record)
            except OSError:
                log.exception("cannot record the divergence in %s", data_dir)

    def _no_majority(self, check: Check, votes: dict[str, int], voters: int) -> None:
        self._decide(check, "undecided")
        self.undecided = (
            f"replica check at log index {check.index}: no majority of the {voters} voters agrees on a digest "
            f"({', '.join(f'{digest[:16]}: {count}' for digest, count in votes.items())}): compare the nodes' data "
            "(README, \"Replica checks\")"
        )
        log.error("REPLICA CHECK UNDECIDED: %s", self.undecided)

    async def _hand_leadership_over(self) -> None:
        node = self._node
        log.error("%s leads with a diverged state: handing leadership to another voter", node.config.node_id)
        await node.transfer_leadership(None)

    def _load_diverged(self, path: Path) -> None:
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as error:
            record = {"message": f"{path} is unreadable ({error})"}
        message = record.get("message") if isinstance(record, dict) else None
        self.diverged = f"{message or 'a replica check found this state diverged'} (recorded in {path})"
        log.error("REPLICA DIVERGED (from an earlier run): %s", self.diverged)


def _write_private_json(path: Path, record: dict[str, Any]) -> None:
    with open_private(path) as file:
        file.write(json.dumps(record).encode())
        file.flush()
        os.fsync(file.fileno())


async def _digests(session: aiohttp.ClientSession, api_url: str) -> dict[int, str] | None:
    """A peer's last digests by index (GET /v1/health's replicaCheck, 200 or 503), None when none answered."""
    view = await peer_health(session, api_url)
    check = view.get("replicaCheck") if view is not None else None
    digests = check.get("digests") if isinstance(check, dict) else None
    if not isinstance(digests, list):
        return None
    return {
        entry["index"]: entry["digest"] for entry in digests
        if isinstance(entry, dict) and isinstance(entry.get("index"), int) and isinstance(entry.get("digest"), str)
    }
