"""Training and evaluation batches from in-memory tensors, or one fake batch;
each epoch's order a function of (seed, epoch) alone, so resumes are exact."""
from __future__ import annotations

from typing import Callable, Iterator, Optional


class DataDirError(ValueError):
    """--datadir does not hold a usable data set; the message says why."""


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool = True):
    """The sample order of one epoch: a function of (seed, epoch) only."""
    import torch
    if not shuffle:
        return torch.arange(n)
    g = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return torch.randperm(n, generator=g)


class TensorSource:
    """Batches of in-memory CPU tensors in a per-epoch order; the ragged tail
    of an epoch is dropped so that every step has the same shape (one graph).

    ``augment(x, generator)``, if given, transforms each batch with random
    numbers from a generator seeded by (seed, epoch, step): the augmentation,
    too, is the same in a resumed run as in an uninterrupted one."""

    def __init__(self, x, y, batch_size: int, seed: int, shuffle: bool = True,
                 transform: Optional[Callable] = None, augment: Optional[Callable] = None):
        if len(y) < batch_size:
            raise ValueError(f"the training set has {len(y)} samples, fewer than one "
                             f"batch (--batch_size={batch_size})")
        self.x, self.y, self.batch_size, self.seed = x, y, batch_size, seed
        self.shuffle, self.transform, self.augment = shuffle, transform, augment
        self.steps_per_epoch = len(y) // batch_size
        self.num_samples = len(y)

    def batches(self, epoch: int, start: int) -> Iterator:
        import torch
        order = epoch_order(len(self.y), self.seed, epoch, self.shuffle)
        b = self.batch_size
        for i in range(start, self.steps_per_epoch):
            idx = order[i * b:(i + 1) * b]
            x = self.x[idx]
            if self.augment is not None:
                g = torch.Generator().manual_seed((self.seed * 100_003 + epoch) * 100_003 + i)
                x = self.augment(x, g)
            yield (self.transform(x) if self.transform else x), self.y[idx]


class FakeSource:
    """One fixed random batch, made on the device once and reused each step."""

    def __init__(self, shape, num_classes: int, batch_size: int, steps_per_epoch: int,
                 devices: Devices, seed: int):
        import torch
        g = torch.Generator().manual_seed(seed)
        self.x = devices.put(torch.randn((batch_size,) + tuple(shape), generator=g))
        self.y = devices.put(torch.randint(0, num_classes, (batch_size,), generator=g))
        self.steps_per_epoch = steps_per_epoch
        self.num_samples = steps_per_epoch * batch_size
        self.batch_size = batch_size

    def batches(self, epoch: int, start: int) -> Iterator:
        for _ in range(start, self.steps_per_epoch):
            yield self.x, self.y


def padded_eval_batches(x, y, batch_size: int, transform: Optional[Callable] = None):
    """Fixed-size evaluation batches of in-memory tensors: the last one is
    padded and carries a mask, so evaluation compiles one graph."""
    for i in range(0, len(y), batch_size):
        xb, yb = x[i:i + batch_size], y[i:i + batch_size]
        yield pad_batch(transform(xb) if transform else xb, yb, batch_size)


def pad_batch(xb, yb, batch_size: int):
    import torch
    n = len(yb)
    mask = torch.zeros(batch_size, dtype=torch.bool)
    mask[:n] = True
    if n < batch_size:
        xb = torch.cat([xb, xb.new_zeros((batch_size - n,) + tuple(xb.shape[1:]))])
        yb = torch.cat([yb, yb.new_zeros(batch_size - n)])
    return xb, yb, mask
