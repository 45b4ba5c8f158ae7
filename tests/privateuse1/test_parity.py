"""Output dtypes per (policy, op case): the PrivateUse1 engine on the
stand-in device against the torch_xla engine, over every case the
conformance tables have for the tpu, cuda and cpu policies and an override.

On torch 2.9 both engines run in one process and the torch_xla engine's
table is compared with the committed one (torch_xla_dtypes.json, the
staleness check); in the current profile the stand-in's table is compared
with that committed torch-2.9 table. Every difference is listed in
EXPLAINED with its cause, per torch version; a new one fails."""
import json
import os
import subprocess
import sys

import pytest
import torch

from xla_amp import _engine, engines

from tests.support import launch, runs

pytestmark = pytest.mark.core

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "torch_xla_dtypes.json")
REGENERATE = ("PJRT_DEVICE=CPU .venv/bin/python tests/privateuse1/_parity_run.py "
              "tests/privateuse1/torch_xla_dtypes.json --reference")
STANDIN_2_9 = "the torch 2.9 stand-in has no device guard (no Python one before torch 2.11)"
EXPLAINED = {
    # (policy, case) -> why the stand-in's result differs from torch_xla's
    ("cpu", "aten::grid_sampler_2d"): {"2.9": STANDIN_2_9},
    ("cpu", "aten::linalg_cond.p_str"): {
        "*": "torch_xla 2.9's lowering raises (a broadcast-shape error, pinned in "
             "tests/support/conformance.py RAISES); PyTorch computes it"},
    ("cuda", "aten::gru_cell"): {
        "*": "the stand-in: gru_cell on a non-CPU device takes the fused CUDA kernel "
             "(_thnn_fused_gru_cell), which the CPU behind the stand-in lacks"},
    ("cuda", "aten::lstm_cell"): {
        "*": "the stand-in: as gru_cell (_thnn_fused_lstm_cell)"},
    # the whole-network ops run the same cells (RNN.cpp's loop; rnn_tanh and
    # rnn_relu have no fused kernel and agree)
    **{(policy, key): {"*": "the stand-in: its cell loop takes the fused CUDA cell "
                            "kernels, as gru_cell and lstm_cell"}
       for policy, key in (("cpu", "aten::lstm.input"), ("cuda", "aten::lstm.input"),
                           ("cuda", "aten::lstm.data"), ("cuda", "aten::gru.input"),
                           ("cuda", "aten::gru.data"))},
}


def _minor() -> str:
    return "%d.%d" % engines.torch_minor()


def _tables(kernels: str = "auto") -> dict:
    """The tables, the stand-in's with the kernels XLA_AMP_PRIVATEUSE1_KERNELS
    picks (auto: the native ones where this torch's build loads)."""
    def compute():
        out = os.path.join(os.environ[runs.RUN_DIR_VAR], f"parity-tables-{kernels}.json")
        proc = subprocess.run([sys.executable, os.path.join(HERE, "_parity_run.py"), out],
                              capture_output=True, text=True,
                              env=launch.launch_env(XLA_AMP_PRIVATEUSE1_KERNELS=kernels),
                              timeout=300, cwd=launch.ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
        with open(out) as f:
            return json.load(f)
    return runs.once_per_run(("privateuse1-parity", torch.__version__, kernels), compute)


def _reference() -> dict:
    with open(REFERENCE) as f:
        return json.load(f)


@pytest.mark.skipif(not engines.available("torch_xla"), reason="the reference is torch 2.9's")
def test_the_committed_torch_xla_table_is_current():
    assert _tables()["torch_xla"] == _reference()["torch_xla"], f"stale: {REGENERATE}"


def test_every_case_of_every_policy_is_covered():
    ref = _reference()["torch_xla"]
    got = _tables()["standin"]
    assert set(got) == set(ref) == {"tpu", "cuda", "cpu", "tpu-override"}
    total = sum(len(v) for v in ref.values())
    assert total > 400, total
    for policy, cases in ref.items():
        missing = set(cases) - set(got[policy])
        # only ops this torch no longer has (a policy skips them as removed)
        for key in missing:
            assert not _has_op(key), (policy, key)


def _has_op(key: str) -> bool:
    ns, _, rest = key.partition("::")
    base, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, ns), base, None)
    return packet is not None and (not overload or overload in packet.overloads())


def test_standin_dtypes_equal_the_torch_xla_engines():
    ref = _reference()["torch_xla"]
    got = _tables()["standin"]
    differences = {}
    for policy, cases in ref.items():
        for key, want in cases.items():
            if key in got[policy] and got[policy][key] != want:
                differences[(policy, key)] = (want, got[policy][key])
    minor = _minor()
    explained = {k for k, why in EXPLAINED.items() if minor in why or "*" in why}
    unexplained = {k: v for k, v in differences.items() if k not in explained}
    assert not unexplained, unexplained
    # an explanation that no longer applies is removed, not kept
    assert explained - set(differences) <= {k for k, why in EXPLAINED.items()
                                            if "*" not in why and minor not in why}, \
        explained - set(differences)


@pytest.mark.skipif(_engine.privateuse1_native() is None,
                    reason="no native build for this torch: make current / make build")
def test_native_kernels_give_the_python_kernels_dtypes():
    native, python = _tables(), _tables("python")  # auto: native where it loads (shared run)
    assert native["kernels"] == "native" and python["kernels"] == "python"
    assert set(native["standin"]) == set(python["standin"])
    for policy, cases in python["standin"].items():
        assert set(native["standin"][policy]) == set(cases), policy
        differences = {key: (want, native["standin"][policy][key])
                       for key, want in cases.items() if native["standin"][policy][key] != want}
        assert not differences, (policy, differences)
