"""xla_amp.syncfree: which path runs (the fused op, the portable one, mixed
groups), parameters stepping at different times, and bad input at step."""
import copy

import pytest
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met

from xla_amp import syncfree

from tests.support import clear_metrics as _clear_metrics
from tests.support.syncfree import sf  # noqa: F401 (a fixture)


@pytest.mark.parametrize("name,kw", [
    ("SGD", dict(momentum=0.9, weight_decay=0.1)),
    ("Adam", dict(weight_decay=0.1)),
    ("AdamW", dict(amsgrad=True)),
])
def test_fused_lr_of_exactly_zero_or_one_neither_recompiles_nor_changes_bits(name, kw, device):
    # PyTorch/XLA inlines the doubles 0.0 and 1.0 as graph constants; the
    # fused path passes the nearest other doubles. Control: the raw fused
    # op called with the exact values.
    lrs = [0.1, 0.2, 0.3, 0.0, 0.4, 1.0, 0.0, 0.5]
    init = torch.randn(6, generator=torch.Generator().manual_seed(0))
    grads = [torch.randn(6, generator=torch.Generator().manual_seed(i)) for i in range(len(lrs))]
    flag = torch.tensor(0.0).to(device)

    p = init.clone().to(device).requires_grad_()
    opt = getattr(syncfree, name)([p], lr=0.1, fused=True, **kw)
    compiles = []
    for lr, g in zip(lrs, grads):
        _clear_metrics()
        opt.param_groups[0]["lr"] = lr
        p.grad = g.to(device)
        opt.step(found_inf=flag)
        torch_xla.sync()
        xm.wait_device_ops()
        compiles.append((met.metric_data("CompileTime") or [0])[0])
    assert compiles[2:] == [0] * (len(lrs) - 2)

    q = init.clone().to(device)
    state = [torch.zeros((), device=device)] + [torch.zeros(6, device=device) for _ in range(3)]
    xlac = torch_xla._XLAC
    for lr, g in zip(lrs, grads):
        if name == "SGD":
            xlac._xla_sgd_optimizer_step_(flag, state[0], q, state[1], g.to(device),
                                          0.1, 0.9, lr, 0.0, False, False)
        else:
            xlac._xla_adam_optimizer_step_(
                flag, state[0], q, g.to(device), state[1], state[2], state[3],
                0.9, 0.999, lr, kw.get("weight_decay", 1e-2), 1e-8, kw.get("amsgrad", False),
                False, name == "AdamW")
        torch_xla.sync()
    assert torch.equal(p.detach().cpu().view(torch.int32), q.cpu().view(torch.int32))




@pytest.mark.parametrize("cls", [syncfree.SGD, syncfree.Adam, syncfree.AdamW])
def test_params_not_on_xla_rejected(cls, device):
    with pytest.raises(ValueError, match="not on an XLA device"):
        cls([torch.zeros(2, requires_grad=True)], lr=0.1)
    opt = cls([torch.zeros(2, device=device, requires_grad=True)], lr=0.1)
    with pytest.raises(ValueError, match="parameter 0 of param group 1"):
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)]})
    assert len(opt.param_groups) == 1


@pytest.mark.parametrize("bad,match", [
    (torch.zeros(1), "0-dim"),          # shape (1,), also on the host
    ("cpu-scalar", "is on 'cpu'"),
    (1.0, "0-dim tensor"),
])
def test_bad_found_inf_rejected_and_changes_nothing(bad, match, device):
    if isinstance(bad, str):
        bad = torch.tensor(0.0)
    elif isinstance(bad, torch.Tensor):
        bad = bad.to(device)
    p = torch.ones(3, device=device, requires_grad=True)
    opt = syncfree.Adam([p], lr=0.1)
    p.grad = torch.ones(3, device=device)
    with pytest.raises(ValueError, match=match):
        opt.step(found_inf=bad)
    torch_xla.sync()
    assert len(opt.state) == 0
    assert torch.equal(p.detach().cpu(), torch.ones(3))


def _shape_mismatch(p, device):
    p.grad = torch.ones_like(p)
    p.data = torch.ones(7, device=device)  # the gradient no longer fits


@pytest.mark.parametrize("spoil,match", [
    (_shape_mismatch, r"gradient of parameter 1 of param group 0 has shape \(3,\)"),
])
def test_unusable_parameter_at_step_rejected_and_changes_nothing(spoil, match, sf, device):
    good = torch.ones(3, device=device, requires_grad=True)
    other = torch.ones(3, device=device, requires_grad=True)
    opt = sf.Adam([good, other], lr=0.1)
    good.grad = torch.ones(3, device=device)
    spoil(other, device)
    with pytest.raises(ValueError, match=match):
        opt.step(found_inf=torch.tensor(0.0).to(device))
    torch_xla.sync()
    assert len(opt.state) == 0
    assert torch.equal(good.detach().cpu(), torch.ones(3))


