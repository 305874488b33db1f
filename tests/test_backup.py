"""Backups and restore with real processes (README "Backups and restore"): `runstate backup` from a
live dev node and from a follower of a three-node cluster under a write load, `runstate backup
inspect`, `runstate restore` into a fresh dir, `runstate dev` and `runstate node` on it (the same
data digest, every task, result and key there; another node joins the restored one), scheduled
backups, and each bad input refused with nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runstate_server.actors import dispatch
from runstate_server.actors.state import State
from runstate_server.node.backup_file import MAGIC, Header, encode_backup
from tests._cluster import Cluster, cluster_factory
from tests._http import Api, call, mailbox_id, recv, settle_ok, submit_task
from tests._nodes import DevNode, start_auth_node
from tests._prometheus import scrape, value

CLI_TIMEOUT_S = 120.0
SCHEDULED_WAIT_S = 30.0


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    yield from cluster_factory(tmp_path)


def runstate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runstate_server.node.cli", *args],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, env=os.environ.copy(),
    )


def refused(finished: subprocess.CompletedProcess[str], status: int, words: str) -> None:
    """A CLI error: the exit status, one line on stderr naming `words`, no traceback."""
    assert finished.returncode == status, (finished.returncode, finished.stdout, finished.stderr)
    lines = finished.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("runstate: ") and words in lines[0], finished.stderr


def dev_world(node: DevNode, key: str) -> tuple[Api, str, list[str], str]:
    """A run with a finished task (its result) and a queued one; (api, run, task ids, result)."""
    api = Api(node.url, key=key)
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    done = submit_task(api, run_id, {"n": 1}, key="first")
    queued = submit_task(api, run_id, {"n": 2}, key="second")
    (delivery,) = recv(api, run_id)
    assert delivery["taskId"] == done["id"]
    settle_ok(api, delivery, "complete", {"result": {"payload": {"answer": 42}}})
    return api, run_id, [done["id"], queued["id"]], "42"


def data_digest(url: str, key: str) -> dict[str, Any]:
    status, answer = call(url, "GET", "/v1/cluster/digest", headers={"Authorization": f"Bearer {key}"})
    assert status == 200, answer
    return dict(answer)


def test_a_dev_node_backed_up_live_restores_to_the_same_state_under_a_new_cluster_id(tmp_path: Path) -> None:
    node, key = start_auth_node(tmp_path / "source")
    restored_node: DevNode | None = None
    try:
        api, run_id, task_ids, _ = dev_world(node, key)
        source_health = call(node.url, "GET", "/v1/health")[1]
        assert source_health["clusterId"].startswith(dispatch.CLUSTER_ID_PREFIX)
        out = tmp_path / "backups" / "first.backup"
        out.parent.mkdir()
        made = runstate("backup", "--out", str(out), "--url", node.url, "--api-key", key, "--json")
        assert made.returncode == 0, made.stderr
        written = json.loads(made.stdout)
        source = data_digest(node.url, key)  # nothing was written since: the state the backup holds
        assert written["clusterId"] == source_health["clusterId"]
        assert written["index"] <= source["appliedIndex"]
        assert [space["tasks"] for space in written["spaces"] if space["id"] == api.space] == [2]
        assert sorted(os.listdir(out.parent)) == ["first.backup"]  # no temporary file left

        inspected = runstate("backup", "inspect", str(out))
        assert inspected.returncode == 0, inspected.stderr
        assert "(verified)" in inspected.stdout and f"index {written['index']}" in inspected.stdout
        assert json.loads(runstate("backup", "inspect", str(out), "--json").stdout)["sha256"] == written["sha256"]

        target = tmp_path / "restored"
        done = runstate("restore", str(out), "--data-dir", str(target), "--json")
        assert done.returncode == 0, done.stderr
        restored = json.loads(done.stdout)
        assert restored["dataDigest"] == source["dataDigest"]
        assert restored["clusterId"] != source_health["clusterId"]

        node.stop()
        restored_node = DevNode(target, "--auth").start()
        again = Api(restored_node.url, space=api.space, key=key)  # the same key works: it was backed up
        health = call(restored_node.url, "GET", "/v1/health")[1]
        assert health["clusterId"] == restored["clusterId"]
        first, second = (again.ok("GET", f"/v1/tasks/{task_id}") for task_id in task_ids)
        assert first["state"] == "SUCCEEDED" and first["outcome"] == {"answer": 42}
        assert second["state"] == "QUEUED"
        (delivery,) = recv(again, run_id)  # the queued task is delivered by the restored node
        assert delivery["taskId"] == task_ids[1]
    finally:
        node.stop()
        if restored_node is not None:
            restored_node.stop()


def test_the_backup_route_refuses_a_space_key_and_writes_nothing(tmp_path: Path) -> None:
    node, key = start_auth_node(tmp_path / "node")
    try:
        operator = Api(node.url, key=key)
        space = operator.ok("POST", "/v1/spaces", {"id": "tenant"})["id"]  # the operator's space is "default"
        space_key = operator.ok("POST", "/v1/keys", {"permissions": ["admin", "coordination_read"], "space": space})["key"]
        status, answer = call(node.url, "GET", "/v1/cluster/backup", headers={"Authorization": f"Bearer {space_key}"})
        assert (status, answer["error"]["code"]) == (403, "FORBIDDEN")
        out = tmp_path / "refused.backup"
        refused(runstate("backup", "--out", str(out), "--url", node.url, "--api-key", space_key), 1, "FORBIDDEN")
        assert not out.exists() and [name for name in os.listdir(tmp_path) if "refused" in name] == []
        assert not [name for name in os.listdir(tmp_path / "node") if name.endswith(".writing")]
    finally:
        node.stop()


def test_bad_files_paths_and_dirs_are_refused_with_nothing_written(tmp_path: Path) -> None:
    refused(runstate("backup", "--out", str(tmp_path / "missing" / "x.backup"), "--url", "http://127.0.0.1:9"),
            2, "cannot write --out")
    assert not (tmp_path / "missing").exists()
    header = Header(cluster_id=None, epoch=1, index=5, term=2, release="0", command_level=dispatch.COMMAND_LEVEL,
                    proven_level=1, created_ms=0, node_id="dev")
    good = tmp_path / "good.backup"
    good.write_bytes(encode_backup(header, State()))
    assert runstate("backup", "inspect", str(good)).returncode == 0
    cases = {
        "not.backup": (b"hello, not a backup\n", "not a runstate backup"),
        "truncated.backup": (good.read_bytes()[:-40], "truncated"),
        "flipped.backup": (bytes([*good.read_bytes()[:-33], good.read_bytes()[-33] ^ 1, *good.read_bytes()[-32:]]),
                           "SHA-256 does not match"),
    }
    for name, (content, words) in cases.items():
        (tmp_path / name).write_bytes(content)
        refused(runstate("backup", "inspect", str(tmp_path / name)), 1, words)
        refused(runstate("restore", str(tmp_path / name), "--data-dir", str(tmp_path / f"dir-{name}")), 1, words)
        assert not (tmp_path / f"dir-{name}").exists()
    later = tmp_path / "later.backup"
    later.write_bytes(encode_backup(Header(**{**header.__dict__, "command_level": dispatch.COMMAND_LEVEL + 1}), State()))
    refused(runstate("restore", str(later), "--data-dir", str(tmp_path / "dir-later")), 1, "command level")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "raft.journal").write_bytes(b"a node's data")
    refused(runstate("restore", str(good), "--data-dir", str(occupied)), 1, "not empty")
    assert os.listdir(occupied) == ["raft.journal"]
    refused(runstate("restore", str(good), "--data-dir", str(tmp_path / "d"), "--node-id", "n1"), 2, "--raft")
    assert not (tmp_path / "d").exists()
    assert [name for name in os.listdir(tmp_path) if "restoring" in name] == []
    assert good.read_bytes().startswith(MAGIC)


def test_scheduled_backups_are_taken_kept_to_n_and_shown_in_metrics(tmp_path: Path) -> None:
    directory = tmp_path / "scheduled"
    node = DevNode(tmp_path / "node", "--backup-dir", str(directory), "--backup-every", "1s", "--backup-keep", "2").start()
    try:
        submit_task(Api(node.url), Api(node.url).ok("POST", "/v1/scopes", {})["id"], {"n": 1})
        deadline = time.monotonic() + SCHEDULED_WAIT_S
        while True:
            # Taken every second: between two, 3 or more taken and the oldest removed past --backup-keep.
            metrics, _ = scrape(node.url)
            files = sorted(name for name in os.listdir(directory) if name.endswith(".backup"))
            if value(metrics, "runstate_backups_total") >= 3 and len(files) == 2:
                break
            assert time.monotonic() < deadline, (
                f"not 3 scheduled backups with 2 kept in {SCHEDULED_WAIT_S} s: {files} {node.log()}")
            time.sleep(0.2)
        assert value(metrics, "runstate_backup_failures_total") == 0
        assert value(metrics, "runstate_backup_last_size_bytes") > 0
        assert value(metrics, "runstate_backup_last_success_timestamp_seconds") > time.time() - SCHEDULED_WAIT_S
        assert runstate("backup", "inspect", str(directory / files[-1])).returncode == 0
        view = call(node.url, "GET", "/v1/cluster")[1]
        assert view["nodes"][0]["backup"]["file"].endswith(".backup")  # the newest: maybe one taken since
    finally:
        node.stop()


def task_ids(api: Api, run_id: str) -> list[str]:
    """Every task of the run, page by page."""
    found: list[str] = []
    cursor = ""
    while True:
        page = api.ok("GET", f"/v1/tasks?scopeId={run_id}&limit=500" + (f"&cursor={cursor}" if cursor else ""))
        found += [task["id"] for task in page["tasks"]]
        cursor = page.get("nextCursor") or ""
        if not cursor:
            return found


def write_load(api: Api, run_id: str, mailbox: str, stop: threading.Event, written: list[str]) -> None:
    while not stop.is_set():
        status, answer = api("POST", "/v1/tasks", {"scopeId": run_id, "mailboxId": mailbox, "input": len(written)})
        if status == 201:
            written.append(answer["taskId"])


def test_a_follower_backs_up_a_cluster_under_load_and_a_new_cluster_grows_from_it(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster().start()
    leader = cluster.leader_index()
    api = cluster.api(leader).resending()
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    before = submit_task(api, run_id, {"n": 0})  # acknowledged before the backup is asked for
    stop, written = threading.Event(), []
    loader = threading.Thread(
        target=write_load, args=(cluster.api(leader), run_id, mailbox_id(api), stop, written), daemon=True,
    )
    loader.start()
    out = tmp_path / "cluster.backup"
    try:
        while len(written) < 20 and loader.is_alive():  # the load is under way
            time.sleep(0.05)
        made = runstate("backup", "--out", str(out), "--url", cluster.base_url, "--api-key", cluster.admin_key, "--json")
        during = len(written)
        while len(written) < during + 20:  # and went on after the backup
            time.sleep(0.05)
    finally:
        stop.set()
        loader.join(10)
    assert made.returncode == 0, made.stderr
    backup = json.loads(made.stdout)
    assert backup["source"] != cluster.urls[leader] and backup["nodeId"] != cluster.ids[leader]

    second = Cluster(tmp_path / "restored", size=1, admin_key=False)
    done = runstate("restore", str(out), "--data-dir", str(second.data_dir(0)), "--node-id", "n1",
                    "--raft", second.rafts[0], "--advertise-url", second.urls[0], "--json")
    assert done.returncode == 0, done.stderr
    restored = json.loads(done.stdout)
    assert restored["epoch"] == backup["epoch"] + 1
    try:
        second.alone.add(0)
        second.start(0)
        joined = second.add_node(join=[0])
        second.start(joined)
        second.wait_same_digest()
        assert second.api(joined).resending().ok("GET", f"/v1/tasks/{before['id']}")["state"] == "QUEUED"
        counted = sum(space["tasks"] for space in backup["spaces"])
        assert len(task_ids(second.api(0).resending(), run_id)) == counted
        health = second.health(joined)
        assert health is not None and health["clusterId"] == restored["clusterId"]
    finally:
        second.stop()
        print(second.logs())
