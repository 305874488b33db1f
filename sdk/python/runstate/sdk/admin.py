"""Spaces, API keys and the caller's identity: `rs.spaces`, `rs.keys`, `rs.whoami()`.

A space is a tenant; an API key belongs to one space and carries permissions (`PERMISSIONS`).
An `admin` key of the operator space (the one created when the node first started with auth)
manages every space; an `admin` key of another space manages only its own space's keys.

    key = await rs.keys.create(["coordination_read", "coordination_write"], name="worker")
    key.secret          # rsk_...: shown only here, store it now
    await rs.keys.revoke(key.id)

Against a node without auth (`runstate dev` without `--auth`) every call is allowed but creating a
key (ConflictError, code AUTH_DISABLED): start the node with `--auth` to use keys.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

from runstate.sdk._time import parse_time
from runstate.sdk.errors import ConfigError, RunstateError

if TYPE_CHECKING:
    from anyio.from_thread import BlockingPortal

    from runstate.sdk._http import Transport

# The permissions a key can carry, in the server's order.
PERMISSIONS = ("admin", "resource_config", "coordination_write", "coordination_read")

T = TypeVar("T")


@dataclass(frozen=True)
class SpaceInfo:
    """A space: `id`, `name` (or None), `created_at` (aware UTC datetime)."""

    id: str
    name: str | None
    created_at: datetime


@dataclass(frozen=True)
class KeyInfo:
    """An API key as the server describes it; never its secret.

    `revoked_at` is None while the key is valid; `created_by` is the id of the key that created it
    (None for the bootstrap key, or a key an earlier version created on a node without auth).
    """

    id: str
    space: str
    name: str | None
    permissions: tuple[str, ...]
    created_at: datetime
    revoked_at: datetime | None
    created_by: str | None


@dataclass(frozen=True)
class NewKey(KeyInfo):
    """A key just created: the `KeyInfo` fields plus `secret`, the only time the server shows it.
    (`repr()` leaves the secret out, so it does not end up in logs by accident.)"""

    secret: str = field(repr=False)


@dataclass(frozen=True)
class Identity:
    """Who the client is to the server. `auth` is False on a node without auth (then `key_id` is
    None and every permission is granted); `operator` is True for an admin key of the operator
    space (it manages every space)."""

    auth: bool
    key_id: str | None
    space: str
    permissions: tuple[str, ...]
    operator: bool


def _parse(what: str, view: dict[str, Any], build: Callable[[dict[str, Any]], T]) -> T:
    """`build(view)`, or RunstateError INVALID_RESPONSE if the answer lacks or garbles a field.
    (The view is not quoted: a new key's view holds its secret.)"""
    try:
        return build(view)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise RunstateError(
            f"the server's answer is not a valid {what} ({type(exc).__name__}: {exc})",
            code="INVALID_RESPONSE",
            status=None,
        ) from exc


def _optional_time(value: Any) -> datetime | None:
    return None if value is None else parse_time(value)


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise TypeError(f"expected a list of strings, got {value!r}")
    return tuple(value)


def _space_info(view: dict[str, Any]) -> SpaceInfo:
    return SpaceInfo(id=view["id"], name=view.get("name"), created_at=parse_time(view["createdAt"]))


def _key_fields(view: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": view["id"],
        "space": view["space"],
        "name": view.get("name"),
        "permissions": _strings(view["permissions"]),
        "created_at": parse_time(view["createdAt"]),
        "revoked_at": _optional_time(view.get("revokedAt")),
        "created_by": view.get("createdBy"),
    }


def _key_info(view: dict[str, Any]) -> KeyInfo:
    return KeyInfo(**_key_fields(view))


def _new_key(view: dict[str, Any]) -> NewKey:
    secret = view["key"]
    if not isinstance(secret, str) or not secret:
        raise ValueError("the secret ('key') is missing")
    return NewKey(**_key_fields(view), secret=secret)


def _identity(view: dict[str, Any]) -> Identity:
    return Identity(
        auth=bool(view["auth"]),
        key_id=view.get("keyId"),
        space=view["space"],
        permissions=_strings(view["permissions"]),
        operator=bool(view["operator"]),
    )


def _optional_text(value: str | None, what: str) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ConfigError(f"{what} must be a non-empty string or None, got {value!r}")
    return value


def _permission_list(permissions: Sequence[str]) -> list[str]:
    # A bare string is a sequence too; "admin" would otherwise become five one-letter names.
    if isinstance(permissions, str) or not isinstance(permissions, Sequence) or not permissions:
        raise ConfigError(
            f"permissions must be a non-empty list such as ['coordination_read'], got {permissions!r}"
        )
    for permission in permissions:
        if not isinstance(permission, str) or not permission:
            raise ConfigError(f"each permission must be a non-empty string, got {permission!r}")
    return list(permissions)


async def fetch_identity(transport: Transport) -> Identity:
    """`GET /v1/whoami`; see `AsyncRunstate.whoami`."""
    view = await transport.request("GET", "/v1/whoami", safe=True)
    return _parse("identity", view, _identity)


class Spaces:
    """`rs.spaces`: create and list spaces (needs an admin key)."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def create(self, id: str | None = None, name: str | None = None) -> SpaceInfo:
        """Create a space; returns its `SpaceInfo`. Without `id` the server picks one (`spc_...`).

        Needs an admin key of the operator space, else ForbiddenError. Raises ConflictError if
        the id exists, ValidationError for a malformed id (1 to 128 of A-Z a-z 0-9 _ . -) or
        name, LimitExceededError past the server's number of spaces. Not repeated once sent (a
        repeat could create a second space): a lost answer raises UnavailableError.
        """
        body: dict[str, Any] = {}
        if _optional_text(id, "id") is not None:
            body["id"] = id
        if _optional_text(name, "name") is not None:
            body["name"] = name
        view = await self._transport.request("POST", "/v1/spaces", body=body, safe=False)
        return _parse("space", view, _space_info)

    async def list(self) -> list[SpaceInfo]:
        """The spaces this key can see: every space for an admin of the operator space, else only
        the key's own. ForbiddenError without the admin permission."""
        answer = await self._transport.request("GET", "/v1/spaces", safe=True)
        return _parse("space list", answer, lambda view: [_space_info(item) for item in view["spaces"]])


