"""Times on the wire: ISO 8601 in UTC with milliseconds (`2026-11-29T09:00:00.000Z`)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from runstate.sdk.errors import ConfigError


def format_time(value: datetime) -> str:
    """A datetime as the API writes it; a naive datetime is taken as UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    value = value.astimezone(timezone.utc)
    # The year padded to four digits: strftime's %Y writes year 999 as "999", not ISO 8601.
    return f"{value.year:04d}-" + value.strftime("%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"


def parse_time(value: str) -> datetime:
    """An API time (or any ISO 8601 string) as an aware UTC datetime; ValueError if malformed."""
    text = value.strip()
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    parsed = datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def format_deadline(value: datetime | timedelta | str | None, *, now: datetime | None = None) -> str | None:
    """A run deadline for the API.

    Accepts an aware datetime, a naive datetime (taken as UTC), a timedelta (from now) or an ISO
    8601 string (without an offset it is taken as UTC). Raises ConfigError for anything else.
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, timedelta):
        return format_time((now or datetime.now(timezone.utc)) + value)
    if isinstance(value, str):
        try:
            return format_time(parse_time(value))
        except ValueError as exc:
            raise ConfigError(f"deadline {value!r} is not an ISO 8601 time: {exc}") from exc
    raise ConfigError(
        f"deadline must be a datetime, timedelta or ISO 8601 string, got {type(value).__name__}"
    )


_DURATION_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


def parse_duration_ms(value: float | int | str | timedelta, what: str) -> int:
    """A duration in whole milliseconds (at least 1): a number of seconds (`30`, `0.5`), a string
    with a unit (`"500ms"`, `"60s"`, `"2m"`, `"1h"`, `"1.5s"`) or a timedelta. ConfigError otherwise."""
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be a number of seconds or a string such as '30s', got {value!r}")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        unit = next((unit for unit in ("ms", "s", "m", "h") if text.endswith(unit)), None)
        number = text[: -len(unit)].strip() if unit else text
        try:
            amount = float(number)
        except ValueError:
            raise ConfigError(f"{what} {value!r} is not a duration such as '500ms', '30s' or '2m'") from None
        seconds = amount * _DURATION_UNITS_MS[unit or "s"] / 1000
    else:
        raise ConfigError(f"{what} must be a number of seconds or a string such as '30s', got {type(value).__name__}")
    if not seconds == seconds or seconds in (float("inf"), float("-inf")):
        raise ConfigError(f"{what} must be finite, got {value!r}")
    milliseconds = round(seconds * 1000)
    if milliseconds < 1:
        raise ConfigError(f"{what} must be at least 1 ms, got {value!r}")
    return milliseconds
