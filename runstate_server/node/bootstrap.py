"""The first admin key of a node that requires keys.

When the state has no operator space yet (the first start of a cluster, or of `runstate dev
--auth`), the leader creates the operator space (`default`) and an admin key in it. The key's
secret is the configured one (RUNSTATE_BOOTSTRAP_KEY or --bootstrap-key-file), else one generated
into DATA_DIR/bootstrap.key (mode 0600) before it is proposed, so a crash in between cannot leave a
committed key whose secret nobody has. Only the first bootstrap in the log applies; a leader that
loses that race removes the file it wrote. A node kept in memory prints a generated key once.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runstate_server.cluster.snapshot import fsync_directory
from runstate_server.node.config import BOOTSTRAP_KEY_ENV, BOOTSTRAP_KEY_FILE_NAME, NodeConfig
from runstate_server.node.keys import key_hash, new_key_id, new_key_secret

if TYPE_CHECKING:
    from runstate_server.node.server import Node

log = logging.getLogger(__name__)

BOOTSTRAP_KEY_NAME = "bootstrap admin"


@dataclass(frozen=True)
class _Secret:
    value: str
    path: Path | None  # the file holding it, if any
    written: bool  # this call created that file (or generated an in-memory key)


def _secret(config: NodeConfig) -> _Secret:
    if config.bootstrap_key is not None:
        return _Secret(config.bootstrap_key, None, written=False)
    if config.data_dir is None:
        return _Secret(new_key_secret(), None, written=True)
    path = config.data_dir / BOOTSTRAP_KEY_FILE_NAME
    if path.exists():  # written by an earlier start whose bootstrap did not commit
        return _Secret(path.read_text().strip(), path, written=False)
    value = new_key_secret()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(value + "\n")
        file.flush()
        os.fsync(file.fileno())
    fsync_directory(str(config.data_dir))
    return _Secret(value, path, written=True)


async def bootstrap(node: Node) -> str | None:
    """Create the operator space and its first admin key unless the state has them. Returns what
    to tell the user (None when there was nothing to do). Raises ApiError when the log refuses."""
    with node.read() as state:
        if state.operator_space is not None:
            return None
    secret = _secret(node.config)
    space = node.config.default_space
    args = {"space_id": space, "key_id": new_key_id(), "key_hash": key_hash(secret.value), "name": BOOTSTRAP_KEY_NAME}
    result = await node.propose_system("access.bootstrap", args)
    if not result["bootstrapped"]:
        if secret.written and secret.path is not None:
            with contextlib.suppress(FileNotFoundError):
                secret.path.unlink()  # another leader's bootstrap won: this key was never valid
        return None
    if secret.path is not None:
        where = f"in {secret.path} (mode 0600):\n  export RUNSTATE_API_KEY=$(cat {secret.path})"
    elif secret.written:
        where = f"shown once (this node keeps nothing on disk):\n  export RUNSTATE_API_KEY={secret.value}"
    else:
        where = f"from {BOOTSTRAP_KEY_ENV} or --bootstrap-key-file"
    message = f"runstate: created space {space!r} and its first admin key, {where}"
    log.info("created space %r and its first admin key", space)
    return message
