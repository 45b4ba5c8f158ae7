"""Checksums of what a checkpoint holds: one algorithm for every file xla_amp
writes (single-file checkpoints, the launchers', sharded ones).

XXH3-64 (``xxhash``): about 10 GB/s on one core here, so a checksum taken
while the bytes pass costs a few percent of writing them (CRC-32 runs at
2 GB/s, SHA-256 at 1 GB/s: benchmarks/checkpoint_write.py). It finds disk
and copy faults, not tampering: a file from a stranger is kept harmless by
the data-only reader, not by this.

    h = hasher(); h.update(chunk); ...; h.hexdigest()     # a stream of bytes
    tensor_digest(t)                                       # a host tensor's bytes
    finish_tensor(h, t)        # the same, from a hasher already fed t's bytes
"""
from __future__ import annotations

import xxhash

ALGORITHM = "xxh3_64"


def hasher():
    """A new incremental hasher (``update(bytes)``, ``hexdigest()``)."""
    return xxhash.xxh3_64()


def digest(data) -> str:
    """The checksum of a bytes-like object."""
    return xxhash.xxh3_64_hexdigest(data)


def tensor_bytes(t):
    """A host tensor's bytes in row-major order, as a memoryview (no copy for
    a contiguous tensor)."""
    import torch
    flat = t.detach().contiguous().reshape(-1)
    if flat.dtype != torch.uint8:
        flat = flat.view(torch.uint8)
    return memoryview(flat.numpy())


def tensor_digest(t) -> str:
    """The checksum of a host tensor's bytes, with its dtype and shape, so
    that a tensor reinterpreted as another dtype or shape does not match."""
    h = hasher()
    h.update(tensor_bytes(t))
    return finish_tensor(h, t)


def finish_tensor(h, t) -> str:
    """``tensor_digest(t)`` from a hasher already fed `t`'s bytes. The dtype
    and shape go in after the bytes, so a reader can hash a storage while it
    is read from the file, before the tensor built on it exists."""
    h.update(f"{str(t.dtype)}{tuple(t.shape)}".encode())
    return h.hexdigest()
