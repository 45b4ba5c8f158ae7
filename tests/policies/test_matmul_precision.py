"""The precision of float32 matmuls is part of a policy: each
built-in file states it (cuda IEEE fp32 and PyTorch's TF32 switch, tpu
torch_xla's default, cpu exact), overrides and bad values are checked with
file:line, and the torch_xla engine -- whose precision is one per process --
sets it from the first region, keeps a user's setting, warns where another
policy states another value, and refuses a request it cannot honour before
anything runs (each scenario in a process of its own)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from xla_amp import policies
from xla_amp.policies import _matmul_precision

HERE = os.path.dirname(os.path.abspath(__file__))


def test_each_builtin_policy_states_its_systems_precision():
    got = {n: (policies.get(n).fp32_matmul_precision,
               policies.get(n).fp32_matmul_precision_follows_torch)
           for n in policies.builtin_names()}
    assert got == {"cuda": ("highest", True), "tpu": ("default", False),
                   "cpu": ("highest", False), "hpu": ("highest", False),
                   "xpu": ("highest", False)}


def test_cuda_follows_pytorchs_tf32_switch():
    cuda = policies.get("cuda")
    before = torch.backends.cuda.matmul.fp32_precision
    try:
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        assert cuda.effective_fp32_matmul_precision() == "highest"
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        assert cuda.effective_fp32_matmul_precision() == "high"
        # an explicit value is exactly that; tpu follows nothing
        assert cuda.with_overrides(fp32_matmul_precision="highest") \
            .effective_fp32_matmul_precision() == "highest"
        assert policies.get("tpu").effective_fp32_matmul_precision() == "default"
    finally:
        torch.backends.cuda.matmul.fp32_precision = before


def test_overrides_and_bad_values():
    tpu = policies.get("tpu")
    high = tpu.with_overrides(fp32_matmul_precision="highest")
    assert (high.fp32_matmul_precision, high.fp32_matmul_precision_requested) == ("highest", True)
    assert tpu.fp32_matmul_precision == "default"  # immutable
    with pytest.raises(ValueError, match="fp32_matmul_precision must be one of highest, high, "
                                         "default, got 'fast'"):
        tpu.with_overrides(fp32_matmul_precision="fast")
    import pickle
    assert pickle.loads(pickle.dumps(high)).fp32_matmul_precision == "highest"


@pytest.mark.parametrize("line,match", [
    ('fp32_matmul_precision = "tf32"', r"t\.toml:5: fp32_matmul_precision must be one of"),
    ('fp32_matmul_precision = 1', r"t\.toml:5: fp32_matmul_precision must be one of"),
    ('fp32_matmul_precision_follows_torch = "yes"', r"t\.toml:5: .*must be true or false"),
])
def test_a_bad_file_value_names_file_and_line(tmp_path, line, match):
    (tmp_path / "t.toml").write_text(
        'name = "t"\n# a comment\ndefault_dtype = "bfloat16"\nsupported_dtypes = ["bfloat16"]\n'
        f'{line}\n[lower_precision_fp]\n"aten::mm" = "x"\n')
    with pytest.raises(ValueError, match=match):
        policies.load(tmp_path / "t.toml")


def test_a_file_without_the_key_gets_the_backends_default(tmp_path):
    (tmp_path / "t.toml").write_text(
        'name = "t"\ndefault_dtype = "bfloat16"\nsupported_dtypes = ["bfloat16"]\n')
    assert policies.load(tmp_path / "t.toml").fp32_matmul_precision == "default"
    assert _matmul_precision.PRECISIONS == ("highest", "high", "default")


def _run(scenario: str) -> dict:
    env = dict(os.environ, PJRT_DEVICE="CPU")
    env.pop("CPU_NUM_DEVICES", None)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "_matmul_precision_run.py"),
                           scenario], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_torch_xla_sets_the_process_precision_from_the_first_region():
    got = _run("cuda-then-tpu")
    assert got["process"] == "highest"
    # every dot the process lowers carries it (HLO operand_precision)
    assert got["f32_dot"] == ["highest"] and set(got["low_dot"]) == {"highest"}
    assert len(got["warned"]) == 1 and "policy 'tpu' states" in got["warned"][0]
    assert got["request_highest"] == "ok"
    assert got["request_default"].startswith(
        "xla_amp.autocast: fp32_matmul_precision='default' cannot be honoured on torch_xla")
    assert "set by policy 'cuda'" in got["request_default"]


def test_torch_xla_keeps_the_default_under_tpu_and_under_a_module_rule():
    tpu = _run("tpu-then-cuda")  # after an "fp32" module rule ran under tpu
    assert tpu["process"] == "default" and tpu["f32_dot"] == [""]  # no operand_precision
    # tpu's default claims nothing: the first region that states more sets it
    assert tpu["warned"] == [] and tpu["request_highest"] == "ok"


def test_torch_xla_keeps_a_users_setting():
    user = _run("user-set")
    assert user["process"] == "high" and user["f32_dot"] == ["high"]
    assert "set by the user" in user["request_highest"]
    assert len(user["warned"]) == 1
