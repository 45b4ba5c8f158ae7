"""Test configuration: everything runs on XLA:CPU.

PJRT_DEVICE must be set before torch_xla's runtime starts, so it is set here,
before any test module imports torch_xla.
"""
import os

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.pop("XLA_USE_BF16", None)  # would override per-op precision

# Bytecode caches written (__pycache__, ignored by git) by the run, its xdist
# workers and every process a test starts, whatever the environment says: with
# PYTHONDONTWRITEBYTECODE=1 (some hosts' default) each of them would compile
# the test modules, pytest's rewritten asserts and xla_amp from source.
import sys  # noqa: E402
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# One JAX compilation cache for every process of a run (xdist workers and the
# subprocesses they start inherit this environment): the torchax tests and
# their subprocesses compile many of the same programs. A clean clone starts
# with none; JAX keys each entry by the program, the jax/jaxlib versions and
# the compile options, so a stale entry cannot be loaded for another program.
# torch_xla 2.9's own persistent cache is written but never loaded on XLA:CPU
# (pinned in tests/suite/test_compile_cache.py), so it stays off.
from tests.support import memory_maps, quiet_gc  # noqa: E402
from tests.support.launch import BACKEND_O0, ROOT  # noqa: E402  (os, re, sys only)

# XLA:CPU compiles the tests' graphs with backend optimisation off
# (BACKEND_O0, tests/support/launch.py): the same HLO, a third of LLVM's time.
# The fusion emitters stay: with the elemental ones float32 -> float8 rounds
# otherwise than the float64 reference (tests/fp8/test_fp8.py). Where torch_xla
# is installed only: the current profile gained nothing (78 s -> 86 s). Asked
# of find_spec, not of xla_amp.engines below: importing xla_amp imports
# torch_xla, and the flags are set before that.
import importlib.util  # noqa: E402
if importlib.util.find_spec("torch_xla") is not None:
    os.environ.setdefault("XLA_FLAGS", BACKEND_O0)
    # At most 256 executables a process, not torch_xla's 2048: each holds two
    # memory maps a kernel, and a make-test worker that compiled ~1,100 graphs
    # ended at 52,000 of Linux's 65,530 (a .ci/run worker died past it); with
    # 256, at 32,700 (tests/support/memory_maps.py's guard counts them).
    os.environ.setdefault("XLA_COMPILATION_CACHE_SIZE", "256")

# torch.compile(dynamic=True) builds Dynamo's shape guards in C++; the first
# build in a process has Inductor probe each vector ISA the CPU reports by
# compiling a test library and loading it in a fresh interpreter that imports
# torch (torch 2.9 on an AVX-512/AMX host: six of them, about 11 s of CPU, in
# test_dynamic_shapes alone). "0" builds the guards without vector flags and
# probes nothing ("1" still probes AVX512-BF16 and AMX); the tests compile
# with openxla, never with Inductor's CPU kernels (docs/compiled.md).
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")

# The launchers' prepared digits (xla_amp_launch/data_cache.py) in the tree,
# not in the user's home: made by the run's first launcher, read by the rest.
os.environ.setdefault("XLA_AMP_CACHE", os.path.join(ROOT, "build", "data-cache"))

JAX_CACHE = os.path.join(ROOT, "build", "compile-cache", "jax")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", JAX_CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

# Results several tests read, made once per run (tests/support/runs.py): the
# controller (or a run without xdist) makes the folder; workers inherit it.
if "PYTEST_XDIST_WORKER" not in os.environ and "XLA_AMP_TEST_RUN_DIR" not in os.environ:
    import tempfile
    os.makedirs(os.path.join(ROOT, "build", "test-runs"), exist_ok=True)
    os.environ["XLA_AMP_TEST_RUN_DIR"] = tempfile.mkdtemp(
        prefix="run-", dir=os.path.join(ROOT, "build", "test-runs"))
    _OWN_RUN_DIR = os.environ["XLA_AMP_TEST_RUN_DIR"]
else:
    _OWN_RUN_DIR = None

import pytest  # noqa: E402
import torch  # noqa: E402

from xla_amp import engines  # noqa: E402

# The current profile (make current: torch 2.15, no torch_xla) runs only the
# files that hold `core` tests; such a file imports neither torch_xla nor
# tests.support's torch_xla helpers at module level.
TORCH_XLA = engines.available("torch_xla")
if TORCH_XLA:
    import torch_xla  # noqa: F401

import xla_amp  # noqa: E402,F401


# The suite's layout: tests/<folder>/ mirrors xla_amp/'s subpackages, and
# each make target beyond `make test` is a marker. A folder that is wholly one
# target marks every test in it (FOLDER_TARGETS); elsewhere a heavy file or
# test carries its target's marker itself, and lives in that target's folder
# (tests/suite/test_layout_of_tests.py checks both).
FOLDER_TARGETS = {"torchax": "torchax", "zoo": "zoo"}
TARGET_FOLDERS = {"zoo": "zoo", "zoo_large": "zoo", "integrations": "integrations",
                  "sharded": "sharded", "faults": "checkpoint", "torchax": "torchax",
                  "fp8": "fp8", "launchers": "launchers"}
