"""The API's HTTP server (node/http_server.py) against real nodes, over raw sockets: what a client
can hold (connections, idle time, a slow head or body) is bounded, and every answer aiohttp gives
on its own is the JSON error envelope."""

from __future__ import annotations

import json
import logging
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runstate_server.node.config import HttpLimits
from runstate_server.node.http_server import LogRateLimit, connections_max_for
from tests._http import Api
from tests._nodes import DevNode

ANSWER_TIMEOUT_S = 15.0  # far above every deadline the nodes here are given
RUNS_PATH = "/v1/spaces/default/scopes"  # a route that reads a JSON body


def answer_of(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of the answer on `sock`, read until the node closes it."""
    sock.settimeout(ANSWER_TIMEOUT_S)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    assert data, "the node closed the connection without an answer"
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in header_lines)}
    return int(status_line.split()[1]), headers, body


def assert_envelope(headers: dict[str, str], body: bytes, code: str) -> dict[str, str]:
    assert headers["content-type"].startswith("application/json"), headers
    error = json.loads(body)["error"]
    assert set(error) == {"code", "message", "requestId"} and error["code"] == code, error
    assert error["requestId"] == headers["x-request-id"]
    return dict(error)


def connect(node: DevNode) -> socket.socket:
    return socket.create_connection(("127.0.0.1", node.port), timeout=ANSWER_TIMEOUT_S)


def send(node: DevNode, data: bytes) -> tuple[int, dict[str, str], bytes]:
    with connect(node) as sock:
        sock.sendall(data)
        return answer_of(sock)


def start_body(node: DevNode, body_bytes: int = 100) -> socket.socket:
    """A POST whose head the node has taken (it answered `100 Continue`), with half its body sent."""
    sock = connect(node)
    sock.sendall(
        f"POST {RUNS_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {body_bytes}\r\nExpect: 100-continue\r\n\r\n".encode()
    )
    assert sock.recv(64).startswith(b"HTTP/1.1 100"), "the node did not take the request"
    sock.sendall(b" " * (body_bytes // 2))
    return sock


def get_health(node: DevNode) -> tuple[int, dict[str, str], bytes]:
    return send(node, b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevNode]:
    """A node with short deadlines (idle 3 s, head 1 s, body 1 s, send 1 s), logging at debug."""
    started = DevNode(
        None, "--http-idle-timeout", "3s", "--http-header-timeout", "1s", "--http-body-timeout", "1s",
        "--http-send-timeout", "1s", "--log-level", "DEBUG",
    )
    started.log_path = tmp_path_factory.mktemp("http-node") / "node.log"
    try:
        yield started.start()
    finally:
        started.stop()


# -- aiohttp's own answers: the JSON envelope (issue 13, finding 9) ------------------------------

MALFORMED = {
    "bad content-length": b"POST /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n",
    "two content-lengths": b"POST /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    "nul in the path": b"GET /v1/he\x00alth HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "request line too long": b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "header too long": b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: " + b"a" * 10_000 + b"\r\n\r\n",
    "too many headers": b"GET /v1/health HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
    "invalid method": b"G(T /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
    "http/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "bad chunk size": b"POST /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
}


@pytest.mark.parametrize("request_bytes", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_request_is_answered_with_the_error_envelope(node: DevNode, request_bytes: bytes) -> None:
    status, headers, body = send(node, request_bytes)
    assert status == 400
    assert assert_envelope(headers, body, "VALIDATION_FAILED")["message"].startswith("malformed HTTP request: ")


def test_clients_that_go_away_mid_body_log_no_error(node: DevNode) -> None:
    """100 clients closing mid-body logged 101 ERROR tracebacks; a client going away is not an error."""
    gone = 50
    for _ in range(gone):
        start_body(node).close()
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while time.monotonic() < deadline:
        log_text = Path(node.log_path).read_text(errors="replace")
        assert " ERROR " not in log_text and "Traceback" not in log_text, log_text[-3000:]
        if log_text.count("client went away during POST") >= gone:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the node did not see the {gone} clients go: {node.log()}")
    assert get_health(node)[0] == 200


# -- deadlines (issue 13, finding 2) ------------------------------------------------------------


def test_a_request_head_that_stops_half_way_is_answered_408_and_closed(node: DevNode) -> None:
    status, headers, body = send(node, b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
    assert status == 408
    assert "headers" in assert_envelope(headers, body, "REQUEST_TIMEOUT")["message"]
    assert headers["connection"] == "close"


def test_a_body_shorter_than_its_content_length_is_answered_408_and_closed(node: DevNode) -> None:
    status, headers, body = send(
        node, f"POST {RUNS_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n".encode()
        + b'{"a": 1234'
    )
    assert status == 408
    assert "body" in assert_envelope(headers, body, "REQUEST_TIMEOUT")["message"]


BIG_INPUT_CHARS = 60_000  # a task input just under the 64 KB bound
BIG_TASKS = 150  # their list is about 9 MB: more than the kernel's socket buffers take (4 MB)


def test_an_answer_its_client_does_not_take_is_dropped(node: DevNode) -> None:
    """A client that asks for a large answer and never reads kept what the kernel could not take
    in the node's memory, and a close of the connection waited for it. The node drops it after
    the send deadline: what the client reads afterwards is cut short."""
    api = Api(node.url)
    run_id = api.ok("POST", "/v1/scopes", {})["id"]
    mailbox = api.ok("PUT", "/v1/mailboxes/by-name/big", {})["id"]
    tasks = [{"scopeId": run_id, "mailboxId": mailbox, "input": f"{n:06d}" + "x" * BIG_INPUT_CHARS} for n in range(BIG_TASKS)]
    for start in range(0, BIG_TASKS, 4):  # a body is at most 256 KiB
        api.ok("POST", "/v1/tasks/batch", {"tasks": tasks[start:start + 4]})
    request = f"GET /v1/spaces/default/mailboxes/{mailbox}/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    # (The whole answer holds every input: more than BIG_TASKS * BIG_INPUT_CHARS bytes. It is not
    # read here for reference: a test process descheduled for the send deadline would see it cut.)
    dropped_before = Path(node.log_path).read_text(errors="replace").count("was not taken within")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(ANSWER_TIMEOUT_S)
        sock.connect(("127.0.0.1", node.port))
        sock.sendall(request.encode())
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while Path(node.log_path).read_text(errors="replace").count("was not taken within") == dropped_before:
            assert time.monotonic() < deadline, f"the node kept the unread answer: {node.log()}"
            time.sleep(0.1)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass  # dropped: what was unsent is gone
    assert len(received) < BIG_TASKS * BIG_INPUT_CHARS, len(received)
    assert get_health(node)[0] == 200


def test_an_idle_connection_is_closed(node: DevNode) -> None:
    with connect(node) as sock:
        sock.settimeout(ANSWER_TIMEOUT_S)
        assert sock.recv(1) == b""  # closed by the node, unanswered: it asked nothing


# -- the connection cap, under a low file-descriptor limit (issue 13, finding 2) -----------------

NODE_FD_SOFT_LIMIT = 200
NODE_FD_HARD_LIMIT = 256
CONNECTIONS_MAX = 4


@pytest.fixture(scope="module")
def capped_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevNode]:
    """A node that may open 200 files (256 once it raises its soft limit) and serves 4 connections."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < NODE_FD_HARD_LIMIT:
        pytest.skip("the test process may not open 256 files")
    started = DevNode(None, "--http-connections-max", str(CONNECTIONS_MAX))
    started.log_path = tmp_path_factory.mktemp("capped-node") / "node.log"
    started.preexec_fn = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (NODE_FD_SOFT_LIMIT, NODE_FD_HARD_LIMIT))
    try:
        yield started.start()
    finally:
        started.stop()


