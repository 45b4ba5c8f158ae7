"""GradScaler faults that used to be silent, and the additions for long
runs: settings that take effect (no stale compiled constants), min_scale,
skipped_steps(), long overflow streaks, NaN losses, exact resume."""
import copy
import io
import os
import subprocess
import sys

import pytest
import torch
import torch_xla

from xla_amp import GradScaler, syncfree

from tests.support import clear_metrics as _clear_metrics, count as _count
from tests.support.scaler import INF, _data, _make, _restore, _train

from tests.support.launch import ROOT  # noqa: E402


def _run(device, scaler, steps, opt_cls=syncfree.SGD, pattern=None, seed=0):
    model = _make(device, seed)
    opt = opt_cls(model.parameters(), lr=0.01)
    return _train(model, opt, scaler, device, pattern=pattern or "F" * steps)


def _reference(pattern, **kw):
    """torch.amp.GradScaler's scale after each update, on the CPU."""
    model = _make("cpu")
    return _train(model, torch.optim.SGD(model.parameters(), lr=0.01),
                  torch.amp.GradScaler("cpu", **kw), torch.device("cpu"), pattern=pattern)


def test_second_scaler_with_other_interval_is_not_stale(device):
    """The defect: torch._amp_update_scale_'s XLA node kept the factors out of
    the graph hash, so a second scaler with the same graph shape reused the
    first one's growth_interval (interval 2 never grew after 2000)."""
    first = _run(device, GradScaler(init_scale=1024.0, growth_interval=2000), 6)
    assert first == [1024.0] * 6
    second = _run(device, GradScaler(init_scale=1024.0, growth_interval=2), 6)
    assert second == [1024.0, 2048.0, 2048.0, 4096.0, 4096.0, 8192.0]
    third = _run(device, GradScaler(init_scale=1024.0, growth_factor=4.0, growth_interval=3), 6)
    assert third == [1024.0, 1024.0, 4096.0, 4096.0, 4096.0, 16384.0]


@pytest.mark.parametrize("kw", [dict(init_scale=1000.0, growth_factor=1.7, backoff_factor=0.3,
                                     growth_interval=3),
                                dict(init_scale=3.0, growth_factor=3.0, backoff_factor=0.9,
                                     growth_interval=1)])
def test_trace_equals_torch_amp_with_odd_factors(device, kw):
    pattern = "FFFOFFFFOOFFFFFF"
    ours = _run(device, GradScaler(**kw), len(pattern), pattern=pattern)
    assert ours == _reference(pattern, **kw)


def test_setters_and_loaded_settings_take_effect_without_recompiling(device):
    model = _make(device)
    opt = syncfree.SGD(model.parameters(), lr=0.01)
    scaler = GradScaler(init_scale=8.0, growth_interval=1000)
    # warm-up compiles both step variants (clean, overflow)
    assert _train(model, opt, scaler, device, pattern="FOFF") == [8.0, 4.0, 4.0, 4.0]
    _clear_metrics()
    scaler.set_growth_interval(4)  # the tracker is at 2
    scaler.set_growth_factor(3.0)
    assert _train(model, opt, scaler, device, pattern="FF") == [4.0, 12.0]
    scaler.set_backoff_factor(0.25)
    assert _train(model, opt, scaler, device, pattern="O") == [3.0]
    assert _count("CompileTime") == 0
    # A load uploads the scaler's tensors afresh; PyTorch/XLA inlines an
    # uploaded 0-dim 0 or 1 (the growth tracker) as a constant, so the next
    # step compiles once -- the settings themselves are graph inputs.
    scaler.load_state_dict({**scaler.state_dict(), "growth_interval": 2, "growth_factor": 5.0})
    assert _train(model, opt, scaler, device, pattern="FF") == [3.0, 15.0]
    assert _count("CompileTime") <= 1


@pytest.mark.parametrize("opt_cls", [syncfree.SGD, syncfree.Adam, syncfree.AdamW])
@pytest.mark.parametrize("where", ["loss", "input"])
def test_hundred_overflows_change_nothing_and_stop_at_min_scale(device, opt_cls, where):
    model = _make(device)
    opt = opt_cls(model.parameters(), lr=0.01)
    scaler = GradScaler(init_scale=2.0 ** 16, min_scale=1.0)
    _train(model, opt, scaler, device, pattern="FF")
    before = ([p.detach().cpu().clone() for p in model.parameters()],
              copy.deepcopy(opt.state_dict()))
    x, y = _data(1)[0]
    x, y = x.to(device), y.to(device)
    inf = torch.tensor(INF).to(device)
    torch_xla.sync()
    _clear_metrics()
    for _ in range(100):
        opt.zero_grad()
        if where == "loss":
            loss = torch.nn.functional.mse_loss(model(x), y) * inf
        else:
            loss = torch.nn.functional.mse_loss(model(x * inf), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch_xla.sync()
    assert _count("TransferFromDeviceTime") == 0
    for a, b in zip(before[0], model.parameters()):
        assert torch.equal(a, b.detach().cpu())
    after = opt.state_dict()
    for k, st in before[1]["state"].items():
        for n, v in st.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(after["state"][k][n])), n
    assert scaler.get_scale() == 1.0  # 2^16 halved 16 times, then held
    assert scaler.skipped_steps() == 100


