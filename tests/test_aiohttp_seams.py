"""node/_aiohttp.py: every reach into aiohttp's internals is declared and checked, and a mismatch
stops a real node at start (issue 38, item 4)."""

from __future__ import annotations

import ast
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from runstate_server._seams import ALLOW_UNTESTED_ENV, DependencyMismatch, Seam
from runstate_server.node import _aiohttp, http_server
from runstate_server.node._aiohttp import RequestHandler
from tests._nodes import START_TIMEOUT_S, STOP_TIMEOUT_S, DevNode, free_port

SERVER_SOURCE = Path(http_server.__file__)
PROJECT_ROOT = SERVER_SOURCE.parents[2]
# Our subclasses of aiohttp's classes, as http_server.py names them.
SUBCLASSES = {"Connection": http_server.Connection, "LimitedServer": http_server.LimitedServer,
              "Runner": http_server.Runner, "Site": http_server.Site}
# Reached through super() but aiohttp's documented API (AppRunner(app, **kwargs), BaseSite(runner, backlog=)).
PUBLIC = frozenset({("Runner", "__init__"), ("Site", "__init__")})
UNTESTED_VERSION = "3.15.0"
REFUSAL_TIMEOUT_S = START_TIMEOUT_S  # a refusing node exits at import: far sooner
ANSWER_BYTES_MAX = 65536  # an error envelope is far smaller


# -- the declarations ----------------------------------------------------------------------------


def test_every_seam_resolves_on_the_installed_aiohttp() -> None:
    assert _aiohttp.tested(aiohttp.__version__), "the lock's aiohttp is the tested one"
    problems = {f"{seam.owner_name}.{seam.name}": seam.problem("aiohttp") for seam in _aiohttp.SEAMS}
    assert {name: problem for name, problem in problems.items() if problem is not None} == {}
    assert RequestHandler is aiohttp.web_protocol.RequestHandler
    assert _aiohttp.StreamReader is aiohttp.streams.StreamReader


@pytest.mark.parametrize(("version", "tested"), [
    ("3.14.0", True), ("3.14.5", True), ("3.14.10", True), ("3.14", True), ("3.14.0rc1", True),
    ("3.15.0", False), ("3.13.2", False), ("3.140.0", False), ("4.0.0", False),
])
def test_the_tested_releases_are_3_14_x(version: str, tested: bool) -> None:
    assert _aiohttp.tested(version) is tested


def _declared(klass: type) -> frozenset[str]:
    bases = [base for base in klass.__mro__ if base.__module__.split(".")[0] == "aiohttp"]
    return frozenset(seam.name for seam in _aiohttp.SEAMS if seam.owner in bases)


def _reaches(node: ast.ClassDef) -> tuple[set[str], set[str], set[str]]:
    """What the class's code reaches for (self.x; super().x, aiohttp's by definition), and what it
    defines itself (its body's names, its __slots__, what its __init__ assigns to self)."""
    reached: set[str] = set()
    through_super: set[str] = set()
    own: set[str] = set()
    for statement in node.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own.add(statement.name)
        elif isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name) and target.id == "__slots__":
                    own |= {element.value for element in ast.walk(statement.value) if isinstance(element, ast.Constant)}
    for function in node.body:
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for found in ast.walk(function):
            if not isinstance(found, ast.Attribute):
                continue
            value = found.value
            if isinstance(value, ast.Name) and value.id == "self":
                reached.add(found.attr)
                if function.name == "__init__" and isinstance(found.ctx, ast.Store):
                    own.add(found.attr)
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super":
                through_super.add(found.attr)
    return reached, through_super, own


def test_every_reach_of_http_server_into_aiohttp_is_declared() -> None:
    """A new self._x or super().x of aiohttp's in one of our subclasses, or an override of one of
    its methods, fails here until node/_aiohttp.py declares it (and so checks it at start)."""
    tree = ast.parse(SERVER_SOURCE.read_text())
    classes = {node.name: node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in SUBCLASSES}
    assert set(classes) == set(SUBCLASSES)
    undeclared: dict[str, list[str]] = {}
    for name, node in classes.items():
        klass = SUBCLASSES[name]
        reached, through_super, own = _reaches(node)
        from_aiohttp = (reached - own) | through_super | {
            defined for defined in own if hasattr(klass.__mro__[1], defined) and not hasattr(object, defined)
        }
        missing = sorted(
            attribute for attribute in from_aiohttp
            if attribute not in _declared(klass) and (name, attribute) not in PUBLIC
        )
        if missing:
            undeclared[name] = missing
    assert undeclared == {}


