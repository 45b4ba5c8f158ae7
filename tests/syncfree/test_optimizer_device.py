"""Every xla_amp entry point that steps an optimizer refuses one whose
parameters are not on the XLA device, in one line naming the first such
parameter, before anything changes. (Lightning Fabric's canonical order
leaves an optimizer holding a model's host copies: before this, a step
trained nothing in silence, or failed with "No inf checks were recorded".)"""
import copy

import pytest
import torch
import torch_xla

import xla_amp
from xla_amp import GradScaler, syncfree
from xla_amp.integrations._hooks import Hooks
from xla_amp.integrations._mode import Mode

from tests.support import clear_metrics, count

SCALE = 2.0 ** 10


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def _stale(device):
    """Fabric's canonical order: the optimizer built on the host model,
    which then moved; the gradients land on the moved parameters."""
    host = _net()
    return host, torch.optim.SGD(host.parameters(), lr=0.1), copy.deepcopy(host).to(device)


def _mixed(device):
    """The moved model's parameters in group 0, one host tensor in group 1."""
    host = _net()
    model = copy.deepcopy(host).to(device)
    extra = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([{"params": list(model.parameters())}, {"params": [extra]}], lr=0.1)
    return torch.nn.ParameterList([extra]), opt, model


def _snapshot(*modules):
    out = [p.detach().cpu().clone() for m in modules for p in m.parameters()]
    return out + [p.grad.cpu().clone() for m in modules for p in m.parameters()
                  if p.grad is not None]


# entry point -> (its name in the message, mode of Hooks or None, call)
ENTRIES = {
    "GradScaler.step": ("GradScaler.step", None, lambda s, h, o: s.step(o)),
    "GradScaler.unscale_": ("GradScaler.unscale_", None, lambda s, h, o: s.unscale_(o)),
    "optimizer_step": ("optimizer_step", None, lambda s, h, o: xla_amp.optimizer_step(o, scaler=s)),
    "optimizer_step-no-scaler": ("optimizer_step", None,
                                 lambda s, h, o: xla_amp.optimizer_step(o)),
    "hooks-16-mixed-step": ("optimizer_step", "16-mixed", lambda s, h, o: h.step(o)),
    "hooks-16-mixed-unscale": ("GradScaler.unscale_", "16-mixed", lambda s, h, o: h.unscale(o)),
    "hooks-bf16-mixed-step": ("optimizer_step", "bf16-mixed", lambda s, h, o: h.step(o)),
    "hooks-check": ("xla_amp", "bf16-mixed", lambda s, h, o: h.check_optimizer(o)),
}


@pytest.mark.parametrize("case,culprit", [(_stale, (0, 0)), (_mixed, (1, 0))],
                         ids=["stale", "mixed"])
@pytest.mark.parametrize("entry", list(ENTRIES))
def test_an_optimizer_off_the_device_is_refused_before_anything_changes(entry, case, culprit,
                                                                        device):
    who, mode, call = ENTRIES[entry]
    hooks = None
    if mode is not None:
        hooks = Hooks(Mode(mode, **({"policy": "cuda", "scaler": {"init_scale": SCALE}}
                                    if mode == "16-mixed" else {})))
        scaler = hooks.scaler
    else:
        scaler = GradScaler(init_scale=SCALE)
    host, opt, model = case(device)
    loss = model(torch.ones(2, 4, device=device)).sum()
    (scaler.scale(loss) if scaler is not None else loss).backward()
    before = _snapshot(host, model)
    gi, pi = culprit
    with pytest.raises(ValueError) as err:
        call(scaler, hooks, opt)
    message = str(err.value)
    assert message.startswith(f"{who}: parameter {pi} of param group {gi} is on cpu, "
                              "not on the XLA device"), message
    assert "\n" not in message and "move the model to the XLA device" in message
    for a, b in zip(before, _snapshot(host, model)):  # parameters and gradients (not unscaled)
        assert torch.equal(a, b)
    assert not opt.state
    if scaler is not None:
        assert scaler.get_scale() == SCALE
        assert scaler.found_inf_flags(opt) == []  # nothing recorded: the iteration goes on
        moved = [p.detach().cpu().clone() for p in model.parameters()]
        scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
        scaler.update()
        assert not any(torch.equal(a, p.detach().cpu()) for a, p in zip(moved, model.parameters()))


def test_a_param_group_changed_after_steps_is_seen(device):
    """The check reads the param groups as they are at each call: a group
    added, or a parameter replaced in place, after steps that passed."""
    model = _net().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler(init_scale=SCALE)

    def step():
        scaler.scale(model(torch.ones(2, 4, device=device)).sum()).backward()
        scaler.step(opt)
        scaler.update()
        torch_xla.sync()

    step()
    opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]})
    with pytest.raises(ValueError, match="parameter 0 of param group 1 is on cpu"):
        step()
    opt.param_groups.pop()
    step()
    opt.param_groups[0]["params"][1] = torch.nn.Parameter(torch.ones(3))
    with pytest.raises(ValueError, match="parameter 1 of param group 0 is on cpu"):
        xla_amp.optimizer_step(opt, scaler=scaler)


@pytest.mark.parametrize("entry", ["scaler", "optimizer_step", "hooks"])
def test_an_optimizer_on_the_device_still_steps_in_one_graph_without_transfer(entry, device):
    model = _net().to(device)
    opt = syncfree.AdamW(model.parameters(), lr=0.01)
    hooks = Hooks(Mode("16-mixed", policy="cuda", scaler={"init_scale": SCALE}))
    scaler = hooks.scaler
    x = torch.ones(2, 4).to(device)
    torch_xla.sync()
    for i in range(5):
        if i == 2:  # after the compilations
            clear_metrics()
        opt.zero_grad()
        scaler.scale(model(x).sum()).backward()
        if entry == "scaler":
            scaler.step(opt)
            scaler.update()
        elif entry == "optimizer_step":
            xla_amp.optimizer_step(opt, scaler=scaler)
        else:
            hooks.step(opt)
        torch_xla.sync()
    assert count("ExecuteTime") == 3
    assert count("TransferFromDeviceTime") == 0
    assert count("CompileTime") == 0