class Keys:
    """`rs.keys`: create, list and revoke API keys (needs an admin key)."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    async def create(
        self, permissions: Sequence[str], *, space: str | None = None, name: str | None = None
    ) -> NewKey:
        """Create a key with `permissions` (some of `PERMISSIONS`) in `space` (default: the
        client's `space_id`, else the caller's space); returns a `NewKey` whose `.secret` is shown this once. The key works at
        once.

        Raises ForbiddenError without the admin permission, or for another space unless the
        caller is an admin of the operator space; NotFoundError for an unknown space;
        ValidationError for an unknown permission or a too long name (ConfigError, before any
        request, for an empty or malformed list); LimitExceededError past the keys of a space;
        ConflictError (code AUTH_DISABLED) on a node without auth, which creates no keys.
        Not repeated once sent (a repeat would mint a second key): a lost answer raises
        UnavailableError.
        """
        body: dict[str, Any] = {"permissions": _permission_list(permissions)}
        space = _optional_text(space, "space") or self._transport.space_id
        if space is not None:
            body["space"] = space
        if _optional_text(name, "name") is not None:
            body["name"] = name
        view = await self._transport.request("POST", "/v1/keys", body=body, safe=False)
        return _parse("new key", view, _new_key)

    async def list(self, space: str | None = None) -> list[KeyInfo]:
        """The keys of `space` (default: the client's `space_id`, else the caller's), revoked ones included, without secrets.

        Raises ForbiddenError without the admin permission, or for another space unless the
        caller is an admin of the operator space.
        """
        space = _optional_text(space, "space") or self._transport.space_id
        params = None if space is None else {"space": space}
        answer = await self._transport.request("GET", "/v1/keys", params=params, safe=True)
        return _parse("key list", answer, lambda view: [_key_info(item) for item in view["keys"]])

    async def revoke(self, key_id: str) -> KeyInfo:
        """Revoke a key: from now on it gets UnauthenticatedError. Returns its `KeyInfo` with
        `revoked_at` set. Idempotent (a second revoke keeps the first time).

        Raises NotFoundError for an unknown key or one of another space (unless the caller is an
        admin of the operator space), ForbiddenError without the admin permission.
        """
        if not isinstance(key_id, str) or not key_id:
            raise ConfigError(f"key_id must be a non-empty string, got {key_id!r}")
        path = f"/v1/keys/{quote(key_id, safe='')}/revoke"
        view = await self._transport.request("POST", path, body={}, safe=True)
        return _parse("key", view, _key_info)


class BlockingSpaces:
    """`rs.spaces` of the blocking client (see `Spaces`)."""

    def __init__(self, inner: Spaces, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def create(self, id: str | None = None, name: str | None = None) -> SpaceInfo:
        return self._portal.call(lambda: self._inner.create(id=id, name=name))

    def list(self) -> list[SpaceInfo]:
        return self._portal.call(self._inner.list)


class BlockingKeys:
    """`rs.keys` of the blocking client (see `Keys`)."""

    def __init__(self, inner: Keys, portal: BlockingPortal) -> None:
        self._inner = inner
        self._portal = portal

    def create(self, permissions: Sequence[str], *, space: str | None = None, name: str | None = None) -> NewKey:
        return self._portal.call(lambda: self._inner.create(permissions, space=space, name=name))

    def list(self, space: str | None = None) -> list[KeyInfo]:
        return self._portal.call(self._inner.list, space)

    def revoke(self, key_id: str) -> KeyInfo:
        return self._portal.call(self._inner.revoke, key_id)
