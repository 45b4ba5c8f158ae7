"""Files a launcher must never trust or silently misread (make faults): a
crafted pickle (raw, and a real checkpoint with a payload object added) is
refused and its payload never runs; a checkpoint resumed under another
--precision converts exactly or is refused in one line naming both modes."""
import os
import pickle

import pytest
import torch

from tests.support.launch import MNIST_TINY, launch

pytestmark = pytest.mark.faults


class Payload:
    """Unpickling this creates the file `marker` (what an attacker's code would do)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def one_error(proc) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A real launcher checkpoint after 6 steps of --precision bf16_master."""
    path = tmp_path_factory.mktemp("good") / "ck.pt"
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 6, "--precision",
                  "bf16_master", "--checkpoint", path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return path


@pytest.mark.parametrize("kind", ["raw pickle", "checkpoint with a payload"])
def test_crafted_pickle_is_refused_and_never_runs(tmp_path, good, kind):
    marker = tmp_path / "payload-ran"
    bad = tmp_path / "bad.pt"
    if kind == "raw pickle":
        with open(bad, "wb") as f:
            pickle.dump({"format": "xla_amp-launcher-checkpoint/2", "x": Payload(marker)}, f)
    else:
        state = torch.load(good, weights_only=True)
        state["position"]["note"] = Payload(marker)
        torch.save(state, bad)
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 8, "--precision",
                  "bf16_master", "--resume", bad)
    assert proc.returncode == 2
    line = one_error(proc)
    assert str(bad) in line and "refused" in line and "not loaded" in line, line
    if kind == "checkpoint with a payload":
        assert "posix.system" in line, line
    assert not marker.exists()


def test_resume_in_another_precision_converts_or_refuses(tmp_path, good):
    """bf16 + master -> AMP on fp32 weights: the weights become the fp32
    masters exactly (a line says so), and training goes on; bf16 + master ->
    bf16 + SR would drop the masters' low bits: refused in one line naming
    both modes, unless --resume_allow_rounding."""
    saved = torch.load(good, weights_only=True)
    out = tmp_path / "amp.pt"
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 8, "--precision", "amp",
                  "--resume", good, "--checkpoint", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "converted to --precision amp" in proc.stdout and "from the fp32 master" in proc.stdout
    state = torch.load(out, weights_only=True)
    assert state["position"]["global_step"] == 8
    names = saved["record"]["optimizer_params"]
    assert all(state["model"][n].dtype == torch.float32 for n in names)
    assert all("master" not in s for s in state["optimizer"]["state"].values())
    assert state["record"]["groups"][0]["master_weights"] is False

    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 8, "--precision", "bf16_sr",
                  "--resume", good)
    assert proc.returncode == 2
    line = one_error(proc)
    assert "bf16 weights + fp32 master" in line and "bf16 weights + stochastic rounding" in line
    assert "--resume_allow_rounding" in line, line
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 8, "--precision", "bf16_sr",
                  "--resume", good, "--resume_allow_rounding")
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_checkpoint_of_an_older_launcher_resumes(tmp_path, good):
    """A file of the launchers before the training record (format /1, no
    "record", no checksums): read unverified with a record inferred from its
    own tensors and groups, so it resumes, and converts (bf16 + master ->
    AMP) like a new one."""
    state = torch.load(good, weights_only=True)
    del state["record"], state["checksums"]
    state["format"] = "xla_amp-launcher-checkpoint/1"
    old = tmp_path / "old.pt"
    torch.save(state, old)
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 8, "--precision",
                  "bf16_master", "--resume", old)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "converted" not in proc.stdout
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 8, "--precision", "amp",
                  "--resume", old)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "from the fp32 master" in proc.stdout
