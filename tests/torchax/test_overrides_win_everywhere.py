"""Overrides win on every engine: each of ≥ 40 ops of the policy
files moved by ``Policy.with_overrides`` into each other category (and
one at a time, on torch_xla, on the stand-in PrivateUse1 device
and on torchax; every engine must give the dtype the override asks for
(tests/support/override_sweep.py). torchax gave float32 for
lower_precision_fp=["aten::log_softmax"] (its attention-softmax rule caught
every softmax inside a low op); scaled_dot_product_attention is always in
the sample (float32 on torchax, bfloat16 on torch_xla under an override
before all three ran xla_amp/policies/_attention.py). One process per engine, side by
side."""
import json
import os
import subprocess
import sys

import pytest

from xla_amp import engines

from tests.support import launch, override_sweep, runs
from tests.support import torchax_current  # noqa: F401  (xla_amp.torchax's shim first: torch 2.15)
from tests.support.torchax_env import TORCHAX_CANNOT_RUN

pytestmark = [pytest.mark.torchax, pytest.mark.core]

HERE = os.path.dirname(os.path.abspath(__file__))
# torchax 0.0.13 cannot run these on bfloat16 inputs, autocast or not (plain
# torch.renorm on a bf16 torchax tensor raises the same): pinned, and checked
# to still fail, so a torchax that learns it shows up here.
TORCHAX_NOT_IN_BF16 = {"aten::renorm": "raises AssertionError"}
# The stand-in: a cell on a non-CPU device takes the fused CUDA kernel
# (_thnn_fused_lstm_cell), which the CPU behind it lacks (test_parity.py);
# the whole-network LSTM and GRU run those cells.
STANDIN_CANNOT_RUN = {"aten::lstm_cell", "aten::gru_cell", "aten::lstm", "aten::lstm.input",
                      "aten::gru"}


def _tables() -> dict:
    def compute():
        names = ["standin", "torchax"] + (["torch_xla"] if engines.available("torch_xla")
                                            else [])
        folder = os.environ[runs.RUN_DIR_VAR]
        env = launch.launch_env()
        if not engines.available("torch_xla"):  # its XLA:CPU flags: jax 0.12 refuses them
            env.pop("XLA_FLAGS", None)
        procs = {e: subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_overrides_run.py"), e,
             os.path.join(folder, f"overrides-{e}.json")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env=env, cwd=launch.ROOT) for e in names}
        out = {}
        for e, proc in procs.items():
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, (e, err[-3000:])
            with open(os.path.join(folder, f"overrides-{e}.json")) as f:
                out[e] = json.load(f)
        return out
    return runs.once_per_run(("overrides-everywhere", sys.executable), compute)


def test_every_engine_gives_the_dtype_the_override_asks_for():
    tables = _tables()
    bad, compared = [], {e: 0 for e in tables}
    for entry, _, key in override_sweep.sample():
        for target in override_sweep.TARGETS:
            k = f"{entry} -> {target}"
            want = override_sweep.expected(entry, target, key)
            for e, t in tables.items():
                if e == "torchax" and (key in TORCHAX_CANNOT_RUN or entry in TORCHAX_CANNOT_RUN):
                    continue  # pinned: torchax 0.0.13 has no lowering (tests/support/torchax_env.py)
                if e == "standin" and entry in STANDIN_CANNOT_RUN:
                    if not t[k].startswith("raises"):
                        bad.append(f"{k} on the stand-in: {t[k]} (pinned as failing: unpin it)")
                    continue
                if e == "torchax" and entry in TORCHAX_NOT_IN_BF16 and want == "bfloat16":
                    if t[k] != TORCHAX_NOT_IN_BF16[entry]:
                        bad.append(f"{k} on torchax: {t[k]} (pinned as failing: unpin it)")
                    continue
                compared[e] += 1
                if t[k] != want:
                    bad.append(f"{k} on {e}: {t[k]}, the override asks for {want}")
    assert bad == [], "\n".join(bad)
    assert all(n >= 40 * len(override_sweep.TARGETS) for n in compared.values()), compared
