"""The dump and batch codecs: msgpack, versioned, never pickle."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path

import msgpack
import pytest

from runstate_server.cluster.codec import BatchFormatError, decode_batch, encode_batch, encode_command
from runstate_server.cluster.snapshot import Dump, DumpFormatError, decode_dump, encode_dump, write_file

DUMP = Dump(
    state={"v": 1, "runs": {"r1": {"status": "RUNNING", "tasks": [1, 2, 3]}}, "blob": b"\x00\xff"},
    last=(b"\x00entry-2", 12, 3),
    previous=(b"\x00entry-1", 11, 3),
    cluster=["127.0.0.1:7002", "127.0.0.1:7001"],
)


def test_dump_round_trip() -> None:
    decoded = decode_dump(encode_dump(DUMP))
    assert decoded.state == DUMP.state
    assert decoded.last == DUMP.last and decoded.previous == DUMP.previous
    assert isinstance(decoded.last, tuple)  # pysyncobj compares entries as tuples
    assert sorted(decoded.cluster) == sorted(DUMP.cluster)


def test_a_dump_file_is_versioned_msgpack(tmp_path: Path) -> None:
    path = tmp_path / "raft.dump"
    write_file(str(path), encode_dump(DUMP), fsync=True)
    data = path.read_bytes()
    assert not data.startswith(b"\x1f\x8b")  # gzip, pysyncobj's default format
    assert not data.startswith(b"\x80")  # a pickle protocol header
    document = msgpack.unpackb(data, raw=False)
    assert document["v"] == 1 and document["raft"]["last"] == [b"\x00entry-2", 12, 3]


@pytest.mark.parametrize(
    "data",
    [
        pickle.dumps({"v": 1}),
        gzip.compress(pickle.dumps((None, 1, 2, 3))),
        msgpack.packb({"v": 2, "state": {}, "raft": {}}),
        msgpack.packb({"v": 1, "state": {}}),
    ],
    ids=["pickle", "pysyncobj-gzip-pickle", "newer-version", "no-raft-section"],
)
def test_foreign_dumps_are_refused(data: bytes) -> None:
    with pytest.raises(DumpFormatError):
        decode_dump(data)


def test_batch_round_trip() -> None:
    commands = [{"type": "add", "id": 1, "args": {"k": [1, 2]}}, {"type": "tick", "id": 2, "data": b"\x01"}]
    batch = decode_batch(
        encode_batch(1_700_000_000_000, 4, [encode_command(command) for command in commands])
    )
    assert (batch.now_ms, batch.epoch, batch.commands) == (1_700_000_000_000, 4, commands)
    assert msgpack.unpackb(encode_batch(5, 1, [encode_command({"a": 1})]))["v"] == 1


def test_batches_of_an_unknown_version_are_refused() -> None:
    with pytest.raises(BatchFormatError):
        decode_batch(msgpack.packb({"v": 2, "now_ms": 1, "epoch": 1, "commands": []}))
    with pytest.raises(BatchFormatError):
        decode_batch(b"\xc1")


def test_unencodable_commands_fail_at_encoding() -> None:
    with pytest.raises(TypeError):
        encode_command({"type": "add", "value": object()})
    with pytest.raises(TypeError):
        encode_command(["not", "a", "dict"])  # type: ignore[arg-type]