def test_bad_hyperparameters_rejected(device):
    p = [torch.zeros(2, device=device, requires_grad=True)]
    with pytest.raises(ValueError, match="Nesterov"):
        syncfree.SGD(p, lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="beta parameter at index 1"):
        syncfree.Adam(p, betas=(0.9, 1.0))
    with pytest.raises(ValueError, match="learning rate"):
        syncfree.AdamW(p, lr=-1.0)
    with pytest.raises(RuntimeError, match="cannot be `True` together"):
        syncfree.Adam(p, fused=True, foreach=True)


@pytest.mark.parametrize("cls", [syncfree.SGD, syncfree.Adam, syncfree.AdamW])
def test_fused_true_that_cannot_be_served_is_rejected(cls, device):
    bf16 = torch.zeros(2, device=device, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(ValueError, match="param group 0 has fused=True but .*bfloat16"):
        cls([bf16], lr=0.1, fused=True)
    fp32 = torch.ones(2, device=device, requires_grad=True)
    opt = cls([fp32], lr=0.1, fused=True)
    with pytest.raises(ValueError, match="param group 1 has fused=True but 'lr' is a tensor"):
        opt.add_param_group({"params": [torch.ones(2, device=device, requires_grad=True)],
                             "lr": torch.tensor(0.1)})
    assert len(opt.param_groups) == 1
    # switched to a tensor lr after construction: refused at step(), nothing changes
    opt.param_groups[0]["lr"] = torch.tensor(0.1)
    fp32.grad = torch.ones(2, device=device)
    with pytest.raises(ValueError, match="'lr' is a tensor"):
        opt.step()
    torch_xla.sync()
    assert len(opt.state) == 0 and torch.equal(fp32.detach().cpu(), torch.ones(2))
    # fused=None falls back to the portable path for both
    auto = cls([bf16], lr=0.1)
    auto.add_param_group({"params": [fp32], "lr": torch.tensor(0.1)})
    bf16.grad = torch.ones(2, device=device, dtype=torch.bfloat16)
    auto.step()
    torch_xla.sync()
    assert float(fp32.detach().cpu()[0]) < 1.0 and float(bf16.detach().float().cpu()[0]) < 0.0


def _ir(tensors):
    return torch_xla._XLAC._get_xla_tensors_text(tensors)


@pytest.mark.parametrize("name,kw,op", [
    ("SGD", dict(lr=0.1, momentum=0.9), "xla::sgd_optimizer_step"),
    ("SGD", dict(lr=0.1), "xla::sgd_optimizer_step"),
    ("Adam", dict(lr=0.1, amsgrad=True), "xla::adam_optimizer_step"),
    ("AdamW", dict(lr=0.1), "xla::adam_optimizer_step"),
])
def test_default_path_is_one_fused_node_per_parameter(name, kw, op, device):
    params = [torch.ones(s, device=device, requires_grad=True) for s in [(3, 2), (4,), (5,)]]
    for fused in (None, False):
        opt = getattr(syncfree, name)(params, fused=fused, **kw)
        for p in params:
            p.grad = torch.ones_like(p)
        torch_xla.sync()
        opt.step(found_inf=torch.tensor(0.0).to(device))
        ir = _ir(params)
        if fused is None:
            assert ir.count(op + "(") == len(params)
            assert "aten::where" not in ir
        else:
            assert op not in ir and ir.count("aten::where") >= len(params)
        torch_xla.sync()


@pytest.mark.parametrize("name", ["SGD", "Adam"])
def test_mixed_dtype_group_splits_float32_onto_the_fused_op(name, device):
    # One group of float32 and bf16 parameters: the float32 ones take the
    # fused op, the bf16 one the portable path; each bit-equal to a run of
    # its dtype alone on that path.
    init = [torch.randn(s, generator=torch.Generator().manual_seed(i))
            for i, s in enumerate([(3, 2), (4,), (5,)])]
    dtypes = [torch.float32, torch.bfloat16, torch.float32]
    kw = dict(lr=0.1, momentum=0.9) if name == "SGD" else dict(lr=0.1)
    cls = getattr(syncfree, name)
    flag = torch.tensor(0.0).to(device)

    def train(idx, **extra):
        ps = [init[i].to(device).to(dtypes[i]).requires_grad_() for i in idx]
        opt = cls(ps, **kw, **extra)
        for step in range(3):
            for p in ps:
                p.grad = torch.full_like(p, 0.25 * (step + 1))
            opt.step(found_inf=flag)
            if step == 2:
                ir = [_ir([p]) for p in ps]
            torch_xla.sync()
        return [p.detach().cpu() for p in ps], ir

    op = "xla::sgd_optimizer_step(" if name == "SGD" else "xla::adam_optimizer_step("
    mixed, ir = train([0, 1, 2])
    assert op in ir[0] and op in ir[2] and op not in ir[1] and "aten::where" in ir[1]
    fp32_alone, _ = train([0, 2], fused=True)
    bf16_alone, _ = train([1], fused=False)
    for a, b in zip([mixed[0], mixed[2], mixed[1]], fp32_alone + bf16_alone):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("flag", [
    torch.tensor(True), torch.tensor(2), torch.tensor(1e-300, dtype=torch.float64),
    torch.tensor(float("nan")), torch.tensor(-1.0)])
def test_any_nonzero_found_inf_skips_on_both_paths(flag, sf, device):
    p = torch.ones(3, device=device, requires_grad=True)
    opt = sf.Adam([p], lr=0.1)
    p.grad = torch.ones(3, device=device)
    opt.step(found_inf=flag.to(device))
    torch_xla.sync()
    assert torch.equal(p.detach().cpu(), torch.ones(3))
    assert float(opt.state_dict()["state"][0]["step"]) == 0.0


# -- per-parameter counters that drift apart ------------------------------------

_DRIFT_SHAPES = [(4, 3), (5,), (2, 2), (3,), (6,)]


def _drift_has_grad(i, k):
    # parameter k gets a gradient on step i? (k = 0 and 4 always: one lineage)
    return {0: True, 1: i % 2 == 0, 2: i >= 3, 3: i % 3 != 1, 4: True}[k]


@pytest.mark.parametrize("name,kw", [
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.3)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("AdamW", dict(lr=0.01, weight_decay=0.1)),
])
def test_parameters_stepping_at_different_times(name, kw, device, sf):
    # Gradients come and go per parameter, so step counts / momentum flags
    # differ between parameters; some steps are skipped by found_inf; halfway
    # the state goes through a state dict into a fresh optimizer.
    steps, skipped, reload_at = 12, {0, 5, 8}, 6
    g = torch.Generator().manual_seed(3)
    init = [torch.randn(s, generator=g) for s in _DRIFT_SHAPES]
    grads = [[torch.randn(s, generator=g) for s in _DRIFT_SHAPES] for _ in range(steps)]

    def run(cls, dev, sync_free):
        params = [t.clone().to(dev).requires_grad_() for t in init]
        opt = cls(params, **kw)
        for i in range(steps):
            if i == reload_at:
                sd = copy.deepcopy(opt.state_dict())
                opt = cls(params, **kw)
                opt.load_state_dict(sd)
            if not sync_free and i in skipped:
                continue
            for k, p in enumerate(params):
                p.grad = grads[i][k].to(dev) if _drift_has_grad(i, k) else None
            if sync_free:
                opt.step(found_inf=torch.tensor(float(i in skipped)).to(dev))
                torch_xla.sync()
            else:
                opt.step()
        return [p.detach().cpu() for p in params], opt

    ref, ref_opt = run(getattr(torch.optim, name), torch.device("cpu"), False)
    out, opt = run(getattr(sf, name), device, True)
    for r, o in zip(ref, out):
        torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-6)
    if name != "SGD":
        ref_steps = {k: float(st["step"]) for k, st in ref_opt.state_dict()["state"].items()}
        assert len(set(ref_steps.values())) > 2  # they did drift apart
        assert {k: float(st["step"]) for k, st in opt.state_dict()["state"].items()} == ref_steps