TESTS = os.path.dirname(os.path.abspath(__file__))


def folder_of(path) -> str | None:
    """The first folder below tests/ that `path` lies in, or None."""
    rel = os.path.relpath(str(path), TESTS).split(os.sep)
    return rel[0] if len(rel) > 1 and rel[0] != ".." else None


def pytest_ignore_collect(collection_path, config):
    """tests/torchax/'s modules import torchax, which renames PyTorch's
    PrivateUse1 backend to "jax" for the whole process (and so changes what
    torch.distributed.checkpoint does in it): they are collected only when
    the torchax marker is selected (`make torchax`), so no other run's
    worker imports torchax."""
    expr = config.getoption("markexpr") or ""
    if folder_of(collection_path) == "torchax" and \
            ("torchax" not in expr or "not torchax" in expr):
        return True
    if not TORCH_XLA and collection_path.suffix == ".py" and \
            collection_path.name.startswith("test_"):
        return "mark.core" not in collection_path.read_text()
    return None


def pytest_collection_finish(session):
    """The imports and the collected tests live for the whole run: out of
    the garbage collector's scans from here on (tests/support/quiet_gc.py)."""
    quiet_gc.settle()


def pytest_collection_modifyitems(config, items):
    for item in items:
        target = FOLDER_TARGETS.get(folder_of(item.path))
        # a test that names its own target keeps it (zoo_large: make zoo-large)
        if target and not any(item.get_closest_marker(m) for m in TARGET_FOLDERS):
            item.add_marker(getattr(pytest.mark, target))
    # (pluggy calls this conftest's hook before pytest's own -m selection)


# A guard against regrowth: a test whose call takes longer than
# this in `make test` is listed at the end of the run as over, the way .ci/run
# prints OVER BUDGET -- listed, not failed (host noise would make it flaky).
# Measured on the faster 2-core host; heavy checks belong in their targets.
TEST_SECONDS = 15.0


def over_budget(reports, limit: float = TEST_SECONDS) -> list[tuple[str, float]]:
    """(nodeid, seconds) of each test call that took more than `limit`, slowest first."""
    calls = [(r.nodeid, r.duration) for r in reports
             if getattr(r, "when", None) == "call" and r.duration > limit]
    return sorted(calls, key=lambda c: -c[1])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    markexpr = config.getoption("markexpr", "") or ""
    if not all(f"not {t}" in markexpr for t in TARGET_FOLDERS):
        return  # a target's run (make zoo, -m sharded, ...): its own budget applies
    reports = [r for key in ("passed", "failed") for r in terminalreporter.stats.get(key, [])]
    over = over_budget(reports)
    if over:
        terminalreporter.write_sep("=", f"tests over {TEST_SECONDS:.0f} s (make test keeps "
                                        "each under it: share a run or move to a target)")
        for nodeid, seconds in over:
            terminalreporter.write_line(f"{seconds:6.1f}s  OVER {TEST_SECONDS:.0f} s  {nodeid}")


_tests_torn_down = 0


def pytest_runtest_teardown(item):
    """Every EVERY tests, this process's memory maps against the limit
    (tests/support/memory_maps.py): a run that nears it stops, the test
    that found it in error naming the count, before XLA:CPU's next compile
    kills the worker."""
    global _tests_torn_down
    _tests_torn_down += 1
    if _tests_torn_down % memory_maps.EVERY == 0:
        try:
            memory_maps.check()
        except RuntimeError as e:
            item.session.shouldstop = str(e)
            raise


def pytest_unconfigure(config):
    if _OWN_RUN_DIR:
        import shutil
        shutil.rmtree(_OWN_RUN_DIR, ignore_errors=True)


@pytest.fixture(scope="module", autouse=True)
def _collect_garbage_between_modules():
    """A sync materialises every live XLA tensor of the process, garbage
    held in reference cycles included (a test's caught exception holds its
    frames' tensors). A file's leftovers are collected before the next file
    runs, so that no test's sync depends on which file its worker ran
    before (once, a module fixture's sync in tests/sharded/ failed with
    "Check failed: tensor_data" after another file's garbage)."""
    yield
    import gc
    gc.collect()


@pytest.fixture(scope="session")
def device():
    import torch_xla
    return torch_xla.device()


@pytest.fixture
def emit_collectives(monkeypatch):
    """Replica-mode collectives in a one-replica process's HLO: PyTorch/XLA's
    own XLA_ALWAYS_ALLREDUCE switch (they do not execute across replicas on
    XLA:CPU, pytorch/xla issue 5005, so replica mode is checked by HLO)."""
    import torch_xla
    monkeypatch.setenv("XLA_ALWAYS_ALLREDUCE", "1")
    yield
    # PyTorch/XLA shares device data between equal 0-dim tensors (a fresh
    # scaler's scale and the last one's): run what is pending so the next
    # test's HLO holds only its own graph.
    torch_xla.sync()



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
#   large-graphs   ResNet-18 step graphs (the ImageNet launcher runs) and
#                  the one-device SPMD runs of the GPU mode: two of these
#                  never compile side by side
#   small-graphs   the MNIST launcher runs, SPMD, compiled training, the wheel
# (whole models under every policy are `make zoo`, tests/zoo/)
# The files of in-process tests then fill in around them, most tests first.
#
# xdist's own `--dist loadgroup` cannot do this on pytest 9.2: it tags node
# ids through `item._nodeid`, which pytest no longer reads, and silently
# stops grouping (pytest-dev/pytest-xdist#1386; pinned in
# tests/suite/test_suite_scheduling.py). So `--dist loadgroup` here means
# SuiteUnits below: xdist's scope scheduler with these units as scopes.
LARGE_GRAPHS = {"test_gpu_spmd_mode.py"}
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


