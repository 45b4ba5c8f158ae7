"""A lost process in a multi-process torchax run: two real
processes x 2 CPU devices (jax.distributed, gloo), both set up by
xla_amp.torchax.initialize_distributed with its default timeouts, train
through make_train_step(mesh=..., sharding="replicate")
(tests/torchax/_torchax_peer_loss_run.py, one process each).

    process 1 SIGKILLed mid-run: process 0 exits with PEER_LOST_EXIT_CODE
    within 20 s of the kill, one line on its stderr naming process 1 (or,
    where the kill cut a message in half, by gloo's own abort at once)
    process 1 ending on an unhandled exception: process 0 exits the same
    way at once, the line saying process 1 failed
    process 0's own step raising because process 1 died (gloo's
    "Connection reset by peer"): process 0 exits naming process 1, as if
    it had blocked
    a clean run, process 0 lingering past peer_timeout_s after process 1
    has ended without jax.distributed.shutdown(): both exit 0, nobody named
    bad arguments: refused before anything changes

(A SIGKILLed process 0, the coordinator, takes JAX's coordination service
with it: JAX aborts the survivor itself, 0.2 s after the kill -- measured,
see docs/torchax.md; not repeated here.) Every child is SIGKILLed in a
finally (JAX catches SIGTERM); every wait has a timeout."""
import math
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

import xla_amp.torchax as xt
from xla_amp.torchax._distributed import PEER_LOST_EXIT_CODE

pytestmark = pytest.mark.torchax

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RUN = os.path.join(HERE, "_torchax_peer_loss_run.py")
TIMEOUT = 120  # seconds, a whole pair at most (a run takes 10 to 20)
KILL_TO_EXIT_S = 20  # the survivor's exit after the kill, at most
LINGER_S = 8  # the clean run's straggler: past peer_timeout_s (6 s)
# gloo's transport thread aborting the survivor when the killed peer's last
# message arrives cut short (about once in 20 runs): upstream's outcome
GLOO_ABORT = "Received data size doesn't match expected size"


def _env():
    """JAX on the CPU; the children set their own device count."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PJRT_DEVICE="CPU")
    env.pop("XLA_FLAGS", None)
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _kill_all(procs):
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
        p.wait()


def _read(tmp_path, name):
    with open(tmp_path / name) as f:
        return f.read()


def _count(tmp_path, pid, prefix):
    """Lines of process `pid`'s stdout that start with `prefix`."""
    return sum(line.startswith(prefix) for line in _read(tmp_path, f"out{pid}").splitlines())


def _report(tmp_path, procs):
    """Return codes and stderr tails (less torch's dispatcher listings)."""
    parts = []
    for pid, p in enumerate(procs):
        err = "\n".join(line for line in _read(tmp_path, f"err{pid}").splitlines()
                        if "registered at" not in line)
        steps = _count(tmp_path, pid, "step ")
        parts.append(f"--- process {pid}: rc {p.returncode}, {steps} steps\n{err[-3000:]}")
    return "\n".join(parts)


def _start(tmp_path, steps, linger, end, gate=(None, None)):
    """Both children, stdout and stderr to files in tmp_path; `steps`,
    `linger`, `end` and `gate` (PEER_LOSS_GATE) per process (see the
    child's docstring)."""
    port, procs = _free_port(), []
    for pid in (0, 1):
        env = _env() if gate[pid] is None else dict(_env(), PEER_LOSS_GATE=str(gate[pid]))
        with open(tmp_path / f"out{pid}", "w") as out, open(tmp_path / f"err{pid}", "w") as err:
            procs.append(subprocess.Popen(
                [sys.executable, RUN, str(pid), str(port), str(steps[pid]), str(linger[pid]),
                 end[pid]], stdout=out, stderr=err, env=env, cwd=ROOT))
    return procs


