"""Running the launchers (scripts/train_*_amp.py) and the benchmarks in
subprocesses for the tests (not tests themselves)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "scripts")

# Subprocesses that compile whole models (the launchers' runs, the zoo) do
# so with XLA's backend optimisation off and XLA:CPU's elemental emitters
# instead of its MLIR fusion emitters: the same HLO graphs and dtypes; LLVM
# spends about a third of the time, and the elemental emitters half as much
# again (MobileNetV3-Small's zoo check: 66.6 s of compilation with the fusion
# emitters, 36.9 s without; 110 -> 51 CPU-s). Runs compared with each other
# (resume) compile alike. The elemental emitters round float32 -> float8
# through float16 (docs/upstream/xla_cpu_f8_double_rounding.md): these runs
# check fp8 training, not its rounding.
BACKEND_O0 = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
FAST_COMPILE = BACKEND_O0 + " --xla_cpu_use_fusion_emitters=false"
# Lazy against compiled, bit for bit, for a transformer layer
# (tests/zoo/test_compiled_models.py): the two graphs differ in structure, and
# with the elemental emitters one of its 15 gradients differed in its last
# bits; with the fusion emitters (XLA:CPU's default) all are equal.
BITWISE_COMPILE = BACKEND_O0

MNIST_TINY = ["--batch_size", 32, "--num_epochs", 2, "--eval_batch_size", 120,
              "--log_steps", 4]


def nested_pytest_env(**env_vars) -> dict:
    """This environment for a pytest run started by a test: without pytest's
    own variables (PYTEST_ADDOPTS, xdist's PYTEST_XDIST_WORKER, ...)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return {**env, **env_vars}


def launch_env(**env_vars) -> dict:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "XLA_FLAGS": FAST_COMPILE, **env_vars}
    env.pop("CPU_NUM_DEVICES", None)
    env.pop("XLA_USE_BF16", None)
    return env


def command(script, *args) -> list:
    return [sys.executable, os.path.join(SCRIPTS, script), "--noprogress", *map(str, args)]


def launch(script, *args, timeout=400, **env_vars):
    return subprocess.run(command(script, *args), capture_output=True, text=True,
                          env=launch_env(**env_vars), timeout=timeout, cwd=ROOT)


def start(script, *args, **env_vars) -> subprocess.Popen:
    """The launcher as a running process (stdout and stderr to pipes, text)."""
    return subprocess.Popen(command(script, *args), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=launch_env(**env_vars),
                            cwd=ROOT)


def launch_side_by_side(*runs: tuple, timeout=400) -> list[subprocess.CompletedProcess]:
    """Independent launcher runs, each (script, *args), started together and
    waited for: their results, in order, as `launch` gives them."""
    procs = [start(*run) for run in runs]
    done = []
    for run, proc in zip(runs, procs):
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(command(*run), proc.returncode, out, err))
    return done


def summary(proc, key):
    m = re.search(rf"^{key}\s+(.*)$", proc.stdout, re.M)
    assert m, f"no '{key}' line in the summary:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return m.group(1)
