"""What the benchmarks share: interleaved rounds, medians, XLA metric counts,
markdown tables and worker subprocesses. Each benchmark keeps only its own
measurement. Imported as this folder's sibling (``import _harness``).

The rules it keeps:

- warm-up covers every graph variant before timing starts (``warm_up``:
  each variant's step runs as often as it takes to build all its graphs,
  then the device is waited for);
- variants are timed in interleaved rounds (``interleaved``), so slow drifts
  and load from other processes hit them alike; a variant's figure is (in
  most benchmarks) the median over rounds and a ratio the median of
  per-round ratios (``paired_ratio``);
- XLA metrics are read only after ``wait_device_ops()``: torch_xla.sync()
  is asynchronous, and an execution still running is not counted yet.

Nothing here imports torch_xla, torch or xla_amp at import time: a parent
process that only runs workers, a JAX worker and the stock torch.amp worker
(which must never import xla_amp) import this module too.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Hashable, Iterable, Sequence

from xla_amp_launch.metrics import Counters

#: The torch_xla.debug.metrics metrics the benchmarks count: graph
#: executions, device-to-host transfers and XLA compilations.
METRICS = ("ExecuteTime", "TransferFromDeviceTime", "CompileTime")
#: Counted with a metric: in SPMD mode (XLA:GPU through the CUDA plugin,
#: sharded runs) torch_xla records executions as ExecuteReplicatedTime. The
#: launchers' counters say which metrics make up each count.
ALSO = {names[0]: names[1:] for names in Counters.NAMES.values()}

median = statistics.median


# ------------------------------------------------------------ device, metrics


def wait_device() -> None:
    """Waits until the XLA device has run everything launched so far."""
    import torch_xla.core.xla_model as xm
    xm.wait_device_ops()


def counts(names: Sequence[str] = METRICS) -> dict[str, int]:
    """How many samples each torch_xla.debug.metrics metric holds (0 for
    one never recorded), after waiting for the device."""
    import torch_xla.debug.metrics as met
    wait_device()
    out = {}
    for name in names:
        out[name] = 0
        for recorded in (name, *ALSO.get(name, ())):
            data = met.metric_data(recorded)
            out[name] += data[0] if data else 0
    return out


# ------------------------------------------------------------------ timing


def warm_up(steps: Iterable[Callable[[], object]], n: int,
            wait: Callable[[], object] = wait_device) -> None:
    """Runs each variant's step ``n`` times, then waits for the device. ``n``
    must cover every graph a variant builds (the first step's, an overflow
    step's, ...): warm-up compiles every graph variant before timing starts."""
    for step in steps:
        for _ in range(n):
            step()
    wait()


def time_steps(step: Callable[[], object], n: int,
               wait: Callable[[], object] = wait_device) -> float:
    """ms per step of ``n`` calls of ``step``: the device is waited for before
    the clock starts and again before it stops, so the time is these steps'
    tracing and execution, nothing earlier."""
    wait()
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    wait()
    return (time.perf_counter() - t0) * 1e3 / n


def measure(step: Callable[[], object], n: int,
            names: Sequence[str] = METRICS) -> tuple[float, dict[str, int]]:
    """(ms per step, XLA metric counts over these steps) of ``n`` calls of
    ``step`` (see ``time_steps`` and ``counts``)."""
    before = counts(names)
    ms = time_steps(step, n)
    after = counts(names)
    return ms, {k: after[k] - before[k] for k in names}


class Tally:
    """One variant's measured blocks of steps: ms/step of each block and the
    XLA metric counts summed over all of them."""

    def __init__(self):
        self.ms: list[float] = []
        self.counts: collections.Counter = collections.Counter()
        self.steps = 0

    def measure(self, step: Callable[[], object], n: int) -> float:
        """Runs and measures ``n`` more steps (``measure``); their ms/step."""
        ms, c = measure(step, n)
        self.ms.append(ms)
        self.counts.update(c)
        self.steps += n
        return ms

    def per_step(self, metric: str) -> float:
        """``metric``'s count per measured step."""
        return self.counts[metric] / self.steps


# ------------------------------------------------------------------ rounds

ORDERS = ("rotate", "alternate", "fixed")


def round_order(variants: Sequence, r: int, order: str = "rotate") -> list:
    """The order of round ``r``. ``rotate``: led by variant r % n, so none
    always leads or always follows the same heavier one; ``alternate``: as
    given in even rounds, reversed in odd ones; ``fixed``: always as given."""
    variants = list(variants)
    if order == "rotate":
        k = r % len(variants)
        return variants[k:] + variants[:k]
    if order == "alternate":
        return variants if r % 2 == 0 else variants[::-1]
    if order == "fixed":
        return variants
    raise ValueError(f"order {order!r}: one of {', '.join(ORDERS)}")


def interleaved(variants: Iterable[Hashable], rounds: int,
                run_one: Callable[[Hashable, int], object],
                order: str = "rotate") -> dict:
    """Runs ``run_one(variant, r)`` for every variant in each of ``rounds``
    rounds (A B A B ..., in ``round_order``); {variant: its results, one a
    round}. Warm up first: the first round is timed like every other."""
    variants = list(variants)
    results: dict = {v: [] for v in variants}
    for r in range(rounds):
        for v in round_order(variants, r, order):
            results[v].append(run_one(v, r))
    return results


def timed_rounds(runners: dict, steps: int, rounds: int) -> dict:
    """{name: ms/step of each round}: `steps` (less the one each runner
    already took) split over `rounds` interleaved rounds; a runner is
    (run(n steps), wait until they ran), waited for before and after."""
    per_round = max(1, (steps - 1) // rounds)
    ms: dict = {name: [] for name in runners}

    def run_one(name, r):
        run, wait = runners[name]
        wait()
        t0 = time.perf_counter()
        run(per_round)
        wait()
        ms[name].append((time.perf_counter() - t0) * 1e3 / per_round)
    interleaved(list(runners), rounds, run_one)
    return ms


def jitted_ms(calls: dict, args: tuple, iters: int, rounds: int) -> dict:
    """{name: median ms per call} of compiled JAX functions (name -> fn),
    each called on `args` `iters` times over `rounds` interleaved rounds."""
    import jax
    last: dict = {}

    def runner(name):
        def run(n_calls):
            for _ in range(n_calls):
                last[name] = calls[name](*args)
        return run, lambda: jax.block_until_ready(last.get(name))
    ms = timed_rounds({name: runner(name) for name in calls}, iters, rounds)
    return {name: median(ms[name]) for name in calls}


def kernel_parser(doc: str) -> argparse.ArgumentParser:
    """The options of a one-kernel GPU benchmark: --out DIR (else $OUT, else
    build/), --iters calls per form, --rounds, --smoke (tiny shapes)."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "build")
    ap.add_argument("--iters", type=int, default=101)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--smoke", action="store_true")
    return ap


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """The median of per-round ratios a[r] / b[r]: a drift of the machine
    that slows both in a round cancels."""
    return median(x / y for x, y in zip(a, b))


# ------------------------------------------------------------------ tables


def md_row(cells: Iterable) -> str:
    """``| a | b | c |``."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_header(columns: Sequence[str]) -> str:
    """A markdown table's header line and its separator line."""
    return md_row(columns) + "\n|" + "---|" * len(columns)


def markdown_table(columns: Sequence[str], rows: Iterable[Iterable]) -> str:
    """A whole markdown table (rows of cells, already formatted)."""
    return "\n".join([md_header(columns)] + [md_row(r) for r in rows])


# ----------------------------------------------------------------- workers

RESULT = "RESULT "


def write_results(out_dir: str, stem: str, results: dict, table: str) -> None:
    """A GPU benchmark's results: out_dir/stem.json (everything) and
    out_dir/stem.md (the table), then the table on stdout."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write(table + "\n")
    print(table)


def print_result(result: dict) -> None:
    """A worker's answer to ``run_worker``: one JSON line on stdout."""
    print(RESULT + json.dumps(result), flush=True)


def run_worker(script: str, argv: Sequence[str], what: str,
               env: dict | None = None, stream_stderr: bool = False,
               timeout: float | None = None) -> dict:
    """Runs ``python script *argv`` (a benchmark in its worker mode; a dotted
    name without ".py" runs as ``python -m name`` from the current folder) in
    a subprocess and returns the result it printed with ``print_result``
    (even if the process then failed on its way out); a worker that printed
    none, or ran past `timeout` seconds (then killed), ends the benchmark
    with its output's tail. `stream_stderr`: the worker's stderr goes
    straight to ours (progress that outlives a kill)."""
    target = [os.path.abspath(script)] if script.endswith(".py") else ["-m", script]
    try:
        proc = subprocess.run([sys.executable, *target, *argv], stdout=subprocess.PIPE,
                              stderr=None if stream_stderr else subprocess.PIPE, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise SystemExit(f"{os.path.basename(script)}: {what} cut after {timeout:.0f} s:\n"
                         f"{out[-3000:]}") from None
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    raise SystemExit(f"{os.path.basename(script)}: {what} failed (exit {proc.returncode}):\n"
                     f"{proc.stdout[-3000:]}{(proc.stderr or '')[-3000:]}")


# ------------------------------------------------------------ paced workers
#
# For loops a framework owns (Lightning's Trainer, the Transformers
# Trainer): each variant runs in its own process, from a callback at the end
# of every step, and stops after warm-up and after every block of steps
# until the parent says "go". The parent runs one block of each variant in
# turn -- interleaved rounds, one process busy at a time -- and the
# variants' settings (environment variables such as XLA_USE_BF16, whether
# xla_amp is imported at all) cannot leak into each other.


class Pacer:
    """Worker side: call ``tick()`` once at the end of every step. After
    ``warmup`` steps it reports ``{"ready": True}`` and waits; after each
    further ``block`` steps it reports the block's ms/step and metric counts
    and waits. Time spent waiting is not counted."""

    def __init__(self, warmup: int, block: int):
        self.warmup, self.block, self.n = warmup, block, 0
        self._t0, self._c0 = 0.0, {}

    def tick(self) -> None:
        self.n += 1
        if self.n == self.warmup:
            wait_device()
            self._report({"ready": True})
        elif self.n > self.warmup and (self.n - self.warmup) % self.block == 0:
            c = counts()
            ms = (time.perf_counter() - self._t0) * 1e3 / self.block
            self._report({"ms": ms, "counts": {k: c[k] - self._c0[k] for k in c}})

    def _report(self, result: dict) -> None:
        print_result(result)
        if sys.stdin.readline().strip() != "go":
            os._exit(0)  # told to stop: skip the framework's teardown
        self._c0 = counts()
        self._t0 = time.perf_counter()


class PacedWorker:
    """Parent side of a ``Pacer``: ``python script *argv`` started and run
    to its warm-up's end; ``block()`` runs one more block and returns its
    result (``ms``, ``counts``)."""

    def __init__(self, script: str, argv: Sequence[str], env: dict | None = None):
        self.what = " ".join(argv)
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(script), *argv],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env)
        self._read()

    def _read(self) -> dict:
        lines = []
        for line in self.proc.stdout:
            if line.startswith(RESULT):
                return json.loads(line[len(RESULT):])
            lines.append(line)
        raise SystemExit(f"worker {self.what} ended (exit {self.proc.wait()}):\n"
                         + "".join(lines[-40:]))

    def block(self) -> dict:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait()
