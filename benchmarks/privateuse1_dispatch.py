"""The PrivateUse1 engine's dispatch cost per op, on the stand-in "tpu"
device (tests/support/standin_tpu.py), against the same work done by hand.

    python benchmarks/privateuse1_dispatch.py [--rounds 20] [--calls 2000]
    (the current profile: .venv-current/bin/python, TORCH_DEVICE_BACKEND_AUTOLOAD=0)

Variants, timed in interleaved rounds in one process:

    by hand    no autocast: a.to(bf16) @ b.to(bf16), what torch's own C++
               autocast kernel does for a lower-precision op (cast, redispatch)
    per-op     xla_amp's kernels (one per listed overload), region open: a @ b
    fallback   the same rules as one boxed fallback for AutocastPrivateUse1
               (per-op kernels removed for that variant, put back after it)

and the same for an op no policy lists (add: by hand = no region). Reported:
the median time per call and the median of per-round ratios to "by hand".
torch.autocast("cpu") against a hand cast on CPU tensors shows what torch's
C++ autocast kernel itself costs. The fallback variant needs torch 2.11+
(torch 2.9 registers a fallthrough for the key in C++, and a key takes one
fallback).
"""
from __future__ import annotations

import argparse
import contextlib
import time

import torch

from _harness import interleaved, md_header, md_row, median, paired_ratio  # this folder's

import xla_amp
from xla_amp import _engines
from xla_amp.privateuse1 import _install, _kernels

from tests.support import standin_tpu


def _per_call(body, calls: int) -> float:
    """Microseconds per call of body's op, its region (if any) entered once."""
    region, fn = body
    with region() if region else contextlib.nullcontext():
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls * 1e6


class Registration:
    """Switch between per-op kernels and one boxed fallback (private API;
    benchmark only)."""

    def __init__(self):
        self.names = sorted(_install._registered)
        self.fallback_lib = None

    def to_fallback(self):
        for lib in _install._libs.values():
            lib._destroy()
        _install._libs.clear()
        _install._registered.clear()
        self.fallback_lib = torch.library.Library("_", "IMPL")
        self.fallback_lib.fallback(_kernels.fallback_kernel, _install.KEY, with_keyset=True)

    def to_per_op(self):
        self.fallback_lib._destroy()
        self.fallback_lib = None
        if _install.fallthrough_added[0]:
            lib = _install._libs["_"] = torch.library.Library("_", "IMPL")
            lib.fallback(torch.library.fallthrough_kernel, _install.KEY)
        for name in self.names:
            _install.register(name)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    standin_tpu.install()
    a = standin_tpu.to_device(torch.randn(16, 16))
    b = standin_tpu.to_device(torch.randn(16, 16))
    ac, bc = torch.randn(16, 16), torch.randn(16, 16)
    region = xla_amp.autocast("tpu")
    low = torch.bfloat16
    with_fallback = _engines.torch_minor() >= (2, 11)
    reg = Registration()

    def cpu_region():
        return torch.autocast("cpu", dtype=low)

    bodies = {
        ("mm", "by hand"): (None, lambda: a.to(low) @ b.to(low)),
        ("mm", "per-op"): (lambda: region, lambda: a @ b),
        ("add", "by hand"): (None, lambda: a + b),
        ("add", "per-op"): (lambda: region, lambda: a + b),
        ("cpu mm", "by hand"): (None, lambda: ac.to(low) @ bc.to(low)),
        ("cpu mm", "torch.autocast"): (cpu_region, lambda: ac @ bc),
    }
    if with_fallback:
        bodies[("mm", "fallback")] = bodies[("mm", "per-op")]
        bodies[("add", "fallback")] = bodies[("add", "per-op")]
    for body in bodies.values():  # warm-up: every variant, its kernels registered
        _per_call(body, 3)

    def run_one(variant, r):
        if variant[1] == "fallback":
            reg.to_fallback()
            try:
                return _per_call(bodies[variant], args.calls)
            finally:
                reg.to_per_op()
        return _per_call(bodies[variant], args.calls)

    results = interleaved(list(bodies), args.rounds, run_one)
    print(f"torch {torch.__version__}; {args.rounds} rounds x {args.calls} calls; "
          "16x16 float32 inputs, bfloat16 under the tpu policy")
    print(md_header(["op", "variant", "us/call (median)", "ratio to by hand (median)"]))
    for (op, variant), times in results.items():
        base = results[(op, "by hand")]
        print(md_row([op, variant, f"{median(times):.1f}",
                      f"{paired_ratio(times, base):.3f}"]))
    spread = {k: (min(v), max(v)) for k, v in results.items()}
    print("spread (min, max us):", {f"{k[0]}/{k[1]}": (round(x, 1), round(y, 1))
                                    for k, (x, y) in spread.items()})


if __name__ == "__main__":
    main()
