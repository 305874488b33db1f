"""Every rule of spaces and API keys: who creates spaces, who mints and revokes keys, and which key
a request's secret names.

A key belongs to one space and carries permissions. The node hashes the secret a request presents
and finds the key with `authenticate`; the command it then proposes carries the key id, and
dispatch refuses the command before anything else if that key is unknown or revoked
(UNAUTHENTICATED) or belongs to another space than the command (FORBIDDEN). So a revoke holds in
log order: no command after it, reads' barriers included, runs with the revoked key.

An admin key of the operator space (the one `access.bootstrap` created) manages every space; an
admin key of another space manages the keys of its own space only, and a key it may not see looks
exactly like one that does not exist (NOT_FOUND). A command without a key comes from a node that
runs without auth: the node is the trust boundary, and the command may do what an operator admin
may.

The secret never reaches the core: the node generates it, shows it once, and proposes its SHA-256.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable, Iterable
from typing import Any

from runstate_server.actors import errors, limits
from runstate_server.actors.context import Context, api_key_key
from runstate_server.actors.errors import Rejected
from runstate_server.actors.state import ApiKey, Space, State

ADMIN = "admin"
PERMISSIONS = (ADMIN, "resource_config", "coordination_write", "coordination_read")

# The argument dispatch sets on every access command to the key id the command carries (None
# without one), overwriting whatever the node put there: the handlers learn who calls from it.

_SPACE_ID = re.compile(rf"[A-Za-z0-9_.-]{{1,{limits.space_id_chars_max}}}")
_KEY_ID = re.compile(rf"[A-Za-z0-9_.-]{{1,{limits.name_chars_max}}}")
_KEY_HASH = re.compile(r"[0-9a-f]{64}")


# -- the key a command carries -------------------------------------------------------------------


def require_command_key(state: State, key_id: Any, space_id: Any) -> ApiKey:
    """The key a command carries, if it may act in the command's space."""
    key = state.keys.get(key_id) if isinstance(key_id, str) else None
    if key is None or key.revoked_ms is not None:
        raise Rejected(errors.UNAUTHENTICATED, "the API key is not valid (unknown or revoked)")
    if key.space != space_id:
        raise Rejected(errors.FORBIDDEN, "the API key belongs to another space")
    return key


# -- queries for the node (no command) -----------------------------------------------------------


def authenticate(state: State, key_hash: str) -> ApiKey | None:
    """The live key whose secret hashes to `key_hash`; None for an unknown or revoked one."""
    key_id = state.key_ids_by_hash.get(key_hash) if isinstance(key_hash, str) else None
    key = state.keys.get(key_id) if key_id is not None else None
    if key is None or not hmac.compare_digest(key.hash, key_hash):
        return None
    return key if key.revoked_ms is None else None


def is_operator_admin(state: State, key: ApiKey) -> bool:
    """Whether `key` manages every space: a live admin key of the operator space."""
    return (
        state.operator_space is not None
        and key.space == state.operator_space
        and key.revoked_ms is None
        and ADMIN in key.permissions
    )


def list_keys(state: State, space_id: str) -> list[dict[str, Any]]:
    """The views of every key of the space, revoked ones included, oldest first."""
    return [key_view(key) for key in state.keys.values() if key.space == space_id]