def test_the_node_raises_its_open_file_limit_to_the_hard_limit(capped_node: DevNode) -> None:
    assert capped_node.process is not None
    limits = Path(f"/proc/{capped_node.process.pid}/limits")
    if not limits.exists():
        pytest.skip("no /proc")
    line = next(line for line in limits.read_text().splitlines() if line.startswith("Max open files"))
    assert line.split()[3:5] == [str(NODE_FD_HARD_LIMIT), str(NODE_FD_HARD_LIMIT)], line


def test_idle_connections_past_the_cap_do_not_shut_other_clients_out(capped_node: DevNode) -> None:
    """1,100 idle connections under a 1,024-file limit made every other client time out."""
    log_bytes_before = Path(capped_node.log_path).stat().st_size
    idle = [connect(capped_node) for _ in range(NODE_FD_HARD_LIMIT + 50)]  # more than the node can open
    try:
        for _ in range(3):
            status, _, body = get_health(capped_node)
            assert status == 200, body
    finally:
        for sock in idle:
            sock.close()
    assert get_health(capped_node)[0] == 200
    assert Path(capped_node.log_path).stat().st_size - log_bytes_before < 4096, capped_node.log()


def test_past_the_cap_with_every_connection_busy_a_client_is_answered_503(capped_node: DevNode) -> None:
    busy = [start_body(capped_node) for _ in range(CONNECTIONS_MAX)]  # each in the middle of a request
    try:
        status, headers, body = get_health(capped_node)
        assert status == 503
        assert_envelope(headers, body, "UNAVAILABLE")
        assert int(headers["retry-after"]) >= 1
    finally:
        for sock in busy:
            sock.close()
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while get_health(capped_node)[0] != 200:  # once the node has seen them go
        assert time.monotonic() < deadline, capped_node.log()
        time.sleep(0.05)


# -- pieces -----------------------------------------------------------------------------------


def test_the_connection_cap_is_at_most_half_the_open_file_limit() -> None:
    assert connections_max_for(HttpLimits(connections_max=10_000), 1_024) == 512
    assert connections_max_for(HttpLimits(connections_max=100), 1_024) == 100
    assert connections_max_for(HttpLimits(connections_max=100), resource.RLIM_INFINITY) == 100


def test_the_log_rate_limit_lets_a_few_through_then_counts_the_rest() -> None:
    now = [0.0]
    limit = LogRateLimit(records_max=2, window_s=10, clock=lambda: now[0])

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, msg, None, None)

    assert [limit.filter(record("accept failed")) for _ in range(5)] == [True, True, False, False, False]
    assert limit.filter(record("another message"))  # counted apart
    now[0] = 10.0
    later = record("accept failed")
    assert limit.filter(later) and "3 more like this dropped" in later.getMessage()
