"""A tiny blocking JSON client for API tests (deliberately not the SDK)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tests._raw_http import Answer, send

TIMEOUT_S = 60.0
# A write answered 503 UNAVAILABLE (an election: the leader that took it stopped leading, the
# outcome is unknown) is sent again with the same Idempotency-Key, which the server answers with
# the first outcome, for at most UNAVAILABLE_RETRY_S.
UNAVAILABLE_RETRY_S = 15.0
UNAVAILABLE_RETRY_PAUSE_S = 0.2  # between two sends of one write
IDEMPOTENCY_HEADER = "Idempotency-Key"
WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")

Sent = TypeVar("Sent")


def call(base_url: str, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(base_url + path, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            if response.headers.get_content_type() == "text/plain":  # GET /metrics
                return response.status, response.read().decode()
            if response.headers.get_content_type() == "application/vnd.runstate.backup":  # GET /v1/cluster/backup
                return response.status, response.read()
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        payload = error.read()
        error.close()
        return error.code, json.loads(payload or b"null")


def unavailable(status: int, answer: Any) -> bool:
    """The answer is a 503 UNAVAILABLE error envelope."""
    error = answer.get("error") if isinstance(answer, dict) else None
    return status == 503 and isinstance(error, dict) and error.get("code") == "UNAVAILABLE"


def _resent_while_unavailable(send_once: Callable[[str], Sent], is_unavailable: Callable[[Sent], bool]) -> Sent:
    """`send_once(key)` with a fresh idempotency key, and again with that key while it answers
    503 UNAVAILABLE, for at most UNAVAILABLE_RETRY_S; the last answer, whatever it is."""
    key = uuid.uuid4().hex
    deadline = time.monotonic() + UNAVAILABLE_RETRY_S
    while True:
        answer = send_once(key)
        if not is_unavailable(answer) or time.monotonic() >= deadline:
            return answer
        time.sleep(UNAVAILABLE_RETRY_PAUSE_S)


def keyed_call(base_url: str, method: str, path: str, body: Any = None, *, headers: dict[str, str] | None = None,
               **kwargs: Any) -> tuple[int, Any]:
    """`call` with an Idempotency-Key, sent again while it answers 503 UNAVAILABLE (see
    UNAVAILABLE_RETRY_S): for a write that an election right after a cluster starts must not fail."""
    return _resent_while_unavailable(
        lambda key: call(base_url, method, path, body, headers={**(headers or {}), IDEMPOTENCY_HEADER: key}, **kwargs),
        lambda answer: unavailable(*answer),
    )


def resent_call(base_url: str, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
    """`call`, sent again while it answers 503 UNAVAILABLE (see UNAVAILABLE_RETRY_S): for a read,
    which needs no idempotency key to be sent again."""
    return _resent_while_unavailable(lambda _key: call(base_url, method, path, body, **kwargs), lambda answer: unavailable(*answer))


def keyed_send(base_url: str, method: str, path: str, body: bytes | None = None,
               headers: dict[str, bytes | str] | None = None) -> Answer:
    """`keyed_call` through `tests._raw_http.send`: headers sent as given, the answer's kept."""
    return _resent_while_unavailable(
        lambda key: send(base_url, method, path, body, {**(headers or {}), IDEMPOTENCY_HEADER: key}),
        lambda answer: (answer.status, answer.code) == (503, "UNAVAILABLE"),
    )


# Routes outside any space; every other `/v1/...` path a test names is sent under the space,
# `/v1/spaces/{space}/...`.
OPERATOR_PATHS = ("/v1/health", "/v1/cluster", "/v1/openapi.json", "/v1/whoami", "/v1/spaces", "/v1/keys")
DEFAULT_SPACE = "default"  # a node's default space (NodeConfig.default_space)


