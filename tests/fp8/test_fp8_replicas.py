"""Delayed scaling in torch_xla's replica mode: every replica rolls the
amax history of the global batch (xla_amp.fp8.update_scales MAX-reduces
the pending amaxes first, one collective for all layers).

Replica-mode collectives do not run across replicas on XLA:CPU (pytorch/xla
issue 5005): the reduction is checked in the HLO of a one-replica process
with XLA_ALWAYS_ALLREDUCE=1 (the `emit_collectives` fixture), as
tests/distributed/test_distributed.py checks the gradients' and found_inf's.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch_xla

import xla_amp
from xla_amp import fp8

from tests.support import hlo
from tests.support.fp8 import parse

def _model(device, scaling="delayed"):
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    return fp8.convert(mlp, fp8.Fp8Recipe(scaling=scaling)).to(device)


def _layers(model):
    return [m for m in model.modules() if isinstance(m, fp8.Fp8Linear)]


def _backward(model, device, scaler=None):
    x = torch.randn(16, 32).to(device)
    with xla_amp.autocast(device, policy="tpu"):
        loss = model(x).float().pow(2).mean()
    (scaler.scale(loss) if scaler else loss).backward()


def _max_reduces(model) -> list[int]:
    """Per MAX all-reduce in the graph of the model's fp8 buffers, how many
    [3] amax vectors it reduces (its result: "(f32[3]{0}, f32[3]{0}, f32[])",
    the layers' pending amaxes, then PyTorch/XLA's token)."""
    text = hlo(*(b for m in _layers(model) for b in (m.fp8_amax_history, m.fp8_scale)))
    return [typ.count("f32[3]{0}") for typ, opcode, _, attrs in parse(text).values()
            if opcode == "all-reduce" and "to_apply=%MaxComputation" in attrs]


def test_replica_mode_reduces_every_layers_pending_amaxes_in_one_collective(
        device, emit_collectives):
    """A training step through fp8.attach, the GradScaler and
    xla_amp.optimizer_step: one MAX all-reduce of both layers' pending
    amaxes before the roll (the gradients' reduction is a SUM, and
    found_inf needs none when the gradients are reduced first)."""
    model = _model(device)
    opt = xla_amp.syncfree.SGD(model.parameters(), lr=0.1)
    fp8.attach(opt, model)
    scaler = xla_amp.GradScaler()
    _backward(model, device, scaler)
    xla_amp.optimizer_step(opt, scaler=scaler)
    assert _max_reduces(model) == [len(_layers(model))]


def test_explicit_groups_reach_the_collective(device, emit_collectives):
    model = _model(device)
    _backward(model, device)
    fp8.update_scales(model, groups=[[0]])
    text = hlo(*(m.fp8_amax_history for m in _layers(model)))
    assert _max_reduces(model) == [2]
    assert "replica_groups={{0}}" in text, text


def test_one_replica_emits_no_collective(device):
    """PyTorch/XLA's rule for one replica: no collective, and the roll is
    the same graph as before replica mode was handled."""
    model = _model(device)
    _backward(model, device)
    fp8.update_scales(model)
    text = hlo(*(m.fp8_amax_history for m in _layers(model)))
    assert "all-reduce" not in text
    torch_xla.sync()


def _state(model):
    return [b.cpu().clone() for b in model.buffers()]


@pytest.mark.parametrize("where", ["update_scales", "attach"])
def test_groups_that_do_not_cover_the_replicas_are_refused_before_anything_changes(
        device, where):
    model = _model(device)
    _backward(model, device)
    torch_xla.sync()
    before = _state(model)
    with pytest.raises(ValueError, match=r"replica groups \[\[0, 1\]\] do not cover the 1"):
        if where == "attach":
            fp8.attach(torch.optim.SGD(model.parameters(), lr=0.1), model, groups=[[0, 1]])
        else:
            fp8.update_scales(model, groups=[[0, 1]])
    assert all(torch.equal(a, b) for a, b in zip(_state(model), before))


@pytest.mark.parametrize("case", ["cpu", "dynamic"])
def test_groups_without_replicated_histories_are_refused(device, case):
    """Groups for a model whose amaxes no replica reduces (on the CPU, or
    dynamic scaling: no history) would be ignored: refused, naming why."""
    model = _model("cpu") if case == "cpu" else _model(device, scaling="dynamic")
    why = "buffers are on cpu" if case == "cpu" else "no delayed-scaling layer"
    for call in (lambda: fp8.update_scales(model, groups=[[0]]),
                 lambda: fp8.attach(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                    groups=[[0]])):
        with pytest.raises(ValueError, match=why):
            call()
