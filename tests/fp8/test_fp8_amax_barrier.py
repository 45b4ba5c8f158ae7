"""xla_amp.fp8._quant.pinned_amax on torch_xla (on by default: faster on an
H200, docs/benchmarks.md "fp8 on a GPU"; benchmarks/fp8_gpu.py's
``-unpinned`` variants turn it off): every amax behind its own optimization barrier, and no bit of the step
changed. The torchax engine's barrier: tests/torchax/test_torchax_fp8.py."""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch_xla

import xla_amp
from xla_amp import fp8
from xla_amp.fp8 import _quant

from tests.support.fp8 import dots, fp8_dot, parse


def test_pinned_amaxes_stand_behind_barriers_and_change_no_bit(device):
    """Each amax of a delayed-scaling step -- x's and w's in every layer's
    forward, g's in its backward -- behind its own optimization barrier,
    none without the pin; pinned by default; the loss, gradients and fp8
    buffers are the same bits."""
    def step(pin):
        torch.manual_seed(0)
        mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
        model = fp8.convert(mlp, fp8.Fp8Recipe(scaling="delayed")).to(device)
        x = torch.randn(16, 32).to(device)
        with contextlib.nullcontext() if pin is None else _quant.pinned_amax(pin):
            with xla_amp.autocast(device, policy="tpu"):
                loss = model(x).float().pow(2).mean()
            loss.backward()
        live = [loss, *(p.grad for p in model.parameters()), *model.buffers()]
        hlo = torch_xla._XLAC._get_xla_tensors_hlo(live)
        layers = sum(isinstance(m, fp8.Fp8Linear) for m in model.modules())
        return hlo, layers, [t.cpu() for t in live]

    def barriers(hlo):
        return sum(op == "opt-barrier" for _, op, _, _ in parse(hlo).values())
    hlo, layers, want = step(False)
    pinned, _, got = step(True)
    default, _, _ = step(None)
    assert layers == 2 and (barriers(hlo), barriers(pinned)) == (0, 3 * layers)
    assert barriers(default) == barriers(pinned)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    # the same float8 dots (the first layer's input gradient is not taken)
    assert sum(map(fp8_dot, dots(pinned))) == sum(map(fp8_dot, dots(hlo))) == 3 * layers - 1
