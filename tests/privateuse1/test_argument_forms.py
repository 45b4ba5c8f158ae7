"""Every op of every built-in policy, and ops no policy lists, called in each
argument form its schema allows (positional, keyword, defaults spelled out,
Python numbers through the Python binding and Python's operators) under
every built-in policy and under an "fp32" module rule, on the stand-in
device: each result equals the same call without xla_amp's kernel for it,
inputs cast by hand as the policy says (tests/support/argument_forms.py).
Issue #52: with the hpu policy or an "fp32" rule compiled, ``t * 2`` raised
inside any region whose policy does not list mul."""
import json
import os
import subprocess
import sys

import pytest
import torch

from xla_amp import _engines

from tests.support import launch, runs

pytestmark = pytest.mark.core

HERE = os.path.dirname(os.path.abspath(__file__))


def sweep() -> dict:
    """The stand-in's sweep (once per test run); its "calls" file holds the
    captured calls the torch_xla engine replays (tests/autocast)."""
    def compute():
        out = os.path.join(os.environ[runs.RUN_DIR_VAR], "argument-forms-standin.json")
        calls = os.path.join(os.environ[runs.RUN_DIR_VAR], "argument-forms-calls.pt")
        proc = subprocess.run([sys.executable, os.path.join(HERE, "_forms_run.py"), out, calls],
                              capture_output=True, text=True, env=launch.launch_env(),
                              timeout=300, cwd=launch.ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        with open(out) as f:
            return dict(json.load(f), calls=calls)
    return runs.once_per_run(("privateuse1-argument-forms", torch.__version__), compute)


def test_every_form_equals_the_call_without_xla_amps_kernel():
    result = sweep()
    assert result["mismatches"] == [], "\n".join(result["mismatches"][:40])
    # what the sweep covered: a check that ran nothing would pass above
    assert result["checked"] - result["both_raised"] >= 2500, result
    assert len(result["overloads"]) >= 240, len(result["overloads"])
    assert result["numbers_forms"] >= 25, result["numbers_forms"]
    for name in ("aten::mul.Tensor", "aten::add.Tensor", "aten::div.Tensor", "aten::sub.Tensor"):
        assert name in result["overloads"], name


@pytest.mark.skipif(_engines.torch_minor() < (2, 11),
                    reason="the torch 2.9 stand-in has no device guard (no Module.to)")
def test_the_documented_fp32_layernorm_rule_runs_a_transformer_layer():
    # the layer ends in its second LayerNorm, which the rule runs in float32
    assert sweep()["encoder_layer"] == {"dtype": "torch.float32", "finite": True}