def test_without_min_scale_the_scale_keeps_backing_off(device):
    scaler = GradScaler(init_scale=2.0 ** 16)
    assert _run(device, scaler, 20, pattern="O" * 20)[-1] == 2.0 ** -4
    assert scaler.skipped_steps() == 20 and scaler.get_min_scale() is None


def test_min_scale_above_the_scale_is_refused_everywhere(device):
    """A scale under its floor never backs off: every overflowing step was
    skipped at that scale for good (GradScaler(init_scale=1024,
    min_scale=4096) used to be accepted). Refused by the constructor,
    load_state_dict and a float update(new_scale), the scaler unchanged; a
    tensor new_scale (not read back) below the floor stays, not raised."""
    with pytest.raises(ValueError, match=r"min_scale \(4096\) must not exceed init_scale"):
        GradScaler(init_scale=1024.0, min_scale=4096.0)
    scaler = GradScaler(init_scale=8.0, min_scale=4.0)
    with pytest.raises(ValueError, match=r"min_scale \(16\) must not exceed scale \(8\)"):
        scaler.load_state_dict({**scaler.state_dict(), "min_scale": 16.0})
    assert scaler.get_min_scale() == 4.0
    assert _run(device, scaler, 3, pattern="OOO") == [4.0, 4.0, 4.0]  # the floor holds
    with pytest.raises(ValueError, match="must not exceed new_scale"):
        scaler.update(new_scale=2.0)
    scaler.update(new_scale=torch.full((), 2.0, device=device))
    assert _run(device, scaler, 1, pattern="O") == [2.0]


def test_nan_loss_is_skipped(device):
    model = _make(device)
    opt = syncfree.Adam(model.parameters(), lr=0.01)
    scaler = GradScaler(init_scale=8.0)
    before = [p.detach().cpu().clone() for p in model.parameters()]
    x, y = (t.to(device) for t in _data(1)[0])
    loss = torch.nn.functional.mse_loss(model(x), y) * torch.tensor(float("nan")).to(device)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    torch_xla.sync()
    assert all(torch.equal(a, b.detach().cpu()) for a, b in zip(before, model.parameters()))
    assert scaler.get_scale() == 4.0 and scaler.skipped_steps() == 1


def test_skipped_steps_and_min_scale_round_trip():
    scaler = GradScaler(min_scale=2.0)
    scaler.load_state_dict({**scaler.state_dict(), "_skipped_steps": 7})
    sd = scaler.state_dict()
    assert (sd["min_scale"], sd["_skipped_steps"]) == (2.0, 7)
    torch_dict = torch.amp.GradScaler("cpu").state_dict()  # no additions: None and 0
    scaler.load_state_dict(torch_dict)
    assert scaler.get_min_scale() is None and scaler.skipped_steps() == 0


PATTERN = "FFOFFFFOFF"
KW = dict(init_scale=2.0 ** 10, growth_interval=2, min_scale=64.0)


def _checkpoint_after(device, k):
    model = _make(device)
    opt = syncfree.Adam(model.parameters(), lr=0.01)
    scaler = GradScaler(**KW)
    _train(model, opt, scaler, device, pattern=PATTERN[:k])
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "scaler": scaler.state_dict()}, buf)
    rest = _train(model, opt, scaler, device, pattern=PATTERN[k:], start=k)
    return buf.getvalue(), rest, [p.detach().cpu() for p in model.parameters()]


def _resume(device, blob, k):
    ck = torch.load(io.BytesIO(blob), weights_only=True)
    model, opt, scaler = _restore(device, ck, seed=9)
    rest = _train(model, opt, scaler, device, pattern=PATTERN[k:], start=k)
    return rest, [p.detach().cpu() for p in model.parameters()], scaler.skipped_steps()


def test_resume_after_other_scalers_ran_in_the_process(device):
    blob, rest, params = _checkpoint_after(device, 4)
    # other scalers and optimizers with other settings, same graph shapes
    _run(device, GradScaler(init_scale=3.0, growth_interval=1), 4, opt_cls=syncfree.Adam)
    _run(device, GradScaler(backoff_factor=0.125, growth_interval=7), 4, pattern="OFOF",
         opt_cls=syncfree.Adam)
    rest2, params2, skipped = _resume(device, blob, 4)
    assert rest2 == rest and skipped == 2
    assert all(torch.equal(a, b) for a, b in zip(params, params2))


def test_resume_in_a_fresh_process(device, tmp_path):
    blob, rest, params = _checkpoint_after(device, 5)
    (tmp_path / "ck.pt").write_bytes(blob)
    code = (
        "import torch, torch_xla, xla_amp\n"
        "from tests.scaler.test_scaler_faults import _resume\n"
        f"rest, params, skipped = _resume(torch_xla.device(), open({str(tmp_path / 'ck.pt')!r}, 'rb').read(), 5)\n"
        f"torch.save((rest, params, skipped), {str(tmp_path / 'out.pt')!r})\n")
    env = dict(os.environ, PJRT_DEVICE="CPU")  # (cwd: the checkout, where tests/ is a package)
    env.pop("CPU_NUM_DEVICES", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rest2, params2, skipped = torch.load(tmp_path / "out.pt", weights_only=True)
    assert rest2 == rest and skipped == 2
    assert all(torch.equal(a, b) for a, b in zip(params, params2))
