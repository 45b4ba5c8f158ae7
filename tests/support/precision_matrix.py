"""Training a small digits MLP in each precision mode, for the
checkpoint-conversion tests (tests/checkpoint/test_checkpoint_precision.py,
tests/sharded/test_sharded_precision.py)."""
import dataclasses

import torch
import torch_xla
import torch.nn.functional as F

import xla_amp
from xla_amp import checkpoint as ckpt

# name -> (weights dtype, autocast dtype, optimizer options, GradScaler)
MODES = {
    "fp32": (torch.float32, None, {}, False),
    "amp_bf16": (torch.float32, torch.bfloat16, {}, True),
    "amp_fp16": (torch.float32, torch.float16, {}, True),
    "bf16": (torch.bfloat16, torch.bfloat16, {}, True),
    "bf16_master": (torch.bfloat16, torch.bfloat16, {"master_weights": True}, True),
    "bf16_sr": (torch.bfloat16, torch.bfloat16, {"stochastic_rounding": True}, True),
}
LOSSLESS_INTO = {"fp32", "amp_bf16", "amp_fp16", "bf16_master"}   # fp32 values kept


def data():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.data[:512], dtype=torch.float32) / 16.0
    y = torch.tensor(d.target[:512])
    return x, y


@dataclasses.dataclass
class Run:
    mode: str
    model: torch.nn.Module
    optimizer: object
    scaler: object

    @property
    def amp_dtype(self):
        return MODES[self.mode][1]


def build(mode: str, device) -> Run:
    wdtype, _, opts, scale = MODES[mode]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 10)).to(device)
    if wdtype != torch.float32:
        xla_amp.cast_module(model, wdtype)
    opt = xla_amp.syncfree.AdamW(model.parameters(), lr=3e-3, **opts)
    return Run(mode, model, opt, xla_amp.GradScaler(enabled=scale))


def steps(run: Run, device, first: int, count: int) -> list[float]:
    """Train steps first..first+count-1 (batch k of the data, fixed order);
    the losses, read once at the end."""
    x, y = data()
    amp = run.amp_dtype
    losses = []
    for k in range(first, first + count):
        i = (k * 64) % 512
        xb, yb = x[i:i + 64].to(device), y[i:i + 64].to(device)
        run.optimizer.zero_grad(set_to_none=True)
        with xla_amp.autocast(device, enabled=amp is not None, dtype=amp,
                              policy="cuda" if amp == torch.float16 else "tpu"):
            loss = F.cross_entropy(run.model(xb.to(next(run.model.parameters()).dtype)), yb)
        run.scaler.scale(loss).backward()
        run.scaler.step(run.optimizer)
        run.scaler.update()
        losses.append(loss.detach().float())
        torch_xla.sync()
    return torch.stack(losses).cpu().tolist()


def save(run: Run, path) -> None:
    ckpt.save(path, model=run.model, optimizer=run.optimizer, scaler=run.scaler,
              amp_dtype=run.amp_dtype)


def restore(run: Run, path, **kw) -> list[str]:
    return ckpt.restore(ckpt.load(path), model=run.model, optimizer=run.optimizer,
                        scaler=run.scaler, amp_dtype=run.amp_dtype, **kw)


def host_state(run: Run) -> dict:
    """The model's state dict, copied to the host."""
    return {k: v.cpu().clone() for k, v in run.model.state_dict().items()}


def assert_untouched(run: Run, before: dict) -> None:
    """After a refused resume: the model as `before`, no optimizer state, the
    scaler at its initial scale."""
    from tests.support import assert_same
    assert_same(host_state(run), before, "model")
    assert not run.optimizer.state and run.scaler.get_scale() == 2.0 ** 16


def assert_continues(run: Run, device, same_mode: bool, reference: list, final: dict) -> None:
    """Train on from step 5 for len(reference) steps: the losses and final
    model bit-identical to the run that went on when the mode did not
    change, else within 1 % of its losses."""
    from tests.support import assert_same
    losses = steps(run, device, 5, len(reference))
    if same_mode:
        assert losses == reference
        assert_same(host_state(run), final, "model")
    else:
        worst = max(abs(a - b) / b for a, b in zip(losses, reference))
        assert worst < 0.01, (losses, reference)
