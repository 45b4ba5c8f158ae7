"""Runs of benchmarks/sharded.py --check for tests/sharded/: each in its own
process (one XLA runtime per process; CPU_NUM_DEVICES virtual XLA:CPU
devices for a mesh), made once per test run (tests/support/runs.py), and the checks every
sharded run must pass."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys


from tests.support.launch import FAST_COMPILE, ROOT
from tests.support.runs import once_per_run
STEPS = 20
INJECT = 6  # the step that puts an inf into one gradient shard


@functools.lru_cache(maxsize=None)
def run(model: str, mesh: str, devices: int, mode: str, *extra: str) -> dict:
    """One --check run's JSON (`extra`: more flags, e.g. --save-at 10), made
    once per test run: tests/sharded/test_sharded_lm.py and
    test_sharded_fp8.py, on either worker, read the same one-device
    references and the same fp8 run."""
    return once_per_run(("sharded", model, mesh, devices, mode, *extra),
                        lambda: _check_run(model, mesh, devices, mode, *extra))


def _check_run(model, mesh, devices, mode, *extra) -> dict:
    env = dict(os.environ, PJRT_DEVICE="CPU", XLA_FLAGS=FAST_COMPILE)
    for var in ("CPU_NUM_DEVICES", "XLA_USE_BF16", "XLA_USE_SPMD"):
        env.pop(var, None)
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "sharded.py"), "--check",
           "--model", model, "--mesh", mesh, "--devices", str(devices), "--mode", mode,
           "--steps", str(STEPS), "--inject", str(INJECT), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def reference(model: str, mode: str) -> dict:
    """The same run on one device, no SPMD."""
    return run(model, "none", 1, mode)


def tolerances(ref: dict, fp32: dict) -> list[float]:
    """Per step: 1 %, or twice the largest deviation bf16 itself has shown
    from fp32 on one device up to that step, if that is more. Sharding
    rounds differently in bf16 (XLA's partitioner splits contractions and
    sums their bf16 partial results), and at random init a ResNet turns any
    rounding difference into a loss that wanders: measured over 20 steps,
    its one-device bf16 run moved 1.2 % away from fp32 and the 4-device run
    1.2 % away from the one-device run, while fp32 sharded stayed within
    0.014 % of fp32 on one device. A broken step (a wrong dtype, a lost
    update, a skipped shard) moves it by far more."""
    out, worst = [], 0.0
    for a, b in zip(ref["losses"], fp32["losses"]):
        worst = max(worst, abs(a - b) / abs(b))
        out.append(max(0.01, 2.0 * worst))
    return out


def assert_sharded_run(got: dict, ref: dict, fp32: dict) -> None:
    """Loss within :func:`tolerances` of one device's at every step; the
    overflow on one shard skipped the step everywhere (every parameter and
    state tensor bit-identical, the scale halved); 1 execution, 0 transfers
    and 0 compilations per step; every state tensor sharded as its
    parameter."""
    label = f"{got['model']} {got['mode']} on {got['mesh']} x{got['devices']}"
    assert len(got["losses"]) == len(ref["losses"]) == STEPS, label
    for k, (a, b, tol) in enumerate(zip(got["losses"], ref["losses"], tolerances(ref, fp32)), 1):
        assert abs(a - b) <= tol * abs(b), (
            f"{label}: step {k} loss {a} vs one device {b} (tolerance {tol:.4f})"
            f"\n{got['losses']}\n{ref['losses']}")
    inj = got["inject"]
    assert inj["identical"] and inj["tensors"] > 0, (label, inj)
    assert inj["scale_after"] == inj["scale_before"] / 2, (label, inj)
    assert got["executions_per_step"] == 1.0, (label, got)
    assert got["transfers_per_step"] == 0.0, (label, got)
    assert got["compilations_per_step"] == 0.0, (label, got)
    assert got["counted_steps"] == STEPS - 3, (label, got)
    assert got["sharding_mismatches"] == [], (label, got["sharding_mismatches"])
    # state really is sharded: some state tensor carries a devices=[...] tiling
    assert any(s.startswith("{devices=") for s in got["state_specs"]), (label, got)
