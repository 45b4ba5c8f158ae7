"""What a sharded save costs in one checkout against another, in
interleaved rounds: the same model (tests/support/sharded_workload.py's
LM, bf16 + fp32 master under FSDPv2 on 2 XLA:CPU SPMD devices, AdamW) saved
``--saves`` times with ``xla_amp.sharded.save(..., keep=2)`` by each
checkout's xla_amp, one process per checkout and round, alternating.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/sharded_save.py --base DIR [--rounds 4]
        [--saves 5]

DIR is another checkout with xla_amp._C in place (the same csrc/ as this
one's); both processes build the model from this checkout's workload file,
so only the library differs. Each process reports the median of its saves'
wall times (the first save, which compiles the state's transfers, left
out); the ratio is the median of the rounds' ratios (this / base), the
spread their lowest and highest.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time

from _harness import markdown_table, paired_ratio, print_result, run_worker  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOAD = os.path.join(os.path.dirname(HERE), "tests", "support", "sharded_workload.py")


def worker(saves: int, folder: str) -> dict:
    spec = importlib.util.spec_from_file_location("sharded_workload", WORKLOAD)
    wl = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(wl)
    wl.configure_devices("1d", 2)
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr
    xr.use_spmd()
    import xla_amp
    from xla_amp import sharded
    run = wl.Run("lm", "1d", "master")
    run.step()
    xm.wait_device_ops()
    times = []
    for i in range(saves + 1):
        t0 = time.perf_counter()
        sharded.save(os.path.join(folder, "ckpt"), model=run.model, optimizer=run.opt,
                     scaler=run.scaler, keep=2)
        times.append(time.perf_counter() - t0)
    return {"ms": 1000 * statistics.median(times[1:]), "library": os.path.dirname(xla_amp.__file__)}


def _one(tree: str, saves: int) -> dict:
    folder = tempfile.mkdtemp(prefix="sharded-save-")
    try:
        env = dict(os.environ, PYTHONPATH=tree)
        return run_worker(os.path.abspath(__file__),
                          ["--worker", "--saves", str(saves), "--dir", folder],
                          f"a sharded save with {tree}'s xla_amp", env=env)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="the other checkout")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--saves", type=int, default=5)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--dir")
    args = ap.parse_args(argv)
    if args.worker:
        print_result(worker(args.saves, args.dir))
        return
    if not args.base or not os.path.isdir(os.path.join(args.base, "xla_amp")):
        ap.error("--base DIR: another checkout, with xla_amp/ and its _C built")
    this = os.path.dirname(HERE)
    times = {"this": [], "base": []}
    for r in range(args.rounds):
        order = ("this", "base") if r % 2 == 0 else ("base", "this")
        for name in order:
            result = _one(this if name == "this" else os.path.abspath(args.base), args.saves)
            times[name].append(result["ms"])
            print(f"round {r + 1} {name}: {result['ms']:.0f} ms ({result['library']})",
                  file=sys.stderr, flush=True)
    ratios = [a / b for a, b in zip(times["this"], times["base"])]
    print(markdown_table(["this (ms)", "base (ms)", "this / base", "spread"],
                         [[f"{statistics.median(times['this']):.0f}",
                           f"{statistics.median(times['base']):.0f}",
                           f"{paired_ratio(times['this'], times['base']):.3f}",
                           f"{min(ratios):.3f}-{max(ratios):.3f}"]]))


if __name__ == "__main__":
    main()
