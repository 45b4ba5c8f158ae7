"""Every op of every built-in policy, and ops no policy lists, called in each
argument form its schema allows (positional, keyword, defaults spelled out,
Python numbers through the Python binding and Python's operators) under
every built-in policy and under an "fp32" module rule, on the stand-in
device: each result equals the same call without xla_amp's kernel for it,
inputs cast by hand as the policy says (tests/support/argument_forms.py).
The case that once failed: with the hpu policy or an "fp32" rule compiled,
``t * 2`` must not raise inside a region whose policy does not list mul."""
import json
import os
import subprocess
import sys

import pytest
import torch

from xla_amp import engines

from tests.support import launch, runs

pytestmark = pytest.mark.core

HERE = os.path.dirname(os.path.abspath(__file__))


def _run(*args, kernels=None):
    env = launch.launch_env()
    if kernels:
        env["XLA_AMP_PRIVATEUSE1_KERNELS"] = kernels
    proc = subprocess.run([sys.executable, os.path.join(HERE, "_forms_run.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300, cwd=launch.ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]


def sweep() -> dict:
    """The stand-in's sweeps (once per test run), one per kind of kernels
    this torch has ({"native": ..., "python": ...}); "calls" is the file of
    captured calls the torch_xla engine replays (tests/autocast)."""
    def compute():
        folder = os.environ[runs.RUN_DIR_VAR]
        calls = os.path.join(folder, "argument-forms-calls.pt")
        _run("capture", calls, kernels="python")
        out = {"calls": calls}
        for kernels in _KINDS:
            path = os.path.join(folder, f"argument-forms-{kernels}.json")
            if kernels == "native" and not _native():
                continue
            _run("sweep", calls, path, kernels=kernels)
            with open(path) as f:
                out[kernels] = json.load(f)
        return out
    return runs.once_per_run(("privateuse1-argument-forms", torch.__version__), compute)


# The Python kernels' sweep runs in the current profile (make current, torch
# 2.15, where they are TorchTPU users' fallback); make test (torch 2.9, where
# `make build` always gives the native kernels) sweeps the native ones.
_KINDS = ("native",) if engines.available("torch_xla") else ("native", "python")


def _native() -> bool:
    from xla_amp import _engine
    return _engine.privateuse1_native() is not None


@pytest.mark.parametrize("kernels", ["native", "python"])
def test_every_form_equals_the_call_without_xla_amps_kernel(kernels):
    if kernels == "native" and not _native():
        pytest.skip("no xla_amp._C for this Python and torch (make current builds it)")
    if kernels not in _KINDS:
        pytest.skip("the Python kernels' sweep runs in make current (torch 2.15)")
    result = sweep()[kernels]
    assert result["kernels"] == kernels
    assert result["mismatches"] == [], "\n".join(result["mismatches"][:40])
    # what the sweep covered: a check that ran nothing would pass above
    assert result["checked"] - result["both_raised"] >= 2500, result
    assert len(result["overloads"]) >= 240, len(result["overloads"])
    assert result["numbers_forms"] >= 25, result["numbers_forms"]
    for name in ("aten::mul.Tensor", "aten::add.Tensor", "aten::div.Tensor", "aten::sub.Tensor"):
        assert name in result["overloads"], name


@pytest.mark.skipif(engines.torch_minor() < (2, 11),
                    reason="the torch 2.9 stand-in has no device guard (no Module.to)")
def test_the_documented_fp32_layernorm_rule_runs_a_transformer_layer():
    # the layer ends in its second LayerNorm, which the rule runs in float32
    for kernels in _KINDS:
        if kernels in sweep():
            assert sweep()[kernels]["encoder_layer"] == {"dtype": "torch.float32", "finite": True}
