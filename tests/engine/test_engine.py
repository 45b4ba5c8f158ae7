"""The native engine: it owns AutocastXLA, quietly, and serves torch.autocast."""
import os
import subprocess
import sys

import torch

import xla_amp
from xla_amp import _C, _engine, policies


def _python(code, **env):
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PJRT_DEVICE": "CPU", **env})


def test_replaces_pytorch_xla_kernels():
    pytorch_xla_ops = torch._C._dispatch_get_registrations_for_dispatch_key("AutocastXLA")
    assert set(pytorch_xla_ops) <= set(_C.registered_ops())
    assert _engine.replaced_kernels >= 60  # PyTorch/XLA 2.9 registers 70
    dump = torch._C._dispatch_dump("aten::mm")
    line = next(l for l in dump.splitlines() if l.startswith("AutocastXLA:"))
    assert "csrc/autocast/registration.cpp" in line, line


def test_import_logs_one_line_instead_of_dispatcher_warnings():
    r = _python("import logging; logging.basicConfig(level=logging.INFO)\n"
                "import torch_xla, xla_amp")
    assert r.returncode == 0, r.stderr
    assert "Overriding a previously registered kernel" not in r.stderr
    ours = [l for l in r.stderr.splitlines() if "xla_amp" in l]
    assert len(ours) == 1 and "replaces PyTorch/XLA's AutocastXLA kernels" in ours[0], r.stderr


def test_plain_torch_autocast_uses_the_engine(device):
    a = torch.randn(4, 4, device=device).bfloat16()
    custom = policies.get("tpu").with_overrides(name="mm-fp32", fp32=["aten::mm"])
    _engine.set_default_policy(custom)
    try:
        with torch.autocast("xla", dtype=torch.bfloat16):
            assert torch.mm(a, a).dtype == torch.float32       # our override
            assert torch.matmul(a.float(), a.float()).dtype == torch.bfloat16
    finally:
        _engine.set_default_policy(None)


def test_plain_torch_autocast_default_follows_hardware():
    r = _python(
        "import torch, torch_xla, xla_amp\n"
        "from xla_amp import _C\n"
        "a = torch.randn(4, 4, device=torch_xla.device())\n"
        "with torch.autocast('xla', dtype=torch.bfloat16):\n"
        "    y = torch.mm(a, a)\n"
        "    print(_C.active_policy_name(), y.dtype)\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["cpu", "torch.bfloat16"]  # XLA:CPU -> the cpu rules


def test_engine_and_python_agree_on_categories():
    from xla_amp.policies._policy import ADAPTATIONS
    assert set(xla_amp.CATEGORIES) | set(ADAPTATIONS) | {"none"} == set(_C.categories())
