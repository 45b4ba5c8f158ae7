"""The core without torch_xla, on torch 2.9 too: with torch_xla blocked
(sys.modules["torch_xla"] = None, as an uninstalled package), `import
xla_amp` gives the core and the PrivateUse1 engine, and every name that
needs torch_xla raises one line naming the package. The current profile
(make current) runs the same on torch 2.15, where torch_xla does not exist."""
import json
import subprocess
import sys

from tests.support import launch

SCRIPT = r'''
import json, sys
sys.modules["torch_xla"] = None
import xla_amp
out = {"autocast": xla_amp.autocast.__module__, "loaded": sorted(
    m for m in sys.modules if m.startswith("xla_amp") and m not in ("xla_amp",))}
for name in ("syncfree", "sharded", "gpu", "optimizer_step", "explain", "PrecisionReport",
             "custom_fwd", "custom_bwd", "compare", "watch_nonfinite"):
    try:
        getattr(xla_amp, name)
        out[name] = "no error"
    except ImportError as e:
        out[name] = str(e)
try:
    import xla_amp.syncfree
except ImportError as e:
    out["import xla_amp.syncfree"] = str(e)
print(json.dumps(out))
'''


def test_core_imports_and_names_what_is_missing():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=launch.launch_env(), timeout=120, cwd=launch.ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["autocast"] == "xla_amp.privateuse1._region"
    # nothing of the torch_xla engine was loaded (xla_amp._engine and _C serve
    # the PrivateUse1 engine too: import xla_amp takes AutocastPrivateUse1
    # with the native kernels where they load)
    for engine_module in ("xla_amp.syncfree", "xla_amp.autocast", "xla_amp.sharded",
                          "xla_amp.gpu", "xla_amp.distributed"):
        assert engine_module not in out["loaded"], engine_module
    for name in ("custom_fwd", "custom_bwd", "compare", "watch_nonfinite"):  # any engine
        assert out[name] == "no error", (name, out[name])
    for name in ("syncfree", "sharded", "gpu", "optimizer_step", "explain", "PrecisionReport",
                 "import xla_amp.syncfree"):
        message = out[name]
        assert "needs xla_amp's torch_xla engine" in message, (name, message)
        assert "needs the package 'torch_xla', which is not installed" in message
        assert "pip install torch==2.9.0 torch_xla==2.9.0" in message and "\n" not in message
