"""GET /v1/cluster: every node of the cluster as this node sees it; POST /v1/cluster/transfer-leader:
hand leadership to another voter (an operator admin key)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import aiohttp
from aiohttp import web

from runstate_server.actors import limits
from runstate_server.actors.state import to_snapshot
from runstate_server.cluster.errors import ChangeRefused, LogUnavailable, NotLeader
from runstate_server.node._json import json_response
from runstate_server.node.api import _request as req
from runstate_server.node.api.access import require_operator
from runstate_server.node.api.health import health_view
from runstate_server.node.api.routes import ADMIN, ANY_KEY, PUBLIC, RouteTable, caller_of, node_of
from runstate_server.node.api.schemas import BOOLEAN, INTEGER, NAME, STRING, STRING_OR_NULL, array, obj
from runstate_server.node.backup import data_digest
from runstate_server.node.errors import ApiError
from runstate_server.node.membership import JOIN_PROOF_HEADER, proof_holds
from runstate_server.node.replicas import snapshot_digest

routes = RouteTable()

PEER_HEALTH_TIMEOUT_S = 0.5


@routes(
    "GET", "/v1/cluster",
    "Every node: id, role, voter or not, leader, term, commit and applied index, lag behind the leader's commit "
    "index, reachable or not", permission=ANY_KEY,
    answer=obj({"leader": STRING_OR_NULL, "clusterId": STRING_OR_NULL, "nodes": array(obj({
        "id": STRING, "apiUrl": STRING, "reachable": BOOLEAN, "voter": BOOLEAN, "lag": {"type": ["integer", "null"]},
    }))}),
)
async def cluster_view(request: web.Request) -> web.Response:
    node = node_of(request)
    own = {"id": node.config.node_id, "apiUrl": node.config.api_url, "reachable": True, **health_view(node)}
    timeout = aiohttp.ClientTimeout(total=PEER_HEALTH_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(ssl=node.tls.client)) as session:

        async def peer_view(peer_id: str, api_url: str) -> dict[str, Any]:
            view: dict[str, Any] = {"id": peer_id, "apiUrl": api_url, "reachable": False}
            try:
                async with session.get(f"{api_url}/v1/health") as answer:
                    view.update(await answer.json(), reachable=True)
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                pass
            view["id"] = peer_id
            return view

        # This node first (a voter or a learner), then the other voters, then the other learners.
        others = [member for member in node.members() if member.address != node.raft_address]
        others += [member for member in node.membership.learners() if member.address != node.raft_address]
        peers = await asyncio.gather(*(
            peer_view(member.node_id or member.address, member.api_url or "") for member in others
        ))
    nodes = [own, *peers]
    learners = {member.node_id for member in node.membership.learners()}
    leader = node.leader()
    leader_id = leader.node_id if leader is not None else None
    # Lag: the committed entries a node has not applied, against the leader's commit index as the
    # leader answered (or this node's own, when the leader did not answer).
    leader_view = next((view for view in nodes if view["id"] == leader_id and view["reachable"]), own)
    for view in nodes:
        view["voter"] = view["id"] not in learners and not (view is own and node.log.learner)
        applied = view.get("appliedIndex")
        view["lag"] = max(0, leader_view["commitIndex"] - applied) if isinstance(applied, int) else None
    own["backup"] = node.backups.view()  # this node's last scheduled backup (node/backup.py), or null
    return json_response({"leader": leader_id, "clusterId": own.get("clusterId"), "nodes": nodes})


MEMBER = obj({"id": STRING_OR_NULL, "raftAddress": STRING, "apiUrl": STRING_OR_NULL, "voter": BOOLEAN})


@routes(
    "DELETE", "/v1/cluster/members/{id}",
    "Remove a voter from the cluster's configuration, e.g. a dead machine's before its replacement joins "
    "(an operator admin key). Refused while another change is under way, for the leader itself (hand "
    "leadership over first) and when fewer than a majority of the voters left would be reachable",
    errors=("FORBIDDEN", "NOT_FOUND", "CONFLICT", "UNAVAILABLE"), permission=ADMIN,
    answer=obj({"removed": STRING, "members": array(MEMBER)}),
)
async def remove_member(request: web.Request) -> web.Response:
    require_operator(caller_of(request), "removing a member")
    node, node_id = node_of(request), request.match_info["id"]
    if await node.membership.drop_learner(node_id):
        return json_response({"removed": node_id, "members": [node.member_view(member) for member in node.members()]})
    return json_response(await node.remove_member(node_id))


# A TCP port, 1 to 65535, as a pattern (a schema states no bound on the digits of a string).
_PORT = "([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_HOST = "[A-Za-z0-9._\\-\\[\\]:]+"  # a name, an IPv4 address or a [bracketed] IPv6 one
_RAFT_ADDRESS = re.compile(f"^{_HOST}:{_PORT}$")
_API_URL = re.compile(f"^https?://{_HOST}(/[!-~]*)?$")
_NEW_MEMBER = {
    "nodeId": NAME,
    "raftAddress": {**NAME, "pattern": _RAFT_ADDRESS.pattern},
    "apiUrl": {**NAME, "pattern": _API_URL.pattern},
}


def _new_member(body: dict[str, Any]) -> tuple[str, str, str]:
    node_id = req.text(body, "nodeId", max_chars=limits.name_chars_max, required=True)
    raft_address = req.text(body, "raftAddress", max_chars=limits.name_chars_max, required=True)
    api_url = req.text(body, "apiUrl", max_chars=limits.name_chars_max, required=True)
    assert node_id is not None and raft_address is not None and api_url is not None
    if not _RAFT_ADDRESS.match(raft_address):
        raise ApiError("VALIDATION_FAILED", f"raftAddress must be HOST:PORT (a port of 1 to 65535), not {raft_address!r}")
    if not _API_URL.match(api_url):
        raise ApiError("VALIDATION_FAILED", f"apiUrl must be an http:// or https:// URL, not {api_url!r}")
    return node_id, raft_address, api_url.rstrip("/")


@routes(
    "POST", "/v1/cluster/members",
    "Record a new node as a learner: it receives the log and does not vote until the leader promotes it, once "
    "it caught up (an operator admin key; the node itself starts with `runstate node --join`)",
    body=_NEW_MEMBER, required=("nodeId", "raftAddress", "apiUrl"),
    errors=("VALIDATION_FAILED", "FORBIDDEN", "CONFLICT", "UNAVAILABLE"), permission=ADMIN,
    answer=obj({"learner": MEMBER, "voters": array(MEMBER), "epoch": INTEGER}),
)
async def add_member(request: web.Request) -> web.Response:
    require_operator(caller_of(request), "adding a member")
    body = await req.json_body(request)
    return json_response(await node_of(request).membership.add_learner(*_new_member(body)))


@routes(
    "POST", "/v1/cluster/members/{id}/promote",
    "Make a learner a voter now, as the leader does by itself once it has caught up: refused until it has "
    "(an operator admin key)",
    errors=("FORBIDDEN", "NOT_FOUND", "CONFLICT", "UNAVAILABLE"), permission=ADMIN,
    answer=obj({"promoted": STRING, "voters": array(MEMBER)}),
)
async def promote_member(request: web.Request) -> web.Response:
    require_operator(caller_of(request), "promoting a learner")
    node = node_of(request)
    node.require_dynamic_membership()
    try:
        return json_response(await node.membership.promote(request.match_info["id"]))
    except ChangeRefused as error:
        raise ApiError("CONFLICT", f"{error}; try again in a moment") from None
    except (NotLeader, LogUnavailable) as error:
        raise ApiError("UNAVAILABLE", str(error)) from None


@routes(
    "POST", "/v1/cluster/join",
    "A node asks to join as a learner (`runstate node --join`); no API key: the request proves it holds the "
    f"cluster secret ({JOIN_PROOF_HEADER}: HMAC-SHA256 of the body)",
    body=_NEW_MEMBER, required=("nodeId", "raftAddress", "apiUrl"),
    errors=("VALIDATION_FAILED", "UNAUTHENTICATED", "CONFLICT", "UNAVAILABLE"), permission=PUBLIC,
    answer=obj({"learner": MEMBER, "voters": array(MEMBER), "epoch": INTEGER}),
)
async def join(request: web.Request) -> web.Response:
    node = node_of(request)
    raw = await request.read()
    if not proof_holds(node.config.secret, raw, request.headers.get(JOIN_PROOF_HEADER)):
        raise ApiError("UNAUTHENTICATED", "the join proof does not match this cluster's secret (another cluster's "
                                          "secret file?)")
    body = await req.json_body(request)
    return json_response(await node.membership.add_learner(*_new_member(body)))


@routes(
    "POST", "/v1/cluster/transfer-leader",
    "Hand leadership to the voter `to` (default: the most caught-up one), as Raft's TimeoutNow: writes "
    "arriving meanwhile wait, none in flight is lost (an operator admin key)",
    body={"to": NAME}, errors=("VALIDATION_FAILED", "FORBIDDEN", "NOT_FOUND", "CONFLICT", "UNAVAILABLE"),
    permission=ADMIN,
    answer=obj({"leader": STRING_OR_NULL, "previousLeader": STRING, "transferred": BOOLEAN}),
)
async def transfer_leader(request: web.Request) -> web.Response:
    require_operator(caller_of(request), "handing leadership over")
    body = await req.json_body(request, required=False)
    to_id = req.text(body, "to", max_chars=limits.name_chars_max)
    return json_response(await node_of(request).transfer_leadership(to_id))


@routes(
    "GET", "/v1/cluster/digest",
    "This node's applied log index, a SHA-256 of its state there (replicas at one index agree), and one of "
    "the state without its clock and cluster id (`dataDigest`: unchanged by reads and refused commands, and equal to a backup's)", permission=ANY_KEY, answer=obj({"nodeId": STRING, "appliedIndex": INTEGER, "digest": STRING, "dataDigest": STRING}),
)
async def state_digest(request: web.Request) -> web.Response:
    node = node_of(request)
    with node.read() as state:
        applied_index = node.log.applied_index
        snapshot = to_snapshot(state)
    digest = snapshot_digest(snapshot)  # what the replica checks compare (node/replicas.py)
    # Every command moves the clock, a refused one and a read's no-op included; nothing else. The
    # cluster id names the cluster, not its data: a restore gives its state a new one.
    return json_response({
        "nodeId": node.config.node_id, "appliedIndex": applied_index, "digest": digest,
        "dataDigest": data_digest(snapshot),
    })
