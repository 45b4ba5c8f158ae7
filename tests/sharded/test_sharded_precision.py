"""The precision matrix for the sharded format: a run saved with
``xla_amp.sharded.save`` after 5 steps in one mode and loaded into another
is converted exactly -- the fp32 master becomes the weight, an fp32 weight
becomes the master, bf16 is widened -- and continues within 1 % of the run
that never stopped (bit-identical where the mode did not change), or is
refused in one line naming both modes with the model, optimizer and scaler
unchanged (then ``allow_rounding=True`` loads it). The single-file matrix:
tests/checkpoint/test_checkpoint_precision.py."""
import pytest
import torch

from tests.sharded._sharded_saves import contents
from tests.support.precision_matrix import (LOSSLESS_INTO, assert_continues, assert_untouched,
                                            build, host_state, steps)
from xla_amp import checkpoint as ckpt
from xla_amp import sharded
from xla_amp.checkpoint import _record

pytestmark = pytest.mark.sharded

CELLS = ["fp32", "amp_bf16", "bf16", "bf16_master", "bf16_sr"]
NARROWING = {"bf16", "bf16_sr"}     # bf16 weights that keep no fp32 copy


def load(run, path, **kw):
    return sharded.load(path, model=run.model, optimizer=run.optimizer, scaler=run.scaler, **kw)


@pytest.fixture(scope="module")
def runs(device, tmp_path_factory):
    """Per mode: the sharded checkpoint after steps 0-4, the losses of steps
    5-7 of the run that went on, and its final model state."""
    out = {}
    d = tmp_path_factory.mktemp("sharded-matrix")
    for mode in CELLS:
        run = build(mode, device)
        steps(run, device, 0, 5)
        sharded.save(d / mode, model=run.model, optimizer=run.optimizer, scaler=run.scaler)
        losses = steps(run, device, 5, 3)
        out[mode] = (d / mode, losses, host_state(run))
    return out


@pytest.mark.parametrize("dst", CELLS)
@pytest.mark.parametrize("src", CELLS)
def test_every_cell_converts_exactly_or_is_refused(device, runs, src, dst):
    path, reference, final = runs[src]
    run = build(dst, device)
    if dst in NARROWING and src in LOSSLESS_INTO:
        before = host_state(run)
        with pytest.raises(ckpt.CheckpointError) as e:
            load(run, path)
        msg = str(e.value)
        saved = _record.read_sharded(sharded.versions(path)[0], "test")["training"]
        here = _record.sharded_training(run.model, run.optimizer, run.scaler)
        assert "\n" not in msg and msg.startswith("xla_amp.sharded.load: "), msg
        assert ckpt.mode_name(saved) in msg and ckpt.mode_name(here) in msg, msg
        assert msg.endswith("nothing was loaded") and "allow_rounding=True" in msg, msg
        assert_untouched(run, before)
        load(run, path, allow_rounding=True)
    else:
        load(run, path)
    assert_continues(run, device, src == dst, reference, final)


def test_the_master_becomes_the_weight_and_the_weight_the_master_bit_for_bit(device, runs):
    saved = contents(runs["bf16_master"][0])
    run = build("fp32", device)
    load(run, runs["bf16_master"][0])
    for i, (name, p) in enumerate(run.model.named_parameters()):
        assert torch.equal(p.cpu(), saved[f"optimizer.state.{i}.master"]), name
    saved = contents(runs["fp32"][0])
    run = build("bf16_master", device)
    load(run, runs["fp32"][0])
    for i, (name, p) in enumerate(run.model.named_parameters()):
        st = run.optimizer.state[p]
        assert torch.equal(st["master"].cpu(), saved[f"model.{name}"]), name
        assert torch.equal(p.cpu(), saved[f"model.{name}"].to(torch.bfloat16)), name
    saved = contents(runs["bf16_sr"][0])
    run = build("fp32", device)
    load(run, runs["bf16_sr"][0])
    for name, p in run.model.named_parameters():
        assert p.dtype == torch.float32
        assert torch.equal(p.cpu(), saved[f"model.{name}"].float()), name   # widened
