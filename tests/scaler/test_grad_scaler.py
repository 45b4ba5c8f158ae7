"""xla_amp.GradScaler: torch.amp.GradScaler's schedule, without syncs."""
import copy
import warnings

import pytest
import torch
import torch_xla

import xla_amp
from xla_amp import GradScaler, syncfree

from tests.support import clear_metrics as _clear_metrics, count as _count
from tests.support.scaler import INF, PATTERN, _data, _make, _restore, _train

KW = dict(init_scale=2.0 ** 10, growth_interval=3)


@pytest.mark.parametrize("opt_name,okw", [("SGD", dict(lr=0.1, momentum=0.9)),
                                          ("Adam", dict(lr=0.01))])
def test_scale_trace_and_params_match_torch_amp(opt_name, okw, device):
    ref_model = _make("cpu")
    ref_opt = getattr(torch.optim, opt_name)(ref_model.parameters(), **okw)
    ref = _train(ref_model, ref_opt, torch.amp.GradScaler("cpu", **KW), torch.device("cpu"))

    model = _make(device)
    opt = getattr(syncfree, opt_name)(model.parameters(), **okw)
    scaler = GradScaler(**KW)
    ours = _train(model, opt, scaler, device)
    assert ours == ref
    for a, b in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)


def test_one_graph_no_transfer_per_step(device):
    model = _make(device)
    opt = syncfree.AdamW(model.parameters(), lr=0.01)
    scaler = GradScaler(**KW)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)
    data = [(x.to(device), y.to(device)) for x, y in _data()]
    # device-side factors: a Python inf would be a graph constant
    factor = {"O": torch.tensor(INF).to(device), "F": torch.tensor(1.0).to(device)}
    torch_xla.sync()
    for i, c in enumerate(PATTERN[:10]):
        if i == 3:  # after warm-up; step 4 overflows
            _clear_metrics()
        x, y = data[i]
        opt.zero_grad()
        with xla_amp.autocast(device):
            loss = torch.nn.functional.mse_loss(model(x * factor[c]), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        torch_xla.sync()
    assert _count("TransferFromDeviceTime") == 0
    assert _count("ExecuteTime") == 7
    assert _count("CompileTime") == 0


def test_unscale_then_clip_grad_norm(device):
    ref_model = _make("cpu")
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    ref = _train(ref_model, ref_opt, torch.amp.GradScaler("cpu", **KW), torch.device("cpu"),
                 pattern="FFOFF", clip=0.05)
    model = _make(device)
    opt = syncfree.SGD(model.parameters(), lr=0.1)
    ours = _train(model, opt, GradScaler(**KW), device, pattern="FFOFF", clip=0.05)
    assert ours == ref
    for a, b in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-5, atol=1e-6)  # unscaled


def _two_optimizers(device, opt_cls, scaler):
    model = _make(device)
    opt1 = opt_cls(model[0].parameters(), lr=0.1)
    opt2 = opt_cls(model[2].parameters(), lr=0.1)
    data = _data(4)
    scales = []
    for i in range(4):
        x, y = data[i]
        opt1.zero_grad()
        opt2.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x.to(device)), y.to(device))
        scaler.scale(loss).backward()
        if i == 2:  # overflow in opt1's gradients only
            model[0].weight.grad[0, 0] = INF
        scaler.step(opt1)
        scaler.step(opt2)
        scaler.update()
        scales.append(scaler.get_scale())
    return model, scales


def test_two_optimizers_share_one_scaler(device):
    ref_model, ref_scales = _two_optimizers("cpu", torch.optim.SGD,
                                            torch.amp.GradScaler("cpu", **KW))
    model, scales = _two_optimizers(device, syncfree.SGD, GradScaler(**KW))
    assert scales == ref_scales
    for a, b in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)


def test_disabled_passes_through(device):
    scaler = GradScaler(enabled=False)
    model = _make(device)
    opt = syncfree.SGD(model.parameters(), lr=0.1)
    loss = model(torch.ones(2, 4, device=device)).sum()
    assert scaler.scale(loss) is loss
    loss.backward()
    g = model[0].weight.grad.cpu()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    torch_xla.sync()
    assert not scaler.is_enabled()
    assert scaler.get_scale() == 1.0
    assert scaler.state_dict() == {}
    torch.testing.assert_close(model[0].weight.grad.cpu(), g)  # not unscaled


def test_checkpoint_and_resume_bit_identical(device):
    data = _data()
    model = _make(device)
    opt = syncfree.Adam(model.parameters(), lr=0.01)
    scaler = GradScaler(**KW)
    _train(model, opt, scaler, device, pattern=PATTERN[:8], data=data)
    ckpt = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(),
                          "scaler": scaler.state_dict()})
    full = _train(model, opt, scaler, device, pattern=PATTERN[8:], data=data, start=8)

    model2, opt2, scaler2 = _restore(device, ckpt, seed=5)
    resumed = _train(model2, opt2, scaler2, device, pattern=PATTERN[8:], data=data, start=8)
    assert resumed == full
    assert scaler2.state_dict() == scaler.state_dict()
    for a, b in zip(model.parameters(), model2.parameters()):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())


def test_state_dict_format_matches_torch_amp(device):
    ref = torch.amp.GradScaler("cpu", **KW)
    ours = GradScaler(**KW)
    # torch.amp's keys and values, plus the two additions (which torch.amp's
    # load_state_dict ignores)
    sd = ours.state_dict()
    assert {k: sd[k] for k in ref.state_dict()} == ref.state_dict()
    assert set(sd) - set(ref.state_dict()) == {"min_scale", "_skipped_steps"}
    assert (sd["min_scale"], sd["_skipped_steps"]) == (None, 0)
    ref.load_state_dict(sd)
    ours.load_state_dict({**ref.state_dict(), "scale": 8.0, "_growth_tracker": 2})
    assert ours.get_scale() == 8.0
    ours.scale(torch.ones((), device=device))
    assert ours.state_dict()["scale"] == 8.0 and ours.state_dict()["_growth_tracker"] == 2
    with pytest.raises(RuntimeError, match="empty"):
        ours.load_state_dict({})


