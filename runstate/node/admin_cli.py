"""`runstate spaces ...`, `runstate keys ...`, `runstate whoami`: manage spaces and API keys of any
node over HTTP.

Uses only the SDK's blocking client, never the server packages, so it works against a remote node.
Exit codes: 0 on success, 1 when the API refused the call (`runstate: CODE: message` on stderr),
2 for a usage error (argparse's own, or a malformed --url).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from runstate.sdk import PERMISSIONS, KeyInfo, Runstate, SpaceInfo
from runstate.sdk._http import API_KEY_ENV, BASE_URL_DEFAULT, BASE_URL_ENV
from runstate.sdk._time import format_time
from runstate.sdk.errors import ConfigError, RunstateError

ADMIN_COMMANDS = ("spaces", "keys", "whoami")
EXIT_OK = 0
EXIT_API_ERROR = 1
EXIT_USAGE = 2

Action = Callable[[Runstate, argparse.Namespace], tuple[str, Any]]


def _add_client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=None, metavar="URL[,URL...]",
        help=f"the node's API, or a comma-separated list of a cluster's nodes (default ${BASE_URL_ENV}, "
        f"else {BASE_URL_DEFAULT})",
    )
    parser.add_argument("--api-key", default=None, help=f"the API key's secret (default ${API_KEY_ENV})")
    parser.add_argument("--json", action="store_true", help="print JSON (the HTTP API's fields) instead of text")


def _leaf(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, action: Action
) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
    _add_client_flags(parser)
    parser.set_defaults(admin_action=action)
    return parser


def add_admin_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `spaces`, `keys` and `whoami` to the `runstate` command's subparsers; run the parsed
    arguments with `run_admin_command` (when `args.command` is one of ADMIN_COMMANDS)."""
    spaces = subparsers.add_parser("spaces", help="create and list spaces (tenants); needs an admin key")
    space_commands = spaces.add_subparsers(dest="spaces_command", required=True)
    create = _leaf(space_commands, "create", "create a space (needs an admin key of the operator space)", _space_create)
    create.add_argument("--id", help="the space id, 1 to 128 of A-Z a-z 0-9 _ . - (default: the node picks one)")
    create.add_argument("--name", help="a display name")
    _leaf(space_commands, "list", "list the spaces this key can see", _space_list)

    keys = subparsers.add_parser("keys", help="create, list and revoke API keys; needs an admin key")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    create = _leaf(key_commands, "create", "create an API key and print its secret (shown only once)", _key_create)
    create.add_argument(
        "--permission", action="append", required=True, metavar="PERMISSION",
        help=f"a permission of the key, once per permission: {', '.join(PERMISSIONS)}",
    )
    create.add_argument("--space", help="the key's space (default: the caller's)")
    create.add_argument("--name", help="a display name")
    listing = _leaf(key_commands, "list", "list the API keys of a space (never their secrets)", _key_list)
    listing.add_argument("--space", help="the space (default: the caller's)")
    revoke = _leaf(key_commands, "revoke", "revoke an API key: it stops working at once", _key_revoke)
    revoke.add_argument("key_id", metavar="KEY_ID")

    _leaf(subparsers, "whoami", "show the API key's space, permissions and whether it is an operator", _whoami)


def run_admin_command(args: argparse.Namespace) -> int:
    """Run a command added by `add_admin_commands`; returns the exit code (0, 1 or 2)."""
    action: Action = args.admin_action
    try:
        with Runstate(base_url=args.url, api_key=args.api_key) as rs:
            text, machine = action(rs, args)
    except ConfigError as error:
        print(f"runstate: {error.message}", file=sys.stderr)
        return EXIT_USAGE
    except RunstateError as error:
        print(f"runstate: {error.code}: {error.message}", file=sys.stderr)
        return EXIT_API_ERROR
    print(json.dumps(machine, indent=2) if args.json else text)
    return EXIT_OK


# Each command returns its text output and its JSON output (the HTTP API's fields and shapes).


def _space_create(rs: Runstate, args: argparse.Namespace) -> tuple[str, Any]:
    space = rs.spaces.create(id=args.id, name=args.name)
    return f"created space {space.id}" + (f" ({space.name})" if space.name else ""), _space_json(space)


def _space_list(rs: Runstate, args: argparse.Namespace) -> tuple[str, Any]:
    spaces = rs.spaces.list()
    rows = [[space.id, space.name or "-", _time(space.created_at) or "-"] for space in spaces]
    return _table(["ID", "NAME", "CREATED"], rows), {"spaces": [_space_json(space) for space in spaces]}


def _key_create(rs: Runstate, args: argparse.Namespace) -> tuple[str, Any]:
    key = rs.keys.create(args.permission, space=args.space, name=args.name)
    text = "\n".join([
        f"created key {key.id} in space {key.space} ({', '.join(key.permissions)})",
        f"secret: {key.secret}",
        "The secret is shown only this once: store it now. If it is lost, revoke the key and create another.",
    ])
    return text, {"id": key.id, "key": key.secret, **_key_json(key)}


def _key_list(rs: Runstate, args: argparse.Namespace) -> tuple[str, Any]:
    keys = rs.keys.list(space=args.space)
    rows = [
        [key.id, key.name or "-", ",".join(key.permissions), _time(key.created_at) or "-",
         _time(key.revoked_at) or "-", key.created_by or "-"]
        for key in keys
    ]
    text = _table(["ID", "NAME", "PERMISSIONS", "CREATED", "REVOKED", "CREATED BY"], rows)
    return text, {"keys": [_key_json(key) for key in keys]}


def _key_revoke(rs: Runstate, args: argparse.Namespace) -> tuple[str, Any]:
    key = rs.keys.revoke(args.key_id)
    return f"revoked key {key.id} of space {key.space} at {_time(key.revoked_at)}", _key_json(key)


def _whoami(rs: Runstate, args: argparse.Namespace) -> tuple[str, Any]:
    identity = rs.whoami()
    text = "\n".join([
        f"auth:        {'on' if identity.auth else 'off (the node accepts every call)'}",
        f"key:         {identity.key_id or '-'}",
        f"space:       {identity.space}",
        f"permissions: {', '.join(identity.permissions) or '-'}",
        f"operator:    {'yes' if identity.operator else 'no'}",
    ])
    machine = {
        "auth": identity.auth, "keyId": identity.key_id, "space": identity.space,
        "permissions": list(identity.permissions), "operator": identity.operator,
    }
    return text, machine


def _time(value: datetime | None) -> str | None:
    return None if value is None else format_time(value)


def _space_json(space: SpaceInfo) -> dict[str, Any]:
    return {"id": space.id, "name": space.name, "createdAt": _time(space.created_at)}


def _key_json(key: KeyInfo) -> dict[str, Any]:
    return {
        "id": key.id,
        "space": key.space,
        "name": key.name,
        "permissions": list(key.permissions),
        "createdAt": _time(key.created_at),
        "revokedAt": _time(key.revoked_at),
        "createdBy": key.created_by,
    }


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns; the header alone when there are no rows."""
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    lines = ("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in [header, *rows])
    return "\n".join(lines)
