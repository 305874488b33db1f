"""One place decides whether a request is served here or forwarded to the leader.

Any node accepts every call. The leader serves it; a follower forwards it whole (method, path,
query, body, the client's headers) to the leader's API and relays the answer, so clients never
need to know who leads. Node-local routes (health, cluster view, OpenAPI, the console's files) are always served where
they arrive. A forwarded request is never forwarded again: a node that receives one and does not
lead answers UNAVAILABLE, and the client retries (safely: writes carry keys or delivery ids).

A leader whose API refuses the connection (killed: the call never reached it) is a leader about to
be replaced: the follower waits for the next one, within the same LEADER_WAIT_S as an election,
and forwards the call there, instead of answering UNAVAILABLE at once and leaving the client to
back off and come back after the election.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from aiohttp import web

from runstate_server.node import relay
from runstate_server.node.config import LONG_POLL_MS_MAX, PROPOSE_TIMEOUT_S
from runstate_server.node.errors import REQUEST_ID_HEADER, REQUEST_ID_KEY, ApiError

if TYPE_CHECKING:
    from runstate_server.node.server import Node

log = logging.getLogger(__name__)

LOCAL_PATHS = frozenset({
    "/v1/health", "/v1/cluster", "/v1/cluster/digest", "/v1/openapi.json", "/metrics",
    "/v1/cluster/backup",  # taken on the node asked (node/api/backup.py)
    "/", "/console", "/console/",  # the web console (api/console.py): the same files on every node
})
LOCAL_PREFIXES = ("/console/static/",)
FORWARDED_HEADER = "X-Runstate-Forwarded-By"
# On a forwarded answer: the leader's API URL, so a client can go there directly next time.
LEADER_HEADER = "X-Runstate-Leader"
# During an election a request waits this long for a leader before it answers UNAVAILABLE.
LEADER_WAIT_S = 3.0
LEADER_POLL_S = 0.01
# While a call is forwarded, how often to check that its leader still leads.
LEADER_CHECK_S = 0.1
# A forwarded call may be a long poll: its own bound plus the time a write may take.
FORWARD_TIMEOUT_S = LONG_POLL_MS_MAX / 1000 + PROPOSE_TIMEOUT_S + 5.0
FORWARD_CONNECT_TIMEOUT_S = 1.0
# Idle connections to the leader kept for the next forwards (one is open per call in flight).
FORWARD_IDLE_CONNECTIONS_MAX = 100
# An idle connection to the leader is reused while it has been idle at most this share of the
# node's own idle timeout (the leader closes one idle for its own; a cluster's nodes share the
# setting), and never past FORWARD_IDLE_REUSE_S_MAX.
FORWARD_IDLE_REUSE_SHARE = 0.5
FORWARD_IDLE_REUSE_S_MAX = 15.0
# Once the node is stopping, a call still forwarded after this long (a long poll) is answered
# UNAVAILABLE, so the stop does not wait out the poll; its client polls again at another node.
FORWARD_STOP_GRACE_S = 1.0
# Headers of the leader's answer that the client must see.
_RELAYED_HEADERS = (REQUEST_ID_HEADER, "Retry-After")
# Headers that describe one hop, not the request (the body was read whole here: no Expect), and the
# ones the follower sets itself.
_NOT_FORWARDED_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer", "expect",
    FORWARDED_HEADER.lower(), REQUEST_ID_HEADER.lower(),
})


class _LeaderUnreachable(Exception):
    """The leader's API could not be connected to: the call never reached it."""


def forwarded(request: web.Request) -> bool:
    """The request came from a follower that forwarded it here."""
    return FORWARDED_HEADER in request.headers


