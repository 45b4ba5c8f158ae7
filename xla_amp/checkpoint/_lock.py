"""One run per checkpoint path, for every format: an exclusive lock on
``PATH.lock`` (a single file's path, or a sharded checkpoint's directory).

    with CheckpointLock(path):          # CheckpointLocked if a live run holds it
        ... train, save(path, ...) ...

The lock is ``flock(LOCK_EX | LOCK_NB)`` on the lock file, which the kernel
releases when its holder exits in any way (``kill -9`` included): a lock
left by a dead process never blocks a restart, and taking it over says so
in one line (the file still names the dead holder). The file itself stays
(the holder's pid, host and start time, for the refusal's message; emptied
on a clean release); removing it would let two processes lock two
different files of one name. A lock file that holds anything else is not
one of ours: refused, naming it, and left as it is. On NFS, Linux maps
``flock`` to byte-range locks the server keeps; on a file system without
locks the lock is refused at once, by name.

``held_here(path)``: the calling thread holds the lock through a
``CheckpointLock`` of its own, so a save inside that ``with`` does not
lock again (``hold``); any other thread or process is refused.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import socket
import threading
import time

from xla_amp.checkpoint._errors import CheckpointError, CheckpointLocked, os_reason

log = logging.getLogger("xla_amp")
# "pid 4242 on host-a, since 2026-12-01 10:00:00"
_HOLDER = re.compile(r"pid (\d+) on (\S+), since (.+)\Z")
_held: dict[str, int] = {}          # path -> ident of the thread holding it here
_held_lock = threading.Lock()


def lock_path(path: str | os.PathLike) -> str:
    return os.path.abspath(os.fspath(path)) + ".lock"


def held_here(path: str | os.PathLike) -> bool:
    """Does the calling thread hold the lock of `path` (a ``CheckpointLock``)?"""
    with _held_lock:
        return _held.get(os.path.abspath(os.fspath(path))) == threading.get_ident()


class CheckpointLock:
    """Hold the lock of checkpoint `path` from ``acquire()`` (or ``with``)
    until ``release()`` or the process ends. Take it before the run's first
    write (a launcher: before training starts)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.path.abspath(os.fspath(path))
        self._fd: int | None = None

    def _refuse(self, why: str) -> CheckpointError:
        return CheckpointError(f"cannot lock checkpoint {self.path}: {why} "
                               f"(lock file {lock_path(self.path)})")

    def acquire(self) -> "CheckpointLock":
        """Take the lock, or raise :class:`CheckpointLocked` naming the path and
        the holder (:class:`CheckpointError` for any OS failure, and for a
        lock file that is not one of ours; nothing is removed)."""
        name = lock_path(self.path)
        try:
            os.makedirs(os.path.dirname(name), exist_ok=True)
            # read-only: an open for writing would keep the file system from
            # being remounted read-only (a test does; so may an admin)
            fd = os.open(name, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise self._refuse(os_reason(e)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise CheckpointLocked(
                    f"checkpoint {self.path} is in use by another run"
                    + (f" ({holder})" if holder else "")
                    + "; give this run another path, or stop that run") from None
            raise self._refuse(os_reason(e)) from None
        try:
            before = os.pread(fd, 4096, 0).decode().strip()
        except (OSError, UnicodeDecodeError) as e:
            os.close(fd)
            why = os_reason(e) if isinstance(e, OSError) else "it is not text"
            raise self._refuse(f"its lock file cannot be read ({why}); nothing was removed"
                               ) from None
        found = _HOLDER.match(before)
        if before and not found:
            os.close(fd)
            raise self._refuse(f"its lock file is not an xla_amp lock (it holds "
                               f"{before[:60]!r}); move it away if no run uses it; "
                               "nothing was removed")
        if found and int(found.group(1)) != os.getpid():
            log.warning("checkpoint %s: took over the lock left by %s, which no longer "
                        "holds it (ended)", self.path, before)
        _write(name, f"pid {os.getpid()} on {socket.gethostname()}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
        self._fd = fd
        with _held_lock:
            _held.setdefault(self.path, threading.get_ident())
        return self

    def release(self) -> None:
        if self._fd is not None:
            _write(lock_path(self.path), "")   # a clean end: nothing to take over
            with _held_lock:
                if _held.get(self.path) == threading.get_ident():
                    del _held[self.path]
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None

    def __enter__(self) -> "CheckpointLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


@contextlib.contextmanager
def hold(path: str | os.PathLike):
    """The lock of `path` for a block (one save): taken here and released
    after, unless the calling thread holds it already (``held_here``)."""
    if held_here(path):
        yield
        return
    with CheckpointLock(path):
        yield


def _write(name: str, text: str) -> None:
    """Who holds the lock, for the next refusal's message (best effort; the
    lock belongs to the descriptor's open file, which this other one leaves
    alone)."""
    try:
        with open(name, "w") as f:
            f.write(text)
    except OSError:
        pass


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""
