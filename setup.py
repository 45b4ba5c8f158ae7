"""Builds xla_amp and its native engine, xla_amp._C.

`pip install --no-build-isolation -e .` compiles csrc/ against the installed
torch (no CUDA toolkit needed); importing xla_amp never compiles.
"""
import glob

from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(
    name="xla_amp",
    version="0.1.0",
    description="Automatic mixed precision for PyTorch/XLA",
    packages=find_packages(include=["xla_amp", "xla_amp.*", "xla_amp_launch"]),
    package_data={"xla_amp": ["policies/*.toml"]},
    ext_modules=[
        CppExtension(
            name="xla_amp._C",
            sources=sorted(glob.glob("csrc/**/*.cpp", recursive=True)),
            extra_compile_args=["-O2", "-std=c++17"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    python_requires=">=3.10",
)