def test_other_optimizers_masked_without_sync(device):
    """torch.optim optimizers with device-side state: sync-free after the
    first step (which creates their state), correct throughout."""
    for name, kw in [("SGD", dict(lr=0.1, momentum=0.9)),
                     ("RMSprop", dict(lr=0.01, momentum=0.5, centered=True))]:
        ref_model = _make("cpu")
        ref_opt = getattr(torch.optim, name)(ref_model.parameters(), **kw)
        ref = _train(ref_model, ref_opt, torch.amp.GradScaler("cpu", **KW),
                     torch.device("cpu"), pattern="OFFOFOFF")
        model = _make(device)
        if name == "RMSprop":
            kw = dict(kw, capturable=True)  # step count on the device
        opt = getattr(torch.optim, name)(model.parameters(), **kw)
        scaler = GradScaler(**KW)
        # first steps create the state (one read of found_inf each)
        ours = _train(model, opt, scaler, device, pattern="OF")
        _clear_metrics()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no host-state warning
            ours += _train(model, opt, scaler, device, pattern="FOFOFF", sync=False, start=2)
        torch_xla.sync()
        assert _count("TransferFromDeviceTime") == 0, name
        assert scaler.get_scale() == ref[-1]
        for a, b in zip(model.parameters(), ref_model.parameters()):
            torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)


def test_host_state_optimizer_is_correct_and_warns_once(device):
    # torch.optim.Adam without capturable keeps its step count on the host
    ref_model = _make("cpu")
    ref_opt = torch.optim.Adam(ref_model.parameters(), lr=0.01)
    ref = _train(ref_model, ref_opt, torch.amp.GradScaler("cpu", **KW), torch.device("cpu"),
                 pattern="FOFFO")
    model = _make(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    with pytest.warns(UserWarning, match="keeps part of its state on the host") as rec:
        ours = _train(model, opt, GradScaler(**KW), device, pattern="FOFFO")
    assert sum("keeps part of its state" in str(w.message) for w in rec) == 1
    assert ours == ref
    for a, b in zip(model.parameters(), ref_model.parameters()):
        torch.testing.assert_close(a.detach().cpu(), b.detach(), rtol=1e-5, atol=1e-6)
    assert opt.state_dict()["state"][0]["step"] == ref_opt.state_dict()["state"][0]["step"]


# -- bad input ----------------------------------------------------------------

def _scaled_backward(model, scaler, device):
    loss = model(torch.ones(2, 4, device=device)).sum()
    scaler.scale(loss).backward()


def test_misuse_raises_runtime_error(device):
    model = _make(device)
    opt = syncfree.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler()
    with pytest.raises(RuntimeError, match="before scale"):
        scaler.step(opt)
    _scaled_backward(model, scaler, device)
    with pytest.raises(RuntimeError, match="no inf checks"):
        scaler.update()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(opt, closure=lambda: None)
    scaler.update()
    with pytest.raises(RuntimeError, match="no inf checks"):
        scaler.update()  # update twice: nothing recorded since the last update


def test_a_none_closure_passed_positionally_is_no_closure(device):
    """torch.amp.GradScaler.step(opt, None) steps (Accelerate's prepared
    optimizer calls ``scaler.step(optimizer, closure)`` with closure=None);
    a real closure is refused either way, before anything changes."""
    model = _make(device)
    opt = syncfree.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler()
    _scaled_backward(model, scaler, device)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="Closure"):
        scaler.step(opt, lambda: None)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(before, model.parameters()))
    scaler.step(opt, None)
    scaler.update()
    assert not all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(before, model.parameters()))


def test_params_not_on_xla_rejected(device):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler()
    with pytest.raises(ValueError, match="not on an XLA device"):
        scaler.scale(model(torch.ones(1, 2)).sum())
    scaler.scale(torch.ones((), device=device))
    model(torch.ones(1, 2)).sum().backward()
    with pytest.raises(ValueError, match="parameter 0 of param group 0"):
        scaler.unscale_(opt)
    with pytest.raises(ValueError, match="growth_factor"):
        GradScaler(growth_factor=0.5)


def test_torch_xla_syncfree_optimizer_gets_found_inf(device):
    import torch_xla.amp.syncfree as txs
    model = _make(device)
    opt = txs.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = GradScaler(**KW)
    _train(model, opt, scaler, device, pattern="FF")
    _clear_metrics()
    _train(model, opt, scaler, device, pattern="OFF", sync=False, start=2)
    torch_xla.sync()
    assert _count("TransferFromDeviceTime") == 0


def test_get_scale_tensor_reads_without_transfer(device):
    import torch_xla.debug.metrics as met
    scaler = xla_amp.GradScaler(init_scale=512.0)
    assert scaler.get_scale_tensor() is None  # created by the first scale()
    loss = torch.ones((), device=device)
    scaler.scale(loss)
    torch_xla.sync()
    met.clear_all()
    t = scaler.get_scale_tensor()
    assert t.device.type == "xla" and t.dim() == 0
    assert met.metric_data("TransferFromDeviceTime") is None
    assert float(t.cpu()) == 512.0
    assert xla_amp.GradScaler(enabled=False).get_scale_tensor() is None
