"""Learners, from recorded to voter (cluster/DESIGN.md "Membership").

A node joins as a learner: `add_learner` records it in the replicated state (`cluster.learner_add`)
and the node follows the log as pysyncobj's read-only node. While this node leads, `run` checks each
learner's applied index (its public `GET /v1/health`) against the leader's commit index of the
moment of the check; once it is within PROMOTION_SLACK_ENTRIES of it, the leader adds it to the configuration as a voter
(pysyncobj's membership entry) and forgets it as a learner. The learner, seeing itself among the
voters of the configuration it applies, restarts its log as a voter on the same data dir. So a slow
or empty node never counts for a majority before it holds the log.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import aiohttp

from runstate_server.actors import dispatch
from runstate_server.cluster.errors import ChangeRefused
from runstate_server.cluster.log import LogUnavailable, NotLeader
from runstate_server.cluster.membership import Member
from runstate_server.node.config import Peer
from runstate_server.node.errors import ApiError
from runstate_server.node.membership import REMOVED, VOTER, Membership, write_membership
from runstate_server.node.tls import PeerSession

if TYPE_CHECKING:
    from runstate_server.node.server import Node

log = logging.getLogger(__name__)

CHECK_PERIOD_S = 0.5  # how often a leader looks at its learners, and a learner at the configuration
HEALTH_TIMEOUT_S = 1.0  # a learner's answer to the leader's look at its applied index
# A learner within this many entries of the leader's commit index of the moment of the check is
# caught up: under a steady write load one that keeps up trails by the entries in flight (a few
# milliseconds of replication), and waiting for a lull could take as long as the load lasts.
PROMOTION_SLACK_ENTRIES = 16
CHANGE_TIMEOUT_S = 5.0
# A voter that has known no leader this long asks the members it knows whether it is still one of
# them (pysyncobj drops a removed node's connection as the removal is appended: it never hears).
REMOVED_PROBE_AFTER_S = 3.0
REMOVED_PROBE_EVERY_S = 2.0  # a membership entry commits like any other; beyond this its outcome is unknown


class MembershipKeeper:
    def __init__(self, node: Node) -> None:
        self._node = node
        self._leaderless_since: float | None = None  # the loop's clock
        self._probed_at = float("-inf")

    # -- the routes' calls (a leader's) ----------------------------------------------------------

    async def add_learner(self, node_id: str, raft_address: str, api_url: str) -> dict[str, Any]:
        """Record a learner (POST /v1/cluster/join, POST /v1/cluster/members). The same learner
        again changes nothing; CONFLICT for a voter's id or address, or while another learner is
        still catching up (one change at a time)."""
        node = self._node
        node.require_dynamic_membership()
        self._require_membership_level()
        for voter in node.members():
            if node_id == voter.node_id or raft_address == voter.address or api_url == voter.api_url:
                raise ApiError("CONFLICT", f"voter {voter.node_id or voter.address} has that id or address already")
        with node.read() as state:
            learners = dict(state.learners)
        pending = [other for other in learners if other != node_id]
        if pending:
            raise ApiError(
                "CONFLICT", f"learner {pending[0]} is still catching up: add the next once it is a voter (one change at a "
                f"time), or forget it first with `runstate cluster remove {pending[0]}`",
            )
        await node.propose_system(
            "cluster.learner_add", {"node_id": node_id, "raft_address": raft_address, "api_url": api_url},
        )
        log.warning("recorded %s (%s, %s) as a learner", node_id, raft_address, api_url)
        learner = {"id": node_id, "raftAddress": raft_address, "apiUrl": api_url, "voter": False}
        voters = [node.member_view(member) for member in node.members()]
        return {"learner": learner, "voters": voters, "epoch": node.config.epoch}

    async def drop_learner(self, node_id: str) -> bool:
        """Forget the learner `node_id`; False when there is none."""
        with self._node.read() as state:
            if node_id not in state.learners:
                return False
        await self._node.propose_system("cluster.learner_drop", {"node_id": node_id})
        log.warning("dropped learner %s", node_id)
        return True

    def learners(self) -> list[Member]:
        with self._node.read() as state:
            return [Member(raft, node_id, api_url) for node_id, (raft, api_url, _) in state.learners.items()]

    def _require_membership_level(self) -> None:
        with self._node.read() as state:
            proven = dispatch.proven_level(state)
        if proven < dispatch.MEMBERSHIP_LEVEL:
            raise ApiError(
                "CONFLICT", f"every node must run a release that changes memberships first (the log proves command "
                f"level {proven}, membership changes need {dispatch.MEMBERSHIP_LEVEL})",
            )

    # -- the loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
        async with PeerSession(self._node.tls, timeout) as sessions:
            while True:
                await asyncio.sleep(CHECK_PERIOD_S)
                try:
                    session = await sessions.get()
                    if self._node.log.learner:
                        await self._become_voter_once_promoted()
                    elif self._node.log.is_leader:
                        await self._promote_caught_up_learners(session)
                    elif self._node.removed is None:
                        await self._learn_if_removed(session)
                except (ApiError, NotLeader, LogUnavailable, ChangeRefused) as error:
                    log.info("membership: %s (asked again in %s s)", error, CHECK_PERIOD_S)
                except Exception:  # never let the keeper die: the next round tries again
                    log.exception("membership: a round failed (asked again in %s s)", CHECK_PERIOD_S)

    async def promote(self, node_id: str) -> dict[str, Any]:
        """Promote the learner `node_id` now (POST /v1/cluster/members/{id}/promote), as the
        leader would by itself: CONFLICT unless it has caught up; NOT_FOUND for no learner."""
        learner = next((member for member in self.learners() if member.node_id == node_id), None)
        if learner is None:
            names = ", ".join(str(member.node_id) for member in self.learners()) or "none"
            raise ApiError("NOT_FOUND", f"no learner {node_id!r} (the learners: {names})")
        timeout = aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)
        async with PeerSession(self._node.tls, timeout) as sessions:
            promoted = await self._promote_if_caught_up(await sessions.get(), learner)
        if promoted is not None:
            raise ApiError("CONFLICT", f"{node_id} has not caught up yet ({promoted}): promote it once it has")
        node = self._node
        return {"promoted": node_id, "voters": [node.member_view(member) for member in node.members()]}

    async def _promote_caught_up_learners(self, session: aiohttp.ClientSession) -> None:
        for learner in self.learners():
            await self._promote_if_caught_up(session, learner)

    async def _promote_if_caught_up(self, session: aiohttp.ClientSession, learner: Member) -> str | None:
        """Make `learner` a voter if it has caught up; None when it is one now, else why not."""
        node = self._node
        if any(voter.address == learner.address for voter in node.members()):
            await self.drop_learner(str(learner.node_id))  # promoted by a leader that lost its lead before this
            return None
        commit_index = node.log.commit_index
        applied = await _applied_index(session, str(learner.api_url))
        if applied is None:
            return f"its API at {learner.api_url} did not answer"
        if applied < commit_index - PROMOTION_SLACK_ENTRIES:
            return f"applied index {applied}, the leader's commit index {commit_index}"
        await node.log.change_membership("add", learner, CHANGE_TIMEOUT_S)
        log.warning("promoted learner %s to voter (applied %d, commit index %d)", learner.node_id, applied, commit_index)
        await self.drop_learner(str(learner.node_id))
        return None

    async def _learn_if_removed(self, session: aiohttp.ClientSession) -> None:
        """A voter without a leader for REMOVED_PROBE_AFTER_S asks the members it knows; when one that
        leads (at this node's epoch) names voters without this node, it was removed: it records so
        in its data dir, stops its log (it never campaigns again) and answers REMOVED."""
        node = self._node
        now = asyncio.get_running_loop().time()
        if node.log.leader_address is not None:
            self._leaderless_since = None
            return
        if self._leaderless_since is None:
            self._leaderless_since = now
        if now - self._leaderless_since < REMOVED_PROBE_AFTER_S or now - self._probed_at < REMOVED_PROBE_EVERY_S:
            return
        self._probed_at = now
        own = node.config.node_id
        for member in node.members():
            if member.address == node.raft_address or not member.api_url:
                continue
            view = await peer_health(session, member.api_url)
            voters = view.get("voters") if view is not None else None
            if (
                view is not None and view.get("role") == "leader" and view.get("status") == "ok"
                and view.get("epoch") == node.config.epoch and isinstance(voters, list) and own not in voters
            ):
                await self._become_removed(str(member.node_id or member.address), [str(voter) for voter in voters])
                return

    async def _become_removed(self, leader: str, voters: list[str]) -> None:
        node = self._node
        node.removed = (
            f"{node.config.node_id} was removed from its cluster (its leader {leader} names the voters "
            f"{', '.join(voters)}): it serves nothing more; wipe its data dir and start it with --join to serve again"
        )
        log.error("%s", node.removed)
        if node.config.data_dir is not None:
            own = Peer(node.config.node_id, node.raft_address, node.config.api_url)
            write_membership(node.config.data_dir, Membership(REMOVED, (own,), node.config.epoch))
        await node.log.stop()  # it never campaigns again

    async def _become_voter_once_promoted(self) -> None:
        node = self._node
        voters = node.log.voters()
        if not any(voter.address == node.raft_address for voter in voters):
            return
        peers = tuple(
            Peer(voter.node_id or voter.address, voter.address, voter.api_url or "")
            for voter in voters if voter.address != node.raft_address
        )
        own = Peer(node.config.node_id, node.raft_address, node.config.api_url)
        if node.config.data_dir is not None:
            write_membership(node.config.data_dir, Membership(VOTER, (own, *peers), node.config.epoch))
        log.warning("%s is a voter now: restarting its log as one", node.config.node_id)
        await node.restart_log_as_voter(peers)


async def peer_health(session: aiohttp.ClientSession, api_url: str) -> dict[str, Any] | None:
    """A node's GET /v1/health body (200 or 503), None when it did not answer one."""
    try:
        async with session.get(f"{api_url}/v1/health") as answer:
            view = await answer.json()
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None
    return view if isinstance(view, dict) else None


async def _applied_index(session: aiohttp.ClientSession, api_url: str) -> int | None:
    applied = (await peer_health(session, api_url) or {}).get("appliedIndex")
    return applied if isinstance(applied, int) else None
