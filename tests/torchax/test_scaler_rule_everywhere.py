"""One loss-scaling rule on every engine (xla_amp/scaler/_update.next_scale):
the same clean and overflowing steps (tests/support/scaler_sequence.py) fed
to GradScaler on torch_xla and on the stand-in PrivateUse1 device and to
LossScaler on torchax give the same scale, growth tracker and skip count
after every step, plainly, with a floor, and with growth past float32's
range (the scale stays finite and training goes on); a LossScaler state
dict loads into a GradScaler and back and continues identically; a bad
min_scale is refused as GradScaler refuses it."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from xla_amp import engines

from tests.support import launch, runs, scaler_sequence
from tests.support import torchax_current  # noqa: F401  (xla_amp.torchax's shim first: torch 2.15)
from tests.support.torchax_env import ENV, to_jax

import xla_amp.torchax as xt

pytestmark = [pytest.mark.torchax, pytest.mark.core]
HERE = os.path.dirname(os.path.abspath(__file__))


def _other_engines() -> dict:
    def compute():
        names = ["standin"] + (["torch_xla"] if engines.available("torch_xla") else [])
        folder = os.environ[runs.RUN_DIR_VAR]
        out = {}
        for e in names:
            path = os.path.join(folder, f"scaler-sequence-{e}.json")
            proc = subprocess.run([sys.executable, os.path.join(HERE, "_scaler_sequence_run.py"),
                                   e, path], capture_output=True, text=True, timeout=300,
                                  env=launch.launch_env(), cwd=launch.ROOT)
            assert proc.returncode == 0, (e, proc.stderr[-3000:])
            with open(path) as f:
                out[e] = json.load(f)
        return out
    return runs.once_per_run(("scaler-sequence", sys.executable), compute)


def _torchax(config):
    with ENV:
        return scaler_sequence.loss_scaler(xt.LossScaler, lambda t: to_jax([t])[0], config)


@pytest.mark.parametrize("name", list(scaler_sequence.CONFIGS))
def test_every_engine_takes_the_same_steps(name):
    config = scaler_sequence.CONFIGS[name]
    got = {"torchax": _torchax(config), **{e: t[name] for e, t in _other_engines().items()}}
    rows = got["torchax"]
    for engine, other in got.items():
        assert other == rows, (engine, other, rows)
    found = scaler_sequence.FOUND
    assert [r[2] for r in rows] == [sum(found[:i + 1]) for i in range(len(found))]
    assert all(math.isfinite(r[0]) and r[0] > 0 for r in rows)
    if name == "min_scale":
        assert min(r[0] for r in rows) == config["min_scale"]
    if name == "past_float32":  # at float32's largest power of two, growth stops
        assert max(r[0] for r in rows) < float(torch.finfo(torch.float32).max)
        assert rows[0][0] == 2.0 ** 126  # growing it 4x would overflow: kept


def test_a_state_dict_moves_between_loss_scaler_and_grad_scaler():
    import xla_amp
    config = scaler_sequence.CONFIGS["min_scale"]
    scaler = xt.LossScaler(**config)
    with ENV:
        state = scaler.init()
        for found in scaler_sequence.FOUND[:8]:
            grads = {"w": to_jax([torch.full((2,), float("inf") if found else 1.0)])[0]}
            _, f = scaler.unscale(grads, state)
            state = scaler.update(state, f)
        saved = scaler.state_dict(state)
        assert saved["_skipped_steps"] == scaler.skipped_steps(state) == 3
        assert saved["min_scale"] == 2.0
        other = xla_amp.GradScaler(**config)
        other.load_state_dict(saved)  # a CPU GradScaler reads its settings and counts
        back = scaler.load_state_dict(other.state_dict())
        assert scaler.state_dict(back) == saved
        torch_amp = torch.amp.GradScaler("cpu", init_scale=config["init_scale"],
                                         growth_factor=2.0, backoff_factor=0.25,
                                         growth_interval=3)
        from_torch = scaler.load_state_dict(dict(torch_amp.state_dict(), scale=saved["scale"]))
        assert scaler.state_dict(from_torch)["_skipped_steps"] == 0  # torch.amp keeps no count


@pytest.mark.parametrize("bad,message", [
    (0.0, "LossScaler: min_scale must be > 0, got 0.0"),
    (float("inf"), "LossScaler: min_scale must be finite, got inf"),
    (64.0, "LossScaler: min_scale (64) must not exceed init_scale (16)"),
    ("1", "LossScaler: min_scale must be a number, got '1'")])
def test_a_bad_min_scale_is_refused_as_grad_scaler_refuses_it(bad, message):
    with pytest.raises(ValueError) as e:
        xt.LossScaler(init_scale=16.0, min_scale=bad)
    assert str(e.value).startswith(message), str(e.value)


GOOD = {"scale": 16.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2,
        "_growth_tracker": 1, "min_scale": None, "_skipped_steps": 3}
BAD_STATES = [
    ([1, 2], ValueError, "{who}: expected a dict, got list"),
    ({}, RuntimeError, "The source state dict is empty"),
    ({k: v for k, v in GOOD.items() if k != "_growth_tracker"}, ValueError,
     "{who}: missing keys ['_growth_tracker']"),
    ({**GOOD, "extra": 1}, ValueError, "{who}: unknown keys ['extra']"),
    ({**GOOD, "scale": -1.0}, ValueError, "{who}: scale must be > 0, got -1.0"),
    ({**GOOD, "scale": float("nan")}, ValueError, "{who}: scale must be finite, got nan"),
    ({**GOOD, "_growth_tracker": -1}, ValueError, "{who}: _growth_tracker must be an int >= 0"),
    ({**GOOD, "_skipped_steps": 1.5}, ValueError, "{who}: _skipped_steps must be an int >= 0"),
]


@pytest.mark.parametrize("state,error,message", BAD_STATES)
def test_a_bad_state_dict_is_refused_alike_by_both_scalers(state, error, message):
    """One reader (xla_amp/scaler/_state_dict.read): the same refusal from
    GradScaler and LossScaler, each naming itself; neither scaler changes."""
    from xla_amp.scaler import GradScaler
    grad_scaler = GradScaler(init_scale=8.0)
    loss_scaler = xt.LossScaler(init_scale=16.0, growth_interval=2)
    for who, load in (("GradScaler.load_state_dict", grad_scaler.load_state_dict),
                      ("LossScaler.load_state_dict", loss_scaler.load_state_dict)):
        with pytest.raises(error) as e:
            load(state)
        assert str(e.value).startswith(message.format(who=who)), str(e.value)
    assert grad_scaler.state_dict()["scale"] == 8.0


def test_a_loss_scaler_takes_only_its_own_configuration():
    scaler = xt.LossScaler(init_scale=16.0, growth_interval=2)
    state = scaler.load_state_dict(GOOD, device="cpu")
    assert float(state["scale"]) == 16.0 and int(state["growth_tracker"]) == 1
    assert int(state["skipped"]) == 3
    with pytest.raises(ValueError, match=r"growth_interval is 5 in the state, 2 here"):
        scaler.load_state_dict({**GOOD, "growth_interval": 5}, device="cpu")
