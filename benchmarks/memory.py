"""Memory of a training step in each precision mode, as XLA allocates it.

    PJRT_DEVICE=CPU .venv/bin/python benchmarks/memory.py [--models resnet18,lm]

Per model (torchvision ResNet-18 at 32x32, batch 16; the language model of
tests/support/byte_lm.py) and mode (fp32, amp, bf16, bf16_master, bf16_sr with
fp32 state, bf16_sr with state_dtype=bf16), in a process of its own:

  state bytes   parameters + gradients + optimizer state (masters included),
                summed from the tensors after the first step
  step bytes    XLA's buffer assignment of the training step's graph
                (XLA_FLAGS=--xla_dump_to: "Total bytes used", and the peak of
                the live ranges): the real allocation on XLA:CPU, where
                xm.get_memory_info is not implemented
  ms/step       median over timed steps after a warm-up that ran the step
                graph, in the same run as amp's (ratio to amp)

AdamW everywhere (lr 1e-3), xla_amp.GradScaler in every autocast mode.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import tempfile

from _harness import md_header, md_row, median, print_result, run_worker, time_steps, wait_device

MODES = ("fp32", "amp", "bf16", "bf16_master", "bf16_sr", "bf16_sr_bf16state")


def _step_graph_bytes(dump_dir: str) -> tuple[int, int]:
    """(total, peak) bytes of the largest graph XLA compiled: the step."""
    best = (0, 0)
    for path in glob.glob(os.path.join(dump_dir, "*buffer-assignment.txt")):
        text = open(path).read()
        total = int(re.search(r"Total bytes used: (\d+)", text).group(1))
        m = re.search(r"Stack trace breakdown for peak usage: ([\d ]+) bytes", text)
        peak = int(m.group(1).replace(" ", "")) if m else 0
        best = max(best, (total, peak))
    return best


def worker(model_name: str, mode: str, steps: int) -> dict:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch
    import torch.nn.functional as F
    import torch_xla

    from tests.support import byte_lm as lm
    import xla_amp

    dev = torch_xla.device()
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    if model_name == "lm":
        model = lm.LM().to(dev)
        data = lm.corpus(200_000)
        batches = [lm.batch_at(data, g, dev) for _ in range(4)]
    else:
        import torchvision
        model = torchvision.models.resnet18(num_classes=10).to(dev)
        batches = [(torch.randn(16, 3, 32, 32, generator=g).to(dev),
                    torch.randint(0, 10, (16,), generator=g).to(dev)) for _ in range(4)]
    base = mode.replace("_bf16state", "")
    opt, scaler, amp = lm.apply_mode(model, base, 1e-3, state_dtype=(
        torch.bfloat16 if mode.endswith("bf16state") else None))

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad()
        with xla_amp.autocast(dev, policy="tpu", enabled=amp):
            out = model(x)
        scaler.scale(F.cross_entropy(out.float().reshape(-1, out.shape[-1]),
                                     y.reshape(-1))).backward()
        scaler.step(opt)
        scaler.update()
        torch_xla.sync()

    for i in range(3):  # the first step creates the state: its graph differs
        step(i)
    wait_device()
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters()
                                                 if p.grad is not None]
    tensors += [v for st in opt.state.values() for v in st.values()
                if isinstance(v, torch.Tensor) and v.dim() > 0]
    state_bytes = sum(t.numel() * t.element_size() for t in tensors)
    times = [time_steps(lambda: step(i), 1) for i in range(steps)]
    return {"model": model_name, "mode": mode, "state_bytes": state_bytes,
            "ms_per_step": median(times)}


def run_mode(model_name: str, mode: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as dump:
        env = dict(os.environ, PJRT_DEVICE="CPU",
                   XLA_FLAGS=f"--xla_dump_to={dump} --xla_dump_hlo_as_text")
        env.pop("CPU_NUM_DEVICES", None)
        r = run_worker(__file__, ["--worker", f"{model_name}:{mode}", "--steps", str(steps)],
                       f"{model_name} {mode}", env=env)
        r["step_total"], r["step_peak"] = _step_graph_bytes(dump)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18,lm")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        model_name, mode = args.worker.split(":")
        print_result(worker(model_name, mode, args.steps))
        return
    mib = lambda b: f"{b / 2 ** 20:.1f}"  # noqa: E731
    for model_name in args.models.split(","):
        rows = {m: run_mode(model_name, m, args.steps) for m in args.modes.split(",")}
        ref = rows.get("fp32") or next(iter(rows.values()))
        amp = rows.get("amp") or ref
        print(f"\n{model_name}: MiB (vs fp32), step time vs amp")
        print(md_header(["mode", "params+grads+state", "step graph total", "step graph peak",
                         "ms/step", "vs amp"]))
        for m, r in rows.items():
            print(md_row([m] + [f"{mib(r[k])} ({r[k] / ref[k]:.0%})"
                                for k in ("state_bytes", "step_total", "step_peak")]
                         + [f"{r['ms_per_step']:.1f}",
                            f"{r['ms_per_step'] / amp['ms_per_step']:.2f}x"]), flush=True)


if __name__ == "__main__":
    main()