def test_no_module_but_the_seam_imports_aiohttp_internals() -> None:
    public = {"aiohttp", "aiohttp.web"}
    offenders = []
    for path in sorted((PROJECT_ROOT / "runstate_server").rglob("*.py")) + sorted((PROJECT_ROOT / "sdk").rglob("*.py")):
        if path == Path(_aiohttp.__file__):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            )
            offenders += [f"{path}: {module}" for module in modules
                          if module.split(".")[0] == "aiohttp" and module not in public]
    assert offenders == []


def test_our_subclasses_shadow_no_name_of_aiohttp() -> None:
    for klass in SUBCLASSES.values():
        assert _aiohttp.shadowed(klass) == frozenset(), klass


def test_a_name_of_ours_that_aiohttp_uses_too_is_refused() -> None:
    class Clashing(web.Server):
        def __init__(self) -> None:
            self._connections_of_ours = 0  # no clash
            self.requests_count = 0  # aiohttp's counter: a clash

    with pytest.raises(DependencyMismatch, match=r"aiohttp .*Clashing shadows requests_count"):
        _aiohttp.check_own_names(Clashing)


class _OwnCallback(RequestHandler):
    def data_received(self, data: bytes) -> None:  # stands for a callback aiohttp no longer defines
        super().data_received(data)


@pytest.mark.parametrize(("seam", "problem"), [
    (_aiohttp.Signature(web.Server, "__call__", "test", ("extra",)), r"Server\.__call__ takes \(\), not \(extra\)"),
    (_aiohttp.Signature(RequestHandler, "__init__", "test", ("gone",), exact=False), r"RequestHandler\.__init__ takes no gone"),
    (_aiohttp.Signature(RequestHandler, "no_such_callback", "test"), r"RequestHandler has no method no_such_callback"),
    (_aiohttp.Signature(_OwnCallback, "data_received", "test", ("data",)), r"data_received is no longer aiohttp's own"),
    (_aiohttp.CalledBy(web.BaseRunner, "cleanup", "test", called="start"), r"BaseRunner\.cleanup no longer calls start"),
])
def test_the_extra_seam_kinds_name_what_changed(seam: Seam, problem: str) -> None:
    found = seam.problem("aiohttp")
    assert found is not None and re.search(problem, found), found


# -- real nodes ----------------------------------------------------------------------------------


def _child(prelude: str, port: int, data_dir: Path) -> str:
    """Python for a child process: `prelude` (it changes aiohttp, or how its version reads), then
    `runstate dev` as its console script runs it."""
    argv = ["runstate", "dev", "--port", str(port), "--data-dir", str(data_dir)]
    return "\n".join([
        "import runpy, sys",
        prelude,
        f"sys.argv = {argv!r}",
        "runpy.run_module('runstate_server.node.cli', run_name='__main__')",
    ])


def _reports_version(version: str) -> str:
    return "\n".join([
        "import importlib.metadata",
        "_real_version = importlib.metadata.version",
        f"importlib.metadata.version = lambda name: {version!r} if name == 'aiohttp' else _real_version(name)",
    ])


def _environment(**extra: str) -> dict[str, str]:
    environment = {name: value for name, value in os.environ.items() if name != ALLOW_UNTESTED_ENV}
    return {**environment, "PYTHONPATH": str(PROJECT_ROOT), **extra}


def _refused(code: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=REFUSAL_TIMEOUT_S,
            env=_environment(), cwd=PROJECT_ROOT,
        )
    except subprocess.TimeoutExpired as error:  # run() killed it: it served instead of refusing
        raise AssertionError(f"the node did not refuse to start: {error.stderr!r}") from error


