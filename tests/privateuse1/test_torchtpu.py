"""xla_amp beside TorchTPU 0.2.0 (torch-tpu, in the current profile) on a
host with no TPU: its registration takes over TorchTPU's compiled
AutocastPrivateUse1 table with one log line, and a region refuses in one
line. Every process that loads libtpu runs in a network namespace of its
own (`unshare -n`, as root): without a TPU, libtpu looks for cloud instance
metadata, and nothing may leave this machine; there it fails at once."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.support import launch

pytestmark = [pytest.mark.core, pytest.mark.skipif(
    importlib.util.find_spec("torch_tpu") is None, reason="torch-tpu: the current profile")]

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def run():
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("these tests need root and unshare(1) for a private network namespace")
    env = {**launch.launch_env(), "TORCH_DEVICE_BACKEND_AUTOLOAD": "1",
           "PYTHONWARNINGS": "ignore"}
    start = time.monotonic()
    proc = subprocess.run(["unshare", "-n", sys.executable, os.path.join(HERE, "_torchtpu_run.py")],
                          capture_output=True, text=True, env=env, timeout=240, cwd=launch.ROOT)
    wall = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall"] = wall
    return out


def test_libtpu_finds_no_network_and_gives_up_at_once(run):
    # 30 retries of the metadata server would take minutes; offline it is seconds
    assert run["seconds_to_load"] < 30 and run["wall"] < 90, run


def test_torchtpu_table_is_taken_over_in_one_line(run):
    assert len(run["theirs"]) > 30  # TorchTPU's compiled table (135 ops in 0.2.0)
    assert set(run["displaced"]) == set(run["theirs"])
    assert len(run["log"]) == 1 and f"{len(run['theirs'])} AutocastPrivateUse1 kernels" \
        in run["log"][0], run["log"]
    # the dispatcher names xla_amp's kernel for mm now: native (xla_amp._C's
    # registration) where this torch's build loads, else the Python one
    assert run["mm_kernel"] and "registered at" in run["mm_kernel"][0]
    if run["kernels"] == "native":
        assert "/csrc/autocast/registration.cpp" in run["mm_kernel"][0], run["mm_kernel"]
    else:
        assert run["kernels"] == "python"
        assert "python" in run["mm_kernel"][0].lower() or ".py" in run["mm_kernel"][0], \
            run["mm_kernel"]


def test_no_device_refuses_in_one_line(run):
    assert run["backend"] == "privateuseone"  # TorchTPU names it "tpu" only with a TPU
    assert run["xla_amp"].startswith("ValueError: autocast: TorchTPU is installed but found "
                                     "no TPU"), run["xla_amp"]
    assert "\n" not in run["xla_amp"]
    assert run["torch"] != "entered"  # torch.autocast("tpu") cannot be entered either
