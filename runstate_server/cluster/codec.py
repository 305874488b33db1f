"""The replicated batch: msgpack `{"v": 1, "now_ms": int, "epoch": int, "commands": [command, ...]}`.

Commands are encoded one by one when proposed (so an unencodable or oversized command fails its own
caller, not its batch) and the batch is assembled from those bytes without re-encoding them.
Every replica, the leader included, applies the *decoded* batch, so all see the same values
(tuples arrive as lists everywhere).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

BATCH_VERSION = 1


class BatchFormatError(ValueError):
    """A log entry that this code cannot decode (corrupt, or written by a newer version)."""


@dataclass(frozen=True)
class Batch:
    now_ms: int
    epoch: int
    commands: list[dict[str, Any]]


def encode_command(command: dict[str, Any]) -> bytes:
    """msgpack bytes of one command; raises TypeError/ValueError if it is not msgpack-able."""
    if not isinstance(command, dict):
        raise TypeError(f"a command is a dict, not {type(command).__name__}")
    try:
        return msgpack.packb(command, use_bin_type=True)
    except OverflowError as error:  # an integer beyond 64 bits
        raise ValueError(f"a number does not fit in 64 bits: {error}") from None


def encode_batch(now_ms: int, epoch: int, encoded_commands: Sequence[bytes]) -> bytes:
    assert now_ms >= 0 and epoch >= 0
    assert encoded_commands, "an empty batch is never proposed"
    packer = msgpack.Packer(use_bin_type=True)
    head = b"".join(
        (
            packer.pack_map_header(4),
            packer.pack("v"),
            packer.pack(BATCH_VERSION),
            packer.pack("now_ms"),
            packer.pack(now_ms),
            packer.pack("epoch"),
            packer.pack(epoch),
            packer.pack("commands"),
            packer.pack_array_header(len(encoded_commands)),
        )
    )
    return head + b"".join(encoded_commands)


def decode_batch(data: bytes) -> Batch:
    try:
        batch = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as error:
        raise BatchFormatError(f"not a msgpack batch: {error}") from error
    if not isinstance(batch, dict) or batch.get("v") != BATCH_VERSION:
        version = batch.get("v") if isinstance(batch, dict) else None
        raise BatchFormatError(f"unsupported batch version {version!r}")
    now_ms, epoch, commands = batch.get("now_ms"), batch.get("epoch"), batch.get("commands")
    if not isinstance(now_ms, int) or not isinstance(epoch, int) or not isinstance(commands, list):
        raise BatchFormatError("batch fields now_ms, epoch, commands missing or mistyped")
    return Batch(now_ms=now_ms, epoch=epoch, commands=commands)
