"""What SPMD mode changes for a one-GPU user: xm.xla_device_kind raises on
SPMD:0 (torch_xla 2.9), so no code of ours may ask it. The runs in SPMD
mode against plain mode are tests/sharded/test_sharded_gpu_spmd_mode.py
(`make sharded`)."""
import os

from tests.support.launch import ROOT


def test_no_launcher_or_library_code_asks_the_device_kind():
    """xm.xla_device_kind raises on SPMD:0: no code of ours may call it."""
    callers = []
    for folder in ("xla_amp", "xla_amp_launch", "scripts", "benchmarks"):
        for base, _, files in os.walk(os.path.join(ROOT, folder)):
            for f in files:
                if f.endswith(".py") and "xla_device_kind" in open(os.path.join(base, f)).read():
                    callers.append(os.path.join(base, f))
    assert not callers, callers
