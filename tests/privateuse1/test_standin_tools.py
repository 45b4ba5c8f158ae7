"""What docs/torchtpu.md lists as working without torch_xla, on the stand-in
"tpu" device: watch_nonfinite and compare with their flags on
the device, xla_amp.custom_fwd/custom_bwd keeping the region's policy on
autograd's device thread, and plain torch.autocast("tpu") right after
``import xla_amp``, the backend named before or after it. Needs torch 2.11+ (autograd on the stand-in)."""
import subprocess
import sys

import pytest
import torch
from torch import nn

from xla_amp import engines

from tests.support import launch

pytestmark = [pytest.mark.core, pytest.mark.skipif(
    engines.torch_minor() < (2, 11),
    reason="autograd on the stand-in needs torch 2.11+'s Python device guard: make current")]

if engines.torch_minor() >= (2, 11):
    import xla_amp
    from tests.support import standin_tpu
    from tests.support.numerics_models import Exp, Risky, Sqrt

    standin_tpu.install()


def test_watch_nonfinite_finds_the_first_overflow_forward():
    m = nn.Sequential(nn.Linear(4, 8), nn.Sequential(nn.Identity(), Exp()), nn.Linear(8, 2))
    with torch.no_grad():
        m[0].weight.copy_(torch.eye(8, 4))
        m[0].bias.zero_()
    m = standin_tpu.to_device(m)
    watch = xla_amp.watch_nonfinite(m)
    assert watch._first.device.type == "tpu"  # the flags live on the device
    x = standin_tpu.to_device(torch.ones(2, 4))
    for scale in (1.0, 1.0, 100.0, 1000.0):  # step 2: exp(100) = inf in float32
        m(x * scale).float().pow(2).mean().backward()
    assert watch.report() == {"module": "1.1", "phase": "forward", "step": 2}
    watch.remove()
    assert not m._forward_pre_hooks and not m[1][1]._forward_hooks


def test_watch_nonfinite_finds_an_inf_gradient_in_backward():
    m = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), Sqrt(), nn.Linear(4, 1))
    with torch.no_grad():
        m[0].weight.copy_(-torch.eye(4))
        m[0].bias.zero_()
    m = standin_tpu.to_device(m)
    watch = xla_amp.watch_nonfinite(m)
    m(standin_tpu.to_device(torch.ones(2, 4))).sum().backward()
    assert watch.report() == {"module": "1", "phase": "backward", "step": 0}


def test_watch_nonfinite_refuses_the_cpu_in_one_line():
    with pytest.raises(ValueError, match=r"on a device an xla_amp engine serves \(.*tpu.*; "
                                         r"got cpu\); move the model first"):
        xla_amp.watch_nonfinite(nn.Linear(2, 2))


def test_compare_on_the_device_flags_the_overflowing_module():
    torch.manual_seed(0)
    model = standin_tpu.to_device(Risky())
    x = standin_tpu.to_device(torch.randn(6, 8))
    running = model.bn.running_mean
    report = xla_amp.compare(model, x, policy="tpu")
    assert model.bn.running_mean is running
    rows = {r["module"]: r for r in report.rows}
    assert set(rows) == {"", "inp", "block", "block.up", "block.norm", "bn", "head"}
    assert report.risky() == ["block.up"] and report.suggest() == {"block.up": "fp32"}
    # inp's error is exactly bf16 Linear's against float32, computed by hand
    w, b, xc = model.inp.weight.cpu(), model.inp.bias.cpu(), x.cpu()
    ref = nn.functional.linear(xc, w, b)
    low = nn.functional.linear(xc.bfloat16(), w.bfloat16(), b.bfloat16()).float()
    assert rows["inp"]["rel_error"] == pytest.approx(
        float((low - ref).norm() / ref.norm()), rel=1e-5)
    cuda = xla_amp.compare(model, x, policy="cuda")
    assert "block.up" in {r["module"] for r in cuda.rows if r["nonfinite"]}
    with pytest.raises(ValueError, match=r"input \[1\] \(shape \(1, 8\)\) is on 'cpu'"):
        xla_amp.compare(model, x, torch.ones(1, 8))


class _ExpBackward(torch.autograd.Function):
    """Records the dtype exp gives inside its backward (fp32 under the cuda
    rules, bf16 under the default tpu rules)."""
    seen = []

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        _ExpBackward.seen.append(torch.exp(x).dtype)
        return g


def _decorated(fwd_deco, bwd_deco):
    return type("F", (torch.autograd.Function,), {
        "forward": staticmethod(fwd_deco(_ExpBackward.forward)),
        "backward": staticmethod(bwd_deco(_ExpBackward.backward))})


def test_custom_bwd_runs_backward_under_the_regions_non_default_policy():
    ours = _decorated(xla_amp.custom_fwd(device_type="tpu"), xla_amp.custom_bwd(device_type="tpu"))
    torchs = _decorated(lambda f: torch.amp.custom_fwd(f, device_type="tpu"),
                        lambda f: torch.amp.custom_bwd(f, device_type="tpu"))
    for fn in (ours, torchs):
        x = standin_tpu.to_device(torch.randn(4, 4)).bfloat16().requires_grad_()
        with xla_amp.autocast("tpu", policy="cuda", dtype=torch.bfloat16):
            y = fn.apply(x)
        y.float().sum().backward()  # backward on autograd's device thread
    # xla_amp's: the cuda rules (exp in fp32); torch's: the thread's default (tpu: bf16)
    assert _ExpBackward.seen[-2:] == [torch.float32, torch.bfloat16]


_AFTER_IMPORT = """
import torch
from tests.support import standin_tpu
{before}
import xla_amp
{after}
a = standin_tpu.to_device(torch.randn(4, 4))
try:
    with torch.autocast("tpu", dtype=torch.bfloat16):
        print((a @ a).dtype)
except RuntimeError as e:
    print("refused:", str(e))
{then}
"""


def _run(**parts) -> list[str]:
    code = _AFTER_IMPORT.format(**{k: parts.get(k, "") for k in ("before", "after", "then")})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=launch.launch_env(), cwd=launch.ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()


def test_torch_autocast_right_after_import_where_the_backend_is_named():
    assert _run(before="standin_tpu.install()") == ["torch.bfloat16"]


def test_torch_autocast_named_after_import_works_with_the_native_kernels():
    # import xla_amp took the key before the backend was named (native kernels)
    assert _run(after="standin_tpu.install()") == ["torch.bfloat16"]


def test_torch_autocast_named_after_import_with_python_kernels_needs_install():
    # no fallback can refuse in xla_amp's words (a Python fallback on an
    # Autocast key trips a PyTorch assert): torch's own error, then install()
    out = _run(before="import os; os.environ['XLA_AMP_PRIVATEUSE1_KERNELS'] = 'python'",
               after="standin_tpu.install()", then=(
                   "xla_amp.privateuse1.install()\n"
                   "with torch.autocast('tpu', dtype=torch.bfloat16):\n    print((a @ a).dtype)"))
    assert out[0].startswith("refused: Could not run 'aten::matmul' with arguments from "
                             "the 'Autocasttpu' backend"), out
    assert out[-1] == "torch.bfloat16"  # (torch's message runs over many lines)
