"""`runstate spaces ...`, `runstate keys ...`, `runstate whoami`, `runstate cluster members`,
`runstate cluster add`, `runstate cluster remove` and `runstate cluster transfer-leader`: manage spaces, API keys and a
cluster's members over HTTP.

Talks to the node over HTTP(S) only (operator_client), so it works against a remote node.
Exit codes: 0 on success, 1 when the API refused the call or TLS failed (`runstate: CODE: message`
on stderr), 2 for a usage error (argparse's own, a malformed --url, a TLS file that cannot be used).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import quote

from runstate_server.actors.access import PERMISSIONS
from runstate_server.node.operator_client import (
    API_KEY_ENV,
    BASE_URL_DEFAULT,
    BASE_URL_ENV,
    CA_FILE_ENV,
    CLIENT_CERT_ENV,
    CLIENT_KEY_ENV,
    OperatorClient,
    OperatorError,
    UsageError,
)

ADMIN_COMMANDS = ("spaces", "keys", "whoami")
EXIT_OK = 0
EXIT_API_ERROR = 1
EXIT_USAGE = 2

Action = Callable[[OperatorClient, argparse.Namespace], tuple[str, Any]]


def add_client_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url", default=None, metavar="URL[,URL...]",
        help=f"the node's API, or a comma-separated list of a cluster's nodes (default ${BASE_URL_ENV}, "
        f"else {BASE_URL_DEFAULT})",
    )
    parser.add_argument("--api-key", default=None, help=f"the API key's secret (default ${API_KEY_ENV})")
    parser.add_argument("--json", action="store_true", help="print JSON (the HTTP API's fields) instead of text")
    # TLS (issue 42): as the SDKs take them.
    parser.add_argument(
        "--ca-file", default=None, metavar="FILE",
        help=f"trust only this PEM CA for https:// nodes (default ${CA_FILE_ENV}, else the system's CAs)",
    )
    parser.add_argument(
        "--client-cert", default=None, metavar="FILE",
        help=f"present this PEM certificate to nodes that require one (mutual TLS; default ${CLIENT_CERT_ENV})",
    )
    parser.add_argument(
        "--client-key", default=None, metavar="FILE", help=f"the private key of --client-cert (default ${CLIENT_KEY_ENV})",
    )


def client_of(args: argparse.Namespace) -> OperatorClient:
    """The client `add_client_flags`' flags describe; UsageError for a malformed one."""
    return OperatorClient(
        args.url, args.api_key, ca_file=args.ca_file, client_cert=args.client_cert, client_key=args.client_key,
    )


def _leaf(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str, action: Action
) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
    add_client_flags(parser)
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


