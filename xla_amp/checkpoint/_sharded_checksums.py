"""Checksums of a sharded checkpoint, taken while DCP writes it and checked
before ``load`` changes anything.

Writing. DCP's ``FileSystemWriter`` writes every file through its
``fs.create_stream(path, "wb")``; here that stream hashes (XXH3-64,
``xla_amp.checkpoint._checksum``) the bytes on their way to the file, so no
data file is read again. DCP asks the stream for ``tell()`` before and
after each item it writes (torch 2.9, ``filesystem._write_item``: the
item's offset and length in ``.metadata`` come from those two calls), and
every ``tell()`` closes the running checksum and starts the next one. So a
file's record is a list of segments that cover it end to end: one per
item with DCP 2.9, and still a whole cover should a later DCP call
``tell()`` more or less often (a damaged segment then names the first
item it overlaps)::

    {"size": 4242, "segments": [[0, 1178, "9f..."], [1178, 3064, "0c..."]]}

Each process writes the records of its own data files beside them,
``__<rank>_checksums.json`` (DCP names the files ``__<rank>_<n>.distcp``),
before DCP gathers the ranks to write ``.metadata``; the coordinator keeps
the record of ``.metadata`` itself, which went through the same stream,
for the checkpoint's ``xla_amp_sharded.json``. The stream's ``fileno()``
flushes first: DCP fsyncs ``.metadata.tmp`` through it right after
``pickle.dump`` and before Python's buffer reaches the file.

Reading. ``load`` checks ``.metadata`` against the record before unpickling
it, then, from its own read plan, the segments of the data files it is
about to read (every segment that holds a byte it reads), before a value
moves. A file of another size, or a segment whose checksum differs, is one
line of :class:`CheckpointDamaged` naming the file and the first tensor (or
entry) whose bytes are not what was written. A checkpoint whose record has
no ``checksums`` (written before them, or by plain DCP) is not verified.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter

from xla_amp.checkpoint._checksum import ALGORITHM, hasher
from xla_amp.checkpoint._errors import CheckpointDamaged
from xla_amp.checkpoint._files import write_json
from xla_amp.checkpoint._record import FILE as RECORD

SIDECAR = "checksums.json"   # __<rank>_checksums.json
_METADATA_TMP = ".metadata.tmp"   # the name DCP's finish writes .metadata under
_CHUNK = 1 << 24


class _HashingStream(io.RawIOBase):
    """A file open for writing that hashes what is written, one checksum per
    stretch between two ``tell()`` calls."""

    def __init__(self, f):
        super().__init__()
        self._f, self._pos, self._start, self._h = f, 0, 0, hasher()
        self.segments: list[list] = []

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        view = memoryview(b)
        self._f.write(view)   # a buffered file: all of it, or an OSError
        self._h.update(view)
        self._pos += view.nbytes
        return view.nbytes

    def _cut(self) -> None:
        if self._pos > self._start:
            self.segments.append([self._start, self._pos - self._start, self._h.hexdigest()])
            self._start, self._h = self._pos, hasher()

    def tell(self) -> int:
        self._cut()
        return self._pos

    def record(self) -> dict[str, Any]:
        """This file's checksum record (after ``close``)."""
        return {"size": self._pos, "segments": self.segments}

    def flush(self) -> None:
        if not self._f.closed:
            self._f.flush()

    def fileno(self) -> int:
        self._f.flush()   # so that an fsync of this descriptor covers every byte
        return self._f.fileno()

    def close(self) -> None:
        if not self.closed:
            self._cut()
            self._f.close()
        super().close()


class _HashingFileSystem(FileSystem):
    """DCP's local file system, whose write streams hash; ``written`` maps each
    file name written to its record."""

    def __init__(self):
        super().__init__()
        self.written: dict[str, dict[str, Any]] = {}

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        stream = _HashingStream(open(path, mode))
        try:
            yield stream
        finally:
            stream.close()
        self.written[os.path.basename(path)] = stream.record()


