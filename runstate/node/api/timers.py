"""HTTP routes of timers (being built)."""

from __future__ import annotations
