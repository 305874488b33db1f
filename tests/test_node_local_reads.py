"""Reads on a single voter commit nothing (Node.confirm_leadership), and lose no guarantee the read
barrier gave: a read sees every write acknowledged before it, and a key revoked before the read is
refused with the barrier's own error. A cluster's reads: tests/test_cluster_read_index.py."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests._http import Api, mailbox_id
from tests._nodes import DevNode, read_bootstrap_key

READS = 100
CLIENTS = 4
ROUNDS = 40


def commit_index(url: str) -> int:
    return int(Api(url).ok("GET", "/v1/health")["commitIndex"])


def test_a_dev_node_answers_reads_without_a_log_entry(node_factory: Callable[..., DevNode]) -> None:
    node = node_factory(in_memory=True).start()
    api = Api(node.url)
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    task_id = api.ok("POST", "/v1/tasks", {"scopeId": run_id, "mailboxId": mailbox_id(api), "input": 1})["taskId"]
    before = commit_index(node.url)
    for _ in range(READS):
        assert api.ok("GET", f"/v1/tasks/{task_id}")["state"] == "QUEUED"
        api.ok("POST", "/v1/tasks/results", {"ids": [task_id]})
    assert commit_index(node.url) == before
    api.ok("POST", f"/v1/tasks/{task_id}/cancel")  # a write still commits
    assert commit_index(node.url) > before


def test_every_read_sees_the_writes_acknowledged_before_it(node_factory: Callable[..., DevNode]) -> None:
    """Clients write and read at once; each read starts after its write's answer, on another
    connection, and must see it."""
    node = node_factory(in_memory=True).start()
    api = Api(node.url)
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    mailbox = mailbox_id(api)
    failures: list[Any] = []

    def client(index: int) -> None:
        try:
            for round_ in range(ROUNDS):
                task_input = {"client": index, "round": round_}  # the same input would be the same task
                task_id = api.ok("POST", "/v1/tasks", {"scopeId": run_id, "mailboxId": mailbox, "input": task_input})["taskId"]
                status, view = api("GET", f"/v1/tasks/{task_id}")
                if status != 200 or view["state"] != "QUEUED":
                    failures.append(("after submit", status, view.get("state")))
                api.ok("POST", f"/v1/tasks/{task_id}/cancel")
                status, view = api("GET", f"/v1/tasks/{task_id}")
                if status != 200 or view["state"] != "CANCELLED":
                    failures.append(("after cancel", status, view.get("state")))
        except Exception as error:  # noqa: BLE001 - reported below, in the test's thread
            failures.append(error)

    threads = [threading.Thread(target=client, args=(index,)) for index in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []


def test_a_key_revoked_while_a_read_is_under_way_is_refused(tmp_path: Path) -> None:
    """The auth middleware checks the key when the headers arrive; the read itself checks it again
    (as the barrier did): a revoke applied between the two refuses the read with the same error."""
    node = DevNode(tmp_path / "data", "--auth").start()
    try:
        admin = Api(node.url, key=read_bootstrap_key(node))
        created = admin.ok("POST", "/v1/keys", {"permissions": ["resource_config", "coordination_write", "coordination_read"], "name": "reader"})
        reader = Api(node.url, key=created["key"])
        run_id = reader.ok("POST", "/v1/scopes", {})["id"]
        task_id = reader.ok("POST", "/v1/tasks", {"scopeId": run_id, "mailboxId": mailbox_id(reader), "input": 1})["taskId"]
        body = json.dumps({"ids": [task_id]}).encode()
        assert reader.ok("POST", "/v1/tasks/results", {"ids": [task_id]})["results"][0]["id"] == task_id

        address = urlsplit(node.url)
        connection = http.client.HTTPConnection(address.hostname or "127.0.0.1", address.port, timeout=30)
        try:
            # Headers now (the middleware accepts the key), the body only after the revoke.
            connection.putrequest("POST", reader.space_path("/v1/tasks/results"))
            connection.putheader("Authorization", f"Bearer {created['key']}")
            connection.putheader("Content-Type", "application/json")
            connection.putheader("Content-Length", str(len(body)))
            connection.endheaders()
            admin.ok("POST", f"/v1/keys/{created['id']}/revoke")
            connection.send(body)
            response = connection.getresponse()
            answer = json.loads(response.read())
        finally:
            connection.close()
        assert (response.status, answer["error"]["code"]) == (401, "UNAUTHENTICATED"), answer
        assert answer["error"]["message"] == "the API key is not valid (unknown or revoked)"
        # And a read sent after the revoke, refused by the middleware: the same answer.
        assert reader.error("GET", f"/v1/tasks/{task_id}") == (401, "UNAUTHENTICATED")
    finally:
        node.stop()
