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


def writing_path(dump_path: str, name: str) -> str:
    return f"{dump_path}.{name}{_WRITING_SUFFIX}"


def remove_leftovers(dump_path: str) -> None:
    """Files of dump children that died before finishing (the node was killed meanwhile)."""
    for leftover in glob.glob(glob.escape(dump_path) + ".*" + _WRITING_SUFFIX):
        with contextlib.suppress(OSError):
            os.remove(leftover)


class ForkedWrite:
    """`produce()` written to `path` by a forked child, which sees the memory as it was at the fork
    (copy-on-write): a consistent copy of a large state for the cost of a fork. The child closes
    every inherited descriptor, dies with its parent, runs at a lower CPU priority, and never
    renames; `poll` reaps it. For the dump (Dumper) and any other copy of the state made the same
    way (a backup, a digest): call `start` where the state is still, between two applies."""

    def __init__(self, path: str, produce: Callable[[], bytes], *, fsync: bool, what: str) -> None:
        self.path = path
        self.what = what  # for the log: "the Raft dump", "a backup", ...
        self.started_at = time.monotonic()
        self.pid: int | None = None
        self.done: bool | None = None  # None while the child runs; then whether the file is complete
        if not CAN_FORK:
            self.done = self._write_here(produce, fsync)
            return
        parent_pid = os.getpid()
        with warnings.catch_warnings():
            # Python 3.12+ warns about fork() with threads: the child here runs only the code below
            # and leaves with os._exit, touching no lock another thread could hold.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()  # OSError to the caller
        if pid == 0:  # the child: never returns
            code = 1
            try:
                _close_inherited_descriptors()
                _die_with_parent(parent_pid)
                os.nice(_CHILD_NICENESS)  # the node's own threads come first for the CPU
                write_file(path, produce(), fsync=fsync)
                code = 0
            except BaseException:
                with contextlib.suppress(BaseException):
                    logger.exception("the child writing %s failed", what)
            finally:
                os._exit(code)
        self.pid = pid
        logger.info("forked child %s for %s in %.4f s", pid, what, time.monotonic() - self.started_at)

    def poll(self) -> bool | None:
        """None while the child runs; then True once the file is complete, or False (the file is
        removed, the failure logged)."""
        if self.done is None and self.pid is not None:
            try:
                finished_pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                finished_pid, status = self.pid, 1
            if finished_pid == 0:
                return None
            self.done = os.waitstatus_to_exitcode(status) == 0
            if not self.done:
                logger.error("the child %s writing %s ended with status %s", self.pid, self.what, status)
                with contextlib.suppress(OSError):
                    os.remove(self.path)
        return self.done

    def abort(self) -> None:
        """Kill and reap a running child and drop its file."""
        if self.done is None and self.pid is not None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
        self.done = False
        with contextlib.suppress(OSError):
            os.remove(self.path)

    def _write_here(self, produce: Callable[[], bytes], fsync: bool) -> bool:
        try:
            write_file(self.path, produce(), fsync=fsync)
        except Exception:
            logger.exception("writing %s to %s failed", self.what, self.path)
            with contextlib.suppress(OSError):
                os.remove(self.path)
            return False
        return True


class Dumper:
    """One dump at a time, for pysyncobj's serializer and serializeChecker (both in the tick thread)."""

    def __init__(self, dump_path: str, *, fsync: bool) -> None:
        self.dump_path = dump_path
        self.fsync = fsync
        self.child: ForkedWrite | None = None
        self.finished: int | None = None  # a result check() has not reported yet
        self._started = 0  # dumps started: with the pid, names each one's file

    def start(self, encode: Callable[[], bytes]) -> None:
        """Write `encode()` as the dump; `encode` reads the state, so it must run before the next
        entry is applied: in the child, it sees the memory as it was at the fork."""
        assert self.child is None and self.finished is None, "one dump at a time"
        self._started += 1
        path = writing_path(self.dump_path, f"{os.getpid()}-{self._started}")  # remove_leftovers finds it
        try:
            self.child = ForkedWrite(path, encode, fsync=self.fsync, what="the Raft dump")
        except OSError:
            logger.exception("cannot fork to write the Raft dump")
            self.finished = SERIALIZER_STATE.FAILED  # pysyncobj waits for a result before the next try
            return

    def check(self) -> int:
        """pysyncobj's serializeChecker: SERIALIZING while the child runs; then SUCCESS (the dump is
        in place) or FAILED, reported once; NOT_SERIALIZING otherwise."""
        child = self.child
        if child is not None:
            done = child.poll()
            if done is None:
                return int(SERIALIZER_STATE.SERIALIZING)
            self.child = None
            self.finished = SERIALIZER_STATE.SUCCESS if done and self._put_in_place(child) else SERIALIZER_STATE.FAILED
        if self.finished is not None:
            finished, self.finished = self.finished, None
            return int(finished)
        return int(SERIALIZER_STATE.NOT_SERIALIZING)

    def abort(self) -> None:
        """Kill and reap a running child and drop its file (the next check() says FAILED)."""
        if self.child is None:
            return
        self.child.abort()
        self.child = None
        self.finished = SERIALIZER_STATE.FAILED

    def _put_in_place(self, child: ForkedWrite) -> bool:
        # The journal fsyncs the directory before it drops the entries this dump replaces.
        try:
            size = os.path.getsize(child.path)
            os.replace(child.path, self.dump_path)
        except OSError:
            logger.exception("renaming the Raft dump %s failed", child.path)
            with contextlib.suppress(OSError):
                os.remove(child.path)
            return False
        logger.info("Raft dump of %d bytes in place %.3f s after it started", size, time.monotonic() - child.started_at)
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
