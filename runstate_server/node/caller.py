"""Who a command is proposed for."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Caller:
    """Who makes a request, as the auth middleware established it. Without auth (`runstate dev`
    without --auth) there is no key and every permission."""

    space: str
    key_id: str | None
    permissions: frozenset[str]
    operator: bool  # an admin key of the operator space: manages every space
