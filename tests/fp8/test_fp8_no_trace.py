"""A step the GradScaler skips leaves no trace, on a whole model: a
transformer block whose Linear layers are fp8 with delayed scaling
(fp8.attach rolls their histories after each step), trained under the
cuda rules (float16) and the tpu rules (bfloat16), with syncfree and
plain torch.optim optimizers, bf16 parameters with an fp32 master or
stochastic rounding, through the scaler API and through
xla_amp.optimizer_step. One step's loss is multiplied by inf (a device
scalar: good and bad steps are one graph). For each case:

- the step is skipped and the scale halves;
- every tensor of the model's and the optimizer's state_dict keeps its bits
  (tests/support/no_trace.py derives the list from the objects);
- the next good step equals, bit for bit, the same good step taken again
  from the state before the skip loaded back (with the halved scale), by
  the same program: everything advanced exactly once;
- after warm-up each step is 1 execution, 0 compilations, 0 transfers.
"""
from __future__ import annotations

import pytest
import torch
import torch_xla
from torch import nn

import xla_amp
from tests.support import clear_metrics, count, device_scalar
from tests.support.fp8 import Block
from tests.support.no_trace import moved, per_call, training_state
from xla_amp import fp8, syncfree

pytestmark = pytest.mark.fp8  # 14 whole-model runs, one compilation each: make fp8

# id -> (optimizer factory, parameter dtype)
OPTIMIZERS = {
    "syncfree.SGD": (lambda ps: syncfree.SGD(ps, lr=0.05, momentum=0.9), torch.float32),
    "syncfree.AdamW": (lambda ps: syncfree.AdamW(ps, lr=1e-3), torch.float32),
    "syncfree.AdamW-master": (lambda ps: syncfree.AdamW(ps, lr=1e-3, master_weights=True),
                              torch.bfloat16),
    "syncfree.SGD-sr": (lambda ps: syncfree.SGD(ps, lr=0.05, momentum=0.9,
                                                stochastic_rounding=True), torch.bfloat16),
    "torch.SGD": (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), torch.float32),
    "torch.AdamW": (lambda ps: torch.optim.AdamW(ps, lr=1e-3, capturable=True),
                    torch.float32),
}
CASES = ([(o, p, "scaler") for o in OPTIMIZERS for p in ("cuda", "tpu")]
         + [("syncfree.AdamW", "cuda", "optimizer_step"), ("torch.SGD", "tpu", "optimizer_step")])


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block, self.head = Block(), nn.Linear(32, 16)

    def forward(self, x):
        return self.head(self.block(x))


def _build(optimizer, device):
    make, dtype = OPTIMIZERS[optimizer]
    torch.manual_seed(0)
    model = fp8.convert(Model(), fp8.Fp8Recipe(scaling="delayed", amax_history_len=4))
    if dtype != torch.float32:
        xla_amp.cast_module(model, dtype, keep=(nn.LayerNorm,))
    model = model.to(device)
    opt = make(model.parameters())
    fp8.attach(opt, model)
    return model, opt


def _step(model, opt, scaler, batch, factor, policy, entry):
    x, y = batch
    with xla_amp.autocast(x.device, policy=policy):
        loss = nn.functional.mse_loss(model(x).float(), y) * factor
    scaler.scale(loss).backward()
    if entry == "optimizer_step":
        xla_amp.optimizer_step(opt, scaler=scaler)
    else:
        scaler.step(opt)
        scaler.update()
    opt.zero_grad()
    torch_xla.sync()


@pytest.mark.parametrize("optimizer,policy,entry", CASES,
                         ids=[f"{o}-{p}-{e}" for o, p, e in CASES])
def test_a_skipped_step_leaves_no_trace(device, optimizer, policy, entry):
    model, opt = _build(optimizer, device)
    scaler = xla_amp.GradScaler(init_scale=2.0 ** 10)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(4, 8, 32, generator=g).to(device),
                torch.randn(4, 8, 16, generator=g).to(device)) for _ in range(4)]
    one, inf = device_scalar(1.0, device), device_scalar(float("inf"), device)
    for b in batches[:2]:  # warm-up: state made, every graph compiled
        _step(model, opt, scaler, b, one, policy, entry)
    before, scale = training_state(model, opt), scaler.get_scale()

    clear_metrics()
    _step(model, opt, scaler, batches[2], inf, policy, entry)
    assert (count("ExecuteTime"), count("CompileTime"), count("TransferFromDeviceTime")) \
        == (1, 0, 0)
    assert scaler.get_scale() == scale / 2
    assert moved(before, training_state(model, opt)) == []
    assert any("fp8_amax_history" in k for k in before)
    skipped_scaler = scaler.state_dict()

    clear_metrics()
    _step(model, opt, scaler, batches[3], one, policy, entry)
    assert (count("ExecuteTime"), count("CompileTime"), count("TransferFromDeviceTime")) \
        == (1, 0, 0)
    after = training_state(model, opt)
    advanced = moved(before, after)
    assert any("fp8_amax_history" in k for k in advanced)
    assert any(k.startswith("optimizer/state/") for k in advanced)

    # the control: the same objects put back to the state before the skip
    # (with the scale the skip left), then the same good step once more
    missing, _ = model.load_state_dict({k[len("model/"):]: v for k, v in before.items()
                                        if k.startswith("model/")}, strict=False)
    assert sorted(missing) == sorted(per_call(model))  # fp8's diagnostics of the last call
    opt.load_state_dict(_optimizer_state(opt, before))
    scale_after = scaler.get_scale()
    scaler.load_state_dict(skipped_scaler)
    torch_xla.sync()  # the loaded values on the device
    _step(model, opt, scaler, batches[3], one, policy, entry)
    assert moved(after, training_state(model, opt)) == []
    assert scaler.get_scale() == scale_after


def _optimizer_state(opt, flat: dict) -> dict:
    """`opt`'s state_dict with each tensor replaced by its copy in `flat`."""
    def fill(prefix, obj):
        if isinstance(obj, torch.Tensor):
            return flat[prefix].clone()
        if isinstance(obj, dict):
            return {k: fill(f"{prefix}/{k}", v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return type(obj)(fill(f"{prefix}/{i}", v) for i, v in enumerate(obj))
        return obj
    return fill("optimizer", opt.state_dict())
