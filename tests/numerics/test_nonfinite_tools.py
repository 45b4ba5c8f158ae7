"""watch_nonfinite (first module with an inf/NaN, found on the device) and
GradScaler.overflow_report (which gradients made the step skip)."""
import pytest
import torch
import torch_xla
from torch import nn

import xla_amp
from xla_amp import GradScaler, syncfree
from tests.support import clear_metrics, count
from tests.support.numerics_models import Exp, Risky, Sqrt


def overflowing_model(device):
    """exp overflows float32 only for large inputs (> 88)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Tanh(), Exp()), nn.Linear(8, 2))
    with torch.no_grad():
        m[0].weight.copy_(torch.eye(8, 4))
        m[0].bias.zero_()
    return m.to(device)


def _step(model, opt, x, scale=1.0):
    opt.zero_grad()
    loss = model(x * scale).float().pow(2).mean()
    loss.backward()
    opt.step()
    torch_xla.sync()


def test_watch_reports_the_first_overflowing_module_and_step(device):
    m = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Identity(), Exp()), nn.Linear(8, 2))
    m = m.to(device)
    with torch.no_grad():
        m[0].weight.copy_(torch.eye(8, 4, device=device))
        m[0].bias.zero_()
    watch = xla_amp.watch_nonfinite(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    x = torch.ones(2, 4, device=device)
    for _ in range(2):
        _step(m, opt, x)                 # exp(1): finite
    assert watch.report() is None
    _step(m, opt, x, scale=100.0)        # step 2: exp(100) = inf in float32
    _step(m, opt, x, scale=1000.0)       # later overflows do not replace it
    assert watch.report() == {"module": "1.1", "phase": "forward", "step": 2}
    watch.remove()
    assert not m._forward_hooks and not m[1][1]._forward_hooks and not m._forward_pre_hooks


def test_watch_backward_gradient(device):
    # sqrt(relu(x)) is finite forward; its gradient at relu's exact zeros is inf
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), Sqrt(), nn.Linear(4, 1)).to(device)
    with torch.no_grad():
        m[0].weight.copy_(-torch.eye(4, device=device))
        m[0].bias.zero_()
    watch = xla_amp.watch_nonfinite(m)
    x = torch.ones(2, 4, device=device)
    y = m(x)
    y.sum().backward()
    torch_xla.sync()
    # backward order: 3's output grad finite, 2's finite (from Linear), 1 (ReLU)'s inf
    assert watch.report() == {"module": "1", "phase": "backward", "step": 0}


def test_watch_adds_no_transfer_and_no_execution(device):
    m = overflowing_model(device)
    opt = syncfree.SGD(m.parameters(), lr=0.01)
    x = torch.randn(2, 4, device=device)
    _step(m, opt, x)  # compile both variants first
    watch = xla_amp.watch_nonfinite(m)
    _step(m, opt, x)
    _step(m, opt, x)
    clear_metrics()
    for _ in range(3):
        _step(m, opt, x)
    assert count("TransferFromDeviceTime") == 0
    assert count("ExecuteTime") == 3 and count("CompileTime") == 0
    assert watch.report() is None
    assert count("TransferFromDeviceTime") == 1  # the report's read
    watch.remove()


def test_watch_bad_input():
    with pytest.raises(TypeError, match="nn.Module"):
        xla_amp.watch_nonfinite(lambda x: x)
    with pytest.raises(ValueError, match=r"a device an xla_amp engine serves \(jax, xla; got"):
        xla_amp.watch_nonfinite(nn.Linear(2, 2))  # on the CPU


def _scaled_step(model, opt, scaler, x, poison=()):
    opt.zero_grad()
    with xla_amp.autocast(x.device, policy="tpu"):
        loss = model(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    for p in poison:
        p.grad.view(-1)[-1] = float("inf")
    scaler.step(opt)
    scaler.update()
    torch_xla.sync()


def test_overflow_report_names_exactly_the_poisoned_parameter(device):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
    opt = syncfree.AdamW(m.named_parameters(), lr=1e-3)
    scaler = GradScaler()
    x = torch.randn(3, 4, device=device)
    assert scaler.overflow_report(opt) == []
    _scaled_step(m, opt, scaler, x)
    assert scaler.overflow_report(opt) == []
    _scaled_step(m, opt, scaler, x, poison=[m[2].bias])
    assert scaler.overflow_report(opt) == ["2.bias"]
    _scaled_step(m, opt, scaler, x)  # clean again
    assert scaler.overflow_report(opt) == []
    assert scaler.overflow_report(opt, last_skipped=True) == ["2.bias"]
    assert scaler.skipped_steps() == 1


def test_overflow_report_without_names_and_no_extra_transfer(device):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).to(device)
    opt = syncfree.SGD([{"params": [m[0].weight, m[0].bias]},
                        {"params": [m[2].weight, m[2].bias]}], lr=0.1)
    scaler = GradScaler()
    x = torch.randn(3, 4, device=device)
    for poison in ((), (), [m[0].weight]):  # warm-up: every graph variant
        _scaled_step(m, opt, scaler, x, poison=poison)
    clear_metrics()
    _scaled_step(m, opt, scaler, x, poison=[m[0].weight])
    _scaled_step(m, opt, scaler, x)
    assert count("TransferFromDeviceTime") == 0 and count("CompileTime") == 0
    assert scaler.overflow_report(opt) == []
    assert scaler.overflow_report(opt, last_skipped=True) == ["group 0, index 0"]
    assert count("TransferFromDeviceTime") == 2


def test_overflow_report_names_parameters_in_the_optimizers_order_across_dtypes(device):
    """bf16 and float32 gradients are checked per dtype; the report still
    lists the parameters as the optimizer holds them."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).bfloat16(), nn.Linear(4, 2)).to(device)
    params = dict(m.named_parameters())
    opt = syncfree.SGD(m.named_parameters(), lr=0.1, stochastic_rounding=True)
    scaler = GradScaler()
    x = torch.randn(3, 4, device=device)
    for poisoned in (list(params)[::2], list(params)[1::3], []):
        _scaled_step(m, opt, scaler, x, poison=[params[n] for n in poisoned])
        assert scaler.overflow_report(opt) == poisoned
    assert scaler.overflow_report(opt, last_skipped=True) == list(params)[1::3]


