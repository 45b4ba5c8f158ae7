"""The PrivateUse1 engine's native kernels (xla_amp._C under
AutocastPrivateUse1): the one log line naming which kernels serve the key,
a native build for another torch refused in one line (a warning and the
Python kernels, or an ImportError where XLA_AMP_PRIVATEUSE1_KERNELS=native
asks for them), Python scalars passed through, push/pop driving the native
stack, record=True's precision report. Dtype parity with the Python
kernels: test_parity.py."""
import json
import subprocess
import sys

import pytest
import torch

from xla_amp import _engine, engines

from tests.support import launch

pytestmark = pytest.mark.core

NATIVE = _engine.privateuse1_native() is not None
needs_native = pytest.mark.skipif(not NATIVE, reason="no native build for this torch "
                                  f"({_engine.privateuse1_problem()}): make current / make build")

# One process per case: the stand-in renames PrivateUse1 and the choice of
# kernels is made once per process; torch_xla is blocked, so the PrivateUse1
# engine is the one to load _C. `fake`: a build record naming another torch,
# in place of this Python's.
SCRIPT = r'''
import json, logging, sys, types
lines = []
logging.getLogger("xla_amp").addHandler(type("H", (logging.Handler,), {
    "emit": lambda self, r: lines.append((r.levelname, r.getMessage()))})())
logging.getLogger("xla_amp").setLevel(logging.INFO)
sys.modules["torch_xla"] = None  # the PrivateUse1 engine alone (and a quick start on 2.9)
fake = sys.argv[1]
if fake:  # before `import xla_amp`, which takes the key with the native kernels
    import runpy
    record_module = runpy.run_path("xla_amp/_version_check.py")["record_module"]  # as setup.py
    record = types.ModuleType("record")
    record.TORCH_VERSION, record.PYTHON = fake, sys.implementation.cache_tag
    sys.modules["xla_amp." + record_module({"torch": "x"})] = record
    sys.modules["xla_amp._build_info"] = record
import torch, xla_amp, xla_amp.privateuse1
from tests.support import standin_tpu
standin_tpu.install()
out = {}
try:
    xla_amp.privateuse1.install()
    a = standin_tpu.to_device(torch.randn(4, 4))
    with xla_amp.autocast("tpu"):
        out["mm"] = str((a @ a).dtype)
    out["kernels"] = xla_amp.privateuse1.kernels()
except ImportError as e:
    out["error"] = str(e)
out["lines"] = [l for l in lines if "autocast kernels" in l[1]]
print(json.dumps(out))
'''


def _run(fake: str = "", **env) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, fake], capture_output=True,
                          text=True, env=launch.launch_env(**env), timeout=120, cwd=launch.ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@needs_native
def test_one_log_line_names_the_native_kernels():
    out = _run()
    assert out["kernels"] == "native" and out["mm"] == "torch.bfloat16"
    [(level, line)] = out["lines"]
    assert level == "INFO" and ": native (xla_amp._C, built against torch " in line
    assert torch.__version__.split("+")[0] in line


def test_python_kernels_on_request_say_so():
    out = _run(XLA_AMP_PRIVATEUSE1_KERNELS="python")
    assert out["kernels"] == "python" and out["mm"] == "torch.bfloat16"
    [(level, line)] = out["lines"]
    assert level == "INFO" and line.endswith(": python (XLA_AMP_PRIVATEUSE1_KERNELS=python)")


def _other_torch() -> str:
    major, minor = engines.torch_minor()
    return f"{major}.{minor - 1}.0"


def test_a_build_for_another_torch_is_one_warning_and_the_python_kernels():
    other = _other_torch()
    out = _run(other)
    assert out["kernels"] == "python" and out["mm"] == "torch.bfloat16"
    [(level, line)] = out["lines"]
    assert level == "WARNING" and "\n" not in line
    assert f"built against torch {other}" in line and f"runs torch {torch.__version__}" in line
    assert "make current" in line


def test_a_build_for_another_torch_refused_where_native_is_asked_for():
    other = _other_torch()
    out = _run(other, XLA_AMP_PRIVATEUSE1_KERNELS="native")
    message = out["error"]
    assert message.startswith("XLA_AMP_PRIVATEUSE1_KERNELS=native, but ") and "\n" not in message
    assert f"built against torch {other}" in message
    assert f"runs torch {torch.__version__}" in message


# Python scalars reach mul/add/div as wrapped-number tensors: the boxed and
# typed kernels must hand them on untouched, also for an op the active
# policy leaves alone after a policy that lists it (hpu) compiled its kernel.
SCALAR_CASES = {"t * 2": lambda t: t * 2, "t + 1": lambda t: t + 1,
                "0.5 * t": lambda t: 0.5 * t, "t / 2": lambda t: t / 2,
                "t - 1.5": lambda t: t - 1.5, "2 ** t": lambda t: 2 ** t}