def test_bfloat16_parameters_stay_bfloat16(device):
    params = [torch.randn(s).to(device).to(torch.bfloat16).requires_grad_()
              for s in [(3, 2), (4,)]]
    params.append(torch.randn(5).to(device).requires_grad_())  # mixed dtypes in a group
    for cls, kw in [(syncfree.SGD, dict(lr=0.1, momentum=0.9)), (syncfree.Adam, dict(lr=0.1)),
                    (syncfree.AdamW, dict(lr=0.1))]:
        ps = [p.detach().clone().requires_grad_() for p in params]
        ref = [p.detach().cpu().float().clone().requires_grad_() for p in params]
        opt, ref_opt = cls(ps, **kw), getattr(torch.optim, cls.__name__)(ref, **kw)
        for i in range(3):
            for p, r in zip(ps, ref):
                p.grad = torch.full_like(p, 0.5 + i)
                r.grad = torch.full_like(r, 0.5 + i)
            opt.step(found_inf=torch.tensor(0.0).to(device))
            ref_opt.step()
            torch_xla.sync()
        for p, r, orig in zip(ps, ref, params):
            assert p.dtype == orig.dtype
            for st in opt.state[p].values():
                assert st.dim() == 0 or st.dtype == orig.dtype
            torch.testing.assert_close(p.detach().cpu().float(), r.detach(),
                                       rtol=2e-2, atol=2e-2)


def test_optimizer_survives_deepcopy(device):
    p = torch.ones(3, device=device, requires_grad=True)
    opt = syncfree.Adam([p], lr=0.1)
    p.grad = torch.ones(3, device=device)
    opt.step()
    opt2 = copy.deepcopy(opt)
    p2 = opt2.param_groups[0]["params"][0]
    p2.grad = torch.ones(3, device=device)
    opt2.step(found_inf=torch.tensor(0.0).to(device))
    torch_xla.sync()
    assert float(opt2.state_dict()["state"][0]["step"]) == 2.0
