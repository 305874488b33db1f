"""HTTP routes of groups (being built)."""

from __future__ import annotations