def test_compare_flags_only_the_overflowing_module_and_suggest_fixes_it(device):
    torch.manual_seed(0)
    model = Risky().to(device)
    x = torch.randn(6, 8).to(device)  # (the CPU generator: XLA's RNG depends on earlier tests)
    running = model.bn.running_mean
    report = xla_amp.compare(model, x, policy="tpu")
    assert model.bn.running_mean is running  # the model is left as it was
    rows = {r["module"]: r for r in report.rows}
    assert set(rows) == {"", "inp", "block", "block.up", "block.norm", "bn", "head"}
    assert report.risky() == ["block.up"]
    assert rows["block.up"]["max_abs"] > 65504 and rows["block.up"]["overflow"]
    assert 0 < rows["inp"]["rel_error"] < 0.02  # bf16 rounding, not garbage
    assert report.suggest() == {"block.up": "fp32"}
    assert "| block.up |" in report.table() and "**yes**" in report.table()

    with xla_amp.autocast(device, policy="cuda"):
        assert not torch.isfinite(model(x)).all()  # fp16 overflows in block.up
    cuda = xla_amp.compare(model, x, policy="cuda")
    bad = {r["module"] for r in cuda.rows if r["nonfinite"]}
    assert "block.up" in bad and "inp" not in bad
    handle = xla_amp.module_policies(model, report.suggest())
    try:
        with xla_amp.autocast(device, policy="cuda"):
            y = model(x)
        assert torch.isfinite(y).all()
        fixed = xla_amp.compare(model, x, policy="cuda")
        assert not any(r["nonfinite"] for r in fixed.rows)
    finally:
        handle.remove()


def test_compare_names_an_input_on_another_device(device):
    model = nn.Linear(2, 2).to(device)
    with pytest.raises(ValueError, match=r"compare: input \[1\] \(shape \(1, 2\)\) is on "
                                         r"'cpu', the model on 'xla:0'"):
        xla_amp.compare(model, torch.ones(1, 2, device=device), torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"keyword argument \['mask'\]"):
        xla_amp.compare(model, torch.ones(1, 2, device=device), mask=torch.ones(1))
    with pytest.raises(ValueError, match="the model is on 'cpu'"):
        xla_amp.compare(nn.Linear(2, 2), torch.ones(1, 2, device=device))


def test_compare_bad_input(device):
    with pytest.raises(TypeError, match="nn.Module"):
        xla_amp.compare(lambda x: x, torch.ones(1, device=device))
    with pytest.raises(ValueError, match="no-such"):
        xla_amp.compare(nn.Linear(2, 2).to(device), torch.ones(1, 2, device=device),
                        policy="no-such")