def _wait_for(tmp_path, procs, pid, line, count=1):
    """Until process `pid` has printed `count` lines starting with `line`;
    fails on a child's early end or TIMEOUT."""
    deadline = time.monotonic() + TIMEOUT
    while _count(tmp_path, pid, line) < count:
        assert all(p.poll() is None for p in procs), \
            f"a child ended before process {pid} printed {line!r}\n" + _report(tmp_path, procs)
        assert time.monotonic() < deadline, \
            f"process {pid}: no {line!r} in {TIMEOUT} s\n" + _report(tmp_path, procs)
        time.sleep(0.1)


def _survivor_exit(tmp_path, procs, since):
    """Process 0's wait (KILL_TO_EXIT_S + 15 at most), the seconds from
    `since`, and its one xla_amp.torchax line (asserted single)."""
    try:
        procs[0].wait(KILL_TO_EXIT_S + 15)
    except subprocess.TimeoutExpired:
        pass
    elapsed = time.monotonic() - since
    lines = [line for line in _read(tmp_path, "err0").splitlines()
             if line.startswith("xla_amp.torchax: ")]
    return elapsed, lines


def test_a_killed_process_ends_the_survivor_naming_it(tmp_path):
    procs = _start(tmp_path, steps=(10 ** 6, 10 ** 6), linger=(0, 0), end=("shutdown",) * 2)
    try:
        _wait_for(tmp_path, procs, 0, "step ", 3)
        _wait_for(tmp_path, procs, 1, "step ", 3)
        procs[1].send_signal(signal.SIGKILL)
        elapsed, lines = _survivor_exit(tmp_path, procs, time.monotonic())
    finally:
        _kill_all(procs)
    report = _report(tmp_path, procs)
    print(f"process 1 killed: process 0 exited rc {procs[0].returncode} after {elapsed:.1f} s")
    assert elapsed < KILL_TO_EXIT_S, f"{elapsed:.1f} s\n{report}"
    if procs[0].returncode == -signal.SIGABRT and GLOO_ABORT in _read(tmp_path, "err0"):
        return  # gloo read the dying peer's half-sent message: its own abort (docs/torchax.md)
    assert procs[0].returncode == PEER_LOST_EXIT_CODE, report
    assert len(lines) == 1 and lines[0].startswith(
        "xla_amp.torchax: process 1 of 2 stopped answering (no heartbeat for "), report
    assert lines[0].endswith(f"exiting (process 0, status {PEER_LOST_EXIT_CODE})"), report


@pytest.mark.core  # Python 3.12 refuses new threads in exit hooks: the watchdog's exit there
def test_a_step_that_raises_because_its_peer_died_names_the_peer(tmp_path):
    """Gloo sometimes notices the kill itself: the survivor's step raises
    ("Connection reset by peer"; once in a make torchax run, 2026-11-29).
    Process 0 waits at its gate while process 1 blocks in step 3's
    collective; process 1 is SIGKILLed, then process 0 raises that error.
    Its exit hook must not mark it failed (JAX's shutdown barrier would
    abort it a heartbeat timeout later, naming nobody): the watchdog names
    process 1, status 75."""
    gate = tmp_path / "gate"
    procs = _start(tmp_path, steps=(10 ** 6, 10 ** 6), linger=(0, 0), end=("shutdown",) * 2,
                   gate=(gate, None))
    try:
        _wait_for(tmp_path, procs, 0, "gate")
        _wait_for(tmp_path, procs, 1, "step ", 3)
        time.sleep(0.5)  # process 1 inside step 3's all-reduce, waiting for process 0
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait()
        since = time.monotonic()
        gate.write_text("raise")
        elapsed, lines = _survivor_exit(tmp_path, procs, since)
    finally:
        _kill_all(procs)
    report = _report(tmp_path, procs)
    print(f"process 1 killed, process 0 raised: rc {procs[0].returncode} after {elapsed:.1f} s")
    assert "Connection reset by peer (raised by the test)" in _read(tmp_path, "err0"), report
    assert procs[0].returncode == PEER_LOST_EXIT_CODE, report
    assert elapsed < KILL_TO_EXIT_S, f"{elapsed:.1f} s\n{report}"
    assert len(lines) == 1 and lines[0].startswith(
        "xla_amp.torchax: process 1 of 2 stopped answering (no heartbeat for "), report


