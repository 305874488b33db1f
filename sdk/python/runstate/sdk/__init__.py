"""The Python SDK: HTTP clients (async and blocking) and the error classes.

Imports nothing from the server packages (runstate_server.actors, runstate_server.cluster, runstate_server.node).
"""

from __future__ import annotations

from runstate.sdk.admin import PERMISSIONS, Identity, KeyInfo, NewKey, SpaceInfo
from runstate.sdk.client import AsyncRunstate
from runstate.sdk.resources import Reservation, SlotLease
from runstate.sdk.sync import Runstate

__all__ = [
    "PERMISSIONS",
    "AsyncRunstate",
    "Identity",
    "KeyInfo",
    "NewKey",
    "Reservation",
    "Runstate",
    "SlotLease",
    "SpaceInfo",
]
