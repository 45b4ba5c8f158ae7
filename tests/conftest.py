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


def pytest_ignore_collect(collection_path, config):
    """The torchax tests' modules import torchax, which renames PyTorch's
    PrivateUse1 backend to "jax" for the whole process (and so changes what
    torch.distributed.checkpoint does in it): they are collected only when
    the torchax marker is selected (`make torchax`), so no other run's
    worker imports torchax."""
    if collection_path.name.startswith("test_torchax"):
        return "torchax" not in (config.getoption("markexpr") or "")
    return None


@pytest.fixture(scope="session")
def device():
    return torch_xla.device()



# `make test` runs on two pytest-xdist workers, and a test file is the unit
# of work: its tests run in order on one worker. Many files cache what their
# tests share (test_compiled_ops compiles each policy's op cases once, in
# chunks; the conformance and state tests keep per-policy results): spread
# test by test, both workers computed every cache, and the suite used 1.7x
# the CPU of one worker alone (measured on three such files: 279 vs 165
# CPU-s, 146 s wall against 113 s serial; per file, 91 s).
#
# Tests that start subprocesses compiling whole models form two larger units
# that go out first, one to each worker:
#   large-graphs   ResNet-18 / MobileNetV3 / transformer step graphs (the zoo
#                  subset, compiled models, the ImageNet launcher runs): two
#                  of these never compile side by side
#   small-graphs   the MNIST launcher runs, SPMD, compiled training, the wheel
# The files of in-process tests then fill in around them, most tests first.
#
# xdist's own `--dist loadgroup` cannot do this on pytest 9.2: it tags node
# ids through `item._nodeid`, which pytest no longer reads, and silently
# stops grouping (pytest-dev/pytest-xdist#1386; pinned in
# tests/test_suite_scheduling.py). So `--dist loadgroup` here means
# SuiteUnits below: xdist's scope scheduler with these units as scopes.
LARGE_GRAPHS = {"test_zoo.py", "test_zoo_hf.py", "test_compiled_models.py"}
SMALL_GRAPHS = {"test_launchers.py", "test_launcher_devices.py", "test_compiled_training.py",
                "test_packaging.py", "test_distributed.py"}
GROUP_ORDER = ("large-graphs", "small-graphs")


def subprocess_group(file_name: str, test_name: str) -> str | None:
    """The group of a test (its file's name and its own), or None."""
    if file_name in LARGE_GRAPHS or (file_name == "test_launchers.py"
                                     and "imagenet" in test_name):
        return "large-graphs"
    if file_name in SMALL_GRAPHS:
        return "small-graphs"
    return None


@pytest.hookimpl(optionalhook=True)  # (runs without xdist too: -p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SuiteUnits(LoadScopeScheduling):
        """A unit is a subprocess group or one test file; its tests run in
        order on one worker. The groups go out first, then the files with
        the most tests."""

        def _split_scope(self, nodeid: str) -> str:
            path, _, name = nodeid.partition("::")
            return subprocess_group(os.path.basename(path), name) or path

        def schedule(self):
            if self.collection is not None or not self._check_nodes_have_same_collection():
                return super().schedule()  # (later calls hand out the queue)
            self.collection = list(next(iter(self.registered_collections.values())))
            units = {}
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False

            def rank(scope):
                if scope in GROUP_ORDER:
                    return (0, GROUP_ORDER.index(scope))
                return (1, -len(units[scope]))
            for scope in sorted(units, key=rank):
                self.workqueue[scope] = units[scope]
            for node in self.nodes:  # one unit each, then topped up
                if self.workqueue:
                    self._assign_work_unit(node)
            for node in self.nodes:
                self._reschedule(node)

    return SuiteUnits(config, log)
