"""Checksums inside a single-file checkpoint, and their check on reading.

What ``save`` adds to the state it writes (under ``KEY``)::

    "checksums": {"algorithm": "xxh3_64",
                  "tensors": {"model/fc1.weight": "9f0c...",
                              "optimizer/state/0/exp_avg": "51aa...", ...},
                  "data": "07be..."}    # everything in the state but the tensors

Both parts come from one walk over the saved object itself (:func:`walk`),
so nothing lists keys by hand: every tensor anywhere in the state (model,
optimizer, scaler, record, the caller's ``extra``) is named by its path of
keys and indices, and everything else (numbers, strings, dtypes, which
container holds what) becomes one canonical text whose checksum is
``data``. The tensors are hashed from the host copies torch.save is about
to write; the written file is never read back.

Reading (``_read.read``): torch.load hands each storage to
:class:`StorageHashes` (its ``map_location`` hook) as soon as it is read,
and a second thread hashes it while torch.load reads the next one; then
:func:`verify` walks the loaded object the same way, finishes each
tensor's checksum and compares. A mismatch, a tensor missing from the file
or one not in the list, or changed plain data: :class:`CheckpointDamaged`,
one line naming the file, the first damaged tensor and how many there are.
A file without the entry (written before checksums existed) is returned
as it is, unverified.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from xla_amp.checkpoint._checksum import (ALGORITHM, digest, finish_tensor, hasher,
                                          tensor_bytes, tensor_digest)
from xla_amp.checkpoint._errors import CheckpointDamaged, CheckpointError

KEY = "checksums"
# Private switch for benchmarks/checkpoint_write.py: False writes files
# without the entry and reads without hashing, as before checksums existed.
enabled = True

# from this many bytes of tensors on, two threads hash a state being saved
_TWO_THREADS_FROM = 64 * 2 ** 20
# values whose repr is the value itself, the same in every process
_PLAIN = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device,
          torch.layout, torch.memory_format)


def _plain(v) -> str:
    return f"{type(v).__name__}:{v!r}" if isinstance(v, _PLAIN) else f"<{type(v).__qualname__}>"


def _walk(obj, path: str, tensors: list, text: list) -> None:
    join = (lambda k: f"{path}/{k}") if path else str
    if isinstance(obj, torch.Tensor):
        tensors.append((path, obj))
        text.append("T")
    elif isinstance(obj, dict):
        text.append(f"{type(obj).__name__}{{")
        for k, v in obj.items():
            text.append(_plain(k) + "=")
            _walk(v, join(k), tensors, text)
            text.append(",")
        text.append("}")
    elif isinstance(obj, (list, tuple)):
        text.append(f"{type(obj).__name__}[")
        for i, v in enumerate(obj):
            _walk(v, join(i), tensors, text)
            text.append(",")
        text.append("]")
    elif isinstance(obj, (set, frozenset)):   # iteration order differs between processes
        text.append(f"{type(obj).__name__}{{{','.join(sorted(map(_plain, obj)))}}}")
    else:
        text.append(_plain(obj))


def walk(state: dict) -> tuple[list[tuple[str, torch.Tensor]], str]:
    """Every tensor in `state` with its path (``"model/fc1.weight"``), in the
    order pickle writes them, and the canonical text of everything else.
    A path met twice (a key holding "/", an int key beside its string)
    gets ``#2``, ``#3``... in walk order, the same on both sides."""
    tensors: list = []
    text: list = []
    _walk({k: v for k, v in state.items() if k != KEY}, "", tensors, text)
    seen: set = set()
    named = []
    for p, t in tensors:
        name, n = p, 1
        while name in seen:
            n += 1
            name = f"{p}#{n}"
        seen.add(name)
        named.append((name, t))
    return named, "".join(text)


def _checksum(t: torch.Tensor):
    """The tensor's checksum, or None for one whose bytes have no plain
    row-major form here (sparse, quantized, not on the host)."""
    if t.layout != torch.strided or t.device.type != "cpu" or t.is_conj() or t.is_neg():
        return None
    try:
        return tensor_digest(t)
    except (RuntimeError, TypeError, ValueError):
        return None


