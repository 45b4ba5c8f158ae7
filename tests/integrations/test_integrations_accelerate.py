"""xla_amp.integrations.accelerate.Accelerator: Accelerate's own loop
(prepare, backward, the prepared optimizer's step, save_state/load_state)
on XLA:CPU, with xla_amp's autocast and GradScaler in place of Accelerate's
XLA mixed precision. Nothing in Accelerate is patched."""
import os

import pytest
import torch
import torch.nn.functional as F
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met

accelerate = pytest.importorskip("accelerate")
from accelerate.utils import GradScalerKwargs  # noqa: E402
from tests.support.integrations import COMPUTE, close, loader, net, xla_env_vars  # noqa: E402
from xla_amp import syncfree  # noqa: E402
from xla_amp.integrations.accelerate import Accelerator  # noqa: E402

pytestmark = pytest.mark.integrations
NAMES = {"bf16": "bf16-mixed", "fp16": "16-mixed"}


def setup(acc, steps=20):
    """As docs/integrations.md says: the model on the device, the
    recommended (syncfree) optimizer on its parameters, then prepare. The
    DataLoader is not prepared: Accelerate 1.15's save_state fails on its
    XLA loader wrapper ("'MpDeviceLoaderWrapper' object has no attribute
    'dataset'", accelerate/checkpointing.py), with or without xla_amp."""
    model = net().to(acc.device)
    opt = syncfree.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    return model, opt, [(x.to(acc.device), y.to(acc.device)) for x, y in loader(steps)]


def run(acc, model, opt, dl, skip=0, inf_at=None, record=None, count_from=None):
    """Accelerate's loop. Returns losses (device tensors), the dtypes the
    first Linear produced, and (executions, transfers) per step counted
    from step ``count_from``."""
    dtypes = set()
    hook = acc.unwrap_model(model)[0].register_forward_hook(lambda m, i, o: dtypes.add(o.dtype))
    losses, counted = [], 0
    for i, (x, y) in enumerate(dl):
        if i < skip:
            continue
        if i == count_from:
            xm.wait_device_ops()
            met.clear_all()
        loss = F.cross_entropy(model(x), y)
        if i == inf_at:
            loss = loss * float("inf")
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        torch_xla.sync()
        losses.append(loss.detach())
        counted += count_from is not None and i >= count_from
        if record is not None:
            record.append(([p.detach().cpu().float().clone() for p in model.parameters()],
                           acc.scaler.get_scale() if acc.scaler is not None else None))
    hook.remove()
    xm.wait_device_ops()
    per_step = None
    if counted:
        execs = (met.metric_data("ExecuteTime") or [0])[0]
        transfers = (met.metric_data("TransferFromDeviceTime") or [0])[0]
        per_step = (execs / counted, transfers / counted)
    return losses, dtypes, per_step


@pytest.fixture(scope="module")
def fp32_losses():
    acc = accelerate.Accelerator(mixed_precision="no")
    losses, _, _ = run(acc, *setup(acc))
    return [float(v) for v in losses]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_trains_in_one_graph_without_transfers_or_env_switches(precision, fp32_losses):
    acc = Accelerator(mixed_precision=precision, policy="cuda" if precision == "fp16" else None)
    assert acc.mixed_precision == precision
    assert (acc.scaler is not None) is (precision == "fp16")
    losses, dtypes, per_step = run(acc, *setup(acc), count_from=5)
    assert dtypes == {COMPUTE[NAMES[precision]]}
    close([float(v) for v in losses], fp32_losses)
    assert per_step == (1.0, 0.0)
    assert xla_env_vars() == {}


def test_launch_env_chooses_the_precision(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")  # accelerate launch --mixed_precision fp16
    acc = Accelerator(policy="cuda", kwargs_handlers=[GradScalerKwargs(init_scale=64.0)])
    assert acc.mixed_precision == "fp16" and acc.scaler._init_scale == 64.0
    assert acc.state.mixed_precision == "no"  # Accelerate itself was told to do nothing
    assert "XLA_USE_BF16" not in os.environ


def test_an_overflow_skips_the_step_and_halves_the_scale():
    acc = Accelerator(mixed_precision="fp16", policy="cuda")
    rec = []
    run(acc, *setup(acc, steps=8), inf_at=4, record=rec)
    (before, s3), (at, s4), (after, _) = rec[3], rec[4], rec[5]
    assert all(torch.equal(a, b) for a, b in zip(before, at))
    assert not all(torch.equal(a, b) for a, b in zip(at, after))
    assert s4 == s3 / 2


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_save_state_load_state_resumes_bit_identically(precision, tmp_path):
    scaled = precision == "fp16"
    kw = dict(mixed_precision=precision, policy="cuda" if scaled else None,
              kwargs_handlers=[GradScalerKwargs(init_scale=2.0 ** 10, growth_interval=3)]
              if scaled else None)
    inf_at = 2 if scaled else None
    acc = Accelerator(**kw)
    model, opt, dl = setup(acc, steps=10)
    run(acc, model, opt, dl, inf_at=inf_at)
    whole = [p.detach().cpu() for p in model.parameters()]

    acc = Accelerator(**kw)
    model, opt, dl = setup(acc, steps=5)
    run(acc, model, opt, dl, inf_at=inf_at)
    acc.save_state(str(tmp_path / "state"), safe_serialization=False)  # safetensors reads XLA storage: fails

    acc = Accelerator(**kw)
    model, opt, dl = setup(acc, steps=10)
    acc.load_state(str(tmp_path / "state"))
    if scaled:
        assert acc.scaler.get_scale() != 2.0 ** 10  # the overflow's halving came back
    run(acc, model, opt, dl, skip=5, inf_at=inf_at)
    for a, b in zip(whole, model.parameters()):
        assert torch.equal(a, b.detach().cpu())


def test_bad_settings_are_refused_before_accelerate_starts():
    with pytest.raises(ValueError, match="'tpu' policy does not support"):
        Accelerator(mixed_precision="fp16", policy="tpu")
    with pytest.raises(ValueError, match="mixed_precision='int8'"):
        Accelerator(mixed_precision="int8")
    with pytest.raises(ValueError, match="GradScalerKwargs apply to mixed_precision='fp16'"):
        Accelerator(mixed_precision="bf16", kwargs_handlers=[GradScalerKwargs(init_scale=8.0)])


def test_fp8_trains_in_one_graph_and_rolls_once_per_step(fp32_losses):
    """mixed_precision="fp8": the Linear layers in fp8 (delayed scaling, the
    4-way head kept), the rest bf16; the optimizer Accelerate prepared rolls
    the histories once per step."""
    from xla_amp.fp8 import Fp8Linear, Fp8Recipe
    acc = Accelerator(mixed_precision="fp8", fp8=Fp8Recipe(scaling="delayed", keep=("2",)))
    assert acc.mixed_precision == "fp8" and acc.scaler is None
    model, opt, dl = setup(acc)
    first = acc.unwrap_model(model)[0]
    assert isinstance(first, Fp8Linear) and type(acc.unwrap_model(model)[2]) is torch.nn.Linear
    losses, dtypes, per_step = run(acc, model, opt, dl, count_from=5)
    assert dtypes == {torch.bfloat16}
    close([float(v) for v in losses], fp32_losses, rel=0.03)
    assert per_step == (1.0, 0.0)
    hist = first.fp8_amax_history.cpu()
    assert (hist > 0).all()  # 20 steps rolled a 16-long history full
    with pytest.raises(ValueError, match="fp8= need mixed_precision"):
        Accelerator(mixed_precision="no", fp8=Fp8Recipe())
