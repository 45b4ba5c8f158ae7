"""Pinned reproducer (docs/upstream/privateuse1_accelerator_cuda_autograd.md):
importing torchax makes its PrivateUse1 backend ("jax") torch's accelerator,
which is what breaks native CUDA autograd in that process on torch 2.8+
(pytorch/pytorch#161129; seen on an H100 with torch 2.11). Runs on any torch
build: a fresh process, before and after the import. When this fails,
torch no longer hands the accelerator to a renamed PrivateUse1 backend:
check native CUDA autograd after torchax on a GPU and drop the notice."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from xla_amp.torchax import _accelerator

pytestmark = pytest.mark.torchax

PROBE = ("import json, torch\n"
         "t = lambda: getattr(torch.accelerator.current_accelerator(), 'type', None)\n"
         "before = t()\n"
         "import torchax\n"
         "print(json.dumps([before, t(), torch.cuda.is_available()]))\n")


def test_importing_torchax_makes_jax_the_accelerator():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          timeout=300, env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    before, after, _ = json.loads(proc.stdout.strip().splitlines()[-1])
    assert before in (None, "cuda") and after == "jax"


def test_the_notice_is_one_line_where_cuda_is_available():
    line = _accelerator.notice(True, "jax")
    assert "\n" not in line and "native CUDA autograd" in line and "161129" in line
    assert _accelerator.notice(False, "jax") is None      # no CUDA: nothing breaks
    assert _accelerator.notice(True, "cuda") is None      # CUDA still the accelerator
