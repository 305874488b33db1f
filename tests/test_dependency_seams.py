"""pysyncobj's seams (runstate_server/cluster/_pysyncobj.py): every name of pysyncobj's that the
project reaches for is declared and present; a release that lacks one, or that is not the tested
one, stops a node at start with a message naming pysyncobj, its version and the name; and each
method the project overrides by its name-mangled name is really called by pysyncobj in a cluster."""

from __future__ import annotations

import asyncio
import collections
import functools
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj

from runstate_server._seams import ALLOW_UNTESTED_ENV, DependencyMismatch, Override
from runstate_server.cluster import LogConfig, _journal, _pysyncobj
from runstate_server.cluster._pysyncobj import SEAMS, TESTED_VERSIONS, check_seams
from runstate_server.cluster._raft import RaftNode
from runstate_server.cluster._transport import BoundedConnection, BoundedServer, BoundedTransport
from runstate_server.cluster.log import DUMP_FILE_NAME
from runstate_server.node.cli import DEPENDENCY_MISMATCH_EXIT
from tests._nodes import free_port
from tests.test_cluster_dump import COMPACT_AFTER
from tests.test_cluster_log import eventually, running_log, three_logs

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "runstate_server" / "cluster"
START_TIMEOUT_S = 60
# pysyncobj's private names as the project writes them: a class's name-mangled attribute.
MANGLED = re.compile(r"\b_(?:SyncObj|TcpConnection|TcpServer|FileJournal|ResizableFile|PipeNotifier|MetaStorer)__\w+")
# The project's subclasses of pysyncobj's classes: what they define over a name of their base is an override.
SUBCLASSES = (RaftNode, BoundedConnection, BoundedServer, BoundedTransport, _journal._PrivateMetaStorer)
OUR_OWN = {"__init__", "__module__", "__doc__", "__qualname__", "__annotations__", "__dict__", "__weakref__",
           "__firstlineno__", "__static_attributes__"}


def declared(kind: type | None = None) -> set[tuple[str, str]]:
    return {(seam.owner_name, seam.name) for seam in SEAMS if kind is None or isinstance(seam, kind)}


def test_every_seam_is_in_place_in_the_tested_release() -> None:
    assert [(seam.owner_name, seam.name) for seam in SEAMS if seam.problem("pysyncobj") is not None] == []
    check_seams()


def test_every_mangled_name_the_cluster_layer_writes_is_declared() -> None:
    written = {name for path in CLUSTER.glob("*.py") if path.name != "_pysyncobj.py" for name in MANGLED.findall(path.read_text())}
    names = {name for _, name in declared()}
    assert written, "the pattern finds the names the cluster layer reaches for"
    assert sorted(written - names) == []


def test_every_override_of_a_pysyncobj_method_is_declared() -> None:
    undeclared = []
    for subclass in SUBCLASSES:
        base = next(klass for klass in subclass.__mro__[1:] if klass.__module__.startswith("pysyncobj"))
        for name, value in vars(subclass).items():
            if name in OUR_OWN or not callable(value) or not hasattr(base, name):
                continue
            if not any(isinstance(seam, Override) and seam.name == name and issubclass(subclass, seam.owner)  # type: ignore[arg-type]
                       for seam in SEAMS):
                undeclared.append(f"{subclass.__name__}.{name}")
    assert undeclared == []


def test_a_missing_name_or_an_override_pysyncobj_no_longer_calls_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(SyncObj, "_SyncObj__connectedToAnyone")
    with pytest.raises(DependencyMismatch, match=r"pysyncobj 0\.3\.17 lacks .*SyncObj has no method _SyncObj__connectedToAnyone"):
        check_seams()
    monkeypatch.undo()
    # _onTick is where pysyncobj calls __connectedToAnyone (as an election would start): a release
    # whose tick no longer does would leave pre-vote's override uncalled.
    monkeypatch.setattr(SyncObj, "_onTick", lambda self, timeToWait=0.0: None)
    with pytest.raises(DependencyMismatch, match="_SyncObj__connectedToAnyone is no longer called by pysyncobj"):
        check_seams()


def test_the_journal_interface_must_not_grow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pysyncobj.Journal, "truncateTail", lambda self: None, raising=False)
    with pytest.raises(DependencyMismatch, match=r"journal interface changed .*new \['truncateTail'\]"):
        check_seams()


def start_dev_node(tmp_path: Path, prelude: str) -> subprocess.CompletedProcess[str]:
    """`runstate dev` in a process of its own, after `prelude` ran there (it breaks pysyncobj), with
    untested releases refused whatever this run's environment says."""
    env = {name: value for name, value in os.environ.items() if name != ALLOW_UNTESTED_ENV}
    code = (
        f"{prelude}\nimport runpy, sys\n"
        f"sys.argv = ['runstate', 'dev', '--port', '{free_port()}', '--data-dir', {str(tmp_path)!r}]\n"
        "runpy.run_module('runstate_server.node.cli', run_name='__main__')\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=START_TIMEOUT_S,
                          env=env, cwd=ROOT)


