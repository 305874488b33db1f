"""GET /v1/health: is this node up, what is its role, who leads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from runstate.node.api.routes import PUBLIC, node_of, route

if TYPE_CHECKING:
    from runstate.node.server import Node


def health_view(node: Node) -> dict[str, Any]:
    raft = node.log
    return {
        "status": "ok" if raft.leader_address is not None else "unavailable",
        "nodeId": node.config.node_id,
        "role": raft.role,
        "leader": raft.leader_address,
        "term": raft.term,
        "appliedIndex": raft.applied_index,
        "commitIndex": raft.commit_index,
    }


@route("GET", "/v1/health", "Node health, role and log position", errors=("UNAVAILABLE",), permission=PUBLIC)
async def health(request: web.Request) -> web.Response:
    view = health_view(node_of(request))
    return web.json_response(view, status=200 if view["status"] == "ok" else 503)
