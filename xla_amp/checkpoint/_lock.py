"""One run per checkpoint path: an exclusive lock on ``PATH.lock``.

    with CheckpointLock(path):          # CheckpointLocked if a live run holds it
        ... train, save(path, ...) ...

The lock is ``flock(LOCK_EX | LOCK_NB)`` on the lock file, which the kernel
releases when its holder exits in any way (``kill -9`` included): a lock
left by a dead process never blocks a restart. The file itself stays (the
holder's pid, host and start time, for the refusal's message); removing it
would let two processes lock two different files of one name. On NFS,
Linux maps ``flock`` to byte-range locks the server keeps; on a file system
without locks the lock is refused at once, by name.
"""
from __future__ import annotations

import errno
import fcntl
import os
import socket
import time

from xla_amp.checkpoint._errors import CheckpointError, CheckpointLocked, os_reason


def lock_path(path: str | os.PathLike) -> str:
    return os.path.abspath(os.fspath(path)) + ".lock"


class CheckpointLock:
    """Hold the lock of checkpoint `path` from ``acquire()`` (or ``with``)
    until ``release()`` or the process ends. Take it before the run's first
    write (a launcher: before training starts)."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.path.abspath(os.fspath(path))
        self._fd: int | None = None

    def acquire(self) -> "CheckpointLock":
        """Take the lock, or raise :class:`CheckpointLocked` naming the path and
        the holder (:class:`CheckpointError` for any OS failure)."""
        name = lock_path(self.path)
        try:
            os.makedirs(os.path.dirname(name), exist_ok=True)
            # read-only: an open for writing would keep the file system from
            # being remounted read-only (a test does; so may an admin)
            fd = os.open(name, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise CheckpointError(f"cannot lock checkpoint {self.path}: {os_reason(e)} "
                                  f"(lock file {name})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise CheckpointLocked(
                    f"checkpoint {self.path} is in use by another run"
                    + (f" ({holder})" if holder else "")
                    + "; give this run another --checkpoint path, or stop that run") from None
            raise CheckpointError(f"cannot lock checkpoint {self.path}: {os_reason(e)} "
                                  f"(lock file {name})") from None
        try:  # who holds it, for the next refusal's message (best effort; the
            # lock belongs to `fd`'s open file, which this other one leaves alone)
            with open(name, "w") as f:
                f.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                        f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
        except OSError:
            pass
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the lock
            self._fd = None

    def __enter__(self) -> "CheckpointLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""
