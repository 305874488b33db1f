"""GET /v1/cluster: every node of the cluster as this node sees it."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import aiohttp
import msgpack
from aiohttp import web

from runstate_server.actors.state import to_snapshot
from runstate_server.node._json import json_response
from runstate_server.node.api.health import health_view
from runstate_server.node.api.routes import ANY_KEY, RouteTable, node_of
from runstate_server.node.api.schemas import BOOLEAN, INTEGER, STRING, STRING_OR_NULL, array, obj

routes = RouteTable()

PEER_HEALTH_TIMEOUT_S = 0.5


@routes("GET", "/v1/cluster", "Every node: id, role, leader, term, commit and applied index, reachable or not", permission=ANY_KEY, answer=obj({"leader": STRING_OR_NULL, "nodes": array(obj({"id": STRING, "apiUrl": STRING, "reachable": BOOLEAN}))}),)
async def cluster_view(request: web.Request) -> web.Response:
    node = node_of(request)
    own = {"id": node.config.node_id, "apiUrl": node.config.api_url, "reachable": True, **health_view(node)}
    timeout = aiohttp.ClientTimeout(total=PEER_HEALTH_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def peer_view(peer_id: str, api_url: str) -> dict[str, Any]:
            view: dict[str, Any] = {"id": peer_id, "apiUrl": api_url, "reachable": False}
            try:
                async with session.get(f"{api_url}/v1/health") as answer:
                    view.update(await answer.json(), reachable=True)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                pass
            view["id"] = peer_id
            return view

        peers = await asyncio.gather(*(peer_view(peer.id, peer.api_url) for peer in node.config.peers))
    leader_url = node.api_url_by_raft_address.get(node.log.leader_address or "")
    leader_id = next(
        (view["id"] for view in [own, *peers] if view["apiUrl"] == leader_url), None
    )
    return json_response({"leader": leader_id, "nodes": [own, *peers]})


@routes(
    "GET", "/v1/cluster/digest",
    "This node's applied log index, a SHA-256 of its state there (replicas at one index agree), and one of "
    "the state without its clock (`dataDigest`: unchanged by reads and refused commands)", permission=ANY_KEY, answer=obj({"nodeId": STRING, "appliedIndex": INTEGER, "digest": STRING, "dataDigest": STRING}),
)
async def state_digest(request: web.Request) -> web.Response:
    node = node_of(request)
    with node.read() as state:
        applied_index = node.log.applied_index
        snapshot = to_snapshot(state)
    digest = hashlib.sha256(msgpack.packb(snapshot, use_bin_type=True)).hexdigest()
    # Every command moves the clock, a refused one and a read's no-op included; nothing else.
    data_digest = hashlib.sha256(msgpack.packb({**snapshot, "clock_ms": None}, use_bin_type=True)).hexdigest()
    return json_response(
        {"nodeId": node.config.node_id, "appliedIndex": applied_index, "digest": digest, "dataDigest": data_digest}
    )
