"""Real runstate processes for tests: start on free 127.0.0.1 ports, wait for health, kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from chaos.cluster import free_ports

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


# The ports tests' nodes listen on come from below Linux's ephemeral range (32768-60999 by
# default), as the chaos harness's do: a port the kernel picked (bind to port 0) could be handed to
# another test's outgoing connection between the pick and the node's own bind, and the node failed
# to start ("Address already in use", seen in CI).
def free_port() -> int:
    return free_ports(1)[0]


class DevNode:
    """One `runstate dev` process. `url` is its API; the data dir survives kill() and start()."""

    def __init__(self, data_dir: Path | None, *extra_args: str) -> None:
        self.data_dir = data_dir
        self.extra_args = extra_args
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.preexec_fn: Callable[[], None] | None = None  # run in the child before it starts (e.g. setrlimit)
        self.log_path = (data_dir.parent if data_dir else Path("/tmp")) / f"node-{self.port}.log"

    def start(self) -> DevNode:
        assert self.process is None or self.process.poll() is not None, "already running"
        storage = ["--data-dir", str(self.data_dir)] if self.data_dir else ["--in-memory"]
        command = [sys.executable, "-m", "runstate_server.node.cli", "dev", "--port", str(self.port), *storage, *self.extra_args]
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        self.process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, env=os.environ.copy(), preexec_fn=self.preexec_fn
        )
        log_file.close()
        self.wait_healthy()
        return self

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"runstate dev exited with {self.process.returncode}: {self.log()}")
            try:
                if self.health_status() == "ok":
                    return
            except (OSError, urllib.error.URLError, ValueError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"runstate dev did not become healthy in {START_TIMEOUT_S} s: {self.log()}")

    def health_status(self) -> str:
        """GET /v1/health's status (a subclass may ask another way, e.g. over HTTPS)."""
        with urllib.request.urlopen(f"{self.url}/v1/health", timeout=1) as response:
            return str(json.load(response)["status"])

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """kill -9: no chance to flush or say goodbye."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(STOP_TIMEOUT_S)

    def interrupt(self) -> int:
        """Ctrl-C; returns the exit code."""
        assert self.process is not None
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()


BOOTSTRAP_KEY_FILE = "bootstrap.key"
BOOTSTRAP_KEY_WAIT_S = 10.0


def start_auth_node(data_dir: Path) -> tuple[DevNode, str]:
    """A `runstate dev --auth` node on `data_dir` and the secret of the admin key it bootstrapped
    (the node writes it to <data dir>/bootstrap.key)."""
    node = DevNode(data_dir, "--auth").start()
    return node, read_bootstrap_key(node)


def read_bootstrap_key(node: DevNode) -> str:
    assert node.data_dir is not None
    path = node.data_dir / BOOTSTRAP_KEY_FILE
    deadline = time.monotonic() + BOOTSTRAP_KEY_WAIT_S
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            assert path.stat().st_mode & 0o777 == 0o600
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"no bootstrap key in {path}: {node.log()}")
