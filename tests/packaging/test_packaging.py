"""Packaging: the wheel builds, installs into a directory and works from
outside the checkout; its library carries no debug info; it pins the torch /
torch_xla it was built against; importing under another torch_xla (or with
no build record) is an ImportError that names the versions and the fix."""
import email
import importlib.metadata
import os
import subprocess
import sys
import zipfile

import pytest
import torch_xla

import xla_amp
from xla_amp import _version_check

from tests.support.launch import ROOT  # noqa: E402
MAX_LIBRARY_BYTES = 3 * 1024 * 1024

SMOKE = """
import os, sys, torch, torch_xla
real = torch_xla.__version__
torch_xla.__version__ = "2.8.0"            # as if torch_xla were another release
try:
    import xla_amp
    print("no ImportError under torch_xla 2.8.0")
except ImportError as e:
    print("IMPORT ERROR:", e)
torch_xla.__version__ = real
import xla_amp
from xla_amp import policies
import xla_amp_launch.flags
assert xla_amp.__file__.startswith(sys.argv[1]), xla_amp.__file__
assert policies.get("tpu").category("aten::mm") == "lower_precision_fp"
device = torch_xla.device()
a = torch.randn(8, 8, device=device)
with xla_amp.autocast(device):
    print("mm dtype:", (a @ a).dtype)
"""


def _normalized(requirement: str) -> str:
    name, _, rest = requirement.partition("==")
    return name.strip().lower().replace("-", "_") + "==" + rest.strip()


def test_wheel_builds_installs_and_runs_outside_the_checkout(tmp_path):
    dist, target = tmp_path / "dist", tmp_path / "site"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
         "--no-index", "--disable-pip-version-check", "-w", str(dist), ROOT],
        capture_output=True, text=True, cwd=ROOT, timeout=1200,
        env=dict(os.environ, MAX_JOBS=os.environ.get("MAX_JOBS", "2")))
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = dist.glob("xla_amp-*.whl")

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (lib,) = [n for n in names if n.startswith("xla_amp/_C") and n.endswith(".so")]
        assert zf.getinfo(lib).file_size <= MAX_LIBRARY_BYTES, zf.getinfo(lib).file_size
        zf.extract(lib, tmp_path / "unzipped")
        meta = email.message_from_bytes(zf.read(next(n for n in names
                                                     if n.endswith(".dist-info/METADATA"))))
    assert {"xla_amp/_build_info.py", "xla_amp/policies/tpu.toml",
            "xla_amp_launch/flags.py"} <= set(names)
    sections = subprocess.run(["readelf", "-S", "-W", str(tmp_path / "unzipped" / lib)],
                              capture_output=True, text=True, check=True).stdout
    assert ".text" in sections and ".debug_info" not in sections

    requires = [r for r in meta.get_all("Requires-Dist") if ";" not in r]
    pins = {_normalized(r) for r in requires if "==" in r}
    want = {_version_check.requirement(p, importlib.metadata.version(p))
            for p in _version_check.PACKAGES}
    assert pins == want, pins          # here: torch==2.9.*, torch_xla==2.9.*
    # and the checkpoints' checksum library (xla_amp/checkpoint/_checksum.py)
    assert [r.replace(" ", "") for r in requires if "==" not in r] == ["xxhash>=3"], requires
    assert meta["Version"] == xla_amp.__version__ and meta["Requires-Python"] == ">=3.11"

    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
         "--disable-pip-version-check", "--target", str(target), str(wheel)],
        capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]
    env = dict(os.environ, PYTHONPATH=str(target), PJRT_DEVICE="CPU")
    smoke = subprocess.run([sys.executable, "-c", SMOKE, str(target)], capture_output=True,
                           text=True, cwd=tmp_path, env=env, timeout=300)
    assert smoke.returncode == 0, smoke.stderr[-3000:]
    assert "mm dtype: torch.bfloat16" in smoke.stdout
    assert "no ImportError" not in smoke.stdout, smoke.stdout
    (error,) = [line for line in smoke.stdout.splitlines() if line.startswith("IMPORT ERROR")]
    assert "torch_xla 2.8.0" in error and f"torch_xla {torch_xla.__version__}" in error
    assert "make build" in error and "pip install --no-build-isolation ." in error


def test_versions_match_by_release_series():
    built = {"torch": "2.9.0", "torch_xla": "2.9.0"}
    assert _version_check.mismatch_message(built, {"torch": "2.9.0+cu128",
                                                   "torch_xla": "2.9.1"}) is None
    msg = _version_check.mismatch_message(built, {"torch": "2.10.0", "torch_xla": "2.9.0"})
    assert "torch 2.9.0 at build time, 2.10.0 now" in msg and "torch_xla 2.9.0 at" not in msg
    assert "make build" in msg and "'torch==2.9.*' 'torch_xla==2.9.*'" in msg
    assert _version_check.requirement("torch_xla", "2.9.0+cpu") == "torch_xla==2.9.*"


def test_check_refuses_another_build(monkeypatch):
    from xla_amp import _build_info
    monkeypatch.setattr(_build_info, "TORCH_VERSION", "2.8.0")
    with pytest.raises(ImportError, match=r"built against torch 2\.8\.0 .* runs torch 2\.9"):
        _version_check.check()


def test_check_names_a_missing_build_record(monkeypatch):
    monkeypatch.delattr(xla_amp, "_build_info")
    monkeypatch.setitem(sys.modules, "xla_amp._build_info", None)  # import fails
    with pytest.raises(ImportError, match="_build_info.py is missing.*older build.*make build"):
        _version_check.check()
