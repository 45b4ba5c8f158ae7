"""What XLA:GPU through JAX's CUDA PJRT plugin needs, and where each piece is.

Four pieces, each checked without starting the XLA runtime:

    plugin   the ``jax-cuda12-pjrt`` distribution at the version whose PJRT
             C API is the one this torch_xla speaks (read from the library
             itself: ``GetPjrtApi()->pjrt_api_version``)
    nvcc     ``nvidia-cuda-nvcc-cu12``: ptxas and libdevice, which XLA needs
             to compile its kernels (torch's own CUDA wheels lack them)
    libs     the CUDA libraries the plugin loads lazily from
             ``../../nvidia/*/lib`` beside itself: torch's ``nvidia-*-cu12``
    driver   ``libcuda.so.1`` from the host's NVIDIA driver, with a device

``find(path)`` returns a ``Found`` holding every piece it found and a
problem line (with the command that fixes it) for each one it did not.
"""
from __future__ import annotations

import ctypes
import dataclasses
import importlib.metadata
import os
import sys

import torch_xla

# Measured (../shared/NOTES.md, "XLA:GPU through a PJRT plugin"): torch_xla
# 2.9 speaks PJRT C API 0.75; jax-cuda12-pjrt 0.7.0 is 0.73, 0.7.1 is 0.75,
# 0.7.2 is 0.76 (loads, then fails at the first execution).
PINS = {"2.9": {"plugin_version": "0.7.1", "c_api": (0, 75), "nvcc": "12.8.*"}}
PLUGIN = "jax-cuda12-pjrt"
NVCC = "nvidia-cuda-nvcc-cu12"
PLUGIN_FILE = "jax_plugins/xla_cuda12/xla_cuda_plugin.so"
NVCC_DIR = "nvidia/cuda_nvcc"
NVCC_FILES = ("bin/ptxas", "nvvm/libdevice/libdevice.10.bc")
CUDA_LIBS = ("cuda_runtime", "cublas", "cudnn", "cufft", "cusolver", "cusparse", "nvjitlink")
DRIVER = "libcuda.so.1"


def pins() -> dict:
    """The plugin and nvcc versions for the running torch_xla."""
    series = ".".join(torch_xla.__version__.split(".")[:2])
    if series not in PINS:
        raise RuntimeError(f"xla_amp.gpu knows no CUDA PJRT plugin for torch_xla "
                           f"{torch_xla.__version__} (known: {', '.join(PINS)})")
    return PINS[series]


def install_command() -> str:
    p = pins()
    return (f'pip install "{PLUGIN}=={p["plugin_version"]}" "{NVCC}=={p["nvcc"]}"'
            "   (or: pip install 'xla_amp[gpu]')")


@dataclasses.dataclass(frozen=True)
class Found:
    """What ``find`` saw; ``problems`` is empty when everything is there."""
    plugin_path: str | None = None
    plugin_version: str | None = None
    c_api: tuple[int, int] | None = None
    nvcc_dir: str | None = None
    driver_version: int | None = None   # e.g. 12080 for CUDA 12.8
    device_count: int = 0
    problems: tuple[str, ...] = ()


def _distribution(name: str, path):
    return next(iter(importlib.metadata.distributions(name=name, path=path)), None)


def c_api_version(library: str) -> tuple[int, int]:
    """(major, minor) of the PJRT C API a plugin library implements:
    ``GetPjrtApi()`` returns a ``PJRT_Api`` whose third member,
    ``PJRT_Api_Version {size_t struct_size; void* ext; int major; int minor}``,
    starts after two pointer-sized members."""
    lib = ctypes.CDLL(library, mode=os.RTLD_LAZY | os.RTLD_LOCAL)
    get = lib.GetPjrtApi
    get.restype = ctypes.c_void_p
    api = get()
    if not api:
        raise OSError(f"{library}: GetPjrtApi() returned NULL")
    words = ctypes.sizeof(ctypes.c_void_p)
    major = ctypes.c_int.from_address(api + 4 * words).value
    minor = ctypes.c_int.from_address(api + 4 * words + 4).value
    return major, minor


