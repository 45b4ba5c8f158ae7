"""A step the GradScaler skips leaves no trace, through every framework
plug-in: Lightning's Trainer and Fabric, Accelerate and the Transformers
Trainer each train the suite's small classifier in "16-mixed" (fp16 under
the cuda rules + xla_amp.GradScaler) with its first Linear in fp8, delayed
scaling -- the mode system combines fp8= with "16-mixed"; "fp8-mixed"
itself is bf16 and has no scaler, so it cannot skip. Step BAD's loss is
multiplied by a device scalar inf inside the framework's own loss path
(training_step, the user loop, Trainer.compute_loss), so good and bad steps
run the same graph.

The whole training state (tests/support/no_trace.py: every tensor of the
model's and the optimizer's state_dict -- parameters, Adam moments and step
counts, fp8 histories and scales) is captured right before step BAD, right
after it and after the good step that follows. Each framework is trained
once per test run (tests/support/runs.py) and checked several ways:

- the scale halves at BAD (the skip happened), and only there;
- nothing in the training state moved at BAD, to the bit;
- the good step moves it again, and every step count advanced by exactly
  one over the bad and the good step together;
- step BAD is one execution of the good steps' program, with no
  device-to-host transfer (the frameworks' logging is off or placed
  elsewhere: each runner says why).

What moves on the framework's side (its own step counters, the LR
scheduler, the skip flag it reads) is pinned in test_framework_side_state
and described in docs/integrations.md, "Skipped steps".
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torch_xla

from tests.support import clear_metrics, count, device_scalar
from tests.support.integrations import BATCH, MODES, data, loader, net, tpu_probe
from tests.support.no_trace import moved, training_state
from tests.support.runs import once_per_run

pytestmark = pytest.mark.integrations

BAD = 3            # steps 0-2 warm up (state made, the step graph compiled)
STEPS = BAD + 3    # BAD, the good step after it, one more
FACTOR = float("inf")  # the bad step's loss factor (1.0: no skip, every check below fails)
FRAMEWORKS = ["lightning", "fabric", "accelerate", "transformers"]
PRECISION, OPTIONS = MODES["16-mixed"]                      # "16-mixed", policy="cuda"
RECIPE = MODES["fp8-mixed"][1]["fp8"]                       # delayed, the 4-way head kept
LR = 1e-2


def factors(device):
    """The loss factor of each step, as device scalars (one graph for all)."""
    one, bad = device_scalar(1.0, device), device_scalar(FACTOR, device)
    return lambda i: bad if i == BAD else one


class Probe:
    """Captures the state around step BAD, and counts the transfers from
    the end of step BAD - 1 to the end of step BAD."""

    def __init__(self):
        self.states, self.scales, self.side = {}, {}, {}
        self.transfers = self.graphs = None

    def end(self, i, model, optimizer, scaler, **side):
        """At the end of step i, from the framework's hook (or loop)."""
        if i == BAD:  # before anything here reads a value back
            torch_xla.sync()  # the Transformers Trainer leaves the step pending until here
            self.transfers = count("TransferFromDeviceTime")
            self.graphs = (count("ExecuteTime"), count("CompileTime"))
        if BAD - 1 <= i <= BAD + 1:
            self.states[i] = training_state(model, optimizer)
            self.scales[i] = scaler.get_scale()
            self.side[i] = side
        if i == BAD - 1:
            # counted from here: all the framework does between the two
            # hooks (its loop, the next batch, the step) is step BAD's
            clear_metrics()

    def summary(self) -> dict:
        """What the tests read (JSON: shared between processes)."""
        before, bad, good = (self.states[BAD + d] for d in (-1, 0, 1))
        steps = {k: [float(s[k]) for s in (before, bad, good)]
                 for k in before if k.startswith("optimizer/state/") and k.endswith("/step")}
        return {"scales": [self.scales[BAD + d] for d in (-1, 0, 1)],
                "moved_at_bad": moved(before, bad), "moved_at_good": moved(bad, good),
                "keys": sorted(before), "steps": steps,
                "transfers": self.transfers, "graphs": self.graphs,
                "side": [self.side[BAD + d] for d in (-1, 0, 1)]}


# -- the runs: one per framework ---------------------------------------------

