"""XLA:CPU's memory maps (tests/support/memory_maps.py): a compiled graph's
kernels hold maps of their own while torch_xla caches its executable, an
executable evicted from the cache gives them back, and a process at
vm.max_map_count dies at its next compile, its cause on stderr only.
Pinned: when XLA:CPU stops mapping kernels apart, or survives the limit,
this fails (then tests/conftest.py's cache bound and guard can go)."""
import inspect
import json
import re
import subprocess
import sys

import pytest

from tests.support import memory_maps
from tests.support.launch import BACKEND_O0, ROOT, launch_env, nested_pytest_env

_RUN = """
import json, mmap, torch, torch_xla
from tests.support import memory_maps
dev = torch_xla.device()
def graph(n):  # one graph per n: a dot, a reduction, a softmax
    x = torch.arange(8.0 * n, device=dev).reshape(n, 8)
    return ((x @ x.T).relu().sum(0) * n).softmax(0).cpu()
counts = [memory_maps.count()]
for n in range(1, 17):
    graph(n)
    counts.append(memory_maps.count())
print(json.dumps(counts), flush=True)
most, keep = memory_maps.limit(), []  # one page a map, neighbours unmergeable
while memory_maps.count() < most - 10:
    for _ in range(max(1, (most - 10 - memory_maps.count()) // 2)):
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if len(keep) % 2 else 0)
        keep.append(mmap.mmap(-1, 4096, prot=prot))
print("filled", memory_maps.count(), flush=True)
graph(99)
print("survived", flush=True)
"""


@pytest.mark.skipif(memory_maps.limit() is None, reason="no vm.max_map_count (not Linux)")
def test_xla_cpu_maps_each_kernel_and_dies_at_the_limit():
    env = launch_env(XLA_FLAGS=BACKEND_O0, XLA_COMPILATION_CACHE_SIZE="8")  # the tests' flags
    proc = subprocess.run([sys.executable, "-c", _RUN], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)
    lines = proc.stdout.splitlines()
    counts = json.loads(lines[0])
    grown = counts[8] - counts[0]  # eight graphs compiled and cached
    assert grown >= 8 * 4, counts  # two kernels or more, two maps each
    # from the ninth graph on, each compile evicts one: the count stays
    assert max(counts[9:]) - min(counts[9:]) < grown / 4, counts
    assert lines[1].startswith("filled") and "survived" not in proc.stdout, proc.stdout
    assert proc.returncode < 0 or proc.returncode > 1, proc.returncode
    assert "LLVM compilation error: Cannot allocate memory" in proc.stderr, proc.stderr[-3000:]


def test_the_guard_names_the_count_and_the_limit():
    most = memory_maps.limit()
    if most is None:
        memory_maps.check(share=0.0)  # nothing to count against: never raises
        return
    memory_maps.check(share=1.0)
    held = memory_maps.count()
    with pytest.raises(RuntimeError, match=rf"holds \d+ memory maps, over \d+% of "
                                           rf"vm.max_map_count \({most}\)"):
        memory_maps.check(share=held / most / 2)


@pytest.mark.skipif(memory_maps.limit() is None, reason="no vm.max_map_count (not Linux)")
def test_the_suites_guard_stops_the_run_at_the_tenth_test(tmp_path):
    """tests/conftest.py's hook, with SHARE so low that any process is past
    it: the tenth test errors naming the count, and no test after it runs."""
    from tests import conftest
    (tmp_path / "conftest.py").write_text(
        "from tests.support import memory_maps\nmemory_maps.SHARE = 1e-6\n"
        "_tests_torn_down = 0\n\n" + inspect.getsource(conftest.pytest_runtest_teardown))
    (tmp_path / "test_many.py").write_text(
        "import pytest\n@pytest.mark.parametrize('i', range(25))\ndef test_i(i):\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p",
                           "no:xdist", "-q", str(tmp_path)], capture_output=True, text=True,
                          cwd=tmp_path, env=nested_pytest_env(PYTHONPATH=ROOT), timeout=120)
    out = proc.stdout
    assert proc.returncode != 0, out
    assert re.search(r"\b10 passed, 1 error\b", out), out[-2000:]
    assert "ERROR at teardown of test_i[9]" in out, out[-2000:]
    assert re.search(r"Interrupted: this process holds \d+ memory maps", out), out[-2000:]
