"""The worker of benchmarks/sharded.py's benchmark: in one process on N
devices, every mode's FSDPv2 run side by side -- per-device bytes of
parameters + gradients + optimizer state, and step times over
interleaved rounds -- and the table of all N.

Per-device bytes, two ways:

- tensors: each parameter, gradient and state tensor counts the elements
  of its shard (its shape divided by its XLA sharding's tiling, rounded
  up) times its element size;
- XLA: the step graph's buffer assignment (``Total bytes used`` of XLA's
  memory-usage report, dumped while it compiles): the partitioned
  program of one device, inputs, outputs and temporaries. XLA:CPU
  computes bf16 ops in f32, so its temporaries are larger than a TPU's.
"""
from __future__ import annotations

import glob
import math
import os
import re
import tempfile

from tests.support import sharded_workload as wl

_TILES = re.compile(r"devices=\[([0-9,]+)\]")


def shard_numel(t) -> int:
    """Elements of `t` one device holds, from its XLA sharding."""
    from xla_amp.syncfree._sharding import spec
    s = spec(t)
    m = _TILES.search(s)
    if not m:  # unsharded or replicated: the whole tensor
        return t.numel()
    tiles = [int(v) for v in m.group(1).split(",")]
    return math.prod(math.ceil(d / k) for d, k in zip(t.shape, tiles[:t.dim()]))


def tensor_bytes(run) -> dict[str, int]:
    import torch
    params = list(run.model.parameters())
    out = {"params": 0, "grads": 0, "state": 0}
    for p in params:
        out["params"] += shard_numel(p) * p.element_size()
        if p.grad is not None:
            out["grads"] += shard_numel(p.grad) * p.grad.element_size()
        for v in run.opt.state.get(p, {}).values():
            if isinstance(v, torch.Tensor):
                out["state"] += shard_numel(v) * v.element_size()
    out["total"] = sum(out.values())
    return out


def _reports(dump: str) -> set[str]:
    return set(glob.glob(os.path.join(dump, "*memory-usage-report.txt")))


def _xla_bytes(paths) -> int:
    """The largest ``Total bytes used`` among `paths` (the step graph's)."""
    best = 0
    for path in paths:
        with open(path) as f:
            m = re.match(r"Total bytes used: (\d+)", f.readline())
        if m:
            best = max(best, int(m.group(1)))
    return best


def measure(args) -> dict:
    """Every mode of `args.model` on `args.devices` devices (``--worker``)."""
    import _harness as harness
    dump = os.environ["XLA_AMP_BENCH_DUMP"]
    runs, bytes_, xla = {}, {}, {}
    for mode in wl.MODES:
        seen = _reports(dump)
        runs[mode] = wl.Run(args.model, args.mesh, mode)
        harness.warm_up([runs[mode].step], 3)  # the first step's graph, then the steady one
        bytes_[mode] = tensor_bytes(runs[mode])
        xla[mode] = _xla_bytes(_reports(dump) - seen)
    tallies = {mode: harness.Tally() for mode in wl.MODES}
    for r in range(args.rounds):
        for mode in harness.round_order(wl.MODES, r):
            tallies[mode].measure(runs[mode].step, 2)
    fp32 = tallies["fp32"].ms
    return {"devices": args.devices, "model": args.model,
            "modes": {m: {"bytes": bytes_[m], "xla_bytes": xla[m],
                          "ms": harness.median(tallies[m].ms),
                          "vs_fp32": harness.paired_ratio(tallies[m].ms, fp32),
                          "transfers_per_step": tallies[m].per_step("TransferFromDeviceTime"),
                          "executions_per_step": tallies[m].per_step("ExecuteTime")}
                      for m in wl.MODES}}


def worker_env() -> dict[str, str]:
    """XLA_FLAGS that dump each compiled graph's memory-usage report."""
    dump = tempfile.mkdtemp(prefix="sharded-bench-")
    flags = os.environ.get("XLA_FLAGS", "")
    return {"XLA_AMP_BENCH_DUMP": dump,
            "XLA_FLAGS": f"{flags} --xla_dump_to={dump} --xla_dump_hlo_module_re=SyncTensorsGraph"}


def table(rows: list[dict]) -> str:
    """Markdown: per N and mode, bytes per device against N = 1 and fp32."""
    one = {m: rows[0]["modes"][m]["bytes"]["total"] for m in wl.MODES}
    lines = ["| N | mode | params+grads+state per device (KiB) | x N vs N=1 | vs fp32 same N "
             "| XLA step buffers (KiB) | ms/step | vs fp32 | transfers/step |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        n = row["devices"]
        for m in wl.MODES:
            d = row["modes"][m]
            b = d["bytes"]["total"]
            lines.append(
                f"| {n} | {m} | {b / 1024:.1f} | {b * n / one[m]:.3f} | "
                f"{b / row['modes']['fp32']['bytes']['total']:.3f} | {d['xla_bytes'] / 1024:.1f} | "
                f"{d['ms']:.1f} | {d['vs_fp32']:.3f} | {d['transfers_per_step']:.1f} |")
    return "\n".join(lines)
