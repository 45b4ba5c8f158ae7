"""How `make test` spreads the suite over two xdist workers (tests/conftest.py),
and the upstream defect that made us schedule it ourselves."""
import os
import re
import signal
import subprocess
import sys

import pytest

from tests import conftest
from tests.support.launch import ROOT, nested_pytest_env


def _run_xdist(tmp_path, conftest_text=""):
    (tmp_path / "conftest.py").write_text(conftest_text)
    for name in ("test_a.py", "test_b.py", "test_c.py"):
        (tmp_path / name).write_text(
            "import os, pytest\n"
            "@pytest.mark.xdist_group('one')\n"
            "@pytest.mark.parametrize('i', range(4))\n"
            "def test_grouped(i):\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", "-v", str(tmp_path)], capture_output=True,
                          text=True, cwd=tmp_path, env=nested_pytest_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return re.findall(r"\[(gw\d)\].*PASSED (\S+)", proc.stdout)


def _scheduler_conftest(large=(), small=()):
    """tests/conftest.py's scheduler hook alone, with these group files."""
    hook = open(conftest.__file__).read()
    start = hook.index("def subprocess_group")
    return ("import os\nimport pytest\nGROUP_ORDER = ('large-graphs', 'small-graphs')\n"
            + hook[start:].replace("LARGE_GRAPHS", repr(set(large)))
            .replace("SMALL_GRAPHS", repr(set(small))))


def test_pinned_xdist_loadgroup_ignores_groups_on_this_pytest(tmp_path):
    """pytest-dev/pytest-xdist#1386: xdist 3.8 tags grouped node ids through
    item._nodeid, which pytest 9.2 no longer reads, so --dist loadgroup
    spreads one group's tests over both workers and no id carries '@one'.
    When this fails, xdist is fixed: our scheduler can go."""
    ran = _run_xdist(tmp_path)
    assert len(ran) == 12
    assert not any("@one" in nodeid for _, nodeid in ran)
    assert len({worker for worker, _ in ran}) == 2


def test_units_keep_each_file_on_one_worker_and_groups_go_first(tmp_path):
    """Our scheduler (the hook of tests/conftest.py) on the same layout, with
    the groups taken from the file names (test_a large, test_b small,
    test_c in-process): each file's tests on one worker, the two groups on
    different workers, and each worker starts with a group."""
    ran = _run_xdist(tmp_path, _scheduler_conftest(["test_a.py"], ["test_b.py"]))
    assert len(ran) == 12
    workers = {f: {w for w, n in ran if n.startswith(f)}
               for f in ("test_a.py", "test_b.py", "test_c.py")}
    assert all(len(w) == 1 for w in workers.values()), ran
    assert workers["test_a.py"] != workers["test_b.py"], ran
    first = {w: n for w, n in reversed(ran)}  # each worker's first test
    assert sorted(n.split("::")[0] for n in first.values()) == ["test_a.py", "test_b.py"], ran


def _crash_run(tmp_path, flags, timeout):
    """Twenty one-test files, then one whose test aborts its worker (as a
    native crash does: tests/suite/test_upstream_xla_cpu_memory_maps.py), under our
    scheduler with these xdist flags. The pytest process group is killed
    if it runs past `timeout`, and TimeoutExpired raised."""
    (tmp_path / "conftest.py").write_text(_scheduler_conftest())
    for i in range(20):
        (tmp_path / f"test_f{i:02}.py").write_text("def test_f():\n    pass\n")
    (tmp_path / "test_z.py").write_text(
        "import os\ndef test_crash():\n    os.write(2, b'the native cause\\n')\n    os.abort()\n")
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                             *flags, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
                            env=nested_pytest_env(), start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out


def _makefile_flags():
    """The flags `make test` gives pytest: PYTEST's after `-m pytest`, XDIST's."""
    make = open(os.path.join(ROOT, "Makefile")).read()
    pytest_flags = re.search(r"^PYTEST\s*:=.*-m pytest(.*)$", make, re.M).group(1)
    xdist = re.search(r"^XDIST\s*:?=(.*)$", make, re.M).group(1)
    return pytest_flags.split() + xdist.replace("$(TEST_WORKERS)", "2").split()


def test_pinned_xdist_hangs_when_it_replaces_a_crashed_worker(tmp_path):
    """pytest-dev/pytest-xdist#1378 (#1323): xdist 3.8's scope scheduler puts a
    crashed worker's whole workload back on the queue, its finished files
    too, as units with no test left; the workers wait for tests that never
    come. `.ci/run` at c069e6d sat so for 80 minutes after a worker aborted,
    until CI stopped it. Pinned: when this run ends, xdist is fixed."""
    with pytest.raises(subprocess.TimeoutExpired):
        _crash_run(tmp_path, ["-q", "-n", "2", "--dist", "loadgroup"], timeout=6)


