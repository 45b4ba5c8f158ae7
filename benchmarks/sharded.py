"""Sharded mixed precision (xla_amp.sharded, FSDPv2 on XLA:CPU SPMD devices).

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/sharded.py [--model lm] [--devices 1,2,4]
    PJRT_DEVICE=CPU .venv/bin/python benchmarks/sharded.py --check --model lm --mesh 1d \\
        --devices 2 --mode master [--steps 20] [--inject 6] [--save-at 10 --ckpt DIR] [--load DIR]

Benchmark (default): for each N, one process trains the model
(tests/support/sharded_workload.py) under FSDPv2 in every mode -- fp32, amp,
master (bf16 + fp32 master), sr (bf16 + stochastic rounding, bf16 state)
-- and reports per-device bytes of parameters + gradients + optimizer
state, counted from each tensor's shard (its XLA sharding), and the step
time against fp32's, over interleaved rounds after a warm-up that compiles
every mode's graphs. N = 1 is the same model on one device without SPMD.

``--check`` (what tests/sharded/ runs, through tests/support/sharded.py): one run, one JSON line:
its losses, executions / transfers / compilations per step (steps 3 on,
the injected step left out), each state tensor whose sharding is not its
parameter's, the injected overflow's effect (``--inject K``: step K puts
an inf into one gradient shard; were parameters and state bit-identical
after it, and the scale before and after), a digest of the final
parameters and state, and the checkpoint written (``--save-at``) or read
(``--load``: the run starts at the step the checkpoint was written).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

from tests.support import sharded_workload as wl  # noqa: E402  (the checkout is importable)


def _digest(tensors) -> str:
    """sha256 (16 hex digits) of the tensors' bytes, in order."""
    import torch
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def check(args) -> dict:
    import torch
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    import _harness as harness
    from xla_amp import sharded
    from xla_amp.syncfree import _sharding
    run = wl.Run(args.model, args.mesh, args.mode, lr=args.lr)
    out = {"model": args.model, "mesh": args.mesh, "mode": args.mode, "devices": args.devices}
    if args.load:
        sharded.load(args.load, model=run.model, optimizer=run.opt, scaler=run.scaler)
        run.k = args.start
    losses, counted, totals = [], 0, {"executions": 0, "transfers": 0, "compilations": 0}
    while run.k < args.steps:
        k = run.k + 1  # the step about to run, 1-based
        if k == args.inject:
            before = run.snapshot()
            scale = run.scaler.get_scale()
            run.inject = True
        xm.wait_device_ops()
        met.clear_all()
        loss = run.step()
        xm.wait_device_ops()
        c = harness.counts()
        if k >= 3 + (args.start if args.load else 0) and k != args.inject:
            counted += 1
            totals["executions"] += c["ExecuteTime"]
            totals["transfers"] += c["TransferFromDeviceTime"]
            totals["compilations"] += c["CompileTime"]
        losses.append(float(loss.detach().float().cpu()))
        if k == args.inject:
            after = run.snapshot()
            out["inject"] = {"identical": all(torch.equal(a, b) for a, b in zip(before, after)),
                             "tensors": len(before), "scale_before": scale,
                             "scale_after": run.scaler.get_scale()}
        if k == args.save_at:
            sharded.save(args.ckpt, model=run.model, optimizer=run.opt, scaler=run.scaler)
            out["saved_at"] = k
    out["losses"] = losses
    out.update({f"{k}_per_step": v / max(counted, 1) for k, v in totals.items()})
    out["counted_steps"] = counted
    out["sharding_mismatches"] = _sharding.mismatches(run.opt)
    out["state_specs"] = sorted({_sharding.spec(v) for st in run.opt.state.values()
                                 for v in st.values() if isinstance(v, torch.Tensor)})
    out["digest"] = _digest(run.snapshot())
    out["scale"] = run.scaler.get_scale()
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--model", default="lm", choices=wl.MODELS)
    ap.add_argument("--mesh", default="1d", choices=wl.MESHES)
    ap.add_argument("--mode", default="master", choices=wl.MODES)
    ap.add_argument("--devices", default="1,2,4",
                    help="--check: N; benchmark: the Ns, comma-separated")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=None, help="default: the model's (workload.LR)")
    ap.add_argument("--inject", type=int, default=0)
    ap.add_argument("--save-at", type=int, default=0)
    ap.add_argument("--ckpt", default="")
    ap.add_argument("--load", default="")
    ap.add_argument("--start", type=int, default=0, help="--load: the step it was saved at")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.save_at and not args.ckpt:
        ap.error("--save-at needs --ckpt DIR")
    if args.check or args.worker:
        args.devices = int(args.devices)
        wl.configure_devices(args.mesh, args.devices)
        import torch_xla.runtime as xr
        if args.mesh != "none":
            xr.use_spmd()
        if args.check:
            print(json.dumps(check(args)), flush=True)
        else:
            import sharded_bytes
            print(json.dumps(sharded_bytes.measure(args)), flush=True)
        return
    import sharded_bytes
    rows = []
    for n in (int(v) for v in args.devices.split(",")):
        mesh = "none" if n == 1 else "1d"
        cmd = [sys.executable, __file__, "--worker", "--model", args.model, "--mesh", mesh,
               "--devices", str(n), "--rounds", str(args.rounds)]
        env = dict(os.environ, PJRT_DEVICE="CPU", **sharded_bytes.worker_env())
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        finally:  # the dumps: 100-160 MB per N
            shutil.rmtree(env["XLA_AMP_BENCH_DUMP"], ignore_errors=True)
        if done.returncode:
            sys.exit(f"N={n} failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(sharded_bytes.table(rows))


if __name__ == "__main__":
    main()
