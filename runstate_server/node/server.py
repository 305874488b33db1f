"""One runstate node: the core, the replicated log, the waiters, the ticker and the HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import IO, Any

from aiohttp import web

from runstate_server.actors import access, dispatch
from runstate_server.actors.context import Effect
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import State
from runstate_server.cluster.config import LogConfig
from runstate_server.cluster.errors import ChangeRefused
from runstate_server.cluster.log import LogUnavailable, NotLeader, ReplicatedLog
from runstate_server.cluster.membership import Member
from runstate_server.cluster.private_files import make_private_dir, open_private
from runstate_server.node.backup import Backups
from runstate_server.node.bootstrap import bootstrap
from runstate_server.node.caller import Caller
from runstate_server.node.certs import EXPIRY_CHECK_EVERY_S, expiring
from runstate_server.node.config import (
    DEFAULT_HOST,
    LOCK_FILE_NAME,
    PROPOSE_TIMEOUT_S,
    READ_INDEX_TIMEOUT_S,
    READY_TIMEOUT_S,
    WRITE_STOP_GRACE_S,
    ConfigError,
    NodeConfig,
    Peer,
    split_address,
)
from runstate_server.node.errors import ApiError, raise_for_result
from runstate_server.node.http_server import Runner, Site, connections_max_for, limit_log_rate, raise_fd_limit
from runstate_server.node.members import MembershipKeeper
from runstate_server.node.metrics import NodeMetrics
from runstate_server.node.replicas import CheckedCore, ReplicaChecker
from runstate_server.node.routing import Router
from runstate_server.node.ticker import Ticker
from runstate_server.node.tls import NodeTls, certificate_files
from runstate_server.node.waiters import Waiters

log = logging.getLogger(__name__)

COMMAND_ID_BYTES = 10  # 80 bits: run, task and delivery ids and lease tokens derive from a command's id


def new_command_id() -> str:
    """A command's id, from the OS's CSPRNG: tokens derive from it, so no run of earlier ids may
    predict the next (a Mersenne Twister's can, from 624 outputs)."""
    return os.urandom(COMMAND_ID_BYTES).hex()


def new_command_ids(count: int) -> list[str]:
    """`count` command ids as new_command_id makes them, from one read of the CSPRNG (a read per
    id costs a system call each: 1.25 us against 0.16 us)."""
    drawn = os.urandom(COMMAND_ID_BYTES * count)
    return [drawn[start : start + COMMAND_ID_BYTES].hex() for start in range(0, len(drawn), COMMAND_ID_BYTES)]


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


# A command that also comes as one command for many items (args {"items": [args, ...], "ids":
# [command id, ...]}): its kind, and the command level from which every node applies that kind.
MANY_KINDS = {"task.submit": ("task.submit_many", dispatch.SUBMIT_MANY_LEVEL)}


def _outcome(result: Any) -> Any:
    """One item's core result, or the ApiError it carries."""
    try:
        return raise_for_result(result)
    except ApiError as error:
        return error


def _api_error(error: BaseException) -> ApiError:
    """What a client is answered when the log did not commit its command."""
    if isinstance(error, NotLeader):
        return ApiError("UNAVAILABLE", str(error))
    if isinstance(error, LogUnavailable):
        return ApiError("UNAVAILABLE", f"the write could not be confirmed: {error}")
    if isinstance(error, (TypeError, ValueError)):
        # What a client sent cannot be stored: a string that is not valid Unicode (a lone
        # surrogate, which JSON can escape), an integer beyond 64 bits, or a command too large.
        return ApiError("VALIDATION_FAILED", f"the request holds a value that cannot be stored: {error}")
    raise error


# A caught-up, reachable voter takes leadership over within a few ticks of being told; one that does
# not within this long is unreachable or behind, and the leader leads on (transfer_leadership).
TRANSFER_TIMEOUT_S = 5.0
# A membership entry commits like any other; one that did not within this long has an unknown outcome
# (below the CLI's own request timeout, so that it hears the answer).
MEMBERSHIP_CHANGE_TIMEOUT_S = 5.0
NEW_LEADER_WAIT_S = 2.0  # after the handover, until the new leader's first message names it here
NEW_LEADER_POLL_S = 0.01
LISTEN_BACKLOG = 1024  # pending connections the API socket queues
BOOTSTRAP_RETRY_S = 0.5  # a cluster leader retries creating the first admin key this often


class NodeStartError(Exception):
    """The node cannot start as configured (port taken, data dir in use, ...); the message says why."""


def check_port_free(host: str, port: int) -> None:
    """Fail before replaying the log (or starting nodes) if a port is taken."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            raise NodeStartError(f"cannot listen on {host}:{port}: {error.strerror}") from None


class Node:
    def __init__(self, config: NodeConfig, build_app: Callable[[Node], web.Application]) -> None:
        """`build_app` makes the HTTP application that serves this node (node/api/app.py; the
        process's entry point passes it, so this layer imports nothing of the API above it)."""
        self.config = config
        self._build_app = build_app
        self.core = dispatch.Core()
        self.waiters = Waiters(config.long_polls_per_key_max, config.long_polls_max)
        self.metrics = NodeMetrics()  # what this node observes (GET /metrics)
        self.ticker = Ticker(self)
        raft_address = config.raft_address or f"{DEFAULT_HOST}:{free_port(DEFAULT_HOST)}"
        raft_host, raft_port = split_address(raft_address, "the Raft address")
        if raft_port == config.port and raft_host in (config.host, "0.0.0.0"):
            raise NodeStartError(f"the Raft port must not be the API port ({config.port})")
        self.raft_address = raft_address
        self._password = config.secret or secrets.token_hex(16)
        # The TLS contexts of the API, of calls to other nodes' APIs and of the Raft port
        # (node/tls.py); reloaded on SIGHUP and when a file changes.
        try:
            self.tls = NodeTls(config)
        except ConfigError as error:
            raise NodeStartError(str(error)) from None
        self.replicas = ReplicaChecker(self)  # replica checks (node/replicas.py)
        self.log = self._new_log(self.core, learner=config.learner, peers=config.peers)
        self.router = Router(self)
        self.membership = MembershipKeeper(self)
        self.backups = Backups(self)  # GET /v1/cluster/backup and scheduled backups (node/backup.py)
        # Why this node serves nothing more (it was removed from its cluster), None while it serves.
        self.removed: str | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: Runner | None = None
        self._lock_file: IO[bytes] | None = None
        self.url = ""
        self.bootstrap_message: str | None = None  # what `runstate dev --auth` tells the user

    def _new_log(self, core: dispatch.Core, *, learner: bool, peers: tuple[Peer, ...]) -> ReplicatedLog:
        """The replicated log this node applies to `core`: a voter's, or a learner's (no Raft port
        of its own: it dials the voters). The members' names: this node's and its peers', the first
        configuration of a new cluster; the configuration the log applies names every member after
        that (members())."""
        config = self.config
        seed = [Member(self.raft_address, config.node_id, config.api_url)]
        seed += [Member(peer.raft_address, peer.id, peer.api_url) for peer in peers]
        checked = CheckedCore(core, self.replicas)  # forks a replica check's digest as its entry applies
        checked.log = replicated = ReplicatedLog(
            checked,
            self_address=None if learner else self.raft_address,
            peer_addresses=[peer.raft_address for peer in peers],
            data_dir=config.data_dir,
            password=self._password,
            fsync=config.fsync,
            on_applied=self._on_applied,
            on_role_change=self._on_role_change,
            config=LogConfig(
                log_compaction_entries_min=config.compaction_entries, bind_address=config.raft_bind,
                dynamic_membership=config.clustered,
            ),
            command_level=config.command_level,
            members=seed,
            epoch=config.epoch,
            peer_tls=self.tls.peer,
        )
        return replicated

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        limit_log_rate()
        fd_limit = raise_fd_limit()
        self._lock_data_dir()
        check_port_free(self.config.host, self.config.port)
        try:
            await self.log.start()
            if not self.config.clustered:
                # A single node elects itself at once; wait so the first request finds it ready.
                # A cluster node serves at once instead (503 until a majority is up and elects).
                await self.log.wait_ready(READY_TIMEOUT_S)
        except LogUnavailable as error:
            raise NodeStartError(f"the replicated log did not start: {error}") from None
        if self.config.auth and not self.config.clustered:
            try:
                self.bootstrap_message = await bootstrap(self)
            except (ApiError, OSError) as error:
                raise NodeStartError(f"cannot create the first admin key: {error}") from None
        self._spawn(self.ticker.run(), "ticker")
        if self.config.clustered:
            self._spawn(self.membership.run(), "membership")
            self._spawn(self.replicas.run(), "replica-checks")
        if self.config.backup_dir is not None:
            self._spawn(self.backups.run_schedule(
                self.config.backup_dir, self.config.backup_every_ms, self.config.backup_keep), "backups")
        connections_max = connections_max_for(self.config.http, fd_limit)
        self._runner = Runner(self._build_app(self), self.config.http, connections_max=connections_max)
        await self._runner.setup()
        ssl_context = self.tls.server  # HTTPS (node/certs.py), None: plain HTTP
        if self.tls.any:
            self._spawn(self._warn_of_expiring_certificates(), "certificate-expiry")
            self._spawn(self.tls.watch(), "tls-reload")
        site = Site(self._runner, self.config.host, self.config.port, backlog=LISTEN_BACKLOG, ssl_context=ssl_context)
        self.tls.on_server_context = site.use_tls
        await site.start()
        scheme = "https" if ssl_context is not None else "http"
        self.url = f"{scheme}://{self.config.host}:{self.config.port}"

    async def _warn_of_expiring_certificates(self) -> None:
        """A warning per TLS certificate that expires within EXPIRY_WARNING_DAYS: at start, then daily."""
        while True:
            for line in expiring(certificate_files(self.config), time.time()):
                log.warning("%s", line)
            await asyncio.sleep(EXPIRY_CHECK_EVERY_S)

    async def restart_log_as_voter(self, peers: tuple[Peer, ...]) -> None:
        """A learner promoted to voter: its read-only log stops and a voter's starts on the same
        data dir (the dump and journal it wrote), into a fresh core that the new log restores. Calls
        meanwhile find the stopped log: 503, retried elsewhere."""
        old = self.log
        await old.stop()
        core = dispatch.Core()
        new = self._new_log(core, learner=False, peers=peers)
        try:
            await new.start()
        except LogUnavailable as error:
            raise NodeStartError(f"the voter's log did not start: {error}") from None
        self.core, self.log = core, new
        self.config.learner = False
        self.config.peers = peers

    async def stop(self) -> None:
        # The HTTP server's shutdown waits for every handler: long polls answer now, and calls
        # forwarded to the leader (long polls among them) soon (Router.stopping).
        self.waiters.close()
        self.router.stopping()
        ending_waits = asyncio.get_running_loop().call_later(WRITE_STOP_GRACE_S, self.log.end_waits)
        try:
            if self._runner is not None:
                await self._runner.cleanup()
        finally:
            ending_waits.cancel()
        await self.router.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.log.stop()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the lock
            self._lock_file = None

    def _lock_data_dir(self) -> None:
        """One node per data dir: two would interleave their journals. The lock dies with the
        process, so a kill -9 leaves nothing to clean up."""
        data_dir = self.config.data_dir
        if data_dir is None:
            return
        try:
            make_private_dir(data_dir)  # 0700, files 0600 (cluster/private_files.py)
        except OSError as error:
            raise NodeStartError(f"cannot create the data dir {data_dir}: {error.strerror}") from None
        lock_file = open_private(data_dir / LOCK_FILE_NAME, "ab")  # held until stop()
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock_file.close()
            raise NodeStartError(f"another runstate node is using the data dir {data_dir}") from None
        self._lock_file = lock_file

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- writes ----------------------------------------------------------------------------------

    async def propose(
        self, caller: Caller, kind: str, args: dict[str, Any], *, idempotency: tuple[str, str] | None = None
    ) -> Any:
        """Commit one command for `caller` and return its result; a rejection raises ApiError. The
        command carries the caller's key id, so the core refuses it if the key was revoked by an
        earlier entry of the log, whichever node checked the key first. With `idempotency` (the
        request's idempotency key and fingerprint) a retry of the request gets the first result
        instead of applying the command again (actors/idempotency.py)."""
        return await self._propose(caller.space, caller.key_id, kind, args, idempotency)

    async def propose_system(self, kind: str, args: dict[str, Any]) -> Any:
        return await self._propose(dispatch.SYSTEM_SPACE, None, kind, args)

    async def propose_many(
        self,
        caller: Caller,
        kind: str,
        args_list: list[dict[str, Any]],
        idempotency: tuple[str, str] | None,
        idempotencies: list[tuple[str, str] | None],
    ) -> list[Any]:
        """Commit one command of `kind` per args for `caller`, together, as `propose` would each;
        return, in order, each one's result or the ApiError its own `propose` would have raised.
        When every node of the cluster applies it (the log's command level), they travel as one
        command of MANY_KINDS (one envelope, and one idempotency record for all: `idempotency`,
        the request's), else as one command each (`idempotencies[i]` that of args_list[i])."""
        many = MANY_KINDS.get(kind)
        if many is not None and self.proposal_level() >= many[1]:
            args = {"items": args_list, "ids": new_command_ids(len(args_list))}
            try:
                items = (await self._propose(caller.space, caller.key_id, many[0], args, idempotency))["items"]
            except ApiError as error:  # not committed, or refused whole: every item answers so
                return [error] * len(args_list)
            return [_outcome(item) for item in items]
        commands = [
            self._command(caller.space, caller.key_id, kind, args, one_idempotency, command_id)
            for args, one_idempotency, command_id in zip(
                args_list, idempotencies, new_command_ids(len(args_list)), strict=True
            )
        ]
        try:
            outcomes = await self.log.propose_many(commands, PROPOSE_TIMEOUT_S)
        except (NotLeader, LogUnavailable) as error:
            return [_api_error(error) for _ in commands]
        return [_api_error(outcome) if isinstance(outcome, BaseException) else _outcome(outcome) for outcome in outcomes]

    # -- members ---------------------------------------------------------------------------------

    def members(self) -> list[Member]:
        """The voters of the configuration this node applies now, this node first."""
        return self.log.voters()

    def member_by_address(self, raft_address: str | None) -> Member | None:
        """The member at `raft_address` (pysyncobj names the leader by it), None if none is."""
        return next((member for member in self.members() if member.address == raft_address), None)

    def leader(self) -> Member | None:
        """The leader this node knows of, None during an election."""
        return self.member_by_address(self.log.leader_address)

    def require_dynamic_membership(self) -> None:
        """CONFLICT on a node whose membership never changes (`runstate dev`)."""
        if not self.log.dynamic_membership:
            raise ApiError("CONFLICT", "this node runs alone (runstate dev): its membership never changes; a cluster's "
                                       "nodes (runstate node) add and remove members")

    def member_by_id(self, node_id: str) -> Member:
        """The voter `node_id`; NOT_FOUND when there is none."""
        members = self.members()
        found = next((member for member in members if member.node_id == node_id), None)
        if found is None:
            names = ", ".join(sorted(str(member.node_id or member.address) for member in members))
            raise ApiError("NOT_FOUND", f"no voter {node_id!r} in this cluster (its voters: {names})")
        return found

    async def remove_member(self, node_id: str) -> dict[str, Any]:
        """Remove the voter `node_id` from the configuration (a leader's call): refused with
        CONFLICT unless the cluster keeps a majority of its new configuration reachable, every node
        applies membership changes, no other change is under way, and `node_id` is not this
        leader (which hands leadership over first: `transfer_leadership`)."""
        self.require_dynamic_membership()
        removed = self.member_by_id(node_id)
        with self.read() as state:
            proven = dispatch.proven_level(state)
        told = self.log.levels_told()
        others = [member for member in self.members()[1:] if member.address != removed.address]
        if proven < dispatch.MEMBERSHIP_LEVEL and not (
            # A node that died for good during the upgrade never tells its level, so the log never
            # proves it: its removal is allowed when every other voter told the level.
            self.config.command_level >= dispatch.MEMBERSHIP_LEVEL
            and all(told.get(member.address, 1) >= dispatch.MEMBERSHIP_LEVEL for member in others)
        ):
            raise ApiError("CONFLICT", f"every node must run a release that changes memberships first (the log proves "
                                       f"command level {proven}, membership changes need {dispatch.MEMBERSHIP_LEVEL})")
        if not self.log.is_leader:
            raise ApiError("UNAVAILABLE", f"{self.config.node_id} stopped leading; ask again")
        if removed.address == self.log.self_address:
            raise ApiError("CONFLICT", f"{node_id} leads: hand leadership to another voter first "
                                       "(runstate cluster transfer-leader), then remove it")
        remaining = [member for member in self.members() if member.address != removed.address]
        reachable = [member for member in remaining if self.log.reachable(member.address)]
        if 2 * len(reachable) <= len(remaining):
            raise ApiError("CONFLICT", f"removing {node_id} would leave {len(reachable)} of {len(remaining)} voters "
                                       "reachable, fewer than a majority: bring the others back first")
        try:
            await self.log.change_membership("remove", removed, MEMBERSHIP_CHANGE_TIMEOUT_S)
        except NotLeader:
            raise ApiError("UNAVAILABLE", f"{self.config.node_id} stopped leading; ask again") from None
        except ChangeRefused as error:
            raise ApiError("CONFLICT", f"{error}; try again in a moment") from None
        except LogUnavailable as error:
            raise ApiError("UNAVAILABLE", str(error)) from None
        log.warning("removed %s (%s) from the cluster", node_id, removed.address)
        return {"removed": node_id, "members": [self.member_view(member) for member in self.members()]}

    @staticmethod
    def member_view(member: Member) -> dict[str, Any]:
        return {"id": member.node_id, "raftAddress": member.address, "apiUrl": member.api_url, "voter": True}

    async def transfer_leadership(self, to_id: str | None) -> dict[str, Any]:
        """Hand this leader's leadership to the voter `to_id` (None: the most caught-up connected
        one): ReplicatedLog.transfer_leadership, then wait until the new leader is known here.
        The answer names the leader now and the one before; `transferred` is false when `to_id` is
        this node, which leads already."""
        own_id = self.config.node_id
        peers = {member.node_id: member for member in self.members()[1:]}
        if to_id is not None and to_id != own_id and to_id not in peers:
            members = ", ".join(sorted([own_id, *(str(node_id) for node_id in peers)]))
            raise ApiError("NOT_FOUND", f"no voter {to_id!r} in this cluster (its voters: {members})")
        if not self.log.is_leader:
            raise ApiError("UNAVAILABLE", f"{own_id} stopped leading; ask again")
        if to_id == own_id:
            return {"leader": own_id, "previousLeader": own_id, "transferred": False}
        if not peers:
            raise ApiError("CONFLICT", "a cluster of one voter has no other voter to hand leadership to")
        try:
            await self.log.transfer_leadership(peers[to_id].address if to_id else None, TRANSFER_TIMEOUT_S)
        except NotLeader:
            raise ApiError("UNAVAILABLE", f"{own_id} stopped leading before the handover; ask again") from None
        except LogUnavailable as error:
            raise ApiError("CONFLICT", f"leadership stays with {own_id}: {error}") from None
        deadline = asyncio.get_running_loop().time() + NEW_LEADER_WAIT_S
        while (leader := self.log.leader_address) in (None, self.log.self_address) and (
            asyncio.get_running_loop().time() < deadline
        ):
            await asyncio.sleep(NEW_LEADER_POLL_S)
        now_leading = self.member_by_address(leader)
        return {"leader": now_leading.node_id if now_leading else None, "previousLeader": own_id, "transferred": True}

    def proposal_level(self) -> int:
        """The command level this node proposes at: what every peer connected now told, or what
        the applied log proves (dispatch.proven_level), whichever is higher. Any thread: the
        state's creation numbers only ever start, and one attribute is read whole."""
        return self.log.command_level(proven=dispatch.proven_level(self.core.state))

    async def _propose(
        self, space: str, key_id: str | None, kind: str, args: dict[str, Any], idempotency: tuple[str, str] | None = None
    ) -> Any:
        try:
            command = self._command(space, key_id, kind, args, idempotency, new_command_id())
            result = await self.log.propose(command, PROPOSE_TIMEOUT_S)
        except (TypeError, ValueError, NotLeader, LogUnavailable) as error:
            raise _api_error(error) from None
        return raise_for_result(result)

    @staticmethod
    def _command(
        space: str, key_id: str | None, kind: str, args: dict[str, Any], idempotency: tuple[str, str] | None,
        command_id: str,
    ) -> dict[str, Any]:
        command: dict[str, Any] = {
            "type": kind, "v": dispatch.COMMAND_VERSION, "space": space, "id": command_id, "args": args,
        }
        if key_id is not None:
            command["key"] = key_id
        if idempotency is not None:
            command["idem"] = list(idempotency)
        # Committed, a kind no replica knows would halt every one of them (ReplicatedLog.apply_batch).
        assert dispatch.unknown_kind(command) is None, f"proposing an unknown command: {kind!r}"
        return command

    # -- reads -----------------------------------------------------------------------------------

    async def confirm_leadership(self, caller: Caller) -> None:
        """Before a read a client acts on: return once this node may answer it from its applied
        state, linearizably (cluster/DESIGN.md "Linearizable reads").

        On a single voter (`runstate dev`, a one-node cluster) at once: no other node can lead,
        and this one applied every write it acknowledged before answering it
        (`ReplicatedLog.reads_locally`). On a cluster's leader, once a majority confirmed after the
        read began that it still leads and it applied its commit index of that moment (a Raft read
        index, `ReplicatedLog.read_index`): no log entry either. Either way the caller's key is
        checked against the state at the read with the core's own check and error, so a key revoked
        before the read is refused. Otherwise (not leading yet or any more, or no majority
        confirmed the read index in time, e.g. peers that do not know it, and then until a round is
        confirmed again) a no-op `barrier` entry, carrying the caller's key, is committed through
        the log as before."""
        if self.log.reads_locally():
            self._check_read_key(caller)
            return
        if self.log.reads_by_index():
            try:
                await self.log.read_index(READ_INDEX_TIMEOUT_S)
            except NotLeader as error:
                raise ApiError("UNAVAILABLE", str(error)) from None
            except LogUnavailable as error:
                # The log warns once when its rounds go unconfirmed (ReplicatedLog.read_index).
                log.debug("read index not confirmed (%s); the read commits a barrier", error)
            else:
                self._check_read_key(caller)
                return
        await self.propose(caller, "barrier", {})

    def _check_read_key(self, caller: Caller) -> None:
        if caller.key_id is None:
            return
        with self.read() as state:
            try:
                access.require_command_key(state, caller.key_id, caller.space)
            except Rejected as rejected:
                raise_for_result(rejected.as_result())

    @contextlib.contextmanager
    def read(self) -> Iterator[State]:
        """The state, held still: no command is applied while the block runs. Keep it short."""
        with self.log.lock:
            yield self.core.state

    def next_due_ms(self) -> int | None:
        with self.log.lock:
            return self.core.state.next_due_ms()

    async def prove_levels_when_due(self) -> None:
        """A leader starts the state's creation numbers (`state.number_creations`, which lists page
        by) once every node of the cluster applies that command, and writes `state.level` once
        every node told a level above the one the log proves (dispatch.proven_level): at once on a
        new cluster, after the last node of a rolling upgrade runs this release on one that was
        not. Once each: a state numbered stays numbered, a level proven stays proven (the ticker
        asks again while they are not)."""
        told = self.log.command_level()
        if not self.log.is_leader or told < dispatch.NUMBER_CREATIONS_LEVEL:
            return
        with self.log.lock:
            numbered = self.core.state.creation_seq is not None
            proven = dispatch.proven_level(self.core.state)
        if not numbered:
            await self.propose_system("state.number_creations", {})
        if proven < told and told >= dispatch.STATE_LEVEL_LEVEL:
            # The same for the level every node told now: from then on the log proves it.
            await self.propose_system("state.level", {"level": told})
        await self.identify_cluster_when_due()

    async def identify_cluster_when_due(self) -> None:
        """A leader names its cluster (`cluster.identify`, a new random id) once every node applies
        that command (dispatch.INTEGRITY_LEVEL); once: a named cluster keeps its name, and a
        cluster restored from a backup got a new one from `runstate restore` (node/backup.py)."""
        if not self.log.is_leader or self.proposal_level() < dispatch.INTEGRITY_LEVEL:
            return
        with self.log.lock:
            named = self.core.state.cluster_id is not None
        if not named:
            cluster_id = dispatch.CLUSTER_ID_PREFIX + secrets.token_hex(dispatch.CLUSTER_ID_HEX_CHARS // 2)
            await self.propose_system("cluster.identify", {"cluster_id": cluster_id})

    # -- effects, on the event loop --------------------------------------------------------------

    def _on_applied(self, effects: list[Effect]) -> None:
        for effect in effects:
            if effect[0] == "wake":
                self.waiters.wake(effect[1])
            elif effect[0] == "arm":
                self.ticker.arm()
            elif effect[0] == "observe":
                self.metrics.observe(effect)

    def _on_role_change(self) -> None:
        self.ticker.arm()
        if self.log.is_leader:
            self._spawn(self._announce_leadership(), "leader-start")
        else:
            # Long polls parked here would wait for effects that now happen elsewhere.
            self.waiters.wake_all()

    async def _announce_leadership(self) -> None:
        try:
            await self.propose_system("leader.start", {})
        except ApiError as error:
            log.warning("leader.start not applied: %s", error.message)
        try:
            await self.prove_levels_when_due()
        except ApiError as error:  # the ticker asks again
            log.info("state.number_creations or state.level not applied: %s", error.message)
        if self.config.auth and self.config.clustered:
            await self._bootstrap_while_leading()

    async def _bootstrap_while_leading(self) -> None:
        """A cluster's first leader creates the first admin key; retried while this node leads."""
        while self.log.is_leader:
            try:
                message = await bootstrap(self)
            except ApiError as error:
                log.warning("bootstrap not applied (%s); retrying", error.message)
                await asyncio.sleep(BOOTSTRAP_RETRY_S)
                continue
            except OSError as error:
                log.error("cannot write the bootstrap key: %s", error)
                return
            if message is not None:
                print(message, flush=True)
            return