def run_lightning() -> dict:
    import lightning as L
    from xla_amp.integrations.lightning import XLAAMPPrecision
    probe = Probe()

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = net()

        def training_step(self, batch, batch_idx):
            x, y = batch
            return F.cross_entropy(self.net(x), y) * self.factor(batch_idx)

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=LR)  # the plug-in swaps it (syncfree)
            sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    class Hook(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            opt = trainer.optimizers[0]
            probe.end(i, module, opt, trainer.precision_plugin.scaler,
                      global_step=trainer.global_step, lr=opt.param_groups[0]["lr"],
                      scheduler_steps=trainer.lr_scheduler_configs[0].scheduler.last_epoch)

    with tpu_probe():
        module = Classifier()
        # logging off (a logged value is read back for the logger or the
        # progress bar: docs/integrations.md counts them), and so the bar
        trainer = L.Trainer(accelerator="tpu", devices=1, max_epochs=1, logger=False,
                            plugins=[XLAAMPPrecision(PRECISION, **OPTIONS, fp8=RECIPE)],
                            enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[Hook()])
        module.factor = factors(torch_xla.device())
        trainer.fit(module, loader(STEPS))
    return probe.summary()


def run_fabric() -> dict:
    import lightning as L
    from xla_amp import syncfree
    from xla_amp.integrations.fabric import XLAAMPPrecision
    probe = Probe()
    with tpu_probe():
        plugin = XLAAMPPrecision(PRECISION, **OPTIONS, fp8=RECIPE)
        f = L.Fabric(accelerator="tpu", devices=1, plugins=[plugin])
        model = f.setup_module(net())
        opt = f.setup_optimizers(syncfree.AdamW(model.parameters(), lr=LR))
        factor = factors(f.device)
        for i, (x, y) in enumerate(f.setup_dataloaders(loader(STEPS))):
            opt.zero_grad()
            f.backward(F.cross_entropy(model(x), y) * factor(i))
            opt.step()
            probe.end(i, model.module, opt.optimizer, plugin.scaler)
    return probe.summary()


def run_accelerate() -> dict:
    from xla_amp import syncfree
    from xla_amp.integrations.accelerate import Accelerator
    probe = Probe()
    acc = Accelerator(mixed_precision="fp16", policy=OPTIONS["policy"], fp8=RECIPE)
    model = net().to(acc.device)
    opt = syncfree.AdamW(model.parameters(), lr=LR)
    model, opt = acc.prepare(model, opt)
    # batches moved by hand: a prepared DataLoader's XLA wrapper is not needed here
    batches = [(x.to(acc.device), y.to(acc.device)) for x, y in loader(STEPS)]
    factor = factors(acc.device)
    for i, (x, y) in enumerate(batches):
        acc.backward(F.cross_entropy(model(x), y) * factor(i))
        opt.step()
        opt.zero_grad()
        torch_xla.sync()
        probe.end(i, acc.unwrap_model(model), opt.optimizer, acc.scaler,
                  step_was_skipped=opt.step_was_skipped)
    return probe.summary()


def run_transformers(tmp) -> dict:
    import transformers
    from xla_amp.integrations.transformers import XLAAMPTrainer
    probe = Probe()

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net()

        def forward(self, x, labels):
            logits = self.net(x)
            return {"loss": F.cross_entropy(logits, labels), "logits": logits}

    plain = []  # each step's loss before the factor (device tensors)

    class Trainer(XLAAMPTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            plain.append(loss.detach())
            return loss * self.factor(self.state.global_step)

    class Hook(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            t = trainer
            probe.end(state.global_step - 1, t.model, t.optimizer.optimizer, t.accelerator.scaler,
                      global_step=state.global_step, lr=t.lr_scheduler.get_last_lr()[0],
                      scheduler_steps=t.lr_scheduler.last_epoch,
                      step_was_skipped=t.accelerator.optimizer_step_was_skipped)

    x, y = data(STEPS).tensors
    rows = [{"x": a, "labels": b} for a, b in zip(x, y)]
    # adamw_torch: swapped for syncfree.AdamW; a linear decay, so the
    # scheduler's steps show; no tqdm. A log reads the loss (and more) back:
    # one log only, after the good step (global step BAD + 2), outside the
    # steps whose transfers are counted; it covers the bad step's loss
    args = transformers.TrainingArguments(
        output_dir=str(tmp), max_steps=STEPS, per_device_train_batch_size=BATCH,
        learning_rate=LR, optim="adamw_torch", lr_scheduler_type="linear",
        logging_steps=BAD + 2, report_to=[], save_strategy="no", seed=0,
        disable_tqdm=True, fp16=True,
        dataloader_pin_memory=False)  # see test_integrations_transformers.py
    trainer = Trainer(model=Classifier(), args=args, train_dataset=rows, callbacks=[Hook()],
                      xla_amp_policy=OPTIONS["policy"], xla_amp_fp8=RECIPE)
    trainer.factor = factors(torch_xla.device())
    out = trainer.train()
    return {**probe.summary(), "losses": [float(v) for v in plain],
            "logged": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "training_loss": out.training_loss}


RUNNERS = {"lightning": run_lightning, "fabric": run_fabric, "accelerate": run_accelerate,
           "transformers": run_transformers}


def shared(name, tmp_path_factory) -> dict:
    """The framework's run, trained once per test run."""
    pytest.importorskip({"fabric": "lightning"}.get(name, name))
    if name == "transformers":
        compute = lambda: run_transformers(tmp_path_factory.mktemp("hf"))  # noqa: E731
    else:
        compute = RUNNERS[name]
    return once_per_run(("integrations-no-trace", name, FACTOR), compute)


@pytest.fixture
def run(request, tmp_path_factory):
    return shared(request.param, tmp_path_factory)


frameworks = pytest.mark.parametrize("run", FRAMEWORKS, indirect=True)


@frameworks
def test_the_bad_step_is_skipped_and_halves_the_scale(run):
    before, bad, good = run["scales"]
    assert bad == before / 2 and good == bad, run["scales"]


@frameworks
def test_the_bad_step_leaves_the_training_state_bit_identical(run):
    assert any("fp8_amax_history" in k for k in run["keys"])  # the fp8 state is checked too
    assert any(k.endswith("/exp_avg") for k in run["keys"])   # and Adam's
    assert run["moved_at_bad"] == []


@frameworks
def test_the_next_good_step_advances_everything_once(run):
    movers = run["moved_at_good"]
    assert any(k.startswith("model/") and k.endswith("weight") for k in movers)
    assert any(k.startswith("optimizer/state/") for k in movers)
    assert any("fp8_amax_history" in k for k in movers)  # the histories rolled again
    assert run["steps"]  # syncfree.AdamW keeps a step count per parameter
    for path, (before, bad, good) in run["steps"].items():
        assert (bad, good) == (before, before + 1), (path, before, bad, good)


@frameworks
def test_the_skipped_step_is_one_graph_with_no_transfer(run):
    """From the end of the step before to the end of the skipped one: the
    scaler's decision stays on the device (no read-back), and the bad step
    runs the good steps' program (no compilation)."""
    assert run["scales"][1] == run["scales"][0] / 2  # this step was the skipped one
    assert run["transfers"] == 0
    assert run["graphs"] == [1, 0]  # executions, compilations


@pytest.mark.parametrize("run", ["lightning", "accelerate", "transformers"], indirect=True)
def test_framework_side_state(run, request):
    """What the framework itself does on a skipped step; none of it reads
    the skip back (test above). torch.amp on CUDA behaves the same way in
    Lightning (its loop steps the scheduler and counts the step whatever
    the scaler did); the Transformers Trainer there holds its scheduler by
    reading the skip flag on the host, which xla_amp leaves False."""
    before, bad, good = run["side"]
    name = request.node.callspec.params["run"]
    assert run["scales"][1] == run["scales"][0] / 2  # the step was skipped
    if name in ("lightning", "transformers"):
        assert bad["global_step"] == before["global_step"] + 1  # counted as a step
        assert bad["scheduler_steps"] == before["scheduler_steps"] + 1  # the LR moved on
        assert bad["lr"] != before["lr"]
    if name in ("accelerate", "transformers"):
        assert bad["step_was_skipped"] is False  # a host flag: never set on XLA


def test_the_trainers_logged_loss_skips_the_overflow(tmp_path_factory):
    """The Transformers Trainer skips its logging_nan_inf_filter on XLA (it
    would read the loss back); XLAAMPTrainerMixin applies it on the device.
    Without that, the log covering the bad step showed inf and every later
    one (and train()'s training_loss) NaN."""
    run = shared("transformers", tmp_path_factory)
    assert run["scales"][1] == run["scales"][0] / 2  # the step was skipped
    assert len(run["losses"]) == STEPS and len(run["logged"]) == 1
    # the Trainer's own stand-in for the bad step's loss: the running loss
    # divided by one more than the steps since the last log
    before = sum(run["losses"][:BAD])
    logged = (before + before / (BAD + 1) + run["losses"][BAD + 1]) / (BAD + 2)
    assert run["logged"][0] == pytest.approx(logged, rel=1e-5)
    rest = run["losses"][BAD + 2:]
    assert run["training_loss"] == pytest.approx(
        (logged * (BAD + 2) + sum(rest)) / STEPS, rel=1e-5)
