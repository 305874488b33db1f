"""A node's data dir is private (cluster/private_files.py): the directory 0700 and every file in it
0600, whatever the umask of the process that started the node. The journal and the dumps hold
every task input in plain text."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from runstate_server.cluster.private_files import make_private_dir
from tests._http import Api
from tests._nodes import DevNode

DUMP_TIMEOUT_S = 30.0
WRITES = 30  # beyond --compact-after: the node writes a dump too


def modes(root: Path) -> Iterator[tuple[Path, int]]:
    """Every directory and file under `root` (root included) with its permission bits."""
    yield root, stat.S_IMODE(root.stat().st_mode)
    for path in sorted(root.rglob("*")):
        yield path, stat.S_IMODE(path.lstat().st_mode)


def test_a_node_started_under_a_permissive_umask_keeps_its_data_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"  # does not exist yet: the node creates it
    node = DevNode(data_dir, "--compact-after", "10")
    old_umask = os.umask(0)  # inherited by the node: files would be 0666, directories 0777
    try:
        node.start()
    finally:
        os.umask(old_umask)
    try:
        api = Api(node.url)
        for index in range(WRITES):
            api.ok("POST", "/v1/scopes", {"name": f"secret-input-{index}"})
        deadline = time.monotonic() + DUMP_TIMEOUT_S
        while not (data_dir / "raft.dump").exists():
            assert time.monotonic() < deadline, f"no dump written: {sorted(os.listdir(data_dir))}\n{node.log()}"
            time.sleep(0.05)
        assert node.interrupt() == 0  # the journal and meta are written out at exit too
    finally:
        node.stop()
    seen = dict(modes(data_dir))
    names = {path.name for path in seen}
    assert {"LOCK", "raft.journal", "raft.journal.meta", "raft.dump"} <= names, names
    wrong = {
        str(path): oct(mode) for path, mode in seen.items()
        if mode != (0o700 if path.is_dir() else 0o600)
    }
    assert wrong == {}, wrong


def test_an_existing_data_dir_made_wider_is_narrowed(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    make_private_dir(data_dir)
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
