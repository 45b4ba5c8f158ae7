"""The first training step is the graph every later step runs: compiled
once, not twice (xla_amp/syncfree/_fresh.py, _base._reserve,
xla_amp/_upload.py).

Before, a sync-free optimizer made its state inside the first step and the
GradScaler its scale and counters at the first scale(): zeros that were
constants of the first graph, and outputs ordered after that step's
gradients, where every later step has them as inputs and before them. The
first step compiled a graph of its own (on a TPU, the whole model's step a
second time). Each check below fails without the change.
"""
import copy
import itertools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla

import xla_amp
from xla_amp import syncfree

from tests.support import assert_same, clear_metrics, count

CONFIGS = [
    ("SGD", dict(momentum=0.9)),
    ("SGD", dict(momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("SGD", dict()),
    ("Adam", dict()),
    ("AdamW", dict(amsgrad=True)),
]


_WIDTHS = itertools.count(16)  # a width per run: no graph cached by another test


def _model(device, width=16, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, width), nn.BatchNorm1d(width), nn.ReLU(),
                         nn.Linear(width, 3)).to(device)


LOW_PRECISION = [
    dict(master_weights=True),
    dict(stochastic_rounding=True),
    dict(master_weights=True, state_dtype=torch.bfloat16),
    dict(stochastic_rounding=True, state_dtype=torch.bfloat16),
]


def _train(device, name, kw, fused, steps=3, first_inf=False, reserve=True, width=None,
           dtype=torch.float32):
    """(compilations per step, model, optimizer) of `steps` AMP steps with
    GradScaler; `first_inf` makes the first step's gradients overflow;
    `dtype` the parameters' (bf16 with the low-precision options)."""
    model = _model(device, width or next(_WIDTHS)).to(dtype)
    opt = getattr(syncfree, name)(model.parameters(), lr=0.05, fused=fused, **kw)
    if not reserve:
        opt._reserved.clear()  # as before: state made inside the first step
    scaler = xla_amp.GradScaler()
    torch.manual_seed(1)
    x, y = torch.randn(8, 12).to(dtype), torch.randint(0, 3, (8,)).to(device)
    xs = [x.to(device)] * steps  # device data alike: one graph for all
    if first_inf:
        xs[0] = x.index_fill(0, torch.tensor([0]), float("inf")).to(device)
    torch_xla.sync()
    compiles = []
    for i in range(steps):
        clear_metrics()
        opt.zero_grad()
        with xla_amp.autocast(device, policy="tpu"):
            loss = F.cross_entropy(model(xs[i]).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch_xla.sync()
        compiles.append(count("CompileTime"))
    return compiles, model, opt


@pytest.mark.parametrize("fused", [None, False], ids=["fused", "portable"])
@pytest.mark.parametrize("name,kw", CONFIGS, ids=lambda v: str(v))
def test_first_step_compiles_the_graph_of_every_later_step(name, kw, fused, device):
    compiles, _, _ = _train(device, name, kw, fused)
    assert compiles == [1, 0, 0], compiles


@pytest.mark.parametrize("name", ["SGD", "AdamW"])
@pytest.mark.parametrize("kw", LOW_PRECISION, ids=lambda v: str(v))
def test_bf16_parameters_with_master_or_stochastic_rounding_compile_once(name, kw, device):
    """The master is made from the parameter by one small graph when the
    optimizer is built; the rounding counter, the state (in state_dtype)
    and the element-index ranges are uploaded. The same bits as state made
    in the step."""
    kw = dict(kw, momentum=0.9) if name == "SGD" else kw
    compiles, a, oa = _train(device, name, kw, None, dtype=torch.bfloat16)
    assert compiles == [1, 0, 0], compiles
    width = a[0].out_features
    _, b, ob = _train(device, name, kw, None, dtype=torch.bfloat16, reserve=False, width=width)
    assert_same([p.detach().cpu() for p in a.parameters()],
                [p.detach().cpu() for p in b.parameters()], "parameters")
    assert_same(oa.state_dict(), ob.state_dict(), "state_dict")


def test_a_skipped_first_step_is_the_same_graph_too(device):
    compiles, model, opt = _train(device, "SGD", dict(momentum=0.9), None, first_inf=True)
    assert compiles == [1, 0, 0], compiles
    # the skipped first step left the buffer unused: the second step copied
    # its gradient in, as torch.optim.SGD's first step does
    assert all("momentum_buffer" in st for st in opt.state_dict()["state"].values())


@pytest.mark.parametrize("name,kw", CONFIGS, ids=lambda v: str(v))
def test_state_made_before_the_first_step_changes_no_bits(name, kw, device):
    _, a, oa = _train(device, name, kw, None, width=8)
    _, b, ob = _train(device, name, kw, None, width=8, reserve=False)
    assert_same([p.detach().cpu() for p in a.parameters()],
                [p.detach().cpu() for p in b.parameters()], "parameters")
    assert_same(oa.state_dict(), ob.state_dict(), "state_dict")


def test_state_made_for_a_parameter_left_out_of_the_first_step_is_given_back(device):
    """A trainable parameter without a gradient at the first step (an unused
    head) does not keep its reserved state; when it gets a gradient later,
    its state is made then, as torch.optim makes it."""
    model = _model(device)
    opt = syncfree.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ref = torch.optim.SGD(copy.deepcopy(model).cpu().parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 12)
    for step, use_head in enumerate([False, True]):
        for o, xx in ((opt, x.to(device)), (ref, x)):
            params = list(o.param_groups[0]["params"])
            h = F.linear(xx, params[0], params[1])  # the first layer only ...
            if use_head:  # ... then the last one too
                h = F.linear(torch.relu(h), params[4], params[5])
            h.square().sum().backward()
            o.step()
            o.zero_grad()
        torch_xla.sync()
        if step == 0:
            assert not opt._reserved and len(opt.state_dict()["state"]) == 2
    for p, q in zip(opt.param_groups[0]["params"], ref.param_groups[0]["params"]):
        torch.testing.assert_close(p.detach().cpu(), q.detach())


def test_frozen_parameters_get_no_state(device):
    model = _model(device)
    model[0].requires_grad_(False)
    opt = syncfree.Adam(model.parameters(), lr=0.1)
    frozen = set(model[0].parameters())
    assert not frozen & set(opt._reserved) and len(opt._reserved) == 4


def test_options_changed_before_the_first_step_are_followed(device):
    """The reserved state is used only when it is what the step would make."""
    torch.manual_seed(0)
    model = nn.Linear(12, 3).to(device)  # (no batch norm: gradients far from 0)
    sgd = syncfree.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sgd.param_groups[0]["momentum"] = 0.0
    adam_model = nn.Linear(12, 3).to(device)
    adam = syncfree.Adam(adam_model.parameters(), lr=0.1)
    adam.param_groups[0]["amsgrad"] = True
    ref_model = copy.deepcopy(adam_model).cpu()
    ref = torch.optim.Adam(ref_model.parameters(), lr=0.1, amsgrad=True)
    x = torch.randn(4, 12)
    for m, o in ((model, sgd), (adam_model, adam)):
        m(x.to(device)).sum().backward()
        o.step()
    ref_model(x).sum().backward()
    ref.step()
    torch_xla.sync()
    assert not any(sgd.state.values()), "momentum 0 keeps no state"
    got = adam.state_dict()["state"]
    want = ref.state_dict()["state"]
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in want.items()}
    for (k, v), p, q in zip(got.items(), adam_model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(v["max_exp_avg_sq"].cpu(), want[k]["max_exp_avg_sq"])
        torch.testing.assert_close(p.detach().cpu(), q.detach())


def test_loaded_state_replaces_what_was_made_for_the_first_step(device):
    model = _model(device)
    opt = syncfree.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 12).to(device)).sum().backward()
    opt.step()
    torch_xla.sync()
    fresh = syncfree.SGD(model.parameters(), lr=0.1, momentum=0.9)
    assert len(fresh._reserved) == 6
    fresh.load_state_dict(opt.state_dict())
    assert not fresh._reserved  # no second copy of the state held


def test_state_put_in_directly_drops_what_was_made_for_the_first_step(device):
    """State written into ``optimizer.state`` by other code (a sharded
    checkpoint's loader does) wins; the first step drops the other copy."""
    model = _model(device)
    opt = syncfree.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 12).to(device)).sum().backward()
    opt.step()
    torch_xla.sync()
    fresh = syncfree.Adam(model.parameters(), lr=0.1)
    for p in model.parameters():
        fresh.state[p] = {k: v.clone() for k, v in opt.state[p].items()}
    fresh.step()
    torch_xla.sync()
    assert not fresh._reserved
    assert_same(fresh.state_dict()["state"][0]["step"], torch.tensor(2.0))
