"""xla_amp.gpu.use_cuda_plugin on a machine without a GPU.

What stands in for what:
- ``fake_site`` is a site-packages tree with what a GPU machine has after
  ``pip install 'xla_amp[gpu]'``: jax-cuda12-pjrt's and nvcc's
  distribution records, the nvcc files, torch's nvidia library folders, and
  in place of the 120 MB plugin library a 1 kB one exporting
  ``GetPjrtApi`` with the real first members of ``PJRT_Api`` (its C API
  version), compiled here. ``libcuda`` is a compiled stub of the three
  driver calls the check makes, with the answers of a one-GPU machine or of
  a broken one.
- The registration runs in a subprocess (it changes process state: SPMD
  mode, PJRT_DEVICE, XLA_FLAGS, torch_xla's plugin registry), which never
  creates a tensor: the stub library has no client to create.
The SPMD-mode behaviour of everything that runs on the GPU is in
tests/gpu/test_gpu_spmd_mode.py.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.support.launch import ROOT

from xla_amp.gpu import _requirements as req

XLA = req.torch_xla.__version__

PLUGIN_C = """
#include <stddef.h>
typedef struct { size_t struct_size; void* ext; int major; int minor; } Version;
typedef struct { size_t struct_size; void* ext; Version version; } Api;
static Api api = {sizeof(Api), 0, {sizeof(Version), 0, MAJOR, MINOR}};
const Api* GetPjrtApi(void) { return &api; }
"""
DRIVER_C = """
int cuDriverGetVersion(int* v) { *v = 12080; return 0; }
int cuInit(unsigned flags) { return INIT; }
int cuDeviceGetCount(int* n) { *n = COUNT; return 0; }
"""


def _compile(tmp, name, source, **defines):
    c = tmp / f"{name}.c"
    c.write_text(source)
    out = tmp / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(c),
                    *[f"-D{k}={v}" for k, v in defines.items()]], check=True)
    return str(out)


def _dist(site, name, version):
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def make_site(tmp, plugin_version="0.7.1", c_api=(0, 75), nvcc=True, ptxas=True,
              libs=req.CUDA_LIBS):
    site = tmp / "site"
    site.mkdir()
    if plugin_version:
        _dist(site, req.PLUGIN, plugin_version)
        lib = site / req.PLUGIN_FILE
        lib.parent.mkdir(parents=True)
        os.replace(_compile(tmp, "plugin", PLUGIN_C, MAJOR=c_api[0], MINOR=c_api[1]), lib)
    if nvcc:
        _dist(site, req.NVCC, "12.8.93")
        for f in req.NVCC_FILES if ptxas else req.NVCC_FILES[1:]:
            p = site / req.NVCC_DIR / f
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"")
    for name in libs:
        (site / "nvidia" / name / "lib").mkdir(parents=True)
    return str(site)


@pytest.fixture
def driver(tmp_path):
    return _compile(tmp_path, "libcuda_one_gpu", DRIVER_C, INIT=0, COUNT=1)


def test_everything_present(tmp_path, driver):
    site = make_site(tmp_path)
    found = req.find([site], driver)
    assert found.problems == ()
    assert found.plugin_path == os.path.join(site, req.PLUGIN_FILE)
    assert found.plugin_version == "0.7.1" and found.c_api == (0, 75)
    assert found.nvcc_dir == os.path.join(site, req.NVCC_DIR)
    assert (found.driver_version, found.device_count) == (12080, 1)


@pytest.mark.parametrize("site_args,expect", [
    (dict(plugin_version=None), "jax-cuda12-pjrt==0.7.1) is not installed"),
    (dict(plugin_version="0.7.2", c_api=(0, 76)), "jax-cuda12-pjrt 0.7.2 is installed; "
                                                  f"torch_xla {XLA} needs 0.7.1"),
    (dict(c_api=(0, 73)), f"implements PJRT C API 0.73; torch_xla {XLA} speaks 0.75"),
    (dict(nvcc=False), "nvidia-cuda-nvcc-cu12 (ptxas and libdevice"),
    (dict(ptxas=False), "lacks bin/ptxas"),
    (dict(libs=("cuda_runtime", "cublas")), "missing: cudnn, cufft, cusolver, cusparse, "
                                            "nvjitlink"),
])
def test_each_missing_piece_is_named(tmp_path, driver, site_args, expect):
    found = req.find([make_site(tmp_path, **site_args)], driver)
    assert any(expect in p for p in found.problems), found.problems
    assert len([p for p in found.problems if "install them with" not in p]) == 1, found.problems
    if "install" in expect or "needs" in expect:
        assert "pip install \"jax-cuda12-pjrt==0.7.1\" \"nvidia-cuda-nvcc-cu12==12.8.*\"" \
            in found.problems[-1]


@pytest.mark.parametrize("defines,expect", [
    (None, "no NVIDIA driver: "),
    (dict(INIT=100, COUNT=0), "sees no usable GPU: cuInit returned 100"),
    (dict(INIT=0, COUNT=0), "sees no GPU"),
])
def test_driver_problems(tmp_path, defines, expect):
    name = (str(tmp_path / "absent.so") if defines is None
            else _compile(tmp_path, "libcuda", DRIVER_C, **defines))
    found = req.find([make_site(tmp_path)], name)
    assert len(found.problems) == 1 and expect in found.problems[0], found.problems
    assert found.device_count == 0


def test_everything_missing_is_one_list(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    found = req.find([str(empty)], str(tmp_path / "absent.so"))
    text = "\n".join(found.problems)
    for piece in ("jax-cuda12-pjrt==0.7.1", "nvidia-cuda-nvcc-cu12", "no NVIDIA driver",
                  "install them with: pip install"):
        assert piece in text, text


def _python(code, env=None, timeout=120):
    env = dict(os.environ, **(env or {}))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=timeout)
    return proc


STATE = """
import json, os, torch_xla, torch_xla.runtime as xr
import torch_xla.experimental.plugins as plugins
def state():
    return dict(pjrt=os.environ.get("PJRT_DEVICE"), spmd=xr.is_spmd(),
                flags=os.environ.get("XLA_FLAGS", ""), plugins=sorted(plugins._plugin_registry),
                dynamic=os.environ.get("PJRT_DYNAMIC_PLUGINS"))
