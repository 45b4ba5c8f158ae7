"""Writing a checkpoint file so that no crash, full disk or second writer
can leave a torn one at its path.

Algorithm of :func:`write_atomic` (``path`` = DIR/NAME)::

    tmp = a new file DIR/.NAME.<random>.tmp      unique per writer (mkstemp)
    write(tmp); flush; fsync(tmp)                the bytes are on disk
    fsync(DIR)                                   tmp's entry is on disk
    keep > 1: NAME.(k-1) <- ... <- NAME.1 <- NAME (a hard link)
    rename(tmp, NAME); fsync(DIR)                the switch is on disk
    any OSError: remove tmp, raise CheckpointError(one line: path, reason)

A reader sees the old file or the new one, never a part; a process killed
at any point leaves at most its own ``.NAME.*.tmp`` (removed by the next
run that takes the path's lock, :func:`remove_stale_temporaries`).
"""
from __future__ import annotations

import errno
import io
import os
import tempfile
from typing import BinaryIO, Callable

from xla_amp.checkpoint._errors import CheckpointError, os_reason


class _RecordingWriter(io.RawIOBase):
    """A file wrapper that remembers the first OSError of a write: torch.save
    turns it into a RuntimeError from C++ ("enforce fail ...")."""

    def __init__(self, f: BinaryIO):
        super().__init__()
        self._f = f
        self.error: OSError | None = None

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        try:
            return self._f.write(b)
        except OSError as e:
            self.error = self.error or e
            raise


def fsync_dir(directory: str) -> None:
    """Make `directory`'s entries durable (a no-op where the file system
    cannot sync a directory)."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as e:  # some file systems cannot sync a directory
        if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temp_prefix(path: str) -> str:
    return "." + os.path.basename(path) + "."


def older(path: str, k: int) -> str:
    """The name of the k-th older checkpoint kept beside `path` (k >= 1)."""
    return f"{path}.{k}"


def set_aside(path: str, reason: str = "damaged") -> str:
    """Rename `path` to the first free name of ``PATH.damaged``,
    ``PATH.damaged.2``, ... (out of the rotation's way: older versions are
    ``PATH.<k>``), fsync the directory and return the new name. Call it
    holding the path's lock. :class:`CheckpointError` on an OS failure."""
    path = os.path.abspath(os.fspath(path))
    target, n = f"{path}.{reason}", 1
    while os.path.lexists(target):
        n += 1
        target = f"{path}.{reason}.{n}"
    try:
        os.rename(path, target)
        fsync_dir(os.path.dirname(path))
    except OSError as e:
        raise CheckpointError(f"cannot move checkpoint {path} aside to {target}: "
                              f"{os_reason(e)}") from None
    return target


def _rotate(path: str, keep: int) -> None:
    """Shift the kept older checkpoints one place down and link the current
    one as the first of them (a hard link: no copy, and `path` stays)."""
    if keep <= 1 or not os.path.exists(path):
        return
    for k in range(keep - 2, 0, -1):
        if os.path.exists(older(path, k)):
            os.replace(older(path, k), older(path, k + 1))
    first = older(path, 1)
    if os.path.exists(first):
        os.remove(first)
    link_or_copy(path, first)


def link_or_copy(source: str, target: str) -> None:
    """`target` as a hard link to `source`: no copy, and `source` stays; a
    copy where the file system has no hard links (object-store mounts)."""
    try:
        os.link(source, target)
    except OSError as e:
        if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        import shutil
        shutil.copy2(source, target)


def write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], None], *,
                 keep: int = 1) -> None:
    """Write the file `path` through ``write(file)`` atomically (module
    docstring); keep the ``keep - 1`` previous versions as ``path.1``,
    ``path.2``, ... An OSError on the way raises :class:`CheckpointError`
    naming `path` and the reason; the temporary file is gone and `path`
    holds what it held before."""
    path = os.path.abspath(os.fspath(path))
    directory = os.path.dirname(path)
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path), suffix=".tmp", dir=directory)
        os.fchmod(fd, 0o666 & ~_umask())   # as open() would make it, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            recorder = _RecordingWriter(f)
            try:
                write(recorder)
            except Exception:
                if recorder.error is not None:
                    raise recorder.error from None
                raise
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(directory)
        _rotate(path, keep)
        os.replace(tmp, path)
        tmp = None
        fsync_dir(directory)
    except OSError as e:
        raise CheckpointError(f"cannot write checkpoint {path}: {os_reason(e)}") from None
    finally:
        if tmp is not None:
            try:
                os.remove(tmp)
            except OSError:
                pass


def write_json(file: str | os.PathLike, data) -> None:
    """`data` as JSON in `file`, through :func:`write_atomic` (temporary file,
    fsync, rename, directory fsync). Every JSON file of a sharded
    checkpoint is written so."""
    import json
    text = json.dumps(data, indent=1) + "\n"
    write_atomic(file, lambda f: f.write(text.encode()))


def remove_stale_temporaries(path: str | os.PathLike) -> list[str]:
    """Remove the temporary files that writers of `path` left when they were
    killed; call only while holding the path's lock (then no live writer
    owns one). Returns the names removed."""
    path = os.path.abspath(os.fspath(path))
    directory, prefix = os.path.dirname(path), temp_prefix(path)
    removed = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return removed
    for name in names:
        if name.startswith(prefix) and name.endswith(".tmp"):
            try:
                os.remove(os.path.join(directory, name))
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed
