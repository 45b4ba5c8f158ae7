"""The MNIST launcher with --fsdp (FSDPv2 through xla_amp.sharded) on 2
virtual XLA:CPU devices, bf16 weights with an fp32 master: trains to the
accuracy of the same run on one device, one graph execution per step, and
its checkpoint is a sharded one that resumes under --fsdp; SIGTERM during
the run saves it at the step boundary and exits 75, and --auto_resume
continues bit-identically. `make sharded`."""
import os
import re
import signal
import time

import pytest

from tests.sharded._sharded_saves import contents, same
from tests.support.faults import Running
from tests.support.launch import launch, start, summary
from xla_amp import sharded

pytestmark = pytest.mark.sharded

ARGS = ["--batch_size", 32, "--eval_batch_size", 120, "--num_epochs", 1, "--max_steps", 30,
        "--precision", "bf16_master", "--syncfree", "--optimizer", "adamw"]
FSDP = [*ARGS, "--num_devices", 2, "--fsdp"]


def _accuracy(proc) -> float:
    return float(re.match(r"([0-9.]+)%", summary(proc, "accuracy")).group(1))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted --fsdp run and its checkpoint directory."""
    ck = tmp_path_factory.mktemp("ref") / "ck"
    two = launch("train_mnist_amp.py", *FSDP, "--checkpoint", ck)
    assert two.returncode == 0, two.stderr[-3000:]
    return two, ck


def test_mnist_fsdp_trains_like_one_device(reference):
    two, ck = reference
    one = launch("train_mnist_amp.py", *ARGS)
    assert one.returncode == 0, one.stderr[-3000:]
    assert "2 x CPU (FSDPv2: parameters, gradients and state sharded)" in two.stdout
    assert "1.00 graph executions/step" in summary(two, "XLA")
    assert abs(_accuracy(two) - _accuracy(one)) <= 2.0, (summary(one, "accuracy"),
                                                         summary(two, "accuracy"))
    assert os.path.isdir(ck) and len(sharded.versions(ck)) == 1   # a sharded checkpoint
    assert sharded.read_extra(ck)["position"]["global_step"] == 30
    # resume the finished run: the sharded model and master load back
    again = launch("train_mnist_amp.py", *FSDP, "--resume", ck)
    assert again.returncode == 0, again.stderr[-3000:]
    assert summary(again, "accuracy") == summary(two, "accuracy")


def test_sigterm_saves_a_sharded_checkpoint_and_auto_resume_continues_exactly(
        reference, tmp_path):
    """SIGTERM once the first periodic checkpoint (step 5) is published: the
    run finishes the step in flight, saves, prints one line, exits 75 with
    every step it did in the checkpoint; the restart ends with the
    uninterrupted run's checkpoint, bit for bit."""
    _, ref = reference
    ck = tmp_path / "ck"
    argv = [*FSDP, "--checkpoint", ck, "--checkpoint_steps", 5, "--auto_resume"]
    run = Running(start("train_mnist_amp.py", *argv))
    deadline = time.monotonic() + 300
    while not os.path.exists(ck / "xla_amp_sharded_versions.json"):
        assert run.p.poll() is None and time.monotonic() < deadline, "".join(run.err)[-3000:]
        time.sleep(0.02)
    run.p.send_signal(signal.SIGTERM)
    done = run.preempted(ck)
    assert sharded.read_extra(ck)["position"]["global_step"] == done >= 5   # 0 steps lost
    rc, out, err = Running(start("train_mnist_amp.py", *argv)).finish()
    assert rc == 0, err[-3000:]
    assert f"{done} steps done" in out
    assert same(contents(ck), contents(ref))
