"""A sharded checkpoint saved on a mesh of N devices loads on a mesh of M
and training goes on (make sharded): 4 -> 2, 2 -> 1 (a 1-device SPMD
mesh) and 1 -> 4, each in fresh processes (tests/sharded/_sharded_reshard.py: a
small MLP under FSDPv2, bf16 parameters with an fp32 master shard, one
bias whose 10 elements do not divide over 4 devices). After the restore
at step 5 the loss stays within 1 % of the uninterrupted N-device run at
each of 10 steps -- while the same model not restored starts more than
1 % away, so the bound sees a lost restore --, `load` prints nothing,
the optimizer state is sharded as its parameter on the new mesh, and the
checkpoint's record names the mesh it was trained on. And 4 -> 2 into
another precision mode (fp32 parameters: the fp32 masters become them),
converted on the new mesh."""
import functools
import json
import os
import subprocess
import sys

import pytest

from tests.support.launch import FAST_COMPILE

pytestmark = pytest.mark.sharded

HERE = os.path.dirname(os.path.abspath(__file__))
SAVE_AT, STEPS = 5, 15


def run(devices: int, *args: str) -> dict:
    env = dict(os.environ, PJRT_DEVICE="CPU", XLA_FLAGS=FAST_COMPILE)
    for var in ("CPU_NUM_DEVICES", "XLA_USE_BF16", "XLA_USE_SPMD"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "_sharded_reshard.py"),
                           str(devices), "--steps", str(STEPS), *args],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@functools.lru_cache(maxsize=None)
def saved(devices: int, root: str) -> tuple[str, dict]:
    """The uninterrupted run on `devices`, saving at SAVE_AT."""
    ckpt = os.path.join(root, f"on{devices}")
    return ckpt, run(devices, "--save-at", str(SAVE_AT), "--ckpt", ckpt)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("reshard"))


@pytest.mark.parametrize("n,m", [(4, 2), (2, 1), (1, 4)], ids=["4to2", "2to1", "1to4"])
def test_checkpoint_of_n_devices_resumes_on_m(root, n, m):
    ckpt, whole = saved(n, root)
    assert whole["record"]["mesh"] == {"shape": [n], "axis_names": ["fsdp"],
                                       "device_ids": list(range(n))}
    assert whole["record"]["optimizer"]["param_groups"] == [
        {"master_weights": True, "stochastic_rounding": False, "state_dtype": None}]
    resumed = run(m, "--load", ckpt, "--start", str(SAVE_AT))
    assert resumed["devices"] == m and resumed["load_printed"] == ""
    want = whole["losses"][SAVE_AT:]
    assert len(resumed["losses"]) == len(want) == STEPS - SAVE_AT
    worst = max(abs(a - b) / abs(b) for a, b in zip(resumed["losses"], want))
    print(f"{n} -> {m}: largest deviation {worst:.2e}, not restored "
          f"{abs(resumed['fresh_loss'] - want[0]) / want[0]:.2e}")
    for k, (a, b) in enumerate(zip(resumed["losses"], want), SAVE_AT + 1):
        assert abs(a - b) <= 0.01 * abs(b), (f"{n} -> {m}: step {k} loss {a} vs "
                                             f"uninterrupted {b}", resumed["losses"], want)
    assert abs(resumed["fresh_loss"] - want[0]) > 0.01 * abs(want[0]), resumed
    assert resumed["sharding_mismatches"] == [], resumed
    if m > 1:  # the new mesh's shardings, the 10-element bias padded over 4
        assert all(s.startswith("{devices=") and f"{m}" in s for s in resumed["specs"]), resumed
    assert resumed["scale"] == whole["scale"]


def test_checkpoint_of_4_devices_resumes_on_2_in_another_precision_mode(root):
    ckpt, whole = saved(4, root)
    resumed = run(2, "--load", ckpt, "--start", str(SAVE_AT), "--precision", "amp")
    assert resumed["param_dtypes"] == ["torch.float32"] and resumed["load_printed"] == ""
    assert resumed["sharding_mismatches"] == [], resumed
    assert all(s.startswith("{devices=") and "2" in s for s in resumed["specs"]), resumed
    want = whole["losses"][SAVE_AT:]
    for k, (a, b) in enumerate(zip(resumed["losses"], want), SAVE_AT + 1):  # now fp32 weights
        assert abs(a - b) <= 0.02 * abs(b), (f"step {k} loss {a} vs {b}", resumed["losses"], want)
    assert abs(resumed["fresh_loss"] - want[0]) > 0.02 * abs(want[0]), resumed
