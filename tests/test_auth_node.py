"""`runstate dev --auth`: the first admin key, from RUNSTATE_BOOTSTRAP_KEY or generated into a 0600
file that the banner names; created once, however often the node restarts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._http import Api, call
from tests._nodes import DevNode, read_bootstrap_key

RUN_TIMEOUT_S = 60.0
BOOTSTRAP_KEY = "rsk_test-bootstrap-key-0123456789abcdefghij"


def test_the_generated_key_is_in_a_private_file_and_bootstrapped_once(node_factory: Any) -> None:
    node: DevNode = node_factory("--auth").start()
    secret = read_bootstrap_key(node)  # also checks the file's mode is 0600
    assert node.data_dir is not None
    assert f"export RUNSTATE_API_KEY=$(cat {node.data_dir / 'bootstrap.key'})" in node.log()
    api = Api(node.url, key=secret)
    identity = api.ok("GET", "/v1/whoami")
    assert identity == {
        "auth": True, "keyId": identity["keyId"], "space": "default", "operator": True,
        "permissions": ["admin", "resource_config", "coordination_write", "coordination_read"],
    }
    node.kill()
    node.start()
    assert api.ok("GET", "/v1/whoami")["keyId"] == identity["keyId"]
    assert [key["id"] for key in api.ok("GET", "/v1/keys")["keys"]] == [identity["keyId"]]
    assert Api(node.url).error("GET", "/v1/whoami") == (401, "UNAUTHENTICATED")


def test_the_key_from_the_environment_is_the_first_admin_key(node_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTATE_BOOTSTRAP_KEY", BOOTSTRAP_KEY)
    node: DevNode = node_factory("--auth").start()
    assert node.data_dir is not None and not (node.data_dir / "bootstrap.key").exists()
    assert Api(node.url, key=BOOTSTRAP_KEY).ok("GET", "/v1/whoami")["operator"] is True
    assert "RUNSTATE_BOOTSTRAP_KEY" in node.log()


def test_a_node_without_auth_needs_no_key_and_says_so(dev_node: DevNode) -> None:
    identity = Api(dev_node.url).ok("GET", "/v1/whoami")
    assert (identity["auth"], identity["keyId"], identity["space"]) == (False, None, "default")


@pytest.mark.parametrize("key", ["short", "has a space in it and is long enough 0123456789"])
def test_a_malformed_bootstrap_key_is_refused_before_starting(tmp_path: Path, key: str) -> None:
    finished = subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", "dev", "--auth", "--port", "0", "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env={**os.environ, "RUNSTATE_BOOTSTRAP_KEY": key},
    )
    assert finished.returncode == 2, finished.stderr
    assert "bootstrap key must be" in finished.stderr
    assert not (tmp_path / "raft.journal").exists()


def test_a_resent_space_creation_makes_one_space(node_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """POST /v1/spaces under an Idempotency-Key: its resend answers the space it made first (a
    generated id included); the key with another body is IDEMPOTENCY_CONFLICT. POST /v1/keys is
    applied on each request: its answer holds a new secret, which a replay could not repeat."""
    monkeypatch.setenv("RUNSTATE_BOOTSTRAP_KEY", BOOTSTRAP_KEY)
    node: DevNode = node_factory("--auth").start()
    admin = {"Authorization": f"Bearer {BOOTSTRAP_KEY}"}
    keyed = {**admin, "Idempotency-Key": "create-team"}
    first = call(node.url, "POST", "/v1/spaces", {"name": "team"}, headers=keyed)
    assert first[0] == 201 and first[1]["id"].startswith("spc_"), first
    assert call(node.url, "POST", "/v1/spaces", {"name": "team"}, headers=keyed) == first
    status, answer = call(node.url, "POST", "/v1/spaces", {"name": "other"}, headers=keyed)
    assert (status, answer["error"]["code"]) == (409, "IDEMPOTENCY_CONFLICT")
    spaces = Api(node.url, key=BOOTSTRAP_KEY).ok("GET", "/v1/spaces")["spaces"]
    assert sorted(space["name"] or "" for space in spaces) == ["", "team"]  # the default space, and one team
    made = [call(node.url, "POST", "/v1/keys", {"permissions": ["coordination_read"]},
                 headers={**admin, "Idempotency-Key": "create-reader"}) for _ in range(2)]
    assert [status for status, _ in made] == [201, 201] and made[0][1]["id"] != made[1][1]["id"]
    for _, key in made:
        assert Api(node.url, key=key["key"]).ok("GET", "/v1/whoami")["keyId"] == key["id"]
