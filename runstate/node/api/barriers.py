"""HTTP routes of barriers (being built)."""

from __future__ import annotations