def _checksums(tensors: list) -> list:
    """The tensors' checksums, in order. A large state is hashed by this
    thread and a second one together, each taking the next tensor not yet
    taken (xxhash releases the GIL on large buffers)."""
    if sum(t.numel() * t.element_size() for t in tensors) < _TWO_THREADS_FROM:
        return [_checksum(t) for t in tensors]
    out: list = [None] * len(tensors)
    order, lock = iter(range(len(tensors))), threading.Lock()

    def work():
        while True:
            with lock:
                i = next(order, None)
            if i is None:
                return
            out[i] = _checksum(tensors[i])
    with ThreadPoolExecutor(1, thread_name_prefix="xla_amp-checksum") as pool:
        helper = pool.submit(work)
        work()
        helper.result()
    return out


def with_checksums(state: dict) -> dict:
    """`state` with its ``KEY`` entry added (the module docstring)."""
    if KEY in state:
        raise ValueError(f"a checkpoint's state may not hold the entry {KEY!r}: "
                         "save writes it (pass another name in extra)")
    tensors, text = walk(state)
    sums = _checksums([t for _, t in tensors])
    state[KEY] = {"algorithm": ALGORITHM, "tensors": {p: s for (p, _), s in zip(tensors, sums)},
                  "data": digest(text.encode())}
    return state


def _whole(t: torch.Tensor) -> bool:
    """Does `t` cover its storage, in order (then its bytes are the storage's)?"""
    return (t.layout == torch.strided and t.device.type == "cpu" and t.storage_offset() == 0
            and t.is_contiguous() and not t.is_conj() and not t.is_neg()
            and t.numel() * t.element_size() == t.untyped_storage().nbytes())


def _hash_storage(storage):
    h = hasher()
    h.update(tensor_bytes(torch.empty(0, dtype=torch.uint8).set_(storage)))
    return h


class StorageHashes:
    """torch.load's ``map_location``: keeps each storage on the host (what
    ``map_location="cpu"`` does) and has a thread hash its bytes while
    torch.load goes on reading (xxhash releases the GIL while it hashes)."""

    def __init__(self):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="xla_amp-checksum")
        self._pending: dict[int, Future] = {}

    def __call__(self, storage, location):
        if storage.device.type == "cpu" and storage.nbytes() > 0:
            self._pending[storage.data_ptr()] = self._pool.submit(_hash_storage, storage)
        return storage

    def digest(self, t: torch.Tensor) -> str:
        """``tensor_digest(t)`` of a loaded tensor, from its storage's hash
        when the tensor covers that storage; a storage the thread has not
        started on yet is hashed here instead (both threads work on what is
        left when torch.load is done)."""
        job = self._pending.get(t.untyped_storage().data_ptr()) if _whole(t) else None
        if job is None or job.cancel():
            return tensor_digest(t)
        return finish_tensor(job.result().copy(), t)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()


def verify(state: dict, path: str, what: str, hashes: StorageHashes) -> dict:
    """Check the loaded `state` against its ``KEY`` entry and remove the
    entry; raise :class:`CheckpointDamaged` (one line) on any difference."""
    entry = state.pop(KEY)
    if not isinstance(entry, dict) or entry.get("algorithm") != ALGORITHM:
        algorithm = entry.get("algorithm") if isinstance(entry, dict) else entry
        raise CheckpointError(f"{what} {path} carries checksums of another kind "
                              f"({str(algorithm)[:40]!r}); this xla_amp checks {ALGORITHM}")
    expected = entry.get("tensors")
    if not isinstance(expected, dict):
        raise CheckpointDamaged(f"{what} {path} is damaged: its checksum list is unreadable; "
                                "it was not loaded")
    tensors, text = walk(state)
    found = dict(tensors)
    problems = []
    for p, want in expected.items():
        if p not in found:
            problems.append(f"tensor {p} is missing")
        elif want is not None:
            try:
                ok = hashes.digest(found[p]) == want
            except (RuntimeError, TypeError, ValueError):
                ok = False
            if not ok:
                problems.append(f"tensor {p} does not match its checksum")
    problems += [f"tensor {p} is not in its checksum list" for p in found if p not in expected]
    data_ok = digest(text.encode()) == entry.get("data")
    if not problems and data_ok:
        return state
    if problems:
        reason = (f"{problems[0]} ({len(problems)} damaged of {len(expected)} tensors"
                  + ("; its other data too)" if not data_ok else ")"))
    else:
        reason = ("its data besides the tensors (numbers, strings, structure) does not "
                  "match its checksum")
    raise CheckpointDamaged(f"{what} {path} is damaged: {reason}; it was not loaded")
