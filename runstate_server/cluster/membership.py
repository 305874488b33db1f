"""The cluster's members as the cluster layer keeps them: pysyncobj's configuration, with the node
layer's names for each member (DESIGN.md, "Membership").

pysyncobj names a node by its Raft address and keeps any keyword given to its node object as an
attribute, pickled along with it (`pysyncobj.node.Node(id, **kwargs)`): a member's node id and API
URL travel that way inside the configuration, its membership entries and its snapshots (the dump
keeps them beside the addresses, snapshot.py). A member that a release before this one configured
(from its `--peer` flags) has none: the node layer falls back on its own flags for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from runstate_server.cluster._pysyncobj import TCPNode

# The attributes of a pysyncobj node object that hold our names for it.
NODE_ID_ATTRIBUTE = "member_id"
API_URL_ATTRIBUTE = "api_url"


@dataclass(frozen=True, slots=True)
class Member:
    """A member of the configuration: its Raft address, and its node id and API URL (None where
    the configuration does not say)."""

    address: str
    node_id: str | None = None
    api_url: str | None = None

    def named(self) -> dict[str, str]:
        """The names the dump keeps for it (snapshot.py), none when it has none."""
        names = {}
        if self.node_id is not None:
            names["id"] = self.node_id
        if self.api_url is not None:
            names["apiUrl"] = self.api_url
        return names


def raft_node(member: Member) -> Any:
    """pysyncobj's node object for `member`, carrying its names."""
    names: dict[str, str] = {}
    if member.node_id is not None:
        names[NODE_ID_ATTRIBUTE] = member.node_id
    if member.api_url is not None:
        names[API_URL_ATTRIBUTE] = member.api_url
    return TCPNode(member.address, **names)


def member_of(node: Any) -> Member:
    """The member a pysyncobj node object stands for (a plain address string too)."""
    if isinstance(node, str):
        return Member(node)
    node_id, api_url = getattr(node, NODE_ID_ATTRIBUTE, None), getattr(node, API_URL_ATTRIBUTE, None)
    return Member(
        str(node.id), node_id if isinstance(node_id, str) else None, api_url if isinstance(api_url, str) else None,
    )


def with_names(member: Member, known: Mapping[str, Member]) -> Member:
    """`member` with the names `known` (by address) gives, where the configuration has none."""
    seed = known.get(member.address)
    if seed is None:
        return member
    return Member(member.address, member.node_id or seed.node_id, member.api_url or seed.api_url)


def names_by_address(members: Iterable[Member]) -> dict[str, dict[str, str]]:
    return {member.address: names for member in members if (names := member.named())}
