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

import aiohttp
from aiohttp import web

from runstate_server.node.config import LONG_POLL_MS_MAX, PROPOSE_TIMEOUT_S
from runstate_server.node.errors import REQUEST_ID_HEADER, REQUEST_ID_KEY, ApiError

if TYPE_CHECKING:
    from runstate_server.node.server import Node

log = logging.getLogger(__name__)

LOCAL_PATHS = frozenset({
    "/v1/health", "/v1/cluster", "/v1/cluster/digest", "/v1/openapi.json", "/metrics",
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
# Once the node is stopping, a call still forwarded after this long (a long poll) is answered
# UNAVAILABLE, so the stop does not wait out the poll; its client polls again at another node.
FORWARD_STOP_GRACE_S = 1.0
# Headers of the leader's answer that the client must see.
_RELAYED_HEADERS = (REQUEST_ID_HEADER, "Retry-After")
# Headers that describe one hop, not the request.
_HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer"}
)


class _LeaderUnreachable(Exception):
    """The leader's API could not be connected to: the call never reached it."""


def forwarded(request: web.Request) -> bool:
    """The request came from a follower that forwarded it here."""
    return FORWARDED_HEADER in request.headers


class Router:
    def __init__(self, node: Node) -> None:
        self._node = node
        self._session: aiohttp.ClientSession | None = None
        # Connections to the leader open at once: one per call forwarded, so at most as many as
        # the API serves (the setting; the node's start lowers it to the cap in force,
        # `serve_at_most`). A lower cap of its own (it was 256) made every forwarded call wait
        # behind forwarded long polls: with 300 idle workers' receives held through a follower,
        # a create took 18 s, until one of the polls ended.
        self._connections_max = node.config.http.connections_max
        self._stop_deadline: float | None = None  # the loop's clock; set once the node is stopping

    def serve_at_most(self, connections_max: int) -> None:
        """The API serves at most `connections_max` connections: forward at most as many calls."""
        self._connections_max = connections_max

    def stopping(self) -> None:
        """The node is stopping: calls still forwarded FORWARD_STOP_GRACE_S from now are given up."""
        self._stop_deadline = asyncio.get_running_loop().time() + FORWARD_STOP_GRACE_S

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

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
        headers = {name: value for name, value in request.headers.items() if name.lower() not in _HOP_HEADERS}
        headers[FORWARDED_HEADER] = self._node.config.node_id
        headers[REQUEST_ID_HEADER] = request[REQUEST_ID_KEY]  # one id in both nodes' answers and logs
        relay = asyncio.ensure_future(
            self._relay(request.method, leader_url + request.path_qs, body, headers, leader_url)
        )
        try:
            # A leader that stops answering (paused, partitioned) is replaced within about a second;
            # the call sent to it is then given up instead of waiting out its whole timeout.
            while True:
                done, _ = await asyncio.wait({relay}, timeout=LEADER_CHECK_S)
                if done:
                    return relay.result()
                if self._node.log.leader_address != leader_address:
                    raise ApiError(
                        "UNAVAILABLE", f"the leader changed while the call was forwarded to {leader_url}; retry"
                    )
                if self._stop_deadline is not None and asyncio.get_running_loop().time() >= self._stop_deadline:
                    raise ApiError("UNAVAILABLE", "this node is stopping; retry at another node")
        finally:
            relay.cancel()

    async def _relay(
        self, method: str, url: str, body: bytes, headers: dict[str, str], leader_url: str
    ) -> web.Response:
        try:
            async with self._client().request(method, url, data=body, headers=headers) as answer:
                payload = await answer.read()
                relayed = {name: answer.headers[name] for name in _RELAYED_HEADERS if name in answer.headers}
                return web.Response(
                    body=payload,
                    status=answer.status,
                    content_type=None if answer.status == 204 else answer.content_type or "application/json",
                    headers={**relayed, LEADER_HEADER: leader_url},
                )
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as error:
            raise _LeaderUnreachable(f"{url}: {type(error).__name__}") from None
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            raise ApiError(
                "UNAVAILABLE", f"the leader at {url} did not answer ({type(error).__name__}); retry"
            ) from None

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
                url = self._node.api_url_by_raft_address.get(leader)
                if url is None:
                    raise ApiError("UNAVAILABLE", f"the leader {leader} is not among this node's peers")
                return leader, url
            if loop.time() >= deadline:
                if leader is not None:
                    raise ApiError(
                        "UNAVAILABLE", f"the leader at {self._node.api_url_by_raft_address.get(leader)} cannot be "
                        f"reached and no other was elected within {LEADER_WAIT_S} s; retry"
                    )
                raise ApiError("UNAVAILABLE", f"no leader elected within {LEADER_WAIT_S} s; retry")
            await asyncio.sleep(LEADER_POLL_S)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S, sock_connect=FORWARD_CONNECT_TIMEOUT_S),
                connector=aiohttp.TCPConnector(limit=self._connections_max),
                auto_decompress=False,
            )
        return self._session
