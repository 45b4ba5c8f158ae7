"""One face: `import xla_amp` gives the same names with torch_xla and
without it (sys.modules["torch_xla"] = None, as an uninstalled package, on
torch 2.9 too; the current profile, make current, runs the same on torch
2.15). Without it, every name that needs the torch_xla engine raises one
line naming the package, and nothing of that engine is loaded."""
import json
import subprocess
import sys

import pytest

from tests.support import launch

SCRIPT = r'''
import json, sys
if sys.argv[1] == "blocked":
    sys.modules["torch_xla"] = None
import xla_amp
out = {"autocast module": xla_amp.autocast.__module__, "all": sorted(xla_amp.__all__),
       "loaded": sorted(m for m in sys.modules if m.startswith("xla_amp") and m != "xla_amp")}
for name in xla_amp.__all__:
    try:
        getattr(xla_amp, name)
        out[name] = "no error"
    except ImportError as e:
        out[name] = type(e).__name__ + ": " + str(e)
for module in ("xla_amp.syncfree",):
    try:
        __import__(module)
        out["import " + module] = "no error"
    except ImportError as e:
        out["import " + module] = type(e).__name__ + ": " + str(e)
try:
    xla_amp.autocast("xla:0")
    out["autocast xla"] = "no error"
except ImportError as e:
    out["autocast xla"] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
'''
TORCH_XLA_NAMES = {"syncfree", "sharded", "gpu", "optimizer_step", "all_reduce_gradients",
                   "explain"}


def _face(mode: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                          env=launch.launch_env(), timeout=120, cwd=launch.ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def faces():
    return _face("blocked"), _face("installed")


def test_the_same_names_with_and_without_torch_xla(faces):
    blocked, installed = faces
    assert blocked["all"] == installed["all"]
    assert blocked["autocast module"] == installed["autocast module"] == "xla_amp.autocast._region"
    for name in installed["all"]:
        assert installed[name] == "no error", (name, installed[name])
        if name not in TORCH_XLA_NAMES:  # any engine: the same object kind on both
            assert blocked[name] == "no error", (name, blocked[name])
    assert installed["autocast xla"] == "no error"


def test_without_torch_xla_its_names_raise_one_line_and_nothing_of_it_loads(faces):
    blocked, _ = faces
    for engine_module in ("xla_amp.syncfree", "xla_amp.sharded", "xla_amp.gpu",
                          "xla_amp.distributed", "xla_amp.autocast._dynamo",
                          "xla_amp.numerics._explain"):
        assert engine_module not in blocked["loaded"], engine_module
    for name in (*sorted(TORCH_XLA_NAMES), "import xla_amp.syncfree", "autocast xla"):
        message = blocked[name]
        assert message.startswith("EngineUnavailable: "), (name, message)
        assert "needs xla_amp's torch_xla engine" in message, (name, message)
        assert "needs the package 'torch_xla', which is not installed" in message
        assert "pip install torch==2.9.0 torch_xla==2.9.0" in message and "\n" not in message
