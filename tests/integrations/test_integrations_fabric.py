"""xla_amp.integrations.fabric.XLAAMPPrecision in a real lightning.Fabric on
XLA:CPU (SingleDeviceXLAStrategy). Only Lightning's TPU availability probe
is patched (tests.support.integrations.tpu_probe)."""
import pytest
import torch
import torch.nn.functional as F

L = pytest.importorskip("lightning")
from tests.support.integrations import (COMPUTE, MODES, close, loader, net, optimizer_options,  # noqa: E402
                                  param_dtype, tpu_probe, xla_env_vars)
from xla_amp import syncfree  # noqa: E402
from xla_amp.integrations.fabric import XLAAMPPrecision  # noqa: E402

pytestmark = pytest.mark.integrations


@pytest.fixture(scope="module", autouse=True)
def _tpu_probe():
    with tpu_probe():
        yield


def fabric(precision, **kw):
    if precision == "32-true":
        return L.Fabric(accelerator="tpu", devices=1, precision="32-true")
    return L.Fabric(accelerator="tpu", devices=1,
                    plugins=[XLAAMPPrecision(MODES[precision][0], **MODES[precision][1], **kw)])


def setup(f, precision):
    """As docs/integrations.md tells Fabric users: the model on the device
    first (syncfree optimizers take XLA parameters), then its optimizer."""
    model = f.setup_module(net())
    options = optimizer_options(precision) if precision != "32-true" else {}
    return model, f.setup_optimizers(syncfree.AdamW(model.parameters(), lr=1e-2, **options))


def run(f, model, opt, steps=20, skip=0, inf_at=None, record=None):
    """The loop a Fabric user writes, from batch ``skip`` on. Returns the
    losses (device tensors) and the dtypes the first Linear (a matmul)
    produced inside the forward."""
    dtypes = set()
    hook = model.module[0].register_forward_hook(lambda m, i, o: dtypes.add(o.dtype))
    losses = []
    for i, (x, y) in enumerate(f.setup_dataloaders(loader(steps))):
        if i < skip:
            continue
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        if i == inf_at:
            loss = loss * float("inf")
        f.backward(loss)
        opt.step()
        losses.append(loss.detach())
        assert xla_env_vars() == {}
        if record is not None:
            scaler = f._precision.scaler if hasattr(f._precision, "scaler") else None
            record.append(([p.detach().cpu().float().clone() for p in model.parameters()],
                           scaler.get_scale() if scaler is not None else None))
    hook.remove()
    return losses, dtypes


@pytest.fixture(scope="module")
def fp32_losses():
    f = fabric("32-true")
    losses, _ = run(f, *setup(f, "32-true"))
    return [float(v) for v in losses]


@pytest.mark.parametrize("precision", list(MODES))
def test_trains_in_the_mode_without_env_switches(precision, fp32_losses):
    f = fabric(precision)
    model, opt = setup(f, precision)
    losses, dtypes = run(f, model, opt)
    assert dtypes == {COMPUTE[precision]}
    close([float(v) for v in losses], fp32_losses)
    assert {p.dtype for p in model.parameters()} == {param_dtype(precision)}
    assert xla_env_vars() == {}


def test_an_overflow_skips_the_step_and_halves_the_scale():
    f = fabric("16-mixed")
    rec = []
    run(f, *setup(f, "16-mixed"), steps=8, inf_at=4, record=rec)
    (before, s3), (at, s4), (after, _) = rec[3], rec[4], rec[5]
    assert all(torch.equal(a, b) for a, b in zip(before, at))
    assert not all(torch.equal(a, b) for a, b in zip(at, after))
    assert s4 == s3 / 2


@pytest.mark.parametrize("precision", list(MODES))
def test_checkpoint_resume_continues_bit_identically(precision, tmp_path):
    """fabric.save / fabric.load of model, optimizer and the plugin (its
    scaler state), then the rest of the run in a fresh Fabric."""
    scaled = precision == "16-mixed"
    extra = {"scaler": {"init_scale": 2.0 ** 10, "growth_interval": 3}} if scaled else {}
    inf_at = 2 if scaled else None
    f = fabric(precision, **extra)
    model, opt = setup(f, precision)
    run(f, model, opt, steps=10, inf_at=inf_at)
    whole = [p.detach().cpu() for p in model.parameters()]

    f = fabric(precision, **extra)
    model, opt = setup(f, precision)
    run(f, model, opt, steps=5, inf_at=inf_at)
    path = str(tmp_path / "ckpt")
    f.save(path, {"model": model, "optimizer": opt, "precision": f._precision})

    f = fabric(precision, **extra)
    model, opt = setup(f, precision)
    f.load(path, {"model": model, "optimizer": opt, "precision": f._precision})
    run(f, model, opt, steps=10, skip=5, inf_at=inf_at)
    for a, b in zip(whole, model.parameters()):
        assert torch.equal(a, b.detach().cpu())
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_an_optimizer_without_the_modes_master_is_refused_before_the_step():
    """In the documented order (built before setup, the optimizer is refused
    with the order to follow: test_integrations_fabric_order.py)."""
    f = fabric("bf16-true")
    model = f.setup_module(net())
    opt = f.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-2))
    before = [p.detach().cpu().clone() for p in model.parameters()]
    x, y = next(iter(f.setup_dataloaders(loader(1))))
    f.backward(F.cross_entropy(model(x), y))
    with pytest.raises(ValueError, match="master_weights=True needs an xla_amp.syncfree optimizer"):
        opt.step()
    assert all(torch.equal(a, b.detach().cpu()) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("precision", list(MODES))
def test_xla_fsdp_strategy_takes_the_plugin_and_its_dtype(precision):
    """XLAFSDPStrategy (FSDPv1) accepts only XLAPrecision plugins and wraps
    with compute_dtype = the plugin's _desired_dtype: the parameters' dtype
    (autocast casts inside the mixed modes' forward). Running it needs more
    than one device in replica mode, whose collectives do not execute on
    XLA:CPU (pytorch/xla issue 5005), and the strategy refuses one device."""
    plugin = XLAAMPPrecision(MODES[precision][0], **MODES[precision][1])
    f = L.Fabric(accelerator="tpu", devices=1, strategy="xla_fsdp", plugins=[plugin])
    assert f.strategy.precision is plugin
    assert f.strategy._parse_fsdp_kwargs()["compute_dtype"] == param_dtype(precision)