def add_cluster_commands(cluster_commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `members`, `add`, `promote`, `remove` and `transfer-leader` to `runstate cluster`; run them with `run_admin_command`
    (the parsed arguments carry `admin_action`)."""
    _leaf(cluster_commands, "members", "show the cluster's members: role, voter, lag, reachable", _members)
    transfer = _leaf(
        cluster_commands, "transfer-leader",
        "hand leadership to another voter, e.g. before the leader's maintenance (needs an operator admin key)",
        _transfer_leader,
    )
    transfer.add_argument("--to", metavar="ID", help="the voter to lead (default: the most caught-up one)")
    add = _leaf(
        cluster_commands, "add",
        "record a new node as a learner; start it with `runstate node --join` (needs an operator admin key)",
        _add_member,
    )
    add.add_argument("--node-id", required=True, metavar="ID", help="the new node's id")
    add.add_argument("--raft", required=True, metavar="HOST:PORT", help="its Raft address, as the others reach it")
    add.add_argument("--api-url", required=True, metavar="URL", help="its API's URL, as the others reach it")
    promote = _leaf(
        cluster_commands, "promote",
        "make a learner a voter now, refused until it has caught up (the leader does it by itself then)",
        _promote_member,
    )
    promote.add_argument("node_id", metavar="ID")
    remove = _leaf(
        cluster_commands, "remove",
        "remove a voter, e.g. a dead machine's before its replacement joins (needs an operator admin key)",
        _remove_member,
    )
    remove.add_argument("node_id", metavar="ID")


def run_admin_command(args: argparse.Namespace) -> int:
    """Run a command added by `add_admin_commands`; returns the exit code (0, 1 or 2)."""
    action: Action = args.admin_action
    try:
        text, machine = action(client_of(args), args)
    except UsageError as error:
        print(f"runstate: {error}", file=sys.stderr)
        return EXIT_USAGE
    except OperatorError as error:
        print(f"runstate: {error.code}: {error.message}", file=sys.stderr)
        return EXIT_API_ERROR
    print(json.dumps(machine, indent=2) if args.json else text)
    return EXIT_OK


# Each command returns its text output and its JSON output (the HTTP API's fields and shapes).


def _given(**fields: Any) -> dict[str, Any]:
    """The options that were given; an empty one (`--space ''`) is a usage error."""
    for name, value in fields.items():
        if value == "":
            raise UsageError(f"--{name} must not be empty")
    return {name: value for name, value in fields.items() if value is not None}


def _space_create(client: OperatorClient, args: argparse.Namespace) -> tuple[str, Any]:
    space = _space_json(client.request("POST", "/v1/spaces", _given(id=args.id, name=args.name)))
    return f"created space {space['id']}" + (f" ({space['name']})" if space["name"] else ""), space


def _space_list(client: OperatorClient, args: argparse.Namespace) -> tuple[str, Any]:
    spaces = [_space_json(view) for view in client.request("GET", "/v1/spaces")["spaces"]]
    rows = [[space["id"], space["name"] or "-", space["createdAt"] or "-"] for space in spaces]
    return _table(["ID", "NAME", "CREATED"], rows), {"spaces": spaces}


def _key_create(client: OperatorClient, args: argparse.Namespace) -> tuple[str, Any]:
    view = client.request("POST", "/v1/keys", _given(permissions=args.permission, space=args.space, name=args.name))
    key = _key_json(view)
    text = "\n".join([
        f"created key {key['id']} in space {key['space']} ({', '.join(key['permissions'])})",
        f"secret: {view['key']}",
        "The secret is shown only this once: store it now. If it is lost, revoke the key and create another.",
    ])
    return text, {"id": key["id"], "key": view["key"], **key}


def _key_list(client: OperatorClient, args: argparse.Namespace) -> tuple[str, Any]:
    keys = [_key_json(view) for view in client.request("GET", "/v1/keys", query=_given(space=args.space))["keys"]]
    rows = [
        [key["id"], key["name"] or "-", ",".join(key["permissions"]), key["createdAt"] or "-",
         key["revokedAt"] or "-", key["createdBy"] or "-"]
        for key in keys
    ]
    text = _table(["ID", "NAME", "PERMISSIONS", "CREATED", "REVOKED", "CREATED BY"], rows)
    return text, {"keys": keys}


def _key_revoke(client: OperatorClient, args: argparse.Namespace) -> tuple[str, Any]:
    key = _key_json(client.request("POST", f"/v1/keys/{quote(args.key_id, safe='')}/revoke", {}))
    return f"revoked key {key['id']} of space {key['space']} at {key['revokedAt']}", key


def _whoami(client: OperatorClient, args: argparse.Namespace) -> tuple[str, Any]:
    view = client.request("GET", "/v1/whoami")
    machine = {
        "auth": bool(view["auth"]), "keyId": view.get("keyId"), "space": view["space"],
        "permissions": list(view["permissions"]), "operator": bool(view["operator"]),
    }
    text = "\n".join([
        f"auth:        {'on' if machine['auth'] else 'off (the node accepts every call)'}",
        f"key:         {machine['keyId'] or '-'}",
        f"space:       {machine['space']}",
        f"permissions: {', '.join(machine['permissions']) or '-'}",
        f"operator:    {'yes' if machine['operator'] else 'no'}",
    ])
    return text, machine


def _members(client: OperatorClient, args: argparse.Namespace) -> tuple[str, Any]:
    view = client.request("GET", "/v1/cluster")
    rows = [
        [
            member["id"] + (" *" if member["id"] == view["leader"] else ""),
            member.get("role") or "-",
            "voter" if member.get("voter", True) else "learner",
            "-" if member.get("lag") is None else str(member["lag"]),
            "-" if member.get("appliedIndex") is None else str(member["appliedIndex"]),
            "yes" if member["reachable"] else "no",
            member["apiUrl"],
        ]
        for member in view["nodes"]
    ]
    text = _table(["ID", "ROLE", "VOTES", "LAG", "APPLIED", "REACHABLE", "API"], rows)
    return text + "\n(* leads; LAG: committed entries it has not applied)", view


def _add_member(client: OperatorClient, args: argparse.Namespace) -> tuple[str, Any]:
    body = _given(nodeId=args.node_id, raftAddress=args.raft, apiUrl=args.api_url)
    answer = client.request("POST", "/v1/cluster/members", body)
    return (f"recorded {answer['learner']['id']} as a learner: start it with runstate node --join; the leader "
            "makes it a voter once it has caught up"), answer


def _promote_member(client: OperatorClient, args: argparse.Namespace) -> tuple[str, Any]:
    answer = client.request("POST", f"/v1/cluster/members/{quote(args.node_id, safe='')}/promote", {})
    voters = ", ".join(str(member["id"] or member["raftAddress"]) for member in answer["voters"])
    return f"promoted {answer['promoted']}; the voters now: {voters}", answer


def _remove_member(client: OperatorClient, args: argparse.Namespace) -> tuple[str, Any]:
    answer = client.request("DELETE", f"/v1/cluster/members/{quote(args.node_id, safe='')}")
    members = ", ".join(str(member["id"] or member["raftAddress"]) for member in answer["members"])
    return f"removed {answer['removed']}; the voters now: {members}", answer


def _transfer_leader(client: OperatorClient, args: argparse.Namespace) -> tuple[str, Any]:
    answer = client.request("POST", "/v1/cluster/transfer-leader", _given(to=args.to))
    if not answer["transferred"]:
        return f"{answer['leader']} leads already: nothing to hand over", answer
    return f"leadership handed from {answer['previousLeader']} to {answer['leader'] or '(not known yet)'}", answer


def _space_json(view: dict[str, Any]) -> dict[str, Any]:
    return {"id": view["id"], "name": view.get("name"), "createdAt": view.get("createdAt")}


def _key_json(view: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": view["id"],
        "space": view["space"],
        "name": view.get("name"),
        "permissions": list(view["permissions"]),
        "createdAt": view.get("createdAt"),
        "revokedAt": view.get("revokedAt"),
        "createdBy": view.get("createdBy"),
    }


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns; the header alone when there are no rows."""
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(len(header))]
    lines = ("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in [header, *rows])
    return "\n".join(lines)