class Api:
    """Calls in one space: `space`, else the key's space, else the default space."""

    def __init__(self, base_url: str, space: str | None = None, key: str | None = None) -> None:
        self.base_url = base_url
        self.headers: dict[str, str] = {}
        if key is not None:
            self.headers["Authorization"] = f"Bearer {key}"
        self.space = space
        self.resends_unavailable = False

    def resending(self) -> Api:
        """This client, its writes sent by `keyed_call` and its reads by `resent_call` (again while
        they answer 503 UNAVAILABLE): for a test's setup calls through a cluster."""
        resending = Api(self.base_url, self.space)
        resending.headers = dict(self.headers)
        resending.resends_unavailable = True
        return resending

    def space_path(self, path: str) -> str:
        if not path.startswith("/v1/") or path.startswith(OPERATOR_PATHS):
            return path
        if self.space is None:
            status, identity = call(self.base_url, "GET", "/v1/whoami", headers=self.headers)
            self.space = identity["space"] if status == 200 else DEFAULT_SPACE
        return f"/v1/spaces/{self.space}/{path[len('/v1/'):]}"

    def __call__(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        sender = (keyed_call if method in WRITE_METHODS else resent_call) if self.resends_unavailable else call
        return sender(self.base_url, method, self.space_path(path), body, headers=self.headers, **kwargs)

    def ok(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self(method, path, body)
        assert 200 <= status < 300, (status, answer)
        return answer

    def error(self, method: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, str]:
        status, answer = self(method, path, body, **kwargs)
        assert status >= 400, (status, answer)
        return status, answer["error"]["code"]


def new_space(base_url: str, prefix: str, key: str | None = None) -> str:
    """A new space, `<prefix>-<12 random hex digits>`, made through POST /v1/spaces (a space must
    exist before it is used; on a node without auth, anyone may make one); returns its id."""
    space_id = f"{prefix}-{uuid.uuid4().hex[:12]}"
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    status, answer = keyed_call(base_url, "POST", "/v1/spaces", {"id": space_id}, headers=headers)
    assert status == 201, (status, answer)
    return space_id


def configured_run(base_url: str) -> Iterator[str]:
    """A fresh run that the module-level API of this process (`runstate.once`, `runstate.queue`)
    uses until the generator ends; for a fixture to `yield from`."""
    import runstate

    scope_id = str(Api(base_url).ok("POST", "/v1/scopes", {})["id"])
    runstate.configure(base_url=base_url, scope_id=scope_id)
    try:
        yield scope_id
    finally:
        runstate.close()


# -- queues on the wire: mailboxes by id, tasks, recv, and the calls on a delivery ---------------
# A delivery is returned as {"id": token, "token", "taskId", "input", "attempt", "needs", "holds",
# "leaseExpiresAt"}; `settle` sends its token to /v1/messages/{taskId}/...


def mailbox_id(api: Api, name: str = "work", mode: str | None = None) -> str:
    """The id of the mailbox `name`, created (in `mode`) when missing."""
    status, answer = api("POST", "/v1/mailboxes", {"name": name, **({"mode": mode} if mode else {})})
    if status == 201:
        return str(answer["id"])
    assert (status, answer["error"]["code"]) == (409, "CONFLICT"), (status, answer)
    (found,) = api.ok("GET", f"/v1/mailboxes?name={name}")["mailboxes"]
    return str(found["id"])


def task_body(run_id: str, mailbox: str, task_input: Any, key: str | None = None, **extra: Any) -> dict[str, Any]:
    body = {"scopeId": run_id, "mailboxId": mailbox, "input": task_input, **extra}
    if key is not None:
        body["taskKey"] = key
    return body


def submit_task(api: Api, run_id: str, task_input: Any, key: str | None = None, mailbox: str = "work",
                **extra: Any) -> dict[str, Any]:
    """POST /v1/tasks to the mailbox named `mailbox`; the answer, with `id` = its taskId."""
    answer = dict(api.ok("POST", "/v1/tasks", task_body(run_id, mailbox_id(api, mailbox), task_input, key, **extra)))
    assert answer["id"] == answer["taskId"]
    return answer


def as_delivery(given: dict[str, Any]) -> dict[str, Any]:
    message = given["message"]
    return {"id": given["token"], "token": given["token"], "taskId": message["id"], "input": message["payload"],
            "attempt": message["attempt"], "needs": message.get("needs"), "holds": message.get("holds"),
            "leaseExpiresAt": given.get("leaseExpiresAt"), "scopeId": message["scopeId"]}


def recv_path(api: Api, mailbox: str = "work") -> str:
    return f"/v1/mailboxes/{mailbox_id(api, mailbox)}/recv"


def recv(api: Api, run_id: str, mailbox: str = "work", **body: Any) -> list[dict[str, Any]]:
    """Up to `max` deliveries (default 1) of one recv; `leaseMs` is turned into leaseSeconds."""
    wire: dict[str, Any] = {"scopeId": run_id, "holder": "tests", "holderSession": "s1", "max": body.pop("max", 1)}
    if "leaseMs" in body:
        wire["leaseSeconds"] = body.pop("leaseMs") / 1000
    status, answer = api("POST", recv_path(api, mailbox), {**wire, **body})
    if status == 204:
        return []
    assert status == 200, (status, answer)
    return [as_delivery(given) for given in answer["messages"]]


def delivery_request(delivery: dict[str, Any], how: str, body: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """The path and body of complete, renew, retry, reject or release of a delivery."""
    body = dict(body or {})
    if how == "renew" and "leaseMs" in body:
        body["leaseSeconds"] = body.pop("leaseMs") / 1000
    action = how
    if how in ("retry", "reject", "release"):
        action = "nack"
        body["retry"] = how != "reject"
        if how == "release":
            body["countAttempt"] = False
    return f"/v1/messages/{delivery['taskId']}/{action}", {"token": delivery["token"], **body}


def settle(api: Api, delivery: dict[str, Any], how: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    path, wire = delivery_request(delivery, how, body)
    return api("POST", path, wire)


def settle_ok(api: Api, delivery: dict[str, Any], how: str, body: dict[str, Any] | None = None) -> Any:
    status, answer = settle(api, delivery, how, body)
    assert 200 <= status < 300, (status, answer)
    return answer


def settle_error(api: Api, delivery: dict[str, Any], how: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
    status, answer = settle(api, delivery, how, body)
    assert status >= 400, (status, answer)
    return status, answer["error"]["code"]


def task_request(api: Api, run_id: str, body: dict[str, Any], mailbox: str = "work") -> tuple[int, Any]:
    """POST /v1/tasks with a task body in the shape of a mailbox's tasks ({"input", "key"?, ...});
    the answer has `id` = taskId."""
    body = dict(body)
    if "key" in body:
        body["taskKey"] = body.pop("key")
    status, answer = api("POST", "/v1/tasks", {"scopeId": run_id, "mailboxId": mailbox_id(api, mailbox), **body})
    return status, answer


def task_ok(api: Api, run_id: str, body: dict[str, Any], mailbox: str = "work") -> dict[str, Any]:
    status, answer = task_request(api, run_id, body, mailbox)
    assert 200 <= status < 300, (status, answer)
    return dict(answer)


def task_error(api: Api, run_id: str, body: dict[str, Any], mailbox: str = "work") -> tuple[int, str]:
    status, answer = task_request(api, run_id, body, mailbox)
    assert status >= 400, (status, answer)
    return status, answer["error"]["code"]
