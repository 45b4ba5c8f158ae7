"""Where the sharded checkpoints of one path live, and how a new one is
published in one atomic step.

    PATH/
      xla_amp_sharded_versions.json   {"format": "xla_amp.sharded versions",
                                       "versions": ["v000007", "v000006"]}   newest first
      v000007/     the current checkpoint: .metadata, __0_0.distcp, ...,
                   __0_checksums.json, xla_amp_sharded.json
      v000006/     an older one, kept by keep=2

Each version directory is a whole DCP checkpoint and loads by its own path
too. A save (:func:`begin`, DCP, :func:`publish`; the coordinator does
both ends, every process writes its own files in between)::

    begin     remove what no manifest names (a killed save's directory,
              versions rotated out, a pre-version checkpoint's files once a
              manifest exists, the manifest's temporary files); the next
              number; an empty PATH/v<N>
    write     every process its data files and checksums into v<N>; the
              coordinator .metadata, then the record (its write fsyncs v<N>)
    publish   the manifest, naming v<N> and the keep - 1 versions before it:
              a temporary file, fsync, rename over the old one, fsync PATH
              -- the one step that switches; then begin's clean-up again

Killed before the rename, the old manifest names the old versions, all of
them whole; after it, the new one is whole. A directory holding
``.metadata`` itself and no manifest is a checkpoint from before versions:
``load`` reads it as it is, and the first save over it publishes beside
it, then removes its files (``keep > 1``: hard-links them into ``v000000``
first, which the manifest then names as the older version).

One save at a time per path: a save holds the path's lock (_lock) from
``begin`` to ``publish``, so the clean-up never meets another save's
directory. A load holds what it reads (:func:`reading`): a shared
``flock`` on the version directory (on `path` itself for a checkpoint
from before versions), taken, then checked to be still published; the
clean-up removes a directory only under an exclusive ``flock`` of it, and
leaves one being read to a later save.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
import time

from xla_amp.checkpoint._errors import CheckpointError
from xla_amp.checkpoint._files import fsync_dir, link_or_copy, remove_stale_temporaries, write_json
from xla_amp.checkpoint._record import FILE as RECORD

MANIFEST = "xla_amp_sharded_versions.json"
FORMAT = "xla_amp.sharded versions"
_NAME = re.compile(r"v\d{6,}\Z")


def check_keep(keep, who: str) -> None:
    """`keep`, the number of checkpoints kept, is an int >= 1."""
    if not isinstance(keep, int) or isinstance(keep, bool):
        raise TypeError(f"{who}: keep must be an int >= 1 (how many checkpoints to keep), "
                        f"got {type(keep).__name__}; nothing was written")
    if keep < 1:
        raise ValueError(f"{who}: keep must be an int >= 1 (how many checkpoints to keep), "
                         f"got {keep}; nothing was written")


def published(path: str, who: str) -> list[str] | None:
    """The version names the manifest of `path` lists, newest first; None
    when there is no manifest."""
    file = os.path.join(path, MANIFEST)
    try:
        with open(file) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ValueError(f"{who}: {file} was not loaded: {str(e).splitlines()[0]}") from None
    names = data.get("versions") if isinstance(data, dict) else None
    if (data.get("format") != FORMAT or not isinstance(names, list) or not names
            or not all(isinstance(n, str) and _NAME.match(n) for n in names)):
        raise ValueError(f"{who}: {file} was not loaded: not an xla_amp.sharded manifest")
    return names


def _legacy(path: str) -> list[str]:
    """The files of a checkpoint written into `path` itself (before
    versions), ``.metadata`` last."""
    names = [n for n in os.listdir(path)
             if n in (".metadata.tmp", RECORD) or n.endswith(".distcp")]
    return sorted(names) + ([".metadata"] if os.path.isfile(os.path.join(path, ".metadata"))
                            else [])


def versions(path) -> list[str]:
    """The directories of the complete checkpoints kept at `path`, newest
    first: ``versions(path)[0]`` is what ``load(path, ...)`` reads, and each
    one loads by its own path. A checkpoint from before versions is
    ``[path]``; nothing saved there, ``[]``."""
    path = os.fspath(path)
    names = published(path, "xla_amp.sharded.versions")
    if names is not None:
        return [os.path.join(path, n) for n in names]
    return [path] if os.path.isfile(os.path.join(path, ".metadata")) else []


def resolve(path: str, who: str) -> str:
    """The directory ``load(path)`` reads: the newest version, or `path`."""
    names = published(path, who)
    return path if names is None else os.path.join(path, names[0])


def _flock(directory: str, how: int) -> int | None:
    """A descriptor of `directory` holding ``flock(how | LOCK_NB)``; None when
    it is gone or another process holds a conflicting lock."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    return fd