@pytest.mark.slow
def test_a_node_refuses_to_start_on_a_pysyncobj_without_a_name_it_reaches_for(tmp_path: Path) -> None:
    finished = start_dev_node(tmp_path, "from pysyncobj import SyncObj\ndel SyncObj._SyncObj__onMessageReceived")
    assert finished.returncode == DEPENDENCY_MISMATCH_EXIT, finished.stderr
    assert "runstate: cannot start: pysyncobj 0.3.17 lacks what runstate reaches for: " in finished.stderr
    assert "SyncObj has no method _SyncObj__onMessageReceived" in finished.stderr
    assert "Traceback" not in finished.stderr
    assert not list(tmp_path.iterdir()), "nothing was written: the node never started"


@pytest.mark.slow
def test_a_node_refuses_to_start_on_an_untested_pysyncobj_release(tmp_path: Path) -> None:
    prelude = (
        "import importlib.metadata\n_version = importlib.metadata.version\n"
        "importlib.metadata.version = lambda name: '0.3.18' if name == 'pysyncobj' else _version(name)"
    )
    finished = start_dev_node(tmp_path, prelude)
    assert finished.returncode == DEPENDENCY_MISMATCH_EXIT, finished.stderr
    assert f"pysyncobj 0.3.18 is installed; runstate was tested with pysyncobj {TESTED_VERSIONS[0]}" in finished.stderr
    assert f"set {ALLOW_UNTESTED_ENV}=1" in finished.stderr


Counts = collections.Counter[str]


def counting(counts: Counts, key: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[key] += 1
        return method(*args, **kwargs)

    return counted


def test_pysyncobj_calls_every_override_and_a_pre_vote_round_precedes_the_first_election(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three journaled in-process nodes over real sockets: each override by a name-mangled name
    (and every other declared override) is called by pysyncobj's own code as they elect, replicate,
    and see a follower go."""
    counts: Counts = collections.Counter()
    expected = []
    for subclass in SUBCLASSES:
        for seam in SEAMS:
            if isinstance(seam, Override) and issubclass(subclass, seam.owner) and seam.name in vars(subclass):  # type: ignore[arg-type]
                key = f"{subclass.__name__}.{seam.name}"
                expected.append(key)
                monkeypatch.setattr(subclass, seam.name, counting(counts, key, vars(subclass)[seam.name]))
    # The journal's meta storer is read through the method patched on pysyncobj's class.
    monkeypatch.setattr(_pysyncobj.MetaStorer, "getMeta", counting(counts, "MetaStorer.getMeta", _pysyncobj.MetaStorer.getMeta))
    expected.append("MetaStorer.getMeta")
    assert "RaftNode._SyncObj__connectedToAnyone" in expected and "BoundedConnection._TcpConnection__processRead" in expected

    async def scenario() -> None:
        async with three_logs(data_root=tmp_path) as (leader, followers):
            for index in range(5):
                await leader.propose({"type": "add", "id": index})
            raft = leader._raft
            assert raft is not None and raft.pre_vote is not None
            # This node became leader by an election, and pre-vote let it start one.
            assert raft.pre_vote.counters.rounds_won >= 1
            await followers[0].stop()  # its peers see it go
            await eventually(lambda: counts["RaftNode._SyncObj__onNodeDisconnected"] > 0)
        # A node with a dump loads it as it starts (and then the journal's membership entries).
        data_dir = tmp_path / "alone"
        address = f"127.0.0.1:{free_port()}"
        config = LogConfig(log_compaction_entries_min=COMPACT_AFTER)
        async with running_log(data_dir, config=config, self_address=address) as (log, _):
            for index in range(3 * COMPACT_AFTER):
                await log.propose({"type": "add", "id": index})
            await eventually(lambda: (data_dir / DUMP_FILE_NAME).exists())
        # With dynamic membership, the dump's configuration is applied as it loads.
        async with running_log(data_dir, config=LogConfig(dynamic_membership=True), self_address=address):
            await eventually(lambda: counts["RaftNode._SyncObj__loadDumpFile"] > 0)
            await eventually(lambda: counts["RaftNode._SyncObj__updateClusterConfiguration"] > 0)

    asyncio.run(scenario())
    assert sorted(key for key in expected if counts[key] == 0) == []


def test_asyncio_sends_a_failed_handshakes_alert_only_while_its_names_are_there(monkeypatch: pytest.MonkeyPatch) -> None:
    """node/_asyncio_tls.py replaces asyncio's SSLProtocol._do_handshake (installed as the HTTP
    server is imported); a Python whose asyncio lacks a name it calls is refused, not patched."""
    from asyncio import sslproto

    from runstate_server.node import _asyncio_tls, http_server  # importing the HTTP server installs it

    assert http_server.Site is not None
    _asyncio_tls.check_seams()
    assert sslproto.SSLProtocol._do_handshake is _asyncio_tls._do_handshake  # type: ignore[attr-defined]
    monkeypatch.delattr(sslproto.SSLProtocol, "_process_outgoing")
    with pytest.raises(DependencyMismatch, match="_process_outgoing"):
        _asyncio_tls.check_seams()
