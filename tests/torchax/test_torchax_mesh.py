"""xla_amp.torchax.make_train_step on several devices, each run
in a subprocess with its own devices (make torchax):

    tests/torchax/_torchax_mesh_run.py      one process, 4 CPU devices: an inf in
                                    one device's rows skips the step (the
                                    found_inf and gradient reductions cross
                                    the devices: all-reduces in the compiled
                                    step), replicated and FSDP; 4 devices
                                    against one
    tests/torchax/_torchax_two_process.py   two processes x 2 CPU devices, one mesh
                                    (jax.distributed, gloo): a GPT-2-shaped
                                    LM trains as the one-process 4-device
                                    run does, an inf only one process sees
                                    skips the step on both, and a checkpoint
                                    taken by both resumes in a fresh pair
                                    bit for bit

JAX catches SIGTERM: a stuck or failed run is ended with SIGKILL."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MESH_RUN = os.path.join(HERE, "_torchax_mesh_run.py")
WORKER = os.path.join(HERE, "_torchax_two_process.py")
TIMEOUT = 300  # seconds, per subprocess (or pair); a run takes 10 to 40


def _env(devices=None):
    """JAX on the CPU; `devices` CPU devices in one process through
    XLA_FLAGS, or none of it (the two-process workers set their own)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PJRT_DEVICE="CPU")
    env.pop("XLA_FLAGS", None)
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


def _tail(text, n=4000):
    """The end of a run's stderr, less torch's dispatcher listings."""
    return "\n".join(line for line in text.splitlines() if "registered at" not in line)[-n:]


def _result(stdout):
    """The JSON object a helper prints last (gloo prints its own lines)."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def _run(script, *args, devices):
    try:
        proc = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                              env=_env(devices), cwd=ROOT, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:  # (subprocess.run has SIGKILLed it)
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or ""
        pytest.fail(f"{os.path.basename(script)} {args}: over {TIMEOUT} s\n{_tail(err)}")
    result = _result(proc.stdout)
    assert proc.returncode == 0 and result is not None, \
        f"{os.path.basename(script)} {args}: rc {proc.returncode}\n{_tail(proc.stderr)}"
    return result


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _run_pair(tmp_path, mode, ckpt):
    """Both workers of a two-process run; the first to fail, or the
    timeout, SIGKILLs both, and the assertion shows both stderrs."""
    port, procs, logs = _free_port(), [], []
    for pid in (0, 1):
        out = open(tmp_path / f"{mode}{pid}.out", "w+")
        err = open(tmp_path / f"{mode}{pid}.err", "w+")
        logs.append((out, err))
        procs.append(subprocess.Popen([sys.executable, WORKER, mode, str(pid), str(port), ckpt],
                                      stdout=out, stderr=err, env=_env(), cwd=ROOT))
    deadline, failed = time.monotonic() + TIMEOUT, None
    try:
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                failed = "a worker failed"
                break
            if time.monotonic() > deadline:
                failed = f"over {TIMEOUT} s"
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
    results, report = [], []
    for pid, (p, (out, err)) in enumerate(zip(procs, logs)):
        out.seek(0)
        err.seek(0)
        results.append(_result(out.read()))
        report.append(f"--- process {pid}: rc {p.returncode}\n{_tail(err.read())}")
        out.close()
        err.close()
    ok = not failed and all(p.returncode == 0 for p in procs) and None not in results
    assert ok, f"{mode} pair: {failed or 'no result'}\n" + "\n".join(report)
    return results


@pytest.fixture(scope="module")
def mesh_runs():
    return _run(MESH_RUN, devices=4)


@pytest.mark.torchax
@pytest.mark.parametrize("sharding", ["replicate", "fsdp"])
def test_inf_in_one_device_shard_skips_the_step_and_the_scale_backs_off(mesh_runs, sharding):
    run = mesh_runs[sharding]
    # fsdp shards what divides by 4 (the 128-row first layer), replicate nothing
    assert run["sharded_params"] == ([] if sharding == "replicate" else ["0.bias", "0.weight"])
    # the inf rows 4..7 are one device's shard, and only it saw an inf
    assert len(run["inf_devices"]) == 1 and run["inf_device_rows"] == [[4, 5, 6, 7]]
    assert run["found_inf"] == [False, False, True, False, False, False]
    assert run["unchanged"]  # parameters and optimizer state, bit for bit
    # 2**10, growth_interval 2: grows after 2 clean steps, halves on the inf,
    # grows again 2 clean steps later
    assert run["scales"] == [1024.0, 2048.0, 1024.0, 1024.0, 2048.0, 2048.0]
    clean = [loss for loss, inf in zip(run["losses"], run["found_inf"]) if not inf]
    assert all(abs(loss) < 10 for loss in clean) and run["params_finite"]


@pytest.mark.torchax
@pytest.mark.parametrize("sharding", ["replicate", "fsdp"])
def test_compiled_step_reduces_across_devices(mesh_runs, sharding):
    coll = mesh_runs[sharding]["collectives"]
    assert coll["counts"]["all-reduce"] >= 1, coll
    types = coll["all_reduce_types"]
    if sharding == "replicate":
        # the gradients of the replicated weights are summed over the devices
        # (found_inf is then computed on the same replicated gradients)
        assert any("f32[128,64]" in t and "f32[10,128]" in t for t in types), types
    else:
        # the sharded gradients' finiteness flags are reduced over the devices
        assert any("pred[]" in t for t in types), types


@pytest.mark.torchax
def test_four_devices_fsdp_match_one_device(mesh_runs):
    mesh, one = mesh_runs["parity"]["mesh"], mesh_runs["parity"]["one_device"]
    assert len(mesh) == len(one) == 5
    for a, b in zip(mesh, one):  # the reductions' order differs
        assert abs(a - b) <= 1e-5 * abs(b), (mesh, one)


@pytest.mark.torchax
def test_two_processes_train_skip_checkpoint_and_resume(tmp_path):
    single = _run(WORKER, "single", devices=4)
    ckpt = str(tmp_path / "step.pt")
    train = _run_pair(tmp_path, "train", ckpt)
    resume = _run_pair(tmp_path, "resume", ckpt)
    for r in train + resume:
        assert (r["processes"], r["devices"], r["local_devices"]) == (2, 4, 2), r
    assert single["devices"] == 4 and single["processes"] == 1

    # one 4-device mesh over two processes trains as one process does
    for r in train:
        assert len(r["losses"]) == 4
        for a, b in zip(r["losses"], single["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b), (r["losses"], single["losses"])
    assert train[0]["losses"] == train[1]["losses"]

    # the inf: only in process 1's rows, and only process 1 passed it; the
    # step is skipped on both, parameters and optimizer state bit for bit
    p0, p1 = train
    assert sorted(p0["local_rows"] + p1["local_rows"]) == list(range(16))
    assert p0["poisoned_rows"] == [] and p1["poisoned_rows"] == p1["local_rows"]
    for r in train:
        assert r["found_inf"] and not r["skipped_loss_finite"], r
        assert r["unchanged"], r
        assert r["scale_after"] == r["scale_before"] / 2, r

    # the checkpoint holds the whole (gathered) state, FSDP-sharded leaves
    # included; a fresh pair built from another seed resumes bit for bit
    assert os.path.exists(ckpt)
    assert p0["saved_shapes"] == p1["saved_shapes"]
    assert p0["saved_shapes"]["gpt.transformer.wte.weight"] == [256, 64]
    for r in resume:
        assert r["scale_loaded"] == p0["scale_after"]
        assert r["continued"] == p0["continued"], (r["continued"], p0["continued"])
    assert p0["continued"] == p1["continued"]
