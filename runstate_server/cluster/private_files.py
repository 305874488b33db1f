"""A node's data dir is private: the directory 0700, every file in it 0600, whatever the umask.

The journal and the dumps hold every task input in plain text, and the meta file the node's vote.
Files we create are opened with mode 0600 (and fchmod'ed: a umask can only narrow a mode, never
widen it, but an exact mode is easier to check); files pysyncobj creates itself (the journal, a
snapshot received from the leader) are narrowed right after. The directory is made 0700 first, so
no file in it is readable by anyone else even for that moment. An existing data dir created wider
(before this rule) is narrowed at start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
from pathlib import Path
from typing import BinaryIO

logger = logging.getLogger(__name__)

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


def make_private_dir(path: Path | str) -> None:
    """Create `path` (and missing parents) and make it 0700; OSError if it cannot be created."""
    os.makedirs(path, mode=PRIVATE_DIR_MODE, exist_ok=True)
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode != PRIVATE_DIR_MODE:
        try:
            os.chmod(path, PRIVATE_DIR_MODE)
        except PermissionError:  # not ours (a shared mount): say so, the node still runs
            logger.warning("the data dir %s is mode %o and cannot be made %o", path, mode, PRIVATE_DIR_MODE)


_FLAGS = {"wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND}


def open_private(path: Path | str, mode: str = "wb") -> BinaryIO:
    """open(path, mode) ("wb" or "ab") creating the file 0600; an existing one is narrowed to 0600."""
    descriptor = os.open(path, _FLAGS[mode] | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        os.fchmod(descriptor, PRIVATE_FILE_MODE)
    except OSError:
        os.close(descriptor)
        raise
    return os.fdopen(descriptor, mode)  # type: ignore[return-value]


def make_private(path: Path | str) -> None:
    """Narrow a file something else created (pysyncobj) to 0600; a missing file is left alone."""
    with contextlib.suppress(FileNotFoundError):
        os.chmod(path, PRIVATE_FILE_MODE)
