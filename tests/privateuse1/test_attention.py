"""SDPA under the tpu and cuda rules on the stand-in PrivateUse1 device
(tests/privateuse1/_attention_run.py), native kernels and Python kernels:
the matmuls the device runs are in the region's dtype, forward and (with
the stand-in's autograd, torch 2.11+) backward, the softmax in float32, the
output bit-equal to the hand-written control, as on torch_xla
(tests/autocast/test_attention.py): the same xla_amp/policies/_attention.py."""
import json
import subprocess
import sys

import pytest

from xla_amp import _engine

from tests.support import launch

pytestmark = pytest.mark.core

LOW = {"tpu": "bfloat16", "cuda": "float16"}
SOFTMAXES = {"aten::_safe_softmax", "aten::_softmax", "aten::_softmax_backward_data"}


def _run(kernels: str) -> dict:
    proc = subprocess.run([sys.executable, "tests/privateuse1/_attention_run.py"],
                          capture_output=True, text=True, timeout=300, cwd=launch.ROOT,
                          env=launch.launch_env(XLA_AMP_PRIVATEUSE1_KERNELS=kernels))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kernels", ["native", "python"])
def test_matmuls_in_the_regions_dtype_softmax_in_float32(kernels):
    if kernels == "native" and _engine.privateuse1_native() is None:
        pytest.skip(f"no native build for this torch ({_engine.privateuse1_problem()})")
    result = _run(kernels)
    assert result["kernels"] == kernels
    assert len(result["runs"]) == 8
    for name, run in result["runs"].items():
        low = LOW[name.split()[0]]
        assert run["dtype"] == low, name
        assert run["equal"], name
        for phase in ("forward", "backward") if result["autograd"] else ("forward",):
            calls = run[phase]
            matmuls = [d for op, d in calls if op not in SOFTMAXES]
            softmaxes = [d for op, d in calls if op in SOFTMAXES]
            assert len(matmuls) == (2 if phase == "forward" else 4), (name, phase, calls)
            assert all(set(d) == {low} for d in matmuls), (name, phase, calls)
            assert softmaxes and all(set(d) == {"float32"} for d in softmaxes), (name, calls)