def _serves(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _assert_refused(finished: subprocess.CompletedProcess[str], port: int, *expected: str) -> None:
    assert finished.returncode != 0, finished.stderr
    assert "runstate:" in finished.stderr, finished.stderr
    for text in expected:
        assert text in finished.stderr, (text, finished.stderr)
    assert "listening on" not in finished.stdout
    assert not _serves(port)


@pytest.mark.parametrize("removed", ["finish_response", "data_received"])
def test_a_node_refuses_to_start_when_aiohttp_lacks_a_method_we_override(tmp_path: Path, removed: str) -> None:
    """finish_response: gone from aiohttp altogether; data_received: aiohttp's own gone, so only
    asyncio.Protocol's no-op would be left for super() to reach."""
    port = free_port()
    prelude = f"import aiohttp.web_protocol\ndel aiohttp.web_protocol.RequestHandler.{removed}"
    finished = _refused(_child(prelude, port, tmp_path / "data"))
    _assert_refused(finished, port, f"aiohttp {aiohttp.__version__}", "RequestHandler", removed, "node/http_server.py")


def test_a_node_refuses_to_start_on_an_untested_aiohttp(tmp_path: Path) -> None:
    port = free_port()
    finished = _refused(_child(_reports_version(UNTESTED_VERSION), port, tmp_path / "data"))
    _assert_refused(finished, port, f"aiohttp {UNTESTED_VERSION}", _aiohttp.TESTED_TEXT, ALLOW_UNTESTED_ENV)


def _start(prelude: str, tmp_path: Path, **environment: str) -> DevNode:
    """A dev node run by `_child(prelude)`, answering /v1/health (its log in node.log())."""
    node = DevNode(tmp_path / "data")
    assert node.data_dir is not None
    code = _child(prelude, node.port, node.data_dir)
    with node.log_path.open("ab") as log:
        node.process = subprocess.Popen(
            [sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT, env=_environment(**environment),
            cwd=PROJECT_ROOT,
        )
    try:
        node.wait_healthy()
    except RuntimeError:
        node.stop()
        raise
    return node


def _stopped(node: DevNode) -> int:
    """Stop it as an operator would (SIGTERM); its exit code."""
    node.stop()
    assert node.process is not None
    return node.process.returncode


def test_with_the_override_an_untested_aiohttp_starts_and_warns(tmp_path: Path) -> None:
    node = _start(_reports_version(UNTESTED_VERSION), tmp_path, **{ALLOW_UNTESTED_ENV: "1"})
    assert _stopped(node) == 0
    assert f"aiohttp {UNTESTED_VERSION} is installed" in node.log()


# Each override, as aiohttp (or asyncio for aiohttp's protocol) calls it: the child notes the
# first call of each in a file. The notes wrap our real methods; nothing is replaced.
OVERRIDES = {
    "Connection": ("connection_made", "connection_lost", "data_received", "finish_response", "handle_error"),
    "LimitedServer": ("__call__",),
    "Runner": ("_make_server",),
    "Site": ("start", "stop"),
}
_NOTE_CALLS = """
import functools, inspect
from runstate_server.node import http_server

def _note(klass, name, path):
    original = vars(klass)[name]
    label = f"{{klass.__name__}}.{{name}}"
    noted = []

    def note():
        if not noted:
            noted.append(True)
            with open(path, "a") as calls:
                calls.write(label + "\\n")

    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def wrapper(*args, **kwargs):
            note()
            return await original(*args, **kwargs)
    else:
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            note()
            return original(*args, **kwargs)
    setattr(klass, name, wrapper)

for _class, _names in {overrides!r}.items():
    for _name in _names:
        _note(getattr(http_server, _class), _name, {path!r})
"""


def test_aiohttp_calls_each_override_of_ours(tmp_path: Path) -> None:
    calls_path = tmp_path / "calls"
    node = _start(_NOTE_CALLS.format(overrides=OVERRIDES, path=str(calls_path)), tmp_path)
    try:
        with socket.create_connection(("127.0.0.1", node.port), timeout=STOP_TIMEOUT_S) as client:
            client.sendall(b"GET /v1/health HTTP/1.1\r\nNo colon here\r\n\r\n")  # handle_error's 400
            answer = client.recv(ANSWER_BYTES_MAX)
        assert answer.split(b" ")[1] == b"400" and b"VALIDATION_FAILED" in answer, answer
    finally:
        assert _stopped(node) == 0
    called = set(calls_path.read_text().split())
    assert called == {f"{klass}.{name}" for klass, names in OVERRIDES.items() for name in names}
