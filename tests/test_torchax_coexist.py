"""The torch_xla side does not change when torchax is in the same process:
the same HLO, dtypes and result bits for a model under every policy, with
and without xla_amp.torchax imported and a torchax region run first.
(torchax turns off PyTorch's MultiheadAttention fast path process-wide; the
model holds an MHA in eval mode, where that path would be taken on CPU, to
show XLA tensors never take it either way.)"""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.torchax
HERE = os.path.dirname(os.path.abspath(__file__))


def _run(mode):
    env = dict(os.environ, PJRT_DEVICE="CPU", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "_torchax_coexist_run.py"), mode],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_torch_xla_unchanged_by_torchax_in_the_process():
    alone, together = _run("alone"), _run("with-torchax")
    assert alone["rows"] == together["rows"]
    assert set(alone["rows"]) == {"tpu", "cuda", "cpu"}
    assert alone["fastpath"] and not together["fastpath"]  # what torchax's import changes