class Writer(FileSystemWriter):
    """DCP's ``FileSystemWriter`` into the version directory `path`, with
    checksums; ``metadata_record()`` (coordinator, after the save) is the
    record of ``.metadata``."""

    def __init__(self, path: str):
        # per_thread_copy_ahead=0: DCP's copy-ahead loader (GPU-to-host overlap)
        # is chosen whenever a PrivateUse1 backend says it is available, and then
        # calls its device module's current_stream(): torchax names PrivateUse1
        # "jax" on import and has none, so every save failed in a process that
        # had imported torchax (tests/torchax/test_torchax_coexist.py pins it)
        super().__init__(path, per_thread_copy_ahead=0)
        self.fs = _HashingFileSystem()

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        future.wait()   # DCP 2.9 writes before it returns; be sure of it
        prefix = plan.storage_data.prefix
        mine = {n: r for n, r in self.fs.written.items() if n.startswith(prefix)}
        write_json(os.path.join(self.path, prefix + SIDECAR),
                   {"algorithm": ALGORITHM, "files": mine})
        return future

    def metadata_record(self) -> dict[str, Any]:
        return {"algorithm": ALGORITHM, ".metadata": self.fs.written[_METADATA_TMP]}


def _damaged(who: str, file: str, why: str) -> CheckpointDamaged:
    return CheckpointDamaged(f"{who}: {file} is damaged: {why}; nothing was loaded")


def _label(index) -> str:
    offset = getattr(index, "offset", None)
    if offset is not None and any(offset):
        return f"{index.fqn!r} (its chunk at {list(offset)})"
    return repr(index.fqn)


class Checksums:
    """The checksums recorded for the checkpoint in directory `where`."""

    def __init__(self, where: str, metadata_record: dict[str, Any], who: str):
        self.where, self.who = where, who
        self.files = {".metadata": metadata_record}
        for name in sorted(os.listdir(where)):
            if name.startswith("__") and name.endswith("_" + SIDECAR):
                file = os.path.join(where, name)
                try:
                    with open(file) as f:
                        data = json.load(f)
                    if data["algorithm"] != ALGORITHM:
                        raise ValueError(f"algorithm {data['algorithm']!r}")
                    self.files.update(data["files"])
                except (OSError, ValueError, KeyError, TypeError) as e:
                    raise _damaged(who, file, f"not a checksum record ({e})") from None

    def _check(self, name: str, ranges: list[tuple[int, int, str]] | None) -> None:
        """Compare file `name` with its record: its size, then every segment
        that overlaps one of `ranges` (offset, length, label; None: all)."""
        file = os.path.join(self.where, name)
        ranges = None if ranges is None else sorted(ranges)
        entry = self.files.get(name)
        if entry is None:
            raise _damaged(self.who, file, "no checksum was recorded for it")
        try:
            size = os.path.getsize(file)
            want, segments = int(entry["size"]), entry["segments"]
            if size != want:
                cut = next((lb for o, n, lb in ranges or () if o + n > size), None)
                what = f" ({cut} is cut short)" if cut and size < want else ""
                raise _damaged(self.who, file, f"it holds {size} bytes, {want} were "
                                               f"written{what}")
            with open(file, "rb") as f:
                for start, length, digest in segments:
                    hit = [lb for o, n, lb in ranges
                           if o < start + length and start < o + n] if ranges else []
                    if ranges is not None and not hit:
                        continue
                    f.seek(start)
                    h, left = hasher(), length
                    while left:
                        block = f.read(min(left, _CHUNK))
                        if not block:
                            break
                        h.update(block)
                        left -= len(block)
                    if h.hexdigest() != digest:
                        what = f"the bytes of {hit[0]}" if hit else "its bytes"
                        raise _damaged(self.who, file, f"{what} do not match their checksum")
        except OSError as e:
            raise _damaged(self.who, file, f"it cannot be read ({e.strerror or e})") from None
        except (KeyError, TypeError, ValueError) as e:
            raise _damaged(self.who, file, f"its checksum record is malformed ({e})") from None

    def check_metadata(self) -> None:
        self._check(".metadata", None)

    def check_reads(self, metadata, items) -> None:
        """Check the bytes the read items `items` (a DCP load plan's) will read."""
        per_file: dict[str, list[tuple[int, int, str]]] = {}
        for item in items:
            info = metadata.storage_data[item.storage_index]
            per_file.setdefault(info.relative_path, []).append(
                (info.offset, info.length, _label(item.storage_index)))
        for name in sorted(per_file):
            self._check(name, per_file[name])


def expected(where: str, record: dict[str, Any] | None, who: str) -> Checksums | None:
    """The checksums of the checkpoint in `where` whose record is `record`;
    None when the record names none (a checkpoint from before them)."""
    recorded = (record or {}).get("checksums")
    if recorded is None:
        return None
    if not isinstance(recorded, dict) or recorded.get("algorithm") != ALGORITHM:
        file = os.path.join(where, RECORD)
        raise _damaged(who, file, f"its checksums are not {ALGORITHM} records")
    return Checksums(where, recorded.get(".metadata"), who)
