"""Writing the Raft dump in a forked child, so a large state never stalls the tick thread.

The tick thread sends the leader's heartbeats; a dump written there (copy the state, encode it,
write and fsync it: ~0.7 s for 100k tasks here) stops them for longer than the followers' election
timeout. A fork costs ~10 ms for the same state and gives the child the state after exactly the last
applied entry, copy-on-write; the child builds, encodes, writes and fsyncs the dump while the parent
goes on ticking. The child holds no file or socket of the node (it closes every inherited
descriptor, the data dir's LOCK included), dies with the thread that forked it (PR_SET_PDEATHSIG),
and never renames: the parent renames its file over the dump once it exited 0, in the tick thread,
so a dump installed from the leader meanwhile (also in the tick thread) is never overwritten by an
older one. See DESIGN.md, "Snapshots".
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import logging
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable

from runstate_server.cluster._pysyncobj import SERIALIZER_STATE
from runstate_server.cluster.snapshot import write_file

logger = logging.getLogger(__name__)

CAN_FORK = hasattr(os, "fork") and sys.platform.startswith("linux")
_PR_SET_PDEATHSIG = 1
_WRITING_SUFFIX = ".writing"
# Descriptors closed in the child where /proc/self/fd cannot be listed (the usual soft limit).
_DESCRIPTORS_WITHOUT_PROC_MAX = 1024
# The child's CPU priority below the node's: a dump may take longer, a heartbeat may not.
_CHILD_NICENESS = 10


def writing_path(dump_path: str, pid: int) -> str:
    return f"{dump_path}.{pid}{_WRITING_SUFFIX}"


def remove_leftovers(dump_path: str) -> None:
    """Files of dump children that died before finishing (the node was killed meanwhile)."""
    for leftover in glob.glob(glob.escape(dump_path) + ".*" + _WRITING_SUFFIX):
        with contextlib.suppress(OSError):
            os.remove(leftover)


class Dumper:
    """One dump at a time, for pysyncobj's serializer and serializeChecker (both in the tick thread)."""

    def __init__(self, dump_path: str, *, fsync: bool) -> None:
        self.dump_path = dump_path
        self.fsync = fsync
        self.child: tuple[int, str] | None = None  # (pid, the file it writes)
        self.started_at = 0.0
        self.finished: int | None = None  # a result check() has not reported yet

    def start(self, encode: Callable[[], bytes]) -> None:
        """Write `encode()` as the dump; `encode` reads the state, so it must run before the next
        entry is applied: in the child, it sees the memory as it was at the fork."""
        assert self.child is None and self.finished is None, "one dump at a time"
        if not CAN_FORK:
            self.finished = self._write_here(encode)
            return
        parent_pid = os.getpid()
        self.started_at = time.monotonic()
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns about fork() with threads: the child here runs only the dump
                # code below and leaves with os._exit, touching no lock another thread could hold.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:
            logger.exception("cannot fork to write the Raft dump")
            self.finished = SERIALIZER_STATE.FAILED  # pysyncobj waits for a result before the next try
            return
        if pid == 0:  # the child: never returns
            code = 1
            try:
                _close_inherited_descriptors()
                _die_with_parent(parent_pid)
                os.nice(_CHILD_NICENESS)  # the node's own threads come first for the CPU
                write_file(writing_path(self.dump_path, os.getpid()), encode(), fsync=self.fsync)
                code = 0
            except BaseException:
                with contextlib.suppress(BaseException):
                    logger.exception("the dump child failed")
            finally:
                os._exit(code)
        self.child = (pid, writing_path(self.dump_path, pid))
        logger.info("forked dump child %s in %.4f s", pid, time.monotonic() - self.started_at)

    def check(self) -> int:
        """pysyncobj's serializeChecker: SERIALIZING while the child runs; then SUCCESS (the dump is
        in place) or FAILED, reported once; NOT_SERIALIZING otherwise."""
        if self.child is not None:
            pid, path = self.child
            try:
                finished_pid, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                finished_pid, status = pid, 1
            if finished_pid == 0:
                return int(SERIALIZER_STATE.SERIALIZING)
            self.child = None
            if os.waitstatus_to_exitcode(status) == 0 and self._put_in_place(path):
                self.finished = SERIALIZER_STATE.SUCCESS
            else:
                logger.error("the dump child %s ended with status %s: no dump this time", pid, status)
                with contextlib.suppress(OSError):
                    os.remove(path)
                self.finished = SERIALIZER_STATE.FAILED
        if self.finished is not None:
            finished, self.finished = self.finished, None
            return int(finished)
        return int(SERIALIZER_STATE.NOT_SERIALIZING)

    def abort(self) -> None:
        """Kill and reap a running child and drop its file (the next check() says FAILED)."""
        if self.child is None:
            return
        pid, path = self.child
        self.child = None
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        with contextlib.suppress(OSError):
            os.remove(path)
        self.finished = SERIALIZER_STATE.FAILED

    def _write_here(self, encode: Callable[[], bytes]) -> int:
        path = writing_path(self.dump_path, os.getpid())
        try:
            write_file(path, encode(), fsync=self.fsync)
        except Exception:
            logger.exception("writing the Raft dump %s failed", path)
            return int(SERIALIZER_STATE.FAILED)
        return int(SERIALIZER_STATE.SUCCESS if self._put_in_place(path) else SERIALIZER_STATE.FAILED)

    def _put_in_place(self, path: str) -> bool:
        # The journal fsyncs the directory before it drops the entries this dump replaces.
        try:
            size = os.path.getsize(path)
            os.replace(path, self.dump_path)
        except OSError:
            logger.exception("renaming the Raft dump %s failed", path)
            return False
        logger.info("Raft dump of %d bytes in place %.3f s after it started", size, time.monotonic() - self.started_at)
        return True


def _close_inherited_descriptors() -> None:
    # Sockets (API, Raft) and the LOCK's flock would otherwise live as long as the child.
    try:
        descriptors = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        descriptors = list(range(3, _DESCRIPTORS_WITHOUT_PROC_MAX))
    for descriptor in descriptors:
        if descriptor > 2:
            with contextlib.suppress(OSError):
                os.close(descriptor)


def _die_with_parent(parent_pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the prctl
        os._exit(1)
