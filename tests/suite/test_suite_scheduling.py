"""How `make test` spreads the suite over two xdist workers (tests/conftest.py),
and the upstream defect that made us schedule it ourselves."""
import os
import re
import subprocess
import sys

from tests import conftest


def _run_xdist(tmp_path, conftest_text=""):
    (tmp_path / "conftest.py").write_text(conftest_text)
    for name in ("test_a.py", "test_b.py", "test_c.py"):
        (tmp_path / name).write_text(
            "import os, pytest\n"
            "@pytest.mark.xdist_group('one')\n"
            "@pytest.mark.parametrize('i', range(4))\n"
            "def test_grouped(i):\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", "-v", str(tmp_path)], capture_output=True,
                          text=True, cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return re.findall(r"\[(gw\d)\].*PASSED (\S+)", proc.stdout)


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
    hook = open(conftest.__file__).read()
    start = hook.index("def subprocess_group")
    text = ("import os\nimport pytest\nGROUP_ORDER = ('large-graphs', 'small-graphs')\n"
            + hook[start:].replace('LARGE_GRAPHS', '{"test_a.py"}')
            .replace('SMALL_GRAPHS', '{"test_b.py"}'))
    ran = _run_xdist(tmp_path, text)
    assert len(ran) == 12
    workers = {f: {w for w, n in ran if n.startswith(f)}
               for f in ("test_a.py", "test_b.py", "test_c.py")}
    assert all(len(w) == 1 for w in workers.values()), ran
    assert workers["test_a.py"] != workers["test_b.py"], ran
    first = {w: n for w, n in reversed(ran)}  # each worker's first test
    assert sorted(n.split("::")[0] for n in first.values()) == ["test_a.py", "test_b.py"], ran


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
