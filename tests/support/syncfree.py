"""Helpers of the sync-free optimizer tests (test_syncfree*.py)."""
import functools
import types

import pytest
import torch
import torch_xla

from xla_amp import syncfree

STEPS = 20
SHAPES = [(5, 3), (7,), (4,)]


@pytest.fixture(params=["fused", "portable"])
def sf(request):
    """xla_amp.syncfree with each optimizer pinned to one path: PyTorch/XLA's
    fused op (fused=True, so a silent fall-back would raise) or the portable
    multi-tensor one (fused=False)."""
    fused = request.param == "fused"
    return types.SimpleNamespace(**{
        n: functools.partial(getattr(syncfree, n), fused=fused)
        for n in ("SGD", "Adam", "AdamW")})


def _init(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _grads(steps=STEPS, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in SHAPES] for _ in range(steps)]


def _groups(params, lr):
    # two groups (the second at half the learning rate); the last parameter
    # never gets a gradient and must stay untouched
    return [{"params": params[:1]}, {"params": params[1:], "lr": lr / 2}]


def _run(opt_cls, kw, device, grads, skip=(), found_inf_on=()):
    """Train on `device`; steps in `skip` are left out, steps in
    `found_inf_on` get found_inf=1 (the sync-free way to skip)."""
    params = [t.clone().to(device).requires_grad_() for t in _init()]
    opt = opt_cls(_groups(params, kw["lr"]), **kw)
    for i, gs in enumerate(grads):
        if i in skip:
            continue
        for p, g in zip(params[:2], gs):
            p.grad = g.to(device)
        if found_inf_on:
            flag = torch.tensor(1.0 if i in found_inf_on else 0.0).to(device)
            opt.step(found_inf=flag)
        else:
            opt.step()
        if device.type == "xla":
            torch_xla.sync()
    return [p.detach().cpu() for p in params], opt



def _snapshot(opt):
    params = [p.detach().cpu().clone() for g in opt.param_groups for p in g["params"]]
    state = {id(p): {k: v.detach().cpu().clone() for k, v in st.items()}
             for p, st in opt.state.items()}
    return params, state
