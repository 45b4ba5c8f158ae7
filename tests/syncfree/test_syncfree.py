"""xla_amp.syncfree: parity with torch.optim, device-side skip, state dicts,
learning-rate schedules, hooks (the paths and bad input: test_syncfree_paths.py)."""
import copy
import itertools

import pytest
import torch
import torch.optim.optimizer as torch_optimizer
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met

from xla_amp import syncfree

from tests.support import clear_metrics as _clear_metrics
from tests.support.syncfree import _grads, _groups, _init, _run, _snapshot, sf  # noqa: F401 (sf: a fixture)


def _sgd_cases():
    for momentum, dampening, nesterov, wd, maximize in itertools.product(
            [0.0, 0.9], [0.0, 0.5], [False, True], [0.0, 0.1], [False, True]):
        if nesterov and (momentum == 0 or dampening != 0):
            continue
        if momentum == 0 and dampening != 0:
            continue  # dampening is unused without momentum
        yield dict(lr=0.05, momentum=momentum, dampening=dampening, nesterov=nesterov,
                   weight_decay=wd, maximize=maximize)


def _adam_cases():
    for wd, amsgrad, maximize in itertools.product([0.0, 0.1], [False, True], [False, True]):
        yield dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=wd,
                   amsgrad=amsgrad, maximize=maximize)


CASES = ([("SGD", kw) for kw in _sgd_cases()]
         + [("Adam", kw) for kw in _adam_cases()]
         + [("AdamW", kw) for kw in _adam_cases()])


def _case_id(case):
    name, kw = case
    return name + "-" + "-".join(f"{k}={v}" for k, v in kw.items() if k not in ("lr", "eps", "betas"))


@pytest.mark.parametrize("case", CASES, ids=[_case_id(c) for c in CASES])
def test_parity_with_torch_optim(case, device, sf):
    name, kw = case
    grads = _grads()
    ref, _ = _run(getattr(torch.optim, name), kw, torch.device("cpu"), grads)
    out, _ = _run(getattr(sf, name), kw, device, grads)
    for r, o in zip(ref, out):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-6)
    assert torch.equal(out[2], _init()[2])  # no grad: untouched


@pytest.mark.parametrize("name,kw", [
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.5)),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("AdamW", dict(lr=0.01)),
])
def test_found_inf_skips_like_a_missing_step(name, kw, device, sf):
    # skipping step 0 (state not created yet in torch.optim) and step 3
    grads = _grads(8)
    ref, _ = _run(getattr(torch.optim, name), kw, torch.device("cpu"), grads, skip={0, 3})
    out, opt = _run(getattr(sf, name), kw, device, grads, found_inf_on={0, 3})
    for r, o in zip(ref, out):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-6)




@pytest.mark.parametrize("name,kw", [
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1)),
    ("Adam", dict(lr=0.01, amsgrad=True, weight_decay=0.1)),
    ("AdamW", dict(lr=0.01, maximize=True)),
])
def test_skip_is_bit_exact(name, kw, device, sf):
    _, opt = _run(getattr(sf, name), kw, device, _grads(3))
    before = _snapshot(opt)
    params = [p for g in opt.param_groups for p in g["params"]]
    for p in params[:2]:
        p.grad = torch.full_like(p, float("inf"))
    opt.step(found_inf=torch.tensor(1.0).to(device))
    torch_xla.sync()
    after = _snapshot(opt)
    for a, b in zip(before[0], after[0]):
        assert torch.equal(a, b)
    assert before[1].keys() == after[1].keys()
    for pid, st in before[1].items():
        assert st.keys() == after[1][pid].keys()
        for k in st:
            assert torch.equal(st[k], after[1][pid][k]), k


def test_first_step_skipped_leaves_no_momentum_buffer(device, sf):
    p = torch.ones(3, device=device, requires_grad=True)
    opt = sf.SGD([p], lr=0.1, momentum=0.9)
    p.grad = torch.full((3,), float("nan"), device=device)
    opt.step(found_inf=torch.tensor(2.0).to(device))
    torch_xla.sync()
    assert opt.state_dict()["state"] == {} or "momentum_buffer" not in opt.state_dict()["state"][0]
    assert torch.equal(p.detach().cpu(), torch.ones(3))


