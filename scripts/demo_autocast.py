"""A readable look at autocast on XLA: which ops ran in which dtype.

    python scripts/demo_autocast.py [--policy tpu]

Traces a small CNN's forward pass and loss with and without
xla_amp.autocast, then reads the dtypes straight from the lowered HLO.
"""
import argparse
import collections
import os
import re

os.environ.setdefault("PJRT_DEVICE", "CPU")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch_xla  # noqa: E402

import xla_amp  # noqa: E402

HLO_OP = re.compile(r"= (\w+)\[[^\]]*\][^ ]* ([a-z][\w-]*)\(")
SHOWN = ("convolution", "dot", "reduce-window", "exponential", "log", "reduce",
         "concatenate", "maximum", "convert")


def dtype_census(tensor):
    """{hlo opcode: Counter(dtype)} for the graph that computes `tensor`."""
    census = collections.defaultdict(collections.Counter)
    for dtype, opcode in HLO_OP.findall(torch_xla._XLAC._get_xla_tensors_hlo([tensor])):
        census[opcode][dtype] += 1
    return census


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default=None, help="policy name (default: the device's)")
    args = ap.parse_args()
    device = torch_xla.device()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3), nn.ReLU(), nn.Conv2d(8, 16, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 12 * 12, 32), nn.ReLU(), nn.Linear(32, 10)).to(device)
    x = torch.randn(8, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (8,), device=device)
    torch_xla.sync()

    fp32_loss = nn.functional.cross_entropy(model(x), y)
    ac = xla_amp.autocast(device, policy=args.policy)
    with ac:
        logits = model(x)
        amp_loss = nn.functional.cross_entropy(logits, y)

    print(f"device {device} ({ac.policy.name} policy, {ac.fast_dtype})")
    print(f"logits dtype under autocast: {logits.dtype}; loss dtype: {amp_loss.dtype}\n")
    print(f"{'HLO op':<14} {'fp32 run':<22} {'autocast run':<22}")
    ref, amp = dtype_census(fp32_loss), dtype_census(amp_loss)
    for op in SHOWN:
        if op in ref or op in amp:
            fmt = lambda c: ", ".join(f"{n}x {d}" for d, n in sorted(c.items())) or "-"
            print(f"{op:<14} {fmt(ref.get(op, {})):<22} {fmt(amp.get(op, {})):<22}")
    torch_xla.sync()
    print(f"\nloss fp32 {fp32_loss.item():.5f}   autocast {amp_loss.item():.5f}")


if __name__ == "__main__":
    main()
