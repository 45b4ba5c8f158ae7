"""A state_dict loaded between steps keeps the step's graph: the next step
compiles nothing (xla_amp/syncfree/_state_dict.py).

A graph orders its outputs by when their tensors were made, and takes each
0-dim upload of 0 or 1 as a constant and equal 0-dim uploads as one input
(xla_amp/_upload.py). Before, ``load_state_dict`` made every state tensor
anew with ``.to(device)``: the loaded step counts, buffers and masters came
after the model's tensors in a different order, some as constants, some
shared, and the first step after a load -- an in-process rollback to a
checkpoint, a skip test's control -- compiled the whole training step again
(on a TPU, minutes for a large model). Loaded values now go into the
tensors the optimizer already holds (or made for its first step), each an
upload of its own.
"""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
import torch_xla

import xla_amp
from xla_amp import syncfree

from tests.support import assert_same, clear_metrics, count, host_copy
from tests.syncfree.test_first_step_graph import CONFIGS, LOW_PRECISION

_WIDTHS = iter(range(40, 400))  # a width per test: no graph cached by another test


def _model(device, width):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, width), nn.LayerNorm(width), nn.ReLU(),
                         nn.Linear(width, 3)).to(device)


class _Run:
    """A model, a sync-free optimizer and a GradScaler, stepped on one batch."""

    def __init__(self, device, name, kw, width, dtype):
        self.model = _model(device, width).to(dtype)
        self.opt = getattr(syncfree, name)(self.model.parameters(), lr=0.05, **kw)
        self.scaler = xla_amp.GradScaler()
        torch.manual_seed(1)
        self.x = torch.randn(8, 12).to(dtype).to(device)
        self.y = torch.randint(0, 3, (8,)).to(device)
        torch_xla.sync()

    def step(self) -> int:
        """One AMP step; the compilations it took."""
        clear_metrics()
        self.opt.zero_grad()
        with xla_amp.autocast(self.x.device, policy="tpu"):
            loss = F.cross_entropy(self.model(self.x).float(), self.y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        torch_xla.sync()
        return count("CompileTime")

    def state(self) -> dict:
        return host_copy({"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                          "scaler": self.scaler.state_dict()})

    def load(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.scaler.load_state_dict(state["scaler"])


CASES = ([(name, dict(kw, fused=fused), torch.float32) for name, kw in CONFIGS
          for fused in (None, False)]
         + [(name, dict(kw, momentum=0.9) if name == "SGD" else kw, torch.bfloat16)
            for name in ("SGD", "AdamW") for kw in LOW_PRECISION])


@pytest.mark.parametrize("name,kw,dtype", CASES, ids=lambda v: str(v))
def test_a_state_loaded_between_steps_compiles_nothing(name, kw, dtype, device):
    run = _Run(device, name, kw, next(_WIDTHS), dtype)
    assert [run.step() for _ in range(3)] == [1, 0, 0]
    saved = run.state()
    assert run.step() == 0
    after = run.state()
    clear_metrics()
    run.load(saved)  # back one step, in the same process
    assert count("ExecuteTime") == 0  # uploads only: the load runs no graph
    assert run.step() == 0  # the same program as the step before the load
    assert_same(run.state(), after, "the step taken again")


@pytest.mark.parametrize("name,kw,dtype", CASES[::3], ids=lambda v: str(v))
def test_a_new_optimizer_resumes_on_the_graph_of_the_run_it_resumes(name, kw, dtype, device):
    """A resumed run (new model and optimizer, the state loaded before the
    first step) steps with the graph the saved run stepped with: cached
    here, and the program a persistent compilation cache holds on a TPU."""
    width = next(_WIDTHS)
    run = _Run(device, name, kw, width, dtype)
    assert [run.step() for _ in range(2)] == [1, 0]
    saved = run.state()
    assert run.step() == 0
    after = run.state()
    resumed = _Run(device, name, kw, width, dtype)
    resumed.load(saved)
    assert resumed.step() == 0
    assert_same(resumed.state(), after, "the resumed step")
