"""Builds xla_amp and its native engine, xla_amp._C (metadata: pyproject.toml).

Compiles csrc/ against the torch installed in this Python (no CUDA toolkit
needed), so build without isolation, in the environment that has torch and
torch_xla:

    pip wheel --no-build-isolation --no-deps .     # a wheel
    pip install --no-build-isolation -e .          # an editable checkout
    make build                                     # what the Makefile does (ninja, incremental)

The wheel's Requires-Dist pins torch and torch_xla to the release series
found here (torch==2.9.*), and every build writes its build record with the
exact versions, which xla_amp checks (xla_amp/_version_check.py). The
library carries no debug info (-g0: 23 MB -> ~1 MB); XLA_AMP_DEBUG_BUILD=1
keeps it.

Without torch_xla (torch 2.9-2.15, the PrivateUse1 engine; `make current`)
the same csrc/ builds for AutocastPrivateUse1: the record is then
xla_amp/_build_info_<python tag>.py, beside the torch_xla build's
_build_info.py, the pin torch==<series>.* alone, and the C++ standard the
torch headers need (C++17 for torch 2.9, C++20 from 2.10 on, as torch's
own cpp_extension defaults to).
"""
import glob
import os
import runpy

from setuptools import find_packages, setup

ROOT = os.path.dirname(os.path.abspath(__file__))
versions = runpy.run_path(os.path.join(ROOT, "xla_amp", "_version_check.py"))
BUILT_AGAINST = versions["installed_versions"]()  # a clear error without torch/torch_xla

from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: E402

DEBUG = os.environ.get("XLA_AMP_DEBUG_BUILD") == "1"


RECORD = versions["record_module"](BUILT_AGAINST) + ".py"
STD = "c++17" if versions["series"](BUILT_AGAINST["torch"]) == "2.9" else "c++20"


class BuildWithInfo(BuildExtension):
    """build_ext that also writes the build record (RECORD) next to _C."""

    def run(self):
        super().run()
        text = versions["build_info_text"]("setup.py", BUILT_AGAINST)
        targets = [os.path.join(self.build_lib, "xla_amp")]
        if self.inplace:
            targets.append(os.path.join(ROOT, "xla_amp"))
        for folder in targets:
            os.makedirs(folder, exist_ok=True)
            tmp = os.path.join(folder, f".{RECORD}.tmp")
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, os.path.join(folder, RECORD))


setup(
    packages=find_packages(include=["xla_amp", "xla_amp.*", "xla_amp_launch"]),
    package_data={"xla_amp": ["policies/*.toml"]},
    ext_modules=[
        CppExtension(
            name="xla_amp._C",
            sources=sorted(glob.glob("csrc/**/*.cpp", recursive=True)),
            # after Python's own CFLAGS (-g -O3): the last -g / -O wins
            extra_compile_args=["-O2", f"-std={STD}"] + ([] if DEBUG else ["-g0"]),
        )
    ],
    cmdclass={"build_ext": BuildWithInfo},
    install_requires=[versions["requirement"](p, v) for p, v in BUILT_AGAINST.items()]
    + ["xxhash>=3"],   # checkpoint checksums (xla_amp/checkpoint/_checksum.py)
)
