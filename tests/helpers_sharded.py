"""Runs of benchmarks/sharded.py --check for tests/test_sharded_*.py: each in
its own process (one XLA runtime per process; CPU_NUM_DEVICES virtual
XLA:CPU devices for a mesh), cached per test module, and the checks every
sharded run must pass."""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys

from helpers_launch import FAST_COMPILE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 20
INJECT = 6  # the step that puts an inf into one gradient shard


@functools.lru_cache(maxsize=None)
def run(model: str, mesh: str, devices: int, mode: str, *extra: str) -> dict:
    """One --check run's JSON (`extra`: more flags, e.g. --save-at 10)."""
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


def assert_sharded_run(got: dict, ref: dict, tol: float = 0.01) -> None:
    """Loss within `tol` of one device's at every step; the overflow on one
    shard skipped the step everywhere (every parameter and state tensor
    bit-identical, the scale halved); 1 execution, 0 transfers and 0
    compilations per step; every state tensor sharded as its parameter."""
    label = f"{got['model']} {got['mode']} on {got['mesh']} x{got['devices']}"
    assert len(got["losses"]) == len(ref["losses"]) == STEPS, label
    for k, (a, b) in enumerate(zip(got["losses"], ref["losses"]), 1):
        assert abs(a - b) <= tol * abs(b), (
            f"{label}: step {k} loss {a} vs one device {b}\n{got['losses']}\n{ref['losses']}")
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