@pytest.mark.parametrize("name,kw", [
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.3)),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("AdamW", dict(lr=0.01, weight_decay=0.05)),
])
def test_state_dict_round_trip_and_torch_optim_twin(name, kw, device, sf):
    grads = _grads(10)
    first, rest = grads[:5], grads[5:]

    def continue_run(opt_cls, state_dict):
        params = [t.clone().to(device).requires_grad_() for t in _init()]
        opt = opt_cls(_groups(params, kw["lr"]), **kw)
        for i, gs in enumerate(first):  # the same parameters as when saved ...
            for p, g in zip(params[:2], gs):
                p.grad = g.to(device)
            opt.step()
            torch_xla.sync()
        opt2 = opt_cls(_groups(params, kw["lr"]), **kw)  # ... a fresh optimizer
        # deepcopy: like torch.optim, loading shares tensors with the dict
        opt2.load_state_dict(copy.deepcopy(state_dict))
        for gs in rest:
            for p, g in zip(params[:2], gs):
                p.grad = g.to(device)
            opt2.step()
            torch_xla.sync()
        return [p.detach().cpu() for p in params]

    ours_cls, torch_cls = getattr(sf, name), getattr(torch.optim, name)
    full_ours, _ = _run(ours_cls, kw, device, grads)
    _, ours5 = _run(ours_cls, kw, device, first)
    _, torch5 = _run(torch_cls, kw, device, first)
    sd_ours, sd_torch = ours5.state_dict(), torch5.state_dict()

    # same format as torch.optim
    assert sd_ours["state"].keys() == sd_torch["state"].keys()
    for k in sd_torch["state"]:
        assert sd_ours["state"][k].keys() == sd_torch["state"][k].keys()
        if "step" in sd_torch["state"][k]:
            assert sd_ours["state"][k]["step"].device.type == "cpu"
            assert float(sd_ours["state"][k]["step"]) == float(sd_torch["state"][k]["step"])
    for go, gt in zip(sd_ours["param_groups"], sd_torch["param_groups"]):
        assert go.keys() == gt.keys()

    # syncfree -> syncfree: bit-identical continuation
    for a, b in zip(continue_run(ours_cls, sd_ours), full_ours):
        assert torch.equal(a, b)
    # torch.optim -> syncfree and syncfree -> torch.optim
    for a, b in zip(continue_run(ours_cls, sd_torch), full_ours):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(continue_run(torch_cls, sd_ours), full_ours):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name,sched", [
    ("SGD", "exp"), ("AdamW", "exp"),
    # lr held, then changed; lr = 1e-3 = 1 - beta2 at first (equal values
    # must not merge graph inputs)
    ("Adam", "step"),
])
def test_lr_schedule_does_not_recompile_or_sync(name, sched, device, sf):
    params = [t.clone().to(device).requires_grad_() for t in _init()]
    kw = dict(lr=0.1, momentum=0.9) if name == "SGD" else dict(lr=1e-3)
    opt = getattr(sf, name)(params, **kw)
    if sched == "exp":
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    else:
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    grads = [[g.to(device) for g in gs] for gs in _grads(10)]
    flags = [torch.tensor(float(i % 3 == 2)).to(device) for i in range(10)]
    torch_xla.sync()
    for i in range(10):
        if i == 2:
            _clear_metrics()
        for p, g in zip(params, grads[i]):
            p.grad = g
        opt.step(found_inf=flags[i])
        sched.step()
        torch_xla.sync()
    xm.wait_device_ops()
    assert (met.metric_data("CompileTime") or [0])[0] == 0
    assert (met.metric_data("TransferFromDeviceTime") or [0])[0] == 0
    assert (met.metric_data("ExecuteTime") or [0])[0] == 8




def test_step_hooks_and_profiler_range_still_work(device):
    p = torch.ones(2, device=device, requires_grad=True)
    opt = syncfree.SGD([p], lr=0.5, momentum=0.9)
    seen = []
    handles = [
        opt.register_step_pre_hook(lambda o, a, k: seen.append("pre")),
        opt.register_step_post_hook(lambda o, a, k: seen.append("post")),
        torch_optimizer.register_optimizer_step_pre_hook(
            lambda o, a, k: seen.append("global-pre")),
    ]
    p.grad = torch.ones(2, device=device)
    opt.step()
    assert seen == ["global-pre", "pre", "post"]
    for h in handles:
        h.remove()
    seen.clear()
    opt.step()
    assert seen == []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    assert "Optimizer.step#SGD.step" in {e.name for e in prof.events()}
    torch_xla.sync()
    assert torch.allclose(p.detach().cpu(), torch.tensor([1.0 - 0.5 * (1 + 1.9 + 2.71)] * 2))


def test_closure_is_evaluated(device):
    p = torch.tensor([1.0, 2.0], device=device, requires_grad=True)
    opt = syncfree.SGD([p], lr=0.5)

    def closure():
        opt.zero_grad()
        loss = (p * p).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    torch_xla.sync()
    assert float(loss.detach()) == 5.0
    assert torch.equal(p.detach().cpu(), torch.tensor([0.0, 0.0]))


# -- bad input ----------------------------------------------------------------
