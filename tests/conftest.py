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


def pytest_addoption(parser):
    parser.addoption("--zoo-shard", default=None, metavar="I/N",
                     help="run the I-th of N shares of the `zoo`-marked tests (round robin "
                          "over their models): CI runs the sweep as N jobs")


def pytest_collection_modifyitems(config, items):
    shard = config.getoption("--zoo-shard")
    if not shard:
        return
    try:
        i, n = (int(v) for v in shard.split("/"))
        assert 1 <= i <= n
    except (ValueError, AssertionError):
        raise pytest.UsageError(f"--zoo-shard: expected I/N with 1 <= I <= N, got {shard!r}")
    zoo = [item for item in items if item.get_closest_marker("zoo")]
    dropped = [item for k, item in enumerate(zoo) if k % n != i - 1]
    items[:] = [item for item in items if item not in dropped]
    config.hook.pytest_deselected(items=dropped)
