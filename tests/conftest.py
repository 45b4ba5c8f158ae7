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



# `make test` runs on two pytest-xdist workers (--dist loadgroup). The tests
# that start subprocesses compiling whole models (launchers, the zoo subset,
# compiled models and training, packaging, SPMD runs) share one group, so one
# worker runs them one after another and two never compile large graphs side
# by side; the in-process tests spread over both workers.
SUBPROCESS_HEAVY = {"test_launchers.py", "test_zoo.py", "test_compiled_models.py",
                    "test_compiled_training.py", "test_packaging.py", "test_distributed.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in SUBPROCESS_HEAVY:
            item.add_marker(pytest.mark.xdist_group("subprocess-heavy"))