@contextlib.contextmanager
def reading(path: str, who: str, tries: int = 200):
    """The directory ``load(path)`` reads (:func:`resolve`), held against
    removal for the block. A directory that is not there is yielded as it
    is (the load refuses it); one that saves keep replacing for `tries`
    attempts is refused in one line."""
    for _ in range(tries):
        where = resolve(path, who)
        fd = _flock(where, fcntl.LOCK_SH)
        if fd is None and not os.path.isdir(where) and resolve(path, who) == where:
            yield where
            return
        if fd is not None:
            try:
                if resolve(path, who) == where:
                    yield where
                    return
            finally:
                os.close(fd)
        time.sleep(0.01)   # a save is switching versions: read the next one
    raise CheckpointError(f"{who}: {path}: its newest version was replaced {tries} times "
                          "while it was opened (saves in progress); nothing was loaded")


def _remove_unpublished(path: str) -> None:
    """Remove what no manifest names, except what a load is reading."""
    names = published(path, "xla_amp.sharded.save")
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if _NAME.match(name) and name not in (names or ()) and os.path.isdir(full):
            fd = _flock(full, fcntl.LOCK_EX)
            if fd is not None:     # else a load reads it: left to a later save
                try:
                    shutil.rmtree(full)
                finally:
                    os.close(fd)
    if names is not None and _legacy(path):
        fd = _flock(path, fcntl.LOCK_EX)
        if fd is not None:
            try:
                for name in reversed(_legacy(path)):   # .metadata first: no longer a checkpoint
                    os.remove(os.path.join(path, name))
            finally:
                os.close(fd)
    remove_stale_temporaries(os.path.join(path, MANIFEST))


def write_record(path: str, record: dict) -> None:
    """`record` as the record file of the version directory `path`."""
    write_json(os.path.join(path, RECORD), record)


def _adopt(path: str) -> str:
    """A version directory holding the pre-version checkpoint in `path`
    (hard links; copies where the file system has none)."""
    name = f"v{0:06d}"
    target = os.path.join(path, name)
    os.mkdir(target)
    for n in _legacy(path):
        link_or_copy(os.path.join(path, n), os.path.join(target, n))
    fsync_dir(target)
    return name


def begin(path: str, keep: int) -> tuple[str, list[str]]:
    """Coordinator, before a save into `path`: clean up, and make the new
    version's directory. Returns its name and the versions published before."""
    os.makedirs(path, exist_ok=True)
    _remove_unpublished(path)
    previous = published(path, "xla_amp.sharded.save")
    if previous is None:
        legacy = keep > 1 and os.path.isfile(os.path.join(path, ".metadata"))
        previous = [_adopt(path)] if legacy else []
    numbers = [int(n[1:]) for n in os.listdir(path) if _NAME.match(n)]
    name = f"v{max(numbers, default=0) + 1:06d}"
    os.mkdir(os.path.join(path, name))
    return name, previous


def publish(path: str, name: str, previous: list[str], keep: int) -> None:
    """Coordinator, after every process wrote `name`: switch to it (the
    manifest's rename), then remove what it no longer names."""
    kept = [name] + [n for n in previous if n != name][:keep - 1]
    write_json(os.path.join(path, MANIFEST), {"format": FORMAT, "versions": kept})
    _remove_unpublished(path)
