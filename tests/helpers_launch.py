"""Running the launchers (scripts/train_*_amp.py) and the benchmarks in
subprocesses for the tests (not tests themselves)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(ROOT, "scripts")

# Subprocesses that compile whole models (the launchers' runs, the zoo, the
# compiled models) do so with XLA's backend optimisation off: the same graphs
# and dtypes, LLVM spends about a third of the time. Runs compared with each
# other (resume) compile alike.
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

MNIST_TINY = ["--batch_size", 32, "--num_epochs", 2, "--eval_batch_size", 120,
              "--log_steps", 4]


def launch(script, *args, timeout=400, **env_vars):
    env = {**os.environ, "PJRT_DEVICE": "CPU", "XLA_FLAGS": FAST_COMPILE, **env_vars}
    env.pop("CPU_NUM_DEVICES", None)
    env.pop("XLA_USE_BF16", None)
    return subprocess.run([sys.executable, os.path.join(SCRIPTS, script), "--noprogress",
                           *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def summary(proc, key):
    m = re.search(rf"^{key}\s+(.*)$", proc.stdout, re.M)
    assert m, f"no '{key}' line in the summary:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return m.group(1)
