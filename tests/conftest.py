"""Test configuration: everything runs on XLA:CPU.

PJRT_DEVICE must be set before torch_xla's runtime starts, so it is set here,
before any test module imports torch_xla.
"""
import os

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.pop("XLA_USE_BF16", None)  # would override per-op precision

import pytest  # noqa: E402
import torch  # noqa: E402
import torch_xla  # noqa: E402

import xla_amp  # noqa: E402,F401


@pytest.fixture(scope="session")
def device():
    return torch_xla.device()

