"""xla_amp/torchax/_lowerings.py: inside a region, embedding and split lower
to leaner JAX than torchax 0.0.13's (fewer converts and selects), with
the same values and gradients; outside a region torchax's own lowerings run
(the comparison below, so a torchax that changes shows up)."""
from __future__ import annotations

import jax
import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchax

from tests.support.torchax_env import ENV

import xla_amp.torchax as xt

pytestmark = pytest.mark.torchax


def _program(fn, *tensors, region=True):
    """The gradient program of sum(fn(...)) over the first input, optimized HLO."""
    def loss(*xs):
        if region:
            with xt.autocast("jax", policy="tpu"):
                out = fn(*xs)
        else:
            out = fn(*xs)
        outs = out if isinstance(out, (list, tuple)) else [out]
        return sum((o.float() * (i + 1)).sum() for i, o in enumerate(outs))
    arrays = [jax.numpy.asarray(t.numpy()) for t in tensors]
    grad = jax.jit(jax.value_and_grad(torchax.interop.jax_view(loss)))
    with ENV:
        value, g = grad(*arrays)
        text = grad.lower(*arrays).compile().as_text()
    return float(value), np.asarray(g), text


def _count(text, opcode):
    return len([line for line in text.splitlines() if f" {opcode}(" in line])


def test_embedding_has_no_nan_fill_select_and_the_same_values():
    torch.manual_seed(0)
    weight, ids = torch.randn(50, 8), torch.randint(0, 50, (4, 6))
    ours = _program(lambda w, i: F.embedding(i, w), weight, ids)
    theirs = _program(lambda w, i: F.embedding(i, w), weight, ids, region=False)
    assert ours[0] == theirs[0] and np.array_equal(ours[1], theirs[1])
    assert _count(ours[2], "select") == 0 < _count(theirs[2], "select")


def test_embedding_clamps_out_of_range_ids_as_torch_xla_does():
    weight = torch.arange(12.0).reshape(6, 2)
    with ENV:
        ids = torch.tensor([0, 5, 9]).to("jax")
        with xt.autocast("jax", policy="tpu"):
            out = F.embedding(ids, weight.to("jax")).cpu()
        plain = F.embedding(ids, weight.to("jax")).cpu()
    assert torch.equal(out, weight[[0, 5, 5]])
    assert torch.isnan(plain[2]).all()  # torchax 0.0.13's own lowering: a NaN row


@pytest.mark.parametrize("sizes", [3, [2, 3, 2]], ids=["int", "sizes"])
def test_split_backward_is_one_concatenate_and_the_same_values(sizes):
    torch.manual_seed(0)
    x = torch.randn(4, 7)
    ours = _program(lambda t: list(torch.split(t, sizes, dim=1)), x)
    theirs = _program(lambda t: list(torch.split(t, sizes, dim=1)), x, region=False)
    assert ours[0] == theirs[0] and np.array_equal(ours[1], theirs[1])
    assert _count(ours[2], "pad") == 0 < _count(theirs[2], "pad")