"""


def test_registration_on_a_stand_in_gpu_machine(tmp_path, driver):
    site = make_site(tmp_path)
    proc = _python(STATE + f"""
import xla_amp.gpu
from xla_amp.gpu import _requirements
real = _requirements.find
_requirements.find = lambda: real([{site!r}], {driver!r})
before = state()
setup = xla_amp.gpu.use_cuda_plugin(memory_fraction=0.5, preallocate=False)
after = state()
same = xla_amp.gpu.use_cuda_plugin(preallocate=False, memory_fraction=0.5) is setup
try:
    xla_amp.gpu.use_cuda_plugin()
    other = None
except xla_amp.gpu.CudaPluginError as e:
    other = str(e)
plugin = plugins._plugin_registry["CUDA"]
print(json.dumps(dict(before=before, after=after, same=same, other=other,
                      setup=[setup.plugin_path, setup.c_api, setup.device_count],
                      library=plugin.library_path(), options=plugin.client_create_options(),
                      chips=plugin.physical_chip_count(),
                      started=torch_xla._XLAC._xla_runtime_is_initialized())))
""", env={"PJRT_DEVICE": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["before"]["spmd"] is False and "CUDA" not in out["before"]["plugins"]
    after = out["after"]
    assert after["pjrt"] == "CUDA" and after["spmd"] is True and after["dynamic"] == "1"
    assert f"--xla_gpu_cuda_data_dir={site}/nvidia/cuda_nvcc" in after["flags"]
    assert out["library"] == os.path.join(site, req.PLUGIN_FILE) == out["setup"][0]
    assert out["options"] == {"memory_fraction": 0.5, "preallocate": False}
    assert out["chips"] == 1 and out["setup"][1:] == [[0, 75], 1]
    assert out["same"] is True and "cannot be set up again" in out["other"]
    assert out["started"] is False


def test_refusals_change_nothing():
    """On this machine (no plugin, no driver), with a bad option, with
    PJRT_DEVICE naming another device, and once the runtime started on
    XLA:CPU: each call raises and leaves the process as it was."""
    proc = _python(STATE + """
