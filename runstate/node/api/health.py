"""GET /v1/health: is this node up, what is its role, who leads."""

from __future__ import annotations

from aiohttp import web

from runstate.node.api.routes import node_of, route


@route("GET", "/v1/health", "Node health, role and log position", errors=("UNAVAILABLE",))
async def health(request: web.Request) -> web.Response:
    node = node_of(request)
    raft = node.log
    has_leader = raft.leader_address is not None
    body = {
        "status": "ok" if has_leader else "unavailable",
        "nodeId": node.config.node_id,
        "role": raft.role,
        "leader": raft.leader_address,
        "term": raft.term,
        "appliedIndex": raft.applied_index,
        "commitIndex": raft.commit_index,
    }
    return web.json_response(body, status=200 if has_leader else 503)
