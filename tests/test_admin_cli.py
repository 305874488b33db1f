"""`runstate spaces|keys|whoami` as a user runs them, against a real `runstate dev --auth` node:
each command's text and --json output, the settings from flags or the environment, and the exit
codes (0 done, 1 refused by the API with `runstate: CODE: message`, 2 usage)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from tests._http import call
from tests._nodes import DevNode, free_port
from tests.test_sdk_admin import OPERATOR_SPACE, unique

CLI_TIMEOUT_S = 60
CLIENT_ENV = ("RUNSTATE_BASE_URL", "RUNSTATE_API_KEY", "RUNSTATE_SPACE_ID")


def runstate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The `runstate` command with `args`, without the caller's RUNSTATE_* settings (plus `env`)."""
    environment = {name: value for name, value in os.environ.items() if name not in CLIENT_ENV}
    return subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", *args],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env={**environment, **(env or {})},
    )


def ok(*args: str, env: dict[str, str] | None = None) -> str:
    finished = runstate(*args, env=env)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert finished.stderr == ""
    return finished.stdout


def ok_json(*args: str, env: dict[str, str] | None = None) -> Any:
    return json.loads(ok(*args, "--json", env=env))


def refused(code: str, *args: str) -> str:
    """Run a command the API refuses: exit 1, nothing on stdout, `runstate: CODE: ...` on stderr."""
    finished = runstate(*args)
    assert finished.returncode == 1, finished.stdout + finished.stderr
    assert finished.stdout == ""
    assert finished.stderr.startswith(f"runstate: {code}: "), finished.stderr
    assert finished.stderr.count("\n") == 1
    return finished.stderr


def usage_error(*args: str) -> str:
    finished = runstate(*args)
    assert finished.returncode == 2, finished.stdout + finished.stderr
    assert finished.stdout == ""
    return finished.stderr