class Router:
    def __init__(self, node: Node) -> None:
        self._node = node
        # One connection to the leader per call forwarded (so no call waits behind a forwarded long
        # poll: with aiohttp's client, capped at 256 connections, 300 idle workers' receives held
        # through a follower made a create wait 18 s); the API's connection cap bounds the calls.
        idle_reuse_s = min(FORWARD_IDLE_REUSE_S_MAX, node.config.http.idle_timeout_ms / 1000 * FORWARD_IDLE_REUSE_SHARE)
        self._client = relay.RelayClient(
            idle_max=FORWARD_IDLE_CONNECTIONS_MAX, idle_reuse_s=idle_reuse_s, connect_timeout_s=FORWARD_CONNECT_TIMEOUT_S,
            context=lambda: node.tls.client,
        )
        self._stop_deadline: float | None = None  # the loop's clock; set once the node is stopping
        # Per leader API URL (the peers' URLs, fixed by the configuration): its origin, its path
        # prefix and the Host a forward names.
        self._leaders: dict[str, tuple[relay.Origin, str, str]] = {}

    def stopping(self) -> None:
        """The node is stopping: calls still forwarded FORWARD_STOP_GRACE_S from now are given up."""
        self._stop_deadline = asyncio.get_running_loop().time() + FORWARD_STOP_GRACE_S

    async def close(self) -> None:
        self._client.close()

    def serves_here(self, request: web.Request) -> bool:
        return request.path in LOCAL_PATHS or request.path.startswith(LOCAL_PREFIXES) or self._node.log.is_leader

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if FORWARDED_HEADER in request.headers:
            raise ApiError("UNAVAILABLE", "the node this call was forwarded to is not the leader any more; retry")
        deadline = asyncio.get_running_loop().time() + LEADER_WAIT_S
        unreachable: tuple[str | None, int] | None = None
        while True:
            leader_address, leader_url = await self._leader(deadline, unreachable)
            if leader_url is None:  # this node became the leader meanwhile
                return None  # type: ignore[return-value]
            term = self._node.log.term
            try:
                return await self._forward_to(request, leader_address, leader_url)
            except _LeaderUnreachable:
                # Never sent: safe to send to the next leader (another node, or a later term).
                unreachable = (leader_address, term)

    async def _forward_to(self, request: web.Request, leader_address: str | None, leader_url: str) -> web.Response:
        body = await request.read()
        headers = {name: value for name, value in request.headers.items() if name.lower() not in _NOT_FORWARDED_HEADERS}
        headers[FORWARDED_HEADER] = self._node.config.node_id
        headers[REQUEST_ID_HEADER] = request[REQUEST_ID_KEY]  # one id in both nodes' answers and logs
        relayed = asyncio.ensure_future(self._relay(request, body, headers, leader_url))
        try:
            # A leader that stops answering (paused, partitioned) is replaced within about a second;
            # the call sent to it is then given up instead of waiting out its whole timeout.
            while True:
                done, _ = await asyncio.wait({relayed}, timeout=LEADER_CHECK_S)
                if done:
                    return relayed.result()
                if self._node.log.leader_address != leader_address:
                    raise ApiError(
                        "UNAVAILABLE", f"the leader changed while the call was forwarded to {leader_url}; retry"
                    )
                if self._stop_deadline is not None and asyncio.get_running_loop().time() >= self._stop_deadline:
                    raise ApiError("UNAVAILABLE", "this node is stopping; retry at another node")
        finally:
            relayed.cancel()

    async def _relay(self, request: web.Request, body: bytes, headers: dict[str, str], leader_url: str) -> web.Response:
        """The call sent to the leader at `leader_url` as the client sent it here (the request
        target's bytes too), and the leader's answer as this node's."""
        origin, prefix, host = self._leader_origin(leader_url)
        target = request.raw_path if request.raw_path.startswith("/") else request.rel_url.raw_path_qs
        head = relay.request_head(request.method, prefix + target, host, headers, len(body))
        try:
            answer = await self._client.request(
                origin, head + body, head_request=request.method == "HEAD", timeout_s=FORWARD_TIMEOUT_S,
            )
        except relay.ConnectError as error:
            raise _LeaderUnreachable(str(error)) from None
        except relay.AnswerError as error:
            raise ApiError("UNAVAILABLE", f"the leader at {leader_url} did not answer ({error}); retry") from None
        relayed = {name: answer.headers[name.lower()] for name in _RELAYED_HEADERS if name.lower() in answer.headers}
        relayed[LEADER_HEADER] = leader_url
        content_type = answer.headers.get("content-type")
        if content_type is not None and answer.status != 204:
            relayed["Content-Type"] = content_type
        return web.Response(body=answer.body, status=answer.status, headers=relayed)

    def _leader_origin(self, leader_url: str) -> tuple[relay.Origin, str, str]:
        found = self._leaders.get(leader_url)
        if found is None:
            origin, prefix = relay.origin_of(leader_url)
            host = origin.host if ":" not in origin.host else f"[{origin.host}]"  # an IPv6 address
            found = self._leaders[leader_url] = (origin, prefix, f"{host}:{origin.port}")
        return found

    async def _leader(
        self, deadline: float, unreachable: tuple[str | None, int] | None = None
    ) -> tuple[str | None, str | None]:
        """The leader's Raft address and API URL; (None, None) if this node leads now. Waits out
        an election until `deadline` (the loop's clock), and for a leader other than `unreachable`
        (the leader, and the term, whose API could not be connected to)."""
        loop = asyncio.get_running_loop()
        while True:
            raft = self._node.log
            if raft.is_leader:
                return None, None
            leader = raft.leader_address
            if leader is not None and (leader, raft.term) != unreachable:
                member = self._node.member_by_address(leader)
                if member is None or member.api_url is None:
                    raise ApiError("UNAVAILABLE", f"the leader {leader} is not a member this node knows the API of")
                return leader, member.api_url
            if loop.time() >= deadline:
                if leader is not None:
                    raise ApiError(
                        "UNAVAILABLE", f"the leader at {getattr(self._node.member_by_address(leader), 'api_url', leader)} cannot be "
                        f"reached and no other was elected within {LEADER_WAIT_S} s; retry"
                    )
                raise ApiError("UNAVAILABLE", f"no leader elected within {LEADER_WAIT_S} s; retry")
            await asyncio.sleep(LEADER_POLL_S)