def test_a_process_that_raises_ends_the_others_naming_it(tmp_path):
    procs = _start(tmp_path, steps=(10 ** 6, 3), linger=(0, 0), end=("shutdown", "raise"))
    try:
        _wait_for(tmp_path, procs, 1, "done")  # printed just before the raise
        elapsed, lines = _survivor_exit(tmp_path, procs, time.monotonic())
    finally:
        _kill_all(procs)
    report = _report(tmp_path, procs)
    print(f"process 1 raised: process 0 exited rc {procs[0].returncode} after {elapsed:.1f} s")
    assert "RuntimeError: process 1: a planned failure" in _read(tmp_path, "err1"), report
    assert procs[1].returncode != 0, report
    assert procs[0].returncode == PEER_LOST_EXIT_CODE, report
    assert elapsed < KILL_TO_EXIT_S, f"{elapsed:.1f} s\n{report}"
    assert lines == [f"xla_amp.torchax: process 1 of 2 failed (an unhandled exception there); "
                     f"exiting (process 0, status {PEER_LOST_EXIT_CODE})"], report


def test_a_clean_run_with_a_straggler_exits_zero(tmp_path):
    """Process 0 lingers LINGER_S after its steps while process 1 has ended
    without jax.distributed.shutdown() (its key marked "exit" at exit):
    nobody is reported, both exit 0."""
    procs = _start(tmp_path, steps=(3, 3), linger=(LINGER_S, 0), end=("shutdown", "return"))
    try:
        deadline = time.monotonic() + TIMEOUT
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        _kill_all(procs)
    report = _report(tmp_path, procs)
    assert [p.returncode for p in procs] == [0, 0], report
    for pid in (0, 1):
        assert (_count(tmp_path, pid, "step "), _count(tmp_path, pid, "done")) == (3, 1), report
        assert "xla_amp.torchax: " not in _read(tmp_path, f"err{pid}"), report


GOOD = dict(coordinator_address="localhost:1", num_processes=2, process_id=0,
            initialization_timeout_s=1)  # were one let through: fails in 1 s, not 120


@pytest.mark.parametrize("change, named", [
    (dict(coordinator_address="localhost"), "coordinator_address"),
    (dict(coordinator_address="localhost:0"), "coordinator_address"),
    (dict(coordinator_address=None), "coordinator_address"),
    (dict(num_processes=0), "num_processes"),
    (dict(num_processes=True), "num_processes"),
    (dict(process_id=2), "process_id"),
    (dict(process_id=-1), "process_id"),
    (dict(process_id=0.0), "process_id"),
    (dict(heartbeat_timeout_s=0), "heartbeat_timeout_s"),
    (dict(heartbeat_timeout_s=math.inf), "heartbeat_timeout_s"),
    (dict(heartbeat_timeout_s=10), "heartbeat_timeout_s"),  # below 2 * (6 + 2)
    (dict(shutdown_timeout_s=-5), "shutdown_timeout_s"),
    (dict(shutdown_timeout_s=2.5), "shutdown_timeout_s"),
    (dict(initialization_timeout_s=math.nan), "initialization_timeout_s"),
    (dict(peer_timeout_s=0), "peer_timeout_s"),
    (dict(peer_timeout_s=math.inf), "peer_timeout_s"),
    (dict(peer_timeout_s="6"), "peer_timeout_s"),
    (dict(heartbeat_timeout_seconds=30), "heartbeat_timeout_s"),
    (dict(bogus=1), "bogus"),
])
def test_bad_arguments_are_refused_before_anything_changes(change, named):
    from jax._src import distributed
    args = dict(GOOD, **change)
    with pytest.raises(ValueError) as e:
        xt.initialize_distributed(args.pop("coordinator_address"), args.pop("num_processes"),
                                  args.pop("process_id"), **args)
    message = str(e.value)
    assert named in message and "\n" not in message, message
    assert distributed.global_state.client is None and distributed.global_state.service is None
