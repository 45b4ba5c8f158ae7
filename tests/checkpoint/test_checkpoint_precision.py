"""Every cell of the precision matrix (docs/precision_modes.md): a run saved
after 5 steps in one mode and resumed in another continues for 10 steps
within 1 % of the uninterrupted run's losses -- bit-identical where the
mode did not change -- or is refused in one line naming both modes, with
nothing changed (then ``allow_rounding=True`` resumes it). make faults."""
import pytest
import torch

from tests.support.precision_matrix import (LOSSLESS_INTO, MODES, assert_continues,
                                            assert_untouched, build, host_state, restore, save,
                                            steps)
from xla_amp import checkpoint as ckpt

pytestmark = pytest.mark.faults

NARROWING = {"bf16", "bf16_sr"}     # bf16 weights that keep no fp32 copy


@pytest.fixture(scope="module")
def runs(device, tmp_path_factory):
    """Per mode: the checkpoint after steps 0-4, the uninterrupted losses of
    steps 5-14 and the final model state."""
    out = {}
    d = tmp_path_factory.mktemp("matrix")
    for mode in MODES:
        run = build(mode, device)
        steps(run, device, 0, 5)
        save(run, d / f"{mode}.pt")
        losses = steps(run, device, 5, 10)
        out[mode] = (d / f"{mode}.pt", losses, host_state(run))
    return out


def refused(src: str, dst: str) -> bool:
    return dst in NARROWING and src in LOSSLESS_INTO


@pytest.mark.parametrize("dst", list(MODES))
@pytest.mark.parametrize("src", list(MODES))
def test_resume_across_modes(device, runs, src, dst):
    path, reference, final = runs[src]
    run = build(dst, device)
    if refused(src, dst):
        before = host_state(run)
        with pytest.raises(ckpt.CheckpointError) as e:
            restore(run, path)
        msg = str(e.value)
        saved = ckpt.load(path)["record"]
        here = ckpt.training_record(run.model, run.optimizer, run.scaler,
                                    amp_dtype=run.amp_dtype)
        assert "\n" not in msg and ckpt.mode_name(saved) in msg and ckpt.mode_name(here) in msg
        assert "allow_rounding=True" in msg
        assert_untouched(run, before)
        restore(run, path, allow_rounding=True)
    else:
        notes = restore(run, path)
        assert (notes == []) == (MODES[src][0] == MODES[dst][0] and
                                 not (src == "bf16_master" and MODES[dst][0] == torch.float32))
    assert_continues(run, device, src == dst, reference, final)


def test_master_becomes_the_weight_exactly(device, runs):
    """bf16 + master -> fp32: each weight is its saved master, bit for bit;
    fp32 -> bf16 + master: each master is the saved fp32 weight."""
    path = runs["bf16_master"][0]
    state = ckpt.load(path)
    names = state["record"]["optimizer_params"]
    run = build("amp_bf16", device)
    restore(run, path)
    got = run.model.state_dict()
    for i, s in state["optimizer"]["state"].items():
        assert torch.equal(got[names[i]].cpu(), s["master"]), names[i]
    path = runs["amp_bf16"][0]
    state = ckpt.load(path)
    run = build("bf16_master", device)
    restore(run, path)
    for i, p in enumerate(run.optimizer.param_groups[0]["params"]):
        master = run.optimizer.state[p]["master"]
        assert torch.equal(master.cpu(), state["model"][names[i]]), names[i]
        assert torch.equal(p.cpu(), state["model"][names[i]].to(torch.bfloat16))