def driver(name: str = DRIVER) -> tuple[int | None, int, str | None]:
    """(CUDA driver version, visible devices, problem or None)."""
    try:
        cuda = ctypes.CDLL(name)
    except OSError:
        return None, 0, (f"no NVIDIA driver: {name} cannot be loaded (it comes with the "
                         "host's driver, not from pip; in a container run it with the "
                         "NVIDIA container toolkit, e.g. `docker run --gpus all`)")
    version = ctypes.c_int(0)
    cuda.cuDriverGetVersion(ctypes.byref(version))
    status = cuda.cuInit(0)
    if status != 0:
        return version.value, 0, (f"the NVIDIA driver ({name}, CUDA {_cuda(version.value)}) "
                                  f"sees no usable GPU: cuInit returned {status} (check "
                                  "nvidia-smi and CUDA_VISIBLE_DEVICES)")
    count = ctypes.c_int(0)
    cuda.cuDeviceGetCount(ctypes.byref(count))
    if count.value == 0:
        return version.value, 0, f"the NVIDIA driver ({name}) sees no GPU (nvidia-smi)"
    return version.value, count.value, None


def _cuda(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def find(path: list[str] | None = None, driver_name: str = DRIVER) -> Found:
    """Look for every piece in ``path`` (default ``sys.path``) and the driver."""
    path = sys.path if path is None else path
    want = pins()
    found, problems = {}, []
    pip_fixes = False  # a problem that `pip install` of the pinned pieces fixes

    plugin = _distribution(PLUGIN, path)
    if plugin is None:
        pip_fixes = True
        problems.append(f"the CUDA PJRT plugin ({PLUGIN}=={want['plugin_version']}) is not "
                        f"installed in this Python ({sys.executable})")
    else:
        found["plugin_version"] = plugin.version
        library = str(plugin.locate_file(PLUGIN_FILE))
        if not os.path.isfile(library):
            problems.append(f"{PLUGIN} {plugin.version} is installed but {library} is missing "
                            "(reinstall it)")
        elif plugin.version != want["plugin_version"]:
            pip_fixes = True
            problems.append(f"{PLUGIN} {plugin.version} is installed; torch_xla "
                            f"{torch_xla.__version__} needs {want['plugin_version']} (its PJRT "
                            f"C API, {want['c_api'][0]}.{want['c_api'][1]}, is the one this "
                            "torch_xla speaks; another version fails at the first execution)")
        else:
            api = c_api_version(library)
            found.update(plugin_path=library, c_api=api)
            if api != tuple(want["c_api"]):
                problems.append(f"{library} implements PJRT C API {api[0]}.{api[1]}; torch_xla "
                                f"{torch_xla.__version__} speaks {want['c_api'][0]}."
                                f"{want['c_api'][1]} (reinstall {PLUGIN}=="
                                f"{want['plugin_version']})")
        site = str(plugin.locate_file(""))
        missing = [lib for lib in CUDA_LIBS
                   if not os.path.isdir(os.path.join(site, "nvidia", lib, "lib"))]
        if missing:
            problems.append(f"the CUDA libraries the plugin loads from {site}/nvidia are "
                            f"missing: {', '.join(missing)} (torch's own nvidia-*-cu12 "
                            "wheels; install the plugin into the Python that has torch)")

    nvcc = _distribution(NVCC, path)
    if nvcc is None:
        pip_fixes = True
        problems.append(f"{NVCC} (ptxas and libdevice, which XLA compiles GPU kernels with) "
                        "is not installed")
    else:
        root = str(nvcc.locate_file(NVCC_DIR))
        absent = [f for f in NVCC_FILES if not os.path.isfile(os.path.join(root, f))]
        if absent:
            problems.append(f"{NVCC} {nvcc.version} lacks {', '.join(absent)} under {root}")
        else:
            found["nvcc_dir"] = root

    version, count, problem = driver(driver_name)
    found.update(driver_version=version, device_count=count)
    if problem:
        problems.append(problem)
    if pip_fixes:
        problems.append(f"install them with: {install_command()}")
    return Found(**found, problems=tuple(problems))
