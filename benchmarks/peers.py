"""The launcher's MNIST training step, four ways, in one run.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/peers.py [--steps 40] [--rounds 2]

Every path trains the same network (``xla_amp_launch.digits.MNISTNet``:
conv-relu-conv-relu-maxpool-fc-relu-fc, same initial weights) with SGD
(momentum 0.9) on the same batches of real handwritten digits:

  fp32 torch_xla   no autocast, torch.optim.SGD                       (baseline)
  xla_amp          xla_amp.autocast (device policy or --policy) + xla_amp.GradScaler
                   + xla_amp.syncfree.SGD                             (this project)
  torch.amp        stock torch.autocast("xla", bf16) + torch.amp.GradScaler("xla")
                   + torch.optim.SGD, in a process that never imports xla_amp
  JAX bf16         the same network as one jax.jit step: fp32 parameters cast to
                   bf16 for the forward/backward, fp32 loss, hand-written SGD
                   update, buffers donated (what a TPU user would write instead)

Each path runs in its own subprocess (so the stock path is really stock and
JAX's runtime does not share threads with PyTorch/XLA's). A path warms up
(compiles), then times blocks of ``--steps`` steps, waiting for the device at
the end of each block; ``--rounds`` repeats the whole set of subprocesses,
interleaved, so load from other processes hits every path alike. ms/step is
the median over all blocks. For the torch paths the run also counts, from
torch_xla.debug.metrics over the timed steps, graph executions and
device-to-host transfers per step.

Prints a markdown table (ms/step and ratios) and writes a bar chart to
``docs/peers.png`` (``--png``).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from _harness import (Tally, interleaved, markdown_table, median, print_result,  # this folder's
                      run_worker, time_steps, warm_up)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PATHS = ("fp32", "xla_amp", "torch.amp", "jax_bf16")
LABELS = {"fp32": "fp32 torch_xla", "xla_amp": "xla_amp (bf16, GradScaler, syncfree)",
          "torch.amp": "stock torch.autocast + torch.amp.GradScaler + torch.optim",
          "jax_bf16": "JAX jit, bf16 compute", "jax_fp32": "JAX jit, fp32"}
LR, MOMENTUM = 0.05, 0.9


def batches(batch_size: int, count: int):
    """``count`` fixed batches of the digits training set (normalised)."""
    import torch
    from xla_amp_launch.digits import load_sklearn_digits, normalize

    d = load_sklearn_digits()
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(d.train_y), generator=g)
    out = []
    for i in range(count):
        idx = perm[(i * batch_size) % (len(perm) - batch_size):][:batch_size]
        out.append((normalize(d.train_x[idx]).contiguous(), d.train_y[idx].contiguous()))
    return out


def initial_model():
    import torch
    from xla_amp_launch.digits import MNISTNet

    torch.manual_seed(0)
    return MNISTNet()


# ----------------------------------------------------------------- workers


def run_torch(path: str, args) -> dict:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch
    import torch.nn.functional as F
    import torch_xla

    dev = torch_xla.device()
    model = initial_model().to(dev)
    data = [(x.to(dev), y.to(dev)) for x, y in batches(args.batch_size, args.num_batches)]
    if path == "xla_amp":
        import xla_amp
        opt = xla_amp.syncfree.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        scaler = xla_amp.GradScaler()

        def amp():
            return xla_amp.autocast(dev, policy=args.policy)
    elif path == "torch.amp":
        assert "xla_amp" not in sys.modules
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        scaler = torch.amp.GradScaler("xla")

        def amp():
            return torch.autocast("xla", dtype=torch.bfloat16)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
        scaler = None

    step_no = [0]
    last_loss = [None]

    def step():
        x, y = data[step_no[0] % len(data)]
        step_no[0] += 1
        opt.zero_grad(set_to_none=True)
        if scaler is None:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        else:
            with amp():
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        torch_xla.sync()
        last_loss[0] = loss

    warm_up([step], args.warmup)
    tally = Tally()  # XLA metric counts over the timed steps only
    for _ in range(args.blocks):
        tally.measure(step, args.steps)
    return dict(ms=tally.ms, executions=tally.per_step("ExecuteTime"),
                transfers=tally.per_step("TransferFromDeviceTime"),
                compilations_timed=tally.counts["CompileTime"], loss=float(last_loss[0]))


def run_jax(path: str, args) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    compute = jnp.bfloat16 if path == "jax_bf16" else jnp.float32
    # Same initial weights as the torch paths (PyTorch layouts: OIHW, [out, in]).
    params = {k: jnp.asarray(v.detach().numpy()) for k, v in initial_model().state_dict().items()}
    momentum = jax.tree_util.tree_map(jnp.zeros_like, params)
    data = [(jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
            for x, y in batches(args.batch_size, args.num_batches)]

    def conv(x, w, b):
        y = lax.conv_general_dilated(x, w, (1, 1), "VALID",
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + b[None, :, None, None]

    def forward(p, x):
        x = jax.nn.relu(conv(x, p["conv1.weight"], p["conv1.bias"]))
        x = jax.nn.relu(conv(x, p["conv2.weight"], p["conv2.bias"]))
        x = lax.reduce_window(x, -jnp.inf, lax.max,
                              (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        x = x.reshape(x.shape[0], -1)
        x = jax.nn.relu(x @ p["fc1.weight"].T + p["fc1.bias"])
        return x @ p["fc2.weight"].T + p["fc2.bias"]

    def loss_fn(params, x, y):
        p = jax.tree_util.tree_map(lambda a: a.astype(compute), params)
        logits = forward(p, x.astype(compute)).astype(jnp.float32)
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))

    @jax.jit
    def train_step(params, momentum, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        momentum = jax.tree_util.tree_map(lambda m, g: MOMENTUM * m + g, momentum, grads)
        params = jax.tree_util.tree_map(lambda p, m: p - LR * m, params, momentum)
        return params, momentum, loss

    train_step = jax.jit(train_step.__wrapped__, donate_argnums=(0, 1))
    state = [params, momentum, None]  # (params, momentum, loss)
    step_no = [0]

    def step():
        x, y = data[step_no[0] % len(data)]
        step_no[0] += 1
        state[:] = train_step(state[0], state[1], x, y)

    def wait():
        jax.block_until_ready(state)

    warm_up([step], args.warmup, wait=wait)
    ms = [time_steps(step, args.steps, wait=wait) for _ in range(args.blocks)]
    return dict(ms=ms, executions=None, transfers=None, compilations_timed=None,
                loss=float(np.asarray(state[2])))


# ----------------------------------------------------------------- driver


def worker(args) -> None:
    fn = run_jax if args.worker.startswith("jax") else run_torch
    print_result(fn(args.worker, args))


def run_path(path: str, args) -> dict:
    argv = ["--worker", path, "--steps", str(args.steps), "--blocks", str(args.blocks),
            "--warmup", str(args.warmup), "--batch_size", str(args.batch_size),
            "--num_batches", str(args.num_batches)]
    if args.policy:
        argv += ["--policy", args.policy]
    env = dict(os.environ, PJRT_DEVICE=os.environ.get("PJRT_DEVICE", "CPU"))
    return run_worker(__file__, argv, f"the {path!r} worker", env=env)


def table(rows: dict, args) -> str:
    base = rows["fp32"]["median"] if "fp32" in rows else None
    jax_ms = rows["jax_bf16"]["median"] if "jax_bf16" in rows else None
    cells = []
    for n, (path, r) in enumerate(rows.items(), 1):
        def ratio(ref):
            return f"{r['median'] / ref:.2f}x" if ref else "-"

        def fmt(v):
            return "-" if v is None else f"{v:.2f}"
        cells.append([n, LABELS[path], f"{r['median']:.1f}", ratio(base), ratio(jax_ms),
                      fmt(r["executions"]), fmt(r["transfers"])])
    return markdown_table(["#", "path", "ms/step", "vs fp32 torch_xla", "vs JAX bf16",
                           "executions/step", "host transfers/step"], cells)


def chart(rows: dict, png: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [LABELS[p] for p in rows][::-1]
    ms = [r["median"] for r in rows.values()][::-1]
    colors = {"fp32": "#9e9e9e", "xla_amp": "#1f77b4", "torch.amp": "#ff7f0e",
              "jax_bf16": "#2ca02c", "jax_fp32": "#98df8a"}
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.4))
    bars = ax.barh(names, ms, color=[colors[p] for p in rows][::-1])
    for bar, v in zip(bars, ms):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {v:.1f} ms",
                va="center")
    ax.set_xlabel("ms per training step (lower is better)")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, max(ms) * 1.25)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20, help="steps per timed block")
    ap.add_argument("--blocks", type=int, default=2, help="timed blocks per worker")
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of workers")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--batch_size", type=int, default=64)
    ap.add_argument("--num_batches", type=int, default=8, help="distinct batches cycled")
    ap.add_argument("--paths", default=",".join(PATHS),
                    help=f"comma-separated subset of {', '.join(PATHS + ('jax_fp32',))}")
    ap.add_argument("--png", default=os.path.join(ROOT, "docs", "peers.png"))
    ap.add_argument("--policy", default=None,
                    help="xla_amp's policy (default: the device's; on XLA:CPU the cpu rules)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    for p in paths:
        if p not in LABELS:
            ap.error(f"--paths: unknown path {p!r}; choose from {', '.join(LABELS)}")
    t0 = time.time()

    def one(p, r):
        res = run_path(p, args)
        print(f"round {r + 1}/{args.rounds} {p:10s} "
              + " ".join(f"{m:.1f}" for m in res["ms"]) + " ms/step", flush=True)
        return res

    results = interleaved(paths, args.rounds, one, order="fixed")
    rows = {}
    for p, rs in results.items():
        ms = [m for res in rs for m in res["ms"]]
        rows[p] = dict(median=median(ms), min=min(ms),
                       executions=rs[-1]["executions"], transfers=rs[-1]["transfers"])
    import torch
    import jax
    head = (f"MNIST CNN (MNISTNet) training step, batch {args.batch_size}, SGD momentum; "
            f"median of {args.rounds * args.blocks} blocks of {args.steps} steps per path; "
            f"XLA:CPU, {os.cpu_count()} cores; torch {torch.__version__}, jax {jax.__version__}")
    print("\n" + head + "\n")
    print(table(rows, args))
    if "xla_amp" in rows and "jax_bf16" in rows:
        ratio = rows["xla_amp"]["median"] / rows["jax_bf16"]["median"]
        print(f"\nxla_amp vs JAX bf16: {ratio:.2f}x "
              f"({'no slower' if ratio <= 1 else 'SLOWER'})")
    if args.png:
        chart(rows, args.png, f"MNIST CNN step, batch {args.batch_size}, XLA:CPU "
                              f"({os.cpu_count()} cores)")
        print(f"chart: {os.path.relpath(args.png)}")
    print(f"total {time.time() - t0:.0f} s (wall-clock timings; other processes on this "
          "machine slow every path alike)")


if __name__ == "__main__":
    main()
