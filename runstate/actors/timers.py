"""Every rule of timers (being built)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runstate.actors.context import Context

HANDLERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {}
DUE_HANDLERS: dict[str, Callable[[Context, str, int], None]] = {}