import torch, xla_amp.gpu
def attempt(**kw):
    before = state()
    try:
        xla_amp.gpu.use_cuda_plugin(**kw)
        error = None
    except (xla_amp.gpu.CudaPluginError, ValueError) as e:
        error = f"{type(e).__name__}: {e}"
    return error, before == state()
out = [attempt(memory_fraction=1.5), attempt(allocator="x"), attempt()]
os.environ["PJRT_DEVICE"] = "TPU"
out.append(attempt())
os.environ["PJRT_DEVICE"] = "CPU"
torch.ones(2, device=torch_xla.device()).sum().item()
out.append(attempt())
print(json.dumps(out))
""", env={"PJRT_DEVICE": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    errors = [e for e, _ in out]
    assert all(unchanged for _, unchanged in out), out
    assert errors[0].startswith("ValueError: memory_fraction must be a number in (0, 1]")
    assert errors[1].startswith("ValueError: allocator must be one of")
    assert "XLA:GPU cannot start" in errors[2] and "jax-cuda12-pjrt==0.7.1" in errors[2]
    assert "PJRT_DEVICE=TPU is set" in errors[3]
    assert "already started on CPU" in errors[4]


def test_environment_switch_refuses_other_values(monkeypatch):
    """Refused before anything is looked at (so here, in a process whose
    runtime has started, the error is about the value)."""
    import xla_amp.gpu
    monkeypatch.setenv("XLA_AMP_CUDA_PLUGIN", "2")
    with pytest.raises(ValueError, match="XLA_AMP_CUDA_PLUGIN='2': use 1"):
        xla_amp.gpu.from_environment()
    monkeypatch.setenv("XLA_AMP_CUDA_PLUGIN", "0")
    assert xla_amp.gpu.from_environment() is None


def test_environment_switch():
    """XLA_AMP_CUDA_PLUGIN=1: importing xla_amp sets the plugin up, or says
    why it cannot (this machine: no plugin, no driver)."""
    proc = _python("import xla_amp, os; print(os.environ['PJRT_DEVICE'])",
                   env={"XLA_AMP_CUDA_PLUGIN": "1", "PJRT_DEVICE": ""})
    problems = req.find().problems
    if problems:
        assert proc.returncode != 0 and problems[0] in proc.stderr, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0 and proc.stdout.strip() == "CUDA", proc.stderr[-3000:]


def test_unset_import_xla_amp_loads_nothing_of_gpu():
    """Without XLA_AMP_CUDA_PLUGIN, importing xla_amp neither runs nor loads
    xla_amp.gpu; the engine reads the variable gpu/ documents."""
    from xla_amp.autocast import _implementation
    assert _implementation.CUDA_PLUGIN_ENV == "XLA_AMP_CUDA_PLUGIN"
    import xla_amp.gpu
    assert xla_amp.gpu.ENV == _implementation.CUDA_PLUGIN_ENV
    proc = _python("import sys, xla_amp; print(sorted(m for m in sys.modules "
                   "if m.startswith('xla_amp.gpu')))", env={"XLA_AMP_CUDA_PLUGIN": ""})
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "[]", proc.stderr


def test_gpu_extra_pins_what_the_checks_want():
    """`pip install 'xla_amp[gpu]'` installs the versions find() accepts."""
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"),
              "rb") as f:
        extra = tomllib.load(f)["project"]["optional-dependencies"]["gpu"]
    pins = req.pins()
    assert extra == [f"{req.PLUGIN}=={pins['plugin_version']}", f"{req.NVCC}=={pins['nvcc']}"]
