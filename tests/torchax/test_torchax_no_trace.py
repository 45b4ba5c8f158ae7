"""A step the torchax LossScaler skips leaves no trace: every leaf the
step carries -- parameters, optimizer moments and counts, batch-norm
statistics the forward moved, fp8 amax histories, pending amaxes and
scales, the random key -- keeps its bits; only the scaler's state moves
(scale halved). The leaves are taken from the step's own state tree, so a
new piece of state is checked without naming it here. The next good step
then equals, bit for bit, a good step taken from the state before the
skip (with the halved scale): everything advanced exactly once. One
compiled program serves good and skipped steps, and nothing is read back
to the host while they run."""
from __future__ import annotations

import jax
import numpy as np
import optax
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.support.torchax_env import ENV  # noqa: F401  (torchax's environment, made once)

import xla_amp.torchax as xt
from xla_amp import fp8

pytestmark = pytest.mark.torchax

CASES = {  # id -> (optimizer factory, policy, dtype)
    "optax_adamw-fp16": (lambda m: optax.adamw(1e-2), "cuda", torch.float16),
    "torch_adamw-bf16": (lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2), "tpu",
                         torch.bfloat16),
    "torch_sgd-fp16": (lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9),
                       "cuda", torch.float16),
}


class Net(nn.Module):
    """fp8 delayed layers, batch norm (the forward moves its statistics) and
    dropout (each step draws from the key)."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32, bias=False)
        self.bn = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.25)
        self.fc2 = nn.Linear(32, 16, bias=False)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(F.gelu(self.fc2(self.drop(F.relu(self.bn(self.fc1(x)))))))


def _loss(out, y):
    """Cross-entropy on y[:, 0]; y[0, 1] multiplies it (inf injects an overflow)."""
    return F.cross_entropy(out.float(), y[:, 0].long()) * y[0, 1]


def _batch(i, factor=1.0):
    g = torch.Generator().manual_seed(i)
    # 16 rows: fp8 GEMMs need every dimension a multiple of 16 (else the layer
    # falls back to the region's dtype and records no amax)
    y = torch.stack([torch.randint(0, 4, (16,), generator=g).float(), torch.ones(16)], 1)
    y[0, 1] = factor
    return torch.randn(16, 16, generator=g), y


def _bits(tree):
    return [np.asarray(a).tobytes() for a in jax.tree_util.tree_leaves(tree)]


def _carried(state):
    """Everything but the scaler's state (params, buffers, opt_state, rng)."""
    params, buffers, opt_state, _scaler, rng = state
    return (params, buffers, opt_state, rng)


@pytest.mark.parametrize("case", list(CASES))
def test_a_skipped_step_leaves_every_leaf_and_the_next_step_advances_once(case):
    make_opt, policy, dtype = CASES[case]
    torch.manual_seed(0)
    model = fp8.convert(Net(), fp8.Fp8Recipe(scaling="delayed", amax_history_len=4,
                                             keep=("head",)))
    step = xt.make_train_step(model, _loss, make_opt(model), policy=policy, dtype=dtype,
                              seed=3, scaler=xt.LossScaler(init_scale=2.0 ** 10))
    for i in range(3):
        step(*_batch(i))
    assert not bool(step.metrics["found_inf"])
    before, scale = step.state, float(step.metrics["scale"])
    compiled = step._jitted._cache_size()

    with jax.transfer_guard_device_to_host("disallow"):
        step(*_batch(3, factor=float("inf")))
    assert bool(step.metrics["found_inf"])
    assert float(step.metrics["scale"]) == scale / 2
    names = [jax.tree_util.keystr(k) for k, _ in
             jax.tree_util.tree_leaves_with_path(_carried(before))]
    moved = [n for n, a, b in zip(names, _bits(_carried(before)), _bits(_carried(step.state)))
             if a != b]
    assert moved == [], f"a skipped step moved {moved}"
    assert any("fp8_amax_history" in n for n in names) and any("running_var" in n for n in names)

    skipped = step.state
    with jax.transfer_guard_device_to_host("disallow"):
        step(*_batch(4))
    after_skip = step.state
    # the control: the good step straight from the state before the skip,
    # given the scale the skip left
    step.state = (*before[:3], skipped[3], before[4])
    step(*_batch(4))
    for n, a, b in zip(names, _bits(_carried(after_skip)), _bits(_carried(step.state))):
        assert a == b, f"{n}: the step after a skip differs from a plain step"
    assert _bits(after_skip[3]) == _bits(step.state[3])
    advanced = [n for n, a, b in zip(names, _bits(_carried(before)),
                                     _bits(_carried(after_skip))) if a != b]
    assert any("fp8_amax_history" in n for n in advanced) and "[3]" in advanced  # the key
    assert step._jitted._cache_size() == compiled  # good and skipped: one program


@pytest.mark.parametrize("shape", [(8, 32), (4, 6, 5, 5)], ids=["1d", "2d"])
def test_batch_norm_statistics_follow_torch(shape):
    """torchax's batch-norm lowering drops the running statistics (upstream
    defect, torchax 0.0.13): through the step they now move as torch's
    kernels move them (unbiased variance), and are not 0 and 1 for ever."""
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(shape[1]) if len(shape) == 2 else nn.BatchNorm2d(shape[1])
    model = nn.Sequential(bn, nn.Flatten(), nn.LazyLinear(4))
    xs = [torch.randn(*shape) * 3 + 1 for _ in range(3)]
    model(xs[0])  # materialise the lazy layer
    reference = nn.Sequential(*[type(m)(m.num_features) if isinstance(m, nn.modules.batchnorm._BatchNorm)
                                else m for m in model])
    reference.load_state_dict(model.state_dict())
    step = xt.make_train_step(model, lambda out, y: out.float().square().mean() * y.sum(),
                              optax.sgd(0.0), policy="tpu", scaler=xt.LossScaler())
    for x in xs:
        step(x, torch.ones(1))
        reference(x)
    got = step.state[1]
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(np.asarray(got[f"0.{name}"]),
                                   getattr(reference[0], name).numpy(), rtol=1e-5, atol=1e-6)


def test_upstream_torchax_drops_batch_norm_statistics():
    """Pinned upstream defect (torchax 0.0.13): outside an xla_amp region a
    training-mode batch norm leaves its running statistics as they were.
    When this fails, torchax writes them back itself: then drop
    xla_amp/torchax/_batch_norm.py, which would update them twice."""
    from tests.support.torchax_env import ENV
    bn = nn.BatchNorm1d(4)
    with ENV:
        bn = bn.to("jax")
        bn(torch.randn(8, 4, device="jax") + 5)
        mean = bn.running_mean.cpu()
    assert torch.equal(mean, torch.zeros(4))