def list_spaces(state: State, space_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """The views of every space (None), or of those of `space_ids` that exist."""
    if space_ids is None:
        return [space_view(space) for space in state.spaces.values()]
    return [space_view(state.spaces[space_id]) for space_id in space_ids if space_id in state.spaces]


def key_view(key: ApiKey) -> dict[str, Any]:
    """What the API shows of a key (times in ms since the epoch): never its hash."""
    return {
        "id": key.id,
        "space": key.space,
        "name": key.name,
        "permissions": list(key.permissions),
        "createdAt": key.created_ms,
        "revokedAt": key.revoked_ms,
        "createdBy": key.created_by,
    }


def space_view(space: Space) -> dict[str, Any]:
    return {"id": space.id, "name": space.name, "createdAt": space.created_ms}


# -- commands ------------------------------------------------------------------------------------


def create_space(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    caller = _caller(ctx)
    if caller is not None and not is_operator_admin(ctx.state, caller):
        raise Rejected(errors.FORBIDDEN, "managing spaces needs an admin key of the operator space")
    space_id = _require_space_id(args.get("space_id"))
    name = _require_name(args.get("name"))
    if space_id in ctx.state.spaces:
        raise Rejected(errors.CONFLICT, f"space {space_id!r} exists already")
    if len(ctx.state.spaces) >= limits.spaces_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"at most {limits.spaces_max} spaces")
    # The command's own space, when it is the one created, is the new space dispatch made for it.
    space = ctx.space if space_id == ctx.space.id else Space(id=space_id)
    space.name = name
    space.created_ms = ctx.now_ms
    ctx.state.spaces[space_id] = space
    return space_view(space)


def create_key(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    caller = _caller(ctx)
    target_id = args.get("space_id") or ctx.space.id
    if caller is not None:
        if ADMIN not in caller.permissions:
            raise Rejected(errors.FORBIDDEN, f"managing keys needs the {ADMIN} permission")
        if target_id != caller.space and not is_operator_admin(ctx.state, caller):
            raise Rejected(errors.FORBIDDEN, "managing the keys of another space needs an admin key of the operator space")
    # The command's own space is created with its first key, like with its first run; another
    # space must exist.
    target = ctx.space if target_id == ctx.space.id else ctx.state.spaces.get(target_id)
    if target is None:
        raise Rejected(errors.NOT_FOUND, f"space {target_id!r} not found")
    permissions = _require_permissions(args.get("permissions"))
    name = _require_name(args.get("name"))
    key_id, key_hash = _require_new_key(ctx.state, target, args.get("key_id"), args.get("key_hash"))
    key = _add_key(
        ctx.state, target, key_id, key_hash, name, permissions, ctx.now_ms, caller.id if caller is not None else None
    )
    return key_view(key)


def revoke_key(ctx: Context, args: dict[str, Any]) -> dict[str, Any]:
    """Revoke a key; the first revoke's time stays (revoking again answers the same)."""
    caller = _caller(ctx)
    if caller is not None and ADMIN not in caller.permissions:
        raise Rejected(errors.FORBIDDEN, f"managing keys needs the {ADMIN} permission")
    key_id = args.get("key_id")
    key = ctx.state.keys.get(key_id) if isinstance(key_id, str) else None
    hidden = (
        key is not None
        and caller is not None
        and key.space != caller.space
        and not is_operator_admin(ctx.state, caller)
    )
    if key is None or hidden:
        raise Rejected(errors.NOT_FOUND, f"API key {key_id!r} not found")
    if key.revoked_ms is None:
        key.revoked_ms = ctx.now_ms
        ctx.wake(api_key_key(key.id))
    return key_view(key)


def bootstrap(state: State, args: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """The system command a node with auth proposes at its first start: make `space_id` the
    operator space (created if missing; it may hold data from keyless days) and give it an admin
    key with every permission. Once only: later ones change nothing."""
    if state.operator_space is not None:
        return {"bootstrapped": False, "space": state.operator_space}
    space_id = _require_space_id(args.get("space_id"))
    name = _require_name(args.get("name"))
    space = state.spaces.get(space_id)
    if space is None:
        if len(state.spaces) >= limits.spaces_max:
            raise Rejected(errors.LIMIT_EXCEEDED, f"at most {limits.spaces_max} spaces")
        space = Space(id=space_id, created_ms=now_ms)
    key_id, key_hash = _require_new_key(state, space, args.get("key_id"), args.get("key_hash"))
    state.spaces[space_id] = space
    state.operator_space = space_id
    _add_key(state, space, key_id, key_hash, name, list(PERMISSIONS), now_ms, None)
    return {"bootstrapped": True, "space": space_id, "keyId": key_id}


# -- rules ---------------------------------------------------------------------------------------


def _caller(ctx: Context) -> ApiKey | None:
    """The key the command carries (dispatch checked it already), None for a keyless node."""
    return None if ctx.key_id is None else ctx.state.keys[ctx.key_id]


def _require_space_id(space_id: Any) -> str:
    if not isinstance(space_id, str) or not _SPACE_ID.fullmatch(space_id):
        raise Rejected(
            errors.VALIDATION_FAILED,
            f"a space id is 1 to {limits.space_id_chars_max} letters, digits, '_', '.' or '-'",
        )
    return space_id


def _require_name(name: Any) -> str | None:
    if name is not None and not (isinstance(name, str) and len(name) <= limits.name_chars_max):
        raise Rejected(errors.VALIDATION_FAILED, f"a name is at most {limits.name_chars_max} characters")
    return name


def _require_permissions(permissions: Any) -> list[str]:
    """The permissions, in PERMISSIONS order and each once."""
    if not isinstance(permissions, (list, tuple)) or not permissions:
        raise Rejected(errors.VALIDATION_FAILED, f"give at least one permission of {', '.join(PERMISSIONS)}")
    for permission in permissions:
        if permission not in PERMISSIONS:
            raise Rejected(
                errors.VALIDATION_FAILED, f"unknown permission {permission!r}; the permissions are {', '.join(PERMISSIONS)}"
            )
    return [permission for permission in PERMISSIONS if permission in permissions]


def _require_new_key(state: State, space: Space, key_id: Any, key_hash: Any) -> tuple[str, str]:
    """(key id, key hash), valid and not taken, for a new key of `space`."""
    if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
        raise Rejected(errors.VALIDATION_FAILED, f"a key id is 1 to {limits.name_chars_max} letters, digits, '_', '.' or '-'")
    if not isinstance(key_hash, str) or not _KEY_HASH.fullmatch(key_hash):
        raise Rejected(errors.VALIDATION_FAILED, "a key hash is a SHA-256 digest: 64 lowercase hex digits")
    if key_id in state.keys:
        raise Rejected(errors.CONFLICT, f"API key {key_id!r} exists already")
    if key_hash in state.key_ids_by_hash:
        raise Rejected(errors.CONFLICT, "an API key with this secret exists already")
    if space.key_count >= limits.keys_per_space_max:
        raise Rejected(errors.LIMIT_EXCEEDED, f"a space holds at most {limits.keys_per_space_max} API keys")
    return key_id, key_hash


def _add_key(
    state: State,
    space: Space,
    key_id: str,
    key_hash: str,
    name: str | None,
    permissions: list[str],
    now_ms: int,
    created_by: str | None,
) -> ApiKey:
    key = ApiKey(
        id=key_id, space=space.id, name=name, permissions=permissions, hash=key_hash, created_ms=now_ms,
        created_by=created_by,
    )
    state.keys[key.id] = key
    state.key_ids_by_hash[key.hash] = key.id
    space.key_count += 1
    return key


HANDLERS: dict[str, Callable[[Context, dict[str, Any]], Any]] = {
    "space.create": create_space,
    "key.create": create_key,
    "key.revoke": revoke_key,
}
