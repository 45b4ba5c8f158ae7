"""With the shim (xla_amp/torchax/_compat.py), torchax trains: an MLP's
jitted steps give CPU eager torch's losses over 20 steps, in plain torchax +
jax.jit and through xla_amp.torchax.make_train_step (float32, autocast off,
torch.optim SGD with momentum and AdamW). Runs in both profiles (torch 2.9 +
torch_xla, torch 2.15 + jax 0.12).

torch >= 2.13's Adam, AdamW and Adamax check the current accelerator's
stream in step(); with torchax imported that accelerator is PrivateUse1
("jax"), for which torchax registers no device guard, so step() raises,
eager CPU optimizers included (pinned below; torch 2.9 checks CUDA only)."""
from __future__ import annotations

import sys
import time

import jax
import pytest
import torch
import torch.nn.functional as F

from tests.support import torchax_current as cur

import xla_amp.torchax as xt

pytestmark = [pytest.mark.torchax, pytest.mark.core]
STEPS = 20
LOSS_RTOL = 1e-5     # largest relative loss difference over the steps
PARAM_ATOL = 1e-5    # largest parameter difference after them
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01),
}


@pytest.fixture(scope="module", autouse=True)
def _xla_runtime_before_a_cpu_backward(request):
    """Where torch_xla is loaded (the torch 2.9 profile), its runtime starts
    before this file's CPU backward: the autograd engine sizes its device
    queues at the process's first backward, and an XLA backward after a CPU
    one fails otherwise (tests/engine/test_xla_known_issues.py)."""
    if "torch_xla" in sys.modules:
        request.getfixturevalue("device")


# torch >= 2.13 asks the accelerator ("jax") for a device guard in Adam's step;
# xla_amp.torchax's shim registers torch's Python one (_compat._device_guard)
GUARD_NEEDED = cur.torch_minor() >= (2, 13)


def _eager(make_opt):
    model = cur.mlp()
    losses = cur.eager_losses(model, cur.batches(STEPS), make_opt(model.parameters()))
    return losses, {k: v.detach() for k, v in model.named_parameters()}


def _max_param_diff(params, want) -> float:
    return max(float((torch.as_tensor(params[k]) - want[k]).abs().max()) for k in want)


def test_plain_torchax_jit_trains_like_eager():
    want, want_params = _eager(lambda p: torch.optim.SGD(p, lr=0.2))
    step, params = cur.jitted_sgd(cur.mlp(), lr=0.2)
    losses = []
    for x, y in cur.batches(STEPS):
        params, loss = step(params, *cur.ENV.t2j_copy((x, y)))
        losses.append(float(loss))
    params = {k: torch.from_numpy(jax.device_get(v).copy()) for k, v in params.items()}
    print(f"plain torchax jit, torch {torch.__version__}: max rel loss diff "
          f"{cur.relative(losses, want):.2e}, max param diff "
          f"{_max_param_diff(params, want_params):.2e}, losses {want[0]:.5f} -> {want[-1]:.5f}")
    assert cur.relative(losses, want) < LOSS_RTOL
    assert _max_param_diff(params, want_params) < PARAM_ATOL
    assert want[-1] < 0.8 * want[0]


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_make_train_step_trains_like_eager(name):
    want, want_params = _eager(OPTIMIZERS[name])
    model = cur.mlp()
    step = xt.make_train_step(model, F.mse_loss, OPTIMIZERS[name](model.parameters()),
                              policy="cpu", enabled=False)
    data = [step.place_batch(x, y) for x, y in cur.batches(STEPS)]
    losses = [float(step(*data[0]))]
    start = time.perf_counter()
    last = [step(*batch) for batch in data[1:]]
    jax.block_until_ready(last)
    per_step = (time.perf_counter() - start) / (STEPS - 1)
    losses += [float(t) for t in last]
    params = step.state_dict()["model"]
    print(f"make_train_step {name}, torch {torch.__version__}: max rel loss diff "
          f"{cur.relative(losses, want):.2e}, max param diff "
          f"{_max_param_diff(params, want_params):.2e}, {per_step * 1e3:.2f} ms/step, losses "
          f"{want[0]:.5f} -> {want[-1]:.5f}")
    assert cur.relative(losses, want) < LOSS_RTOL
    assert _max_param_diff(params, want_params) < PARAM_ATOL
    assert step._jitted._cache_size() == 1
    assert want[-1] < 0.8 * want[0]


def test_adam_steps_after_torchax_on_current_torch():
    """Without the shim's device guard, torch >= 2.13 raises "PyTorch is not
    linked with support for jax devices" in AdamW.step once torchax is imported."""
    from xla_amp.torchax import _compat
    model = cur.mlp()
    (x, y), = cur.batches(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    F.mse_loss(model(x), y).backward()
    before = [p.detach().clone() for p in model.parameters()]
    opt.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert bool(_compat._state.get("guard")) == GUARD_NEEDED
