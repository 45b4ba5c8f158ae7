"""Fault injection on the MNIST launcher with real processes and signals
(make faults): kill -9 at seeded moments (one inside a checkpoint write),
SIGTERM at seeded moments, a full and a read-only disk, two runs on one
path. Each resumed run must end bit-identical to an uninterrupted one."""
import os
import random
import signal

import pytest
import torch

from tests.support import assert_same
from tests.support.faults import DirWatch, Running
from tests.support.launch import start

pytestmark = pytest.mark.faults

# 2 epochs of 44 steps (digits, batch 32), stopped at 60; a checkpoint
# every 3 steps: 20 writes of ~14 MB
ARGS = ["--batch_size", 32, "--num_epochs", 2, "--eval_batch_size", 120, "--log_steps", 4,
        "--max_steps", 60]
STATE = ("model", "optimizer", "scaler", "position")
# The seeded moments, in CPU seconds of the run after its "devices" line (the
# training loop's own clock, Running.wait_cpu: the same under load, so make
# faults runs two workers). The uninterrupted run uses ~18 CPU s (11.6 s of
# wall) from there; these span about a quarter to three quarters of it.
MOMENTS = (4.5, 13.0)


def load(path):
    return torch.load(path, weights_only=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run's final checkpoint."""
    path = tmp_path_factory.mktemp("ref") / "ck.pt"
    rc, out, err = Running(start("train_mnist_amp.py", *ARGS, "--checkpoint", path,
                                 "--checkpoint_steps", 3)).finish()
    assert rc == 0, err[-3000:]
    state = load(path)
    assert state["position"]["global_step"] == 60
    return state


def assert_equals_reference(path, reference):
    state = load(path)
    for key in STATE:
        assert_same(state[key], reference[key], key)


def temporaries(directory):
    return sorted(n for n in os.listdir(directory) if n.endswith(".tmp"))


def test_kill9_at_seeded_moments_and_inside_a_write(tmp_path, reference):
    """Killed with SIGKILL three times -- once frozen inside a checkpoint
    write (SIGSTOP on the temporary file's creation, then SIGKILL), twice at
    seeded moments -- and restarted each time with the same command line
    (--auto_resume): the checkpoint at the path always loads, the killed
    writer's temporary file is removed by the next run, and the final state
    equals the uninterrupted run's to the bit."""
    path = tmp_path / "ck.pt"
    argv = [*ARGS, "--checkpoint", path, "--checkpoint_steps", 3, "--auto_resume"]
    rng = random.Random(35)

    # 1: inside the second write (a first checkpoint exists by then)
    watch = DirWatch(str(tmp_path))
    run = Running(start("train_mnist_amp.py", *argv))
    created, frozen = 0, False
    while not frozen:
        event = watch.next(timeout=300)
        assert event is not None and run.p.poll() is None, "".join(run.err)[-3000:]
        mask, name = event
        if name.startswith(".ck.pt.") and name.endswith(".tmp"):
            created += 1
            if created >= 2:
                run.p.send_signal(signal.SIGSTOP)
                frozen = (tmp_path / name).exists()  # not yet renamed: inside the write
                if not frozen:
                    run.p.send_signal(signal.SIGCONT)
    before = load(path)                  # the previous checkpoint, whole
    run.p.kill()
    run.finish()
    watch.close()
    assert temporaries(tmp_path), "the killed writer left no temporary file"
    assert before["position"]["global_step"] % 3 == 0
    assert_same(load(path)["position"], before["position"])

    # 2, 3: at seeded moments after the run is under way
    for _ in range(2):
        run = Running(start("train_mnist_amp.py", *argv))
        assert run.wait_for("devices")
        run.wait_cpu(rng.uniform(*MOMENTS))  # (a resumed run may end first)
        run.p.kill()
        run.finish()
        load(path)                        # whatever the moment, the file loads
    # the last run goes to the end
    rc, out, err = Running(start("train_mnist_amp.py", *argv)).finish()
    assert rc == 0, err[-3000:]
    assert "resumed from" in out
    assert temporaries(tmp_path) == []
    assert_equals_reference(path, reference)


@pytest.mark.parametrize("seed", [1, 2])
def test_sigterm_saves_the_step_in_flight_and_resumes_exactly(tmp_path, reference, seed):
    """SIGTERM at a seeded moment: the run finishes the step in flight,
    writes the checkpoint, prints one line naming it and exits 75; no
    periodic checkpoint exists before (--checkpoint_steps 0), so every step
    it had done is in that file. The restart (--auto_resume) ends
    bit-identical to the uninterrupted run."""
    path = tmp_path / "ck.pt"
    argv = [*ARGS, "--checkpoint", path, "--auto_resume"]
    run = Running(start("train_mnist_amp.py", *argv))
    assert run.wait_for("devices")
    assert run.wait_cpu(random.Random(seed).uniform(*MOMENTS)), "".join(run.err)[-3000:]
    run.p.send_signal(signal.SIGTERM)
    done = run.preempted(path)
    state = load(path)
    assert state["position"]["global_step"] == done > 0   # zero steps lost
    rc, out, err = Running(start("train_mnist_amp.py", *argv)).finish()
    assert rc == 0, err[-3000:]
    assert f"{done} steps done" in out
    assert_equals_reference(path, reference)


def test_second_run_on_the_path_is_refused_and_the_first_never_torn(tmp_path):
    """While a run holds --checkpoint, a second run on the same path is
    refused at start (exit 73, one line naming the path); every file that
    appears at the path during the first run is held open and loads whole."""
    path = tmp_path / "ck.pt"
    argv = [*ARGS, "--checkpoint", path, "--checkpoint_steps", 2]
    watch = DirWatch(str(tmp_path))
    first = Running(start("train_mnist_amp.py", *argv))
    assert first.wait_for("devices")
    rc, out, err = Running(start("train_mnist_amp.py", *argv)).finish()
    assert rc == 73, (out, err)
    msg = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(msg) == 1 and str(path) in msg[0] and "in use by another run" in msg[0], err
    assert "Traceback" not in err
    held = []
    while first.p.poll() is None:
        event = watch.next(timeout=1.0)
        if event and event[1] == "ck.pt":
            held.append(open(path, "rb"))   # this version, whatever comes next
    rc, out, err = first.finish()
    assert rc == 0, err[-3000:]
    while (event := watch.next(timeout=0.2)) is not None:
        if event[1] == "ck.pt":
            held.append(open(path, "rb"))
    assert len(held) >= 10
    steps = []
    for f in held:
        state = torch.load(f, weights_only=True)
        steps.append(state["position"]["global_step"])
        f.close()
    assert steps == sorted(steps) and steps[-1] == 60
