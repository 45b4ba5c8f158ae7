"""xla_amp.integrations.lightning.XLAAMPPrecision in a real lightning.Trainer
on XLA:CPU (Lightning 2.6, SingleDeviceXLAStrategy). Only Lightning's TPU
availability probe is patched (tests.support.integrations.tpu_probe); the rest is
Lightning's own code path for accelerator="tpu"."""
import pytest
import torch
import torch.nn.functional as F

import xla_amp

L = pytest.importorskip("lightning")
from tests.support.integrations import (COMPUTE, MODES, close, loader, net, optimizer_options,  # noqa: E402
                                  param_dtype, tpu_probe, xla_env_vars)
from xla_amp import syncfree  # noqa: E402
from xla_amp.integrations.lightning import XLAAMPPrecision  # noqa: E402

pytestmark = pytest.mark.integrations


class Classifier(L.LightningModule):
    def __init__(self, inf_at_step=None, fp8_recipe=None):
        super().__init__()
        self.net = net()
        self.inf_at_step = inf_at_step
        self.fp8_recipe = fp8_recipe

    def configure_model(self):
        # fp8 and a resumed run: Lightning loads the checkpoint's weights
        # before the precision plugin converts the model (docs/integrations.md)
        if self.fp8_recipe is not None:
            xla_amp.fp8.convert(self, self.fp8_recipe)
        self.losses, self.dtypes, self.env = [], set(), []

    def training_step(self, batch, batch_idx):
        x, y = batch
        h = self.net[0](x)  # a matmul: its dtype is the precision's compute dtype
        self.dtypes.add(h.dtype)
        loss = F.cross_entropy(self.net[2](self.net[1](h)), y)
        if self.global_step == self.inf_at_step:
            loss = loss * float("inf")
        self.losses.append(loss.detach())
        self.env.append(xla_env_vars())
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, 3, 0.9)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class Record(L.Callback):
    """Parameters (as copies on the host) and the scale after each step."""

    def __init__(self):
        self.params, self.scales = [], []

    def on_train_batch_end(self, trainer, module, *args):
        self.params.append([p.detach().cpu().float().clone() for p in module.parameters()])
        scaler = trainer.precision_plugin.scaler if hasattr(trainer.precision_plugin, "scaler") else None
        self.scales.append(scaler.get_scale() if scaler is not None else None)


def trainer(precision, callbacks=(), **kw):
    plugins = ([XLAAMPPrecision(MODES[precision][0], **MODES[precision][1], **kw)]
               if precision != "32-true" else [])
    return L.Trainer(accelerator="tpu", devices=1, plugins=plugins, precision="32-true"
                     if not plugins else None, max_steps=-1, max_epochs=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=list(callbacks))


def fit(precision, steps=20, epochs=1, ckpt=None, module=None, **kw):
    module = module or Classifier()
    t = trainer(precision, **kw)
    t.fit_loop.max_epochs = epochs
    t.fit(module, loader(steps), ckpt_path=ckpt)
    return t, module


@pytest.fixture(scope="module", autouse=True)
def _tpu_probe():
    with tpu_probe():
        yield


@pytest.fixture(scope="module")
def fp32_losses():
    _, m = fit("32-true")
    return [float(v) for v in m.losses]


@pytest.mark.parametrize("precision", list(MODES))
def test_trains_in_the_mode_without_env_switches(precision, fp32_losses):
    t, m = fit(precision)
    assert m.dtypes == {COMPUTE[precision]}
    close([float(v) for v in m.losses], fp32_losses)
    assert all(env == {} for env in m.env) and xla_env_vars() == {}
    opt = t.optimizers[0]
    assert isinstance(opt, syncfree.AdamW)  # configure_optimizers' AdamW, swapped in connect
    for key in ("master_weights", "stochastic_rounding"):
        assert opt.param_groups[0][key] is optimizer_options(precision).get(key, False)
    assert t.lr_scheduler_configs[0].scheduler.optimizer is opt
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * 0.9 ** 6)  # the scheduler drove it
    assert {p.dtype for p in m.parameters()} == {param_dtype(precision)}


def test_an_overflow_skips_the_step_and_halves_the_scale():
    rec = Record()
    fit("16-mixed", steps=8, module=Classifier(inf_at_step=4), callbacks=[rec])
    before, at, after = rec.params[3], rec.params[4], rec.params[5]
    assert all(torch.equal(a, b) for a, b in zip(before, at))
    assert not all(torch.equal(a, b) for a, b in zip(at, after))
    assert rec.scales[4] == rec.scales[3] / 2


@pytest.mark.parametrize("precision", list(MODES))
def test_checkpoint_resume_continues_bit_identically(precision, tmp_path):
    # 16-mixed: an overflow at step 2 and growth every 3 steps, so the scale
    # and its growth tracker are state the resume must restore
    scaled = precision == "16-mixed"
    extra = {"scaler": {"init_scale": 2.0 ** 10, "growth_interval": 3}} if scaled else {}
    inf_at = 2 if scaled else None
    full, whole = fit(precision, steps=5, epochs=2, module=Classifier(inf_at), **extra)
    first, _ = fit(precision, steps=5, epochs=1, module=Classifier(inf_at), **extra)
    path = str(tmp_path / "ckpt.pt")
    first.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)
    assert ("XLAAMPPrecision" in saved) is (precision == "16-mixed")  # the scaler's state
    recipe = MODES[precision][1].get("fp8")
    rest, resumed = fit(precision, steps=5, epochs=2, ckpt=path,
                        module=Classifier(inf_at, fp8_recipe=recipe), **extra)
    assert rest.global_step == full.global_step == 10
    for a, b in zip(whole.parameters(), resumed.parameters()):
        assert torch.equal(a.detach().cpu(), b.detach().cpu())
    assert all(torch.isfinite(p).all() for p in resumed.parameters())
    if scaled:
        assert rest.precision_plugin.scaler.state_dict() == full.precision_plugin.scaler.state_dict()


def test_bad_settings_are_refused_before_training():
    with pytest.raises(ValueError, match="master_weights=True needs precision='bf16-true'"):
        XLAAMPPrecision("bf16-mixed", master_weights=True)
    with pytest.raises(ValueError, match="'tpu' policy does not support"):
        XLAAMPPrecision("16-mixed", policy="tpu")
    with pytest.raises(ValueError, match="choose one of bf16-mixed, 16-mixed, bf16-true"):
        XLAAMPPrecision("16-true")

    class Rms(Classifier):  # an optimizer with no syncfree namesake cannot keep a master
        def configure_optimizers(self):
            return torch.optim.RMSprop(self.parameters(), lr=1e-2)
    m = Rms()
    before = [p.detach().clone() for p in m.parameters()]
    with pytest.raises(ValueError, match="needs an xla_amp.syncfree optimizer.*RMSprop"):
        fit("bf16-true", module=m)
    assert m.losses == []  # refused before the first step, and before the model changed:
    assert all(torch.equal(a, b.cpu()) for a, b in zip(before, m.parameters()))  # still fp32
