"""Per-step state of your own (an EMA of the weights kept by an optimizer
step hook) skips with the GradScaler's decision: inside the hook,
``scaler.found_inf_flags(optimizer)`` is this step's flag on the device, so
the hook can keep its state with torch.where and no sync."""
import torch
import torch_xla
from torch import nn

import xla_amp
from tests.support import clear_metrics, count
from xla_amp import syncfree


def _run(device, optimizer_class, factors):
    torch.manual_seed(0)
    model = nn.Linear(8, 4).to(device)
    opt = optimizer_class(model.parameters(), lr=0.1)
    scaler = xla_amp.GradScaler(init_scale=64.0)
    ema = [p.detach().clone() for p in model.parameters()]
    seen = []

    def hook(optimizer, args, kwargs):
        flags = scaler.found_inf_flags(optimizer)
        seen.append(len(flags))
        keep = sum(flags) != 0
        with torch.no_grad():
            for e, p in zip(ema, model.parameters()):
                e.copy_(torch.where(keep, e, 0.9 * e + 0.1 * p))

    opt.register_step_post_hook(hook)
    x, y = torch.randn(16, 8).to(device), torch.randn(16, 4).to(device)
    states = []
    for f in factors:
        factor = torch.tensor(f).to(device)
        torch_xla.sync()
        clear_metrics()
        loss = nn.functional.mse_loss(model(x), y) * factor
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        torch_xla.sync()
        transfers = count("TransferFromDeviceTime")
        states.append(([e.cpu() for e in ema], transfers))
    return states, seen


def test_a_step_hook_keeps_its_state_on_a_skipped_step(device):
    for optimizer_class in (syncfree.SGD, torch.optim.SGD):
        states, seen = _run(device, optimizer_class, [1.0, 1.0, float("inf"), 1.0])
        assert seen == [1, 1, 1, 1]  # the flag reached the hook on every step
        (e1, _), (e2, t2), (e3, t3), (e4, _) = states
        assert all(torch.equal(a, b) for a, b in zip(e2, e3))  # skipped: EMA kept
        assert not all(torch.equal(a, b) for a, b in zip(e1, e2))
        assert not all(torch.equal(a, b) for a, b in zip(e3, e4))
        assert t3 == 0  # decided on the device
