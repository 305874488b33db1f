"""GET /v1/health: is this node up, what is its role, who leads."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from runstate_server.node._json import json_response
from runstate_server.node.api.routes import PUBLIC, RouteTable, node_of
from runstate_server.node.api.schemas import INTEGER, STRING, STRING_OR_NULL, array, enum, obj

# This node's replica checks (node/replicas.py): its verdict, and its last digests for its peers to compare.
REPLICA_CHECK = obj({
    "status": enum("ok", "diverged", "undecided", "off"), "message": STRING_OR_NULL,
    "agreedIndex": {"type": ["integer", "null"]}, "digests": array(obj({"index": INTEGER, "digest": STRING})),
})
HEALTH = obj({
    "status": enum("ok", "unavailable", "removed", "diverged"), "replicaCheck": REPLICA_CHECK, "nodeId": STRING, "role": STRING, "leader": STRING_OR_NULL,
    "term": INTEGER, "appliedIndex": INTEGER, "commitIndex": INTEGER, "longPolls": INTEGER, "epoch": INTEGER,
    "voters": array(STRING), "clusterId": STRING_OR_NULL,
})

routes = RouteTable()

if TYPE_CHECKING:
    from runstate_server.node.server import Node


def health_view(node: Node) -> dict[str, Any]:
    """"ok" once a leader is known and, on a node that requires keys, the first admin key exists
    (until then every keyed call would be refused: the bootstrap is still being committed)."""
    raft = node.log
    with node.read() as state:
        bootstrapped = not node.config.auth or state.operator_space is not None
        cluster_id = state.cluster_id
    status = "ok" if raft.leader_address is not None and bootstrapped else "unavailable"
    if node.replicas.diverged is not None:
        status = "diverged"  # its state differs from the majority's: it serves none of it (node/replicas.py)
    return {
        "status": "removed" if node.removed is not None else status,
        "replicaCheck": node.replicas.view(),
        "nodeId": node.config.node_id,
        "role": raft.role,
        "leader": raft.leader_address,
        "term": raft.term,
        "appliedIndex": raft.applied_index,
        "commitIndex": raft.commit_index,
        "epoch": node.config.epoch,  # the cluster's: 1, plus one per forced recovery
        "clusterId": cluster_id,  # cluster.identify's (node/backup.py), null until a leader wrote it
        # The voters of the configuration this node applies (a removed node learns it from these).
        "voters": [member.node_id or member.address for member in node.members()],
        "longPolls": len(node.waiters),  # parked here now
    }


@routes("GET", "/v1/health", "Node health, role and log position", errors=("UNAVAILABLE",), permission=PUBLIC, answer=HEALTH,)
async def health(request: web.Request) -> web.Response:
    view = health_view(node_of(request))
    return json_response(view, status=200 if view["status"] == "ok" else 503)
