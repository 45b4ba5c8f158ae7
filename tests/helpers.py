"""Helpers shared by test modules (not tests themselves)."""
import math

import torch


def assert_same(a, b, where="state"):
    """a and b are equal to the bit, recursively (tensors by bits and dtype,
    NaNs included; dicts, lists, tuples by structure; the rest by ==)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        bits = lambda t: t.reshape(-1).view(torch.uint8) if t.dtype.is_floating_point else t
        assert torch.equal(bits(a.cpu()), bits(b.cpu())), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"