def test_whoami(auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    text = ok("whoami", "--url", node.url, "--api-key", secret)
    assert "auth:        on" in text
    assert f"space:       {OPERATOR_SPACE}" in text
    assert "permissions: admin, resource_config, coordination_write, coordination_read" in text
    assert "operator:    yes" in text

    # The same from the environment, and as JSON.
    identity = ok_json("whoami", env={"RUNSTATE_BASE_URL": node.url, "RUNSTATE_API_KEY": secret})
    assert identity["keyId"].startswith("key_") and f"key:         {identity['keyId']}" in text
    assert identity == {
        "auth": True, "keyId": identity["keyId"], "space": OPERATOR_SPACE,
        "permissions": ["admin", "resource_config", "coordination_write", "coordination_read"], "operator": True,
    }
    # A comma list of URLs works (the first one is down).
    dead = f"http://127.0.0.1:{free_port()}"
    assert ok_json("whoami", "--url", f"{dead},{node.url}", "--api-key", secret) == identity


def test_spaces_create_and_list(auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    flags = ("--url", node.url, "--api-key", secret)
    space_id = unique("cli")
    assert ok("spaces", "create", "--id", space_id, "--name", "CLI team", *flags) == f"created space {space_id} (CLI team)\n"

    created = ok_json("spaces", "create", *flags)
    assert set(created) == {"id", "name", "createdAt"}
    assert created["id"].startswith("spc_") and created["name"] is None and created["createdAt"].endswith("Z")

    listed = ok_json("spaces", "list", *flags)
    by_id = {space["id"]: space for space in listed["spaces"]}
    assert {space_id, created["id"], OPERATOR_SPACE} <= set(by_id)
    assert by_id[created["id"]] == created and by_id[space_id]["name"] == "CLI team"

    lines = ok("spaces", "list", *flags).splitlines()
    assert lines[0].split() == ["ID", "NAME", "CREATED"]
    (row,) = [line for line in lines if line.startswith(space_id + " ")]
    assert row.split()[1:3] == ["CLI", "team"]

    assert space_id in refused("CONFLICT", "spaces", "create", "--id", space_id, *flags)
    refused("VALIDATION_FAILED", "spaces", "create", "--id", "no/slashes", *flags)


def test_a_node_without_auth_makes_a_space_before_it_is_used(dev_node: DevNode) -> None:
    space_id = unique("keyless")
    runs = f"/v1/spaces/{space_id}/scopes"
    assert call(dev_node.url, "POST", runs, {})[0] == 404
    assert ok("spaces", "create", "--id", space_id, "--url", dev_node.url) == f"created space {space_id}\n"
    assert call(dev_node.url, "POST", runs, {})[0] == 201


def test_keys_create_list_revoke(auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    flags = ("--url", node.url, "--api-key", secret)
    space_id = unique("keys")
    ok("spaces", "create", "--id", space_id, *flags)

    # Text: the id, the secret on a line of its own, and the warning that it is shown once.
    text = ok(
        "keys", "create", "--space", space_id, "--permission", "coordination_read",
        "--permission", "admin", "--name", "team admin", *flags,
    )
    first, second, third = text.splitlines()
    assert first.startswith("created key key_") and f"in space {space_id} (admin, coordination_read)" in first
    assert second.startswith("secret: rsk_")
    assert "shown only this once" in third
    admin_id, admin_secret = first.split()[2], second.removeprefix("secret: ")

    # The new key works at once.
    assert ok_json("whoami", "--url", node.url, "--api-key", admin_secret) == {
        "auth": True, "keyId": admin_id, "space": space_id, "permissions": ["admin", "coordination_read"],
        "operator": False,
    }

    # JSON: the HTTP API's view with the secret under "key"; created by the team admin.
    worker = ok_json(
        "keys", "create", "--permission", "coordination_write", "--url", node.url, "--api-key", admin_secret
    )
    assert worker["key"].startswith("rsk_")
    assert worker["space"] == space_id and worker["createdBy"] == admin_id and worker["revokedAt"] is None
    assert set(worker) == {"id", "key", "space", "name", "permissions", "createdAt", "revokedAt", "createdBy"}

    # Listing shows no secrets, in text or JSON.
    listed = ok_json("keys", "list", "--space", space_id, *flags)["keys"]
    assert {key["id"] for key in listed} == {admin_id, worker["id"]}
    assert all("key" not in key for key in listed)
    text = ok("keys", "list", "--space", space_id, *flags)
    assert text.splitlines()[0].split() == ["ID", "NAME", "PERMISSIONS", "CREATED", "REVOKED", "CREATED", "BY"]
    assert admin_id in text and worker["id"] in text and "rsk_" not in text

    # Revoke: the key stops working at once.
    revoked_text = ok("keys", "revoke", worker["id"], *flags)
    assert revoked_text.startswith(f"revoked key {worker['id']} of space {space_id} at ")
    again = ok_json("keys", "revoke", worker["id"], *flags)
    assert again["revokedAt"] is not None and again["id"] == worker["id"]
    assert revoked_text.strip().endswith(again["revokedAt"])
    refused("UNAUTHENTICATED", "whoami", "--url", node.url, "--api-key", worker["key"])

    refused("NOT_FOUND", "keys", "revoke", "key_00000000000000000000", *flags)
    refused("VALIDATION_FAILED", "keys", "create", "--permission", "superuser", *flags)


def test_refusals_exit_1(auth_node: tuple[DevNode, str]) -> None:
    node, secret = auth_node
    reader = ok_json("keys", "create", "--permission", "coordination_read", "--url", node.url, "--api-key", secret)
    as_reader = ("--url", node.url, "--api-key", reader["key"])
    message = refused("FORBIDDEN", "keys", "list", *as_reader)
    assert "admin" in message
    refused("FORBIDDEN", "spaces", "list", *as_reader)
    refused("FORBIDDEN", "keys", "create", "--permission", "admin", *as_reader)
    refused("UNAUTHENTICATED", "whoami", "--url", node.url)
    refused("UNAUTHENTICATED", "keys", "list", "--url", node.url, "--api-key", "rsk_" + "x" * 43)
    # No node there: nothing answers.
    refused("UNAVAILABLE", "whoami", "--url", f"http://127.0.0.1:{free_port()}")


def test_usage_errors_exit_2() -> None:
    assert "--permission" in usage_error("keys", "create", "--url", "http://127.0.0.1:1")
    assert "KEY_ID" in usage_error("keys", "revoke")
    usage_error("keys")
    usage_error("spaces", "delete")
    usage_error("whoami", "--bogus")
    assert usage_error("whoami", "--url", "ftp://example.com").startswith("runstate: --url 'ftp://example.com'")
    assert usage_error("keys", "list", "--space", "", "--url", "http://127.0.0.1:1").startswith("runstate: --space")


def test_help_lists_the_permissions() -> None:
    text = ok("keys", "create", "--help")
    assert "admin, resource_config, coordination_write, coordination_read" in " ".join(text.split())
