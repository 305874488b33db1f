"""Keys on the three-node cluster: every node requires one, the first leader bootstraps exactly one
admin key, a key created through one node works at once on the others, and a key revoked through
one node is refused by the other two at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests._cluster import Cluster
from tests._http import Api, unavailable

KEY_CREATE_ATTEMPTS = 3  # each answered 503 (an election under load) is revoked and made again


def create_key(api: Api, admin: Api, body: dict[str, Any]) -> Any:
    """A key created through `api`. POST /v1/keys is not idempotent (its secret is shown once): a
    creation of unknown outcome (503) may have made a key nobody received, so it is revoked
    (through `admin`) and another made under a new name."""
    for attempt in range(KEY_CREATE_ATTEMPTS):
        name = f"{body['name']}-{attempt}"
        status, answer = api("POST", "/v1/keys", {**body, "name": name})
        if not unavailable(status, answer):
            assert status == 201, (status, answer)
            return answer
        for key in admin.resending().ok("GET", "/v1/keys")["keys"]:
            if key["name"] == name:
                admin.resending().ok("POST", f"/v1/keys/{key['id']}/revoke")
    raise AssertionError(f"POST /v1/keys answered 503 {KEY_CREATE_ATTEMPTS} times")


def test_keys_are_required_created_and_revoked_at_once_on_every_node(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    followers = [index for index in range(cluster.size) if index != leader]
    for index in range(cluster.size):
        assert Api(cluster.urls[index]).error("GET", "/v1/cluster") == (401, "UNAUTHENTICATED")
        assert Api(cluster.urls[index]).error("POST", "/v1/scopes", {}) == (401, "UNAUTHENTICATED")
    keys = cluster.api(leader).resending().ok("GET", "/v1/keys")["keys"]
    assert [(key["name"], key["permissions"]) for key in keys] == [
        ("bootstrap admin", ["admin", "resource_config", "coordination_write", "coordination_read"])
    ]

    # Created through a follower, used at once through every node (followers forward to the leader).
    created = create_key(
        cluster.api(followers[0]), cluster.api(leader), {"permissions": ["coordination_write", "coordination_read"], "name": "worker"}
    )
    workers = [Api(url, key=created["key"]) for url in cluster.urls]
    for api in workers:
        assert api.resending().ok("GET", "/v1/whoami")["keyId"] == created["id"]
    run_id = workers[followers[1]].resending().ok("POST", "/v1/scopes", {})["id"]

    # Revoked through the other follower: refused at once everywhere, reads and writes alike.
    # Resent while 503 UNAVAILABLE, safe without the key: revoking again answers the first revoke.
    revoked = cluster.api(followers[1]).resending().ok("POST", f"/v1/keys/{created['id']}/revoke")
    assert revoked["revokedAt"] is not None
    for api in workers:
        assert api.error("GET", "/v1/whoami") == (401, "UNAUTHENTICATED")
        assert api.error("GET", f"/v1/scopes/{run_id}") == (401, "UNAUTHENTICATED")
        assert api.error("POST", "/v1/scopes", {}) == (401, "UNAUTHENTICATED")
    assert cluster.api(followers[0]).resending().ok("GET", f"/v1/scopes/{run_id}")["storedState"] == "ACTIVE"
    cluster.wait_same_digest()


def test_without_a_bootstrap_key_the_first_leader_writes_one_to_its_data_dir(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(admin_key=False).start()
    def announced() -> list[int]:
        """The nodes whose log says where the key is (the file is written before the key commits)."""
        return [index for index in range(cluster.size) if "export RUNSTATE_API_KEY=$(cat" in cluster.log_path(index).read_text()]

    (owner,) = cluster.wait_until("a node to say where the first admin key is", announced, timeout_s=30)
    key_file = cluster.data_dir(owner) / "bootstrap.key"
    assert f"RUNSTATE_API_KEY=$(cat {key_file})" in cluster.log_path(owner).read_text()
    assert key_file.stat().st_mode & 0o777 == 0o600
    others = [index for index in range(cluster.size) if index != owner]
    assert not any((cluster.data_dir(index) / "bootstrap.key").exists() for index in others)
    secret = key_file.read_text().strip()
    for url in cluster.urls:
        assert Api(url, key=secret).ok("GET", "/v1/whoami")["operator"] is True
    # A restart of every node creates no second key.
    cluster.kill_all()
    cluster.start()
    keys = Api(cluster.urls[0], key=secret).ok("GET", "/v1/keys")["keys"]
    assert len(keys) == 1