@needs_native
@pytest.mark.skipif(engines.torch_minor() < (2, 11), reason="the stand-in's device guard")
@pytest.mark.parametrize("case", sorted(SCALAR_CASES))
def test_python_scalars_pass_through_the_native_kernels(case):
    import xla_amp
    from xla_amp import policies
    from xla_amp.privateuse1 import _install
    from tests.support import standin_tpu
    standin_tpu.install()
    xla_amp.privateuse1.install()
    assert xla_amp.privateuse1.kernels() == "native"
    hpu = policies.get("hpu")
    assert {"aten::mul.Tensor", "aten::add.Tensor", "aten::div.Tensor"} <= set(hpu.expanded())
    _install.compile(hpu)  # its kernels registered for mul/add/div
    fn = SCALAR_CASES[case]
    x = torch.randn(8, 8)
    t = standin_tpu.to_device(x)
    with xla_amp.autocast("tpu", policy="tpu"):
        got = fn(t)
    assert got.dtype == torch.float32
    assert torch.equal(got.cpu(), fn(x))
    with xla_amp.autocast("tpu", policy=hpu):
        under_hpu = fn(t)
    want = fn(x.bfloat16()) if hpu.expanded().get(_overload_of(case)) == \
        "lower_precision_fp" else fn(x)
    assert under_hpu.dtype == want.dtype and torch.equal(under_hpu.cpu(), want)


def _overload_of(case: str) -> str:
    op = {"*": "mul", "+": "add", "/": "div", "-": "sub", "**": "pow"}[case.split()[1]]
    return "aten::pow.Scalar" if op == "pow" else f"aten::{op}.Tensor"


@needs_native
@pytest.mark.skipif(engines.torch_minor() < (2, 11), reason="the stand-in's device guard")
def test_push_and_pop_drive_the_native_stack():
    import xla_amp
    from xla_amp import policies
    from xla_amp.privateuse1 import _install, _kernels
    from tests.support import standin_tpu
    standin_tpu.install()
    xla_amp.privateuse1.install()
    t = standin_tpu.to_device(torch.randn(4, 4))
    fp32 = _install.compile(policies.get("tpu").with_overrides(fp32=["aten::mm"]))
    depth = _engine.pu1_policy_depth()
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert torch.mm(t, t).dtype == torch.bfloat16  # the default table: tpu
        _kernels.push(fp32)
        try:
            assert _kernels.active_table() is fp32 and _engine.pu1_policy_depth() == depth + 1
            assert torch.mm(t, t).dtype == torch.float32
        finally:
            _kernels.pop()
        assert torch.mm(t, t).dtype == torch.bfloat16 and _engine.pu1_policy_depth() == depth


@needs_native
@pytest.mark.skipif(engines.torch_minor() < (2, 11), reason="the stand-in's device guard")
def test_record_reports_the_native_kernels_decisions_per_module():
    import xla_amp
    from torch import nn
    from tests.support import standin_tpu
    standin_tpu.install()
    model = standin_tpu.to_device(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4)))
    x = standin_tpu.to_device(torch.randn(2, 8))
    with xla_amp.autocast("tpu", record=True) as region:
        y = model(x)
    assert y.dtype == torch.bfloat16
    report = region.report()
    assert report.policy == "tpu" and report.dtype == "bfloat16"
    lower, f32, bf16 = "lower_precision_fp", "float32", "bfloat16"
    assert [(r["module"], r["op"], r["category"], r["in_dtypes"], r["dtype"], r["count"])
            for r in report.rows] == [
        ("0", "aten::linear", lower, [f32, f32, f32], bf16, 1),
        ("1", "aten::relu", lower, [bf16], bf16, 1),
        ("2", "aten::linear", lower, [bf16, f32, f32], bf16, 1)]
    with xla_amp.autocast("tpu", policy="tpu"):  # not recording: nothing added
        model(x)
    assert len(region.report().rows) == 3


def test_record_with_the_python_kernels_is_refused_in_one_line():
    script = ("import torch, xla_amp, xla_amp.privateuse1\n"
              "from tests.support import standin_tpu\n"
              "standin_tpu.install()\n"
              "try:\n"
              "    xla_amp.autocast('tpu', record=True)\n"
              "except ValueError as e:\n"
              "    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=launch.launch_env(XLA_AMP_PRIVATEUSE1_KERNELS="python"),
                          timeout=120, cwd=launch.ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line == ("autocast: record=True needs xla_amp's native kernels (the recorder is "
                    "C++), and the Python ones serve this device: "
                    "XLA_AMP_PRIVATEUSE1_KERNELS=python")