# Files that go out right after the groups, in this order, before the rest
# (which go most tests first): `make torchax`'s heaviest, each a handful of
# whole runs or subprocesses, went last by their test counts and ended the
# run on one worker while the other idled (the mesh test's 91 s began at
# ~127 s of 218). Heaviest first: seconds in a cold-cache run on the slower
# host (2026-11-27): 96, 91, 46, 43, 31, 30. Only the order changes.
FIRST = ("tests/torchax/test_torchax_parity.py", "tests/torchax/test_torchax_mesh.py",
         "tests/torchax/test_torchax_peer_loss.py",
         "tests/torchax/test_overrides_win_everywhere.py",
         "tests/torchax/test_torchax_training.py", "tests/torchax/test_torchax_coexist.py")


# The zoo (`make zoo`, tests/zoo) goes out test by test instead: each sweep
# is its own unit, so that both workers stay busy to the end (with a file a
# unit, the larger file bound the wall). The tests that share one process's work
# form one unit: the two that read one ShuffleNetV2 sweep (test_zoo's
# lru_cache), and the MobileNetV3 sweep after the test that compiles its tpu
# graph (tests/suite/test_suite_scheduling.py checks that these names are
# tests). The compiled-model file stays one unit: its processes are served per
# XLA_FLAGS setting, one set per worker. `make fp8` spreads its skipped-step
# file the same way, around the LM's one long test: as one unit, its 14
# independent whole-model runs (~110 s) bound the target's wall.
PER_TEST = {"test_zoo.py", "test_zoo_hf.py", "test_fp8_no_trace.py"}
SHARED = {
    "test_model_trains_under_every_policy[shufflenet_v2_x0_5]": "zoo-float16",
    "test_cuda_rules_default_float16": "zoo-float16",
    "test_a_sweep_draws_the_same_random_numbers_whatever_ran_before": "zoo-mobilenet",
    "test_model_trains_under_every_policy[mobilenet_v3_small]": "zoo-mobilenet",
}


def single_test_unit(file_name: str, test_name: str) -> str | None:
    """A test's own unit (its file's name and its own), or that of the
    tests it shares a run with, or None: not a test scheduled one by one."""
    if file_name not in PER_TEST:
        return None
    return SHARED.get(test_name, f"{file_name}::{test_name}")


@pytest.hookimpl(optionalhook=True)  # (runs without xdist too: -p no:xdist)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SuiteUnits(LoadScopeScheduling):
        """A unit is a subprocess group, one test file, or one test of
        PER_TEST's files (or the tests sharing a run); its tests run in
        order on one worker.
        The groups go out first, then the units with the most tests."""

        def _split_scope(self, nodeid: str) -> str:
            path, _, name = nodeid.partition("::")
            file_name = os.path.basename(path)
            return (subprocess_group(file_name, name) or single_test_unit(file_name, name)
                    or path)

        one_ahead = False  # set by schedule()

        def _reschedule(self, node):
            """Where the units are single tests (the zoo's sweeps, make fp8), a worker
            gets its next unit when one test of its own is left, not two
            (xdist's heuristic), so that no worker holds a sweep the other,
            idle, could run. (One left, not none: a worker runs a test only
            once it knows the next.) `make test`'s file units keep xdist's
            rule: under the zoo's, one pair of runs gave 7:36 against 6:34
            and 13:44 of CPU against 11:48 (cause not traced)."""
            if (self.one_ahead and not node.shutting_down and self.workqueue
                    and self._pending_of(self.assigned_work[node]) > 1):
                return
            super()._reschedule(node)

        def schedule(self):
            if self.collection is not None or not self._check_nodes_have_same_collection():
                return super().schedule()  # (later calls hand out the queue)
            self.collection = list(next(iter(self.registered_collections.values())))
            self.one_ahead = any(single_test_unit(os.path.basename(path), name)
                                 for path, _, name in
                                 (nodeid.partition("::") for nodeid in self.collection))
            units = {}
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False

            def rank(scope):
                if scope in GROUP_ORDER:
                    return (0, GROUP_ORDER.index(scope))
                if scope in FIRST:
                    return (1, FIRST.index(scope))
                return (2, -len(units[scope]))
            for scope in sorted(units, key=rank):
                self.workqueue[scope] = units[scope]
            for node in self.nodes:  # one unit each, then topped up
                if self.workqueue:
                    self._assign_work_unit(node)
            for node in self.nodes:
                self._reschedule(node)

    return SuiteUnits(config, log)