def test_a_crashed_worker_ends_the_run_naming_its_test(tmp_path):
    """With the Makefile's flags (--max-worker-restart=0) the same crash ends
    the run at once: exit 1, the crashed test failed by name, and what the
    test wrote to stderr at the native level before it died in the log
    (--capture=sys; with pytest's default fd capture it died with the
    worker, as the cause of the abort in CI did)."""
    flags = _makefile_flags()
    assert "--max-worker-restart=0" in flags and "loadgroup" in flags
    rc, out = _crash_run(tmp_path, flags, timeout=120)
    assert rc == 1, out[-3000:]
    assert "crashed while running 'test_z.py::test_crash'" in out, out[-3000:]
    assert re.search(r"1 failed, \d+ passed", out), out[-3000:]
    assert "the native cause" in out, out[-3000:]
    flags.remove("--capture=sys")
    rc, out = _crash_run(tmp_path, flags, timeout=120)
    assert rc == 1 and "the native cause" not in out, out[-3000:]


def test_groups():
    assert conftest.subprocess_group("test_gpu_spmd_mode.py", "test_x") == "large-graphs"
    assert conftest.subprocess_group("test_launchers.py",
                                     "test_imagenet_compile_flag") == "large-graphs"
    assert conftest.subprocess_group("test_launchers.py", "test_mnist_compile_flag") == \
        "small-graphs"
    assert conftest.subprocess_group("test_syncfree.py", "test_parity") is None


def test_zoo_units():
    """The zoo goes out test by test, but the tests that share a run stay
    one unit: every name in SHARED is a zoo test, and the float16
    model's two tests (one lru_cache'd sweep) are one unit."""
    from tests.zoo import test_zoo, test_zoo_hf
    tests = {n for m in (test_zoo, test_zoo_hf) for n in dir(m) if n.startswith("test_")}
    for name in conftest.SHARED:
        function, _, param = name.partition("[")
        assert function in tests, name
        assert not param or param[:-1] in test_zoo.FULL, name
    model = f"test_model_trains_under_every_policy[{test_zoo.FLOAT16_MODEL}]"
    assert conftest.single_test_unit("test_zoo.py", model) == \
        conftest.single_test_unit("test_zoo.py", "test_cuda_rules_default_float16")
    assert conftest.single_test_unit("test_zoo.py", "test_model_trains_under_every_policy[resnet50]") \
        == "test_zoo.py::test_model_trains_under_every_policy[resnet50]"
    assert conftest.single_test_unit("test_compiled_models.py", "test_x") is None  # its file is one
    assert conftest.single_test_unit("test_fp8_no_trace.py", "test_a[x]") == \
        "test_fp8_no_trace.py::test_a[x]"  # make fp8's 14 runs, spread


def test_the_files_sent_first_exist():
    """FIRST names test files by their node-id paths (a renamed file would
    silently go back to the test-count order)."""
    for path in conftest.FIRST:
        assert os.path.isfile(os.path.join(os.path.dirname(conftest.TESTS), path)), path
    assert len(set(conftest.FIRST)) == len(conftest.FIRST)


def _venvs_tree(tmp_path, current_built):
    """A tree for the Makefile alone: .venv and its extension up to date
    (stamps newer than their inputs), the current profile's up to date or
    not, and no Python 3.12 to build it with (PYTHON312=false)."""
    for folder in ("xla_amp", ".venv", ".venv-current"):
        (tmp_path / folder).mkdir(parents=True)
    with open(os.path.join(ROOT, "Makefile")) as f:
        (tmp_path / "Makefile").write_text(f.read())
    stamps = [".venv/.requirements-installed", ".venv/.requirements-dev-installed",
              "xla_amp/.built"]
    if current_built:
        stamps += [".venv-current/.requirements-installed", "xla_amp/.built-current"]
    inputs = ["requirements.txt", "requirements-dev.txt", "requirements-current.txt",
              "setup.py", "pyproject.toml", "xla_amp/_version_check.py"]
    for i, name in enumerate(inputs + stamps):
        (tmp_path / name).touch()
        os.utime(tmp_path / name, (1_000_000 + i, 1_000_000 + i))  # in this order
    return subprocess.run(["make", "--no-print-directory", "venvs", "PYTHON312=false"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)


def test_make_venvs_fails_when_the_current_profile_beside_it_fails(tmp_path):
    """`make venvs` (.ci/run's first target) builds the current profile in
    the background beside `make build dev`: its failure fails the target,
    its output shown, though .venv's part succeeded; with both up to date it
    passes. .ci/run's `current` then has only its tests to run."""
    proc = _venvs_tree(tmp_path / "fails", current_built=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Nothing to be done for 'dev'" in proc.stdout, proc.stdout
    assert "false -m venv .venv-current" in proc.stdout, proc.stdout
    proc = _venvs_tree(tmp_path / "ok", current_built=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "'xla_amp/.built-current' is up to date" in proc.stdout, proc.stdout
    with open(os.path.join(ROOT, ".ci", "run")) as f:
        goals = re.findall(r"^run_target \S+ [\d.]+ (.+)$", f.read(), re.M)
    assert goals[0] == "venvs" and goals.index("current") > 0, goals
