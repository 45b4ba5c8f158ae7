"""Persistent compilation caches and what the suite's compilation counts mean
with them (docs/benchmarks.md, "Test suite").

torch_xla 2.9 writes its persistent cache on XLA:CPU but cannot read it back
(pytorch/xla#9094: `DeserializeComputation` calls the PJRT client's
`DeserializeExecutable`, which its CPU client leaves unimplemented), so the
suite does not turn it on: each process compiles its own graphs, and
`CompileTime` / `UncachedCompile` count real compilations. JAX's cache does
load on the CPU: tests/conftest.py gives every torchax test process of a run
(xdist workers and their subprocesses) one under build/, and a hit there is
not a new entry in a jitted step's own cache (`_cache_size()`), which is what
the torchax tests count."""
import json
import os
import subprocess
import sys

from tests.support.launch import ROOT

TORCH_XLA_RUN = """
import json, os, sys
import torch, torch_xla, torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
d = torch_xla.device()
x = torch.arange(64.0, device=d).reshape(8, 8)
y = (x @ x.T).relu().sum()
torch_xla.sync(); xm.wait_device_ops()
c = {k: met.counter_value(k) or 0 for k in ("PersistentCacheMiss", "PersistentCacheHit",
     "PersistentCacheDeserializeFailure", "UncachedCompile", "CachedCompile")}
c["CompileTime"] = met.metric_data("CompileTime")[0]
print(json.dumps(c))
"""


def _torch_xla_run(cache):
    env = dict(os.environ, PJRT_DEVICE="CPU", XLA_PERSISTENT_CACHE_PATH=str(cache))
    env.pop("CPU_NUM_DEVICES", None)
    proc = subprocess.run([sys.executable, "-c", TORCH_XLA_RUN], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1]), proc.stderr


def test_torch_xla_persistent_cache_is_written_but_never_loaded_on_xla_cpu(tmp_path):
    """Pinned upstream defect (pytorch/xla#9094, open at 2.9.0; fix proposed
    in pytorch/xla#9759). When this fails, torch_xla loads its cache on
    XLA:CPU: give the suite's processes one under build/ as JAX's, and make
    every compilation count below read `UncachedCompile` (a hit counts no
    CompileTime, so "the step compiled once" would read 0 in a warm run)."""
    first, _ = _torch_xla_run(tmp_path)
    assert first["PersistentCacheMiss"] == 1 and first["UncachedCompile"] == 1
    assert first["CompileTime"] == 1
    assert len(os.listdir(tmp_path)) == 1  # the serialized executable
    second, err = _torch_xla_run(tmp_path)
    assert second["PersistentCacheDeserializeFailure"] == 1, second
    assert second["PersistentCacheHit"] == 0
    # the graph is compiled again, and counted as a compilation again
    assert second["UncachedCompile"] == 1 and second["CompileTime"] == 1, second
    assert "Deserializing serialized executable not supported" in err


JAX_RUN = """
import json, os
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax, jax.numpy as jnp
from jax._src import monitoring
events = []
monitoring.register_event_listener(lambda e, **kw: events.append(e))
@jax.jit
def step(w, x):
    for _ in range(8):
        x = jnp.tanh(x @ w)
    return x.sum()
step(jnp.ones((32, 32)), jnp.ones((4, 32))).block_until_ready()
print(json.dumps({"dir": jax.config.jax_compilation_cache_dir,
                  "hits": events.count("/jax/compilation_cache/cache_hits"),
                  "misses": events.count("/jax/compilation_cache/cache_misses"),
                  "cache_size": step._cache_size()}))
"""


def test_jax_processes_of_a_run_share_one_cache_under_build(tmp_path):
    """The environment tests/conftest.py sets reaches a subprocess (as it
    reaches xdist workers): its JAX cache is build/compile-cache/jax, and a
    second process loads the first one's step instead of compiling it. Run
    here against a fresh directory, so the first process really compiles."""
    from tests import conftest
    assert os.environ["JAX_COMPILATION_CACHE_DIR"] == conftest.JAX_CACHE
    assert conftest.JAX_CACHE == os.path.join(ROOT, "build", "compile-cache", "jax")
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path))
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", JAX_RUN], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(json.loads(proc.stdout.splitlines()[-1]))
    first, second = runs
    assert first["dir"] == second["dir"] == str(tmp_path)
    assert first["misses"] >= 1 and first["hits"] == 0, first
    assert second["hits"] >= 1 and second["misses"] == 0, second
    # a loaded step is still one entry of the jitted function's own cache:
    # what tests/torchax count (step._jitted._cache_size() == 1) is unchanged
    assert first["cache_size"] == second["cache_size"] == 1


def test_python_writes_bytecode_caches_in_the_run_and_in_its_processes():
    """tests/conftest.py lifts PYTHONDONTWRITEBYTECODE (set on some hosts): a
    collection of tests/ took 15.5-16.0 s compiling every module from source,
    12.0-15.1 s from __pycache__ (interleaved runs)."""
    assert not sys.dont_write_bytecode
    assert "PYTHONDONTWRITEBYTECODE" not in os.environ
    flag = "import sys; print(sys.flags.dont_write_bytecode)"
    proc = subprocess.run([sys.executable, "-c", flag], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "0", proc.stdout + proc.stderr
