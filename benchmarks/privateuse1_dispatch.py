"""The PrivateUse1 engine's dispatch cost per op, on the stand-in "tpu"
device (tests/support/standin_tpu.py), against the same work done by hand.

    python benchmarks/privateuse1_dispatch.py [--rounds 20] [--calls 2000]
    (the current profile: .venv-current/bin/python, TORCH_DEVICE_BACKEND_AUTOLOAD=0)

Each round runs one worker process per registration (interleaved rounds,
rotating order); a worker times, in its own process:

    by hand    no autocast: a.to(bf16) @ b.to(bf16), what torch's own C++
               autocast kernel does for a lower-precision op (cast, redispatch)
    engine     the region open, a @ b, through the worker's registration:
               per-op    xla_amp's kernels, one per listed overload
               fallback  the same rules as one boxed fallback for the key
                         (a key takes one fallback, and per-op kernels win
                         over it, so the two never share a process)

and the same for an op no policy lists (add: by hand = no region). Reported:
the median time per call and the median of per-round ratios to "by hand"
measured in the same worker.
torch.autocast("cpu") against a hand cast on CPU tensors shows what torch's
C++ autocast kernel itself costs. The fallback variant needs torch 2.11+
(torch 2.9 registers a fallthrough for the key in C++, and a key takes one
fallback).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time

from _harness import (interleaved, md_header, md_row, median, paired_ratio,  # this folder's
                      print_result, run_worker)

MODES = ("per-op", "fallback")


def _per_call(region, fn, calls: int) -> float:
    """Microseconds per call of `fn`, `region` (if any) entered once."""
    with region if region is not None else contextlib.nullcontext():
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls * 1e6


def worker(mode: str, calls: int) -> dict:
    import torch

    import xla_amp
    from xla_amp.privateuse1 import _install, _kernels

    from tests.support import standin_tpu

    torch.set_grad_enabled(False)
    standin_tpu.install()
    if mode == "fallback":  # the rules as one boxed fallback (private API; benchmark only)
        _install.register = lambda name: _install._registered.add(name)
        xla_amp.privateuse1.install()
        fallthrough = _install._libs.pop("_", None)
        if fallthrough is not None:
            fallthrough._destroy()
        lib = torch.library.Library("_", "IMPL")
        lib.fallback(_kernels.fallback_kernel, _install.KEY, with_keyset=True)
    a = standin_tpu.to_device(torch.randn(16, 16))
    b = standin_tpu.to_device(torch.randn(16, 16))
    low = torch.bfloat16
    region = xla_amp.autocast("tpu")
    bodies = {"mm by hand": (None, lambda: a.to(low) @ b.to(low)),
              "mm engine": (region, lambda: a @ b),
              "add by hand": (None, lambda: a + b),
              "add engine": (region, lambda: a + b)}
    with region:
        assert (a @ b).dtype == low and (a + b).dtype == torch.float32
    for region_, fn in bodies.values():  # warm-up
        _per_call(region_, fn, 20)
    return {name: _per_call(region_, fn, calls) for name, (region_, fn) in bodies.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--worker", choices=MODES)
    args = parser.parse_args()
    if args.worker:
        print_result(worker(args.worker, args.calls))
        return
    import torch

    from xla_amp import _engines
    modes = MODES if _engines.torch_minor() >= (2, 11) else ("per-op",)
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    results = interleaved(modes, args.rounds, lambda mode, r: run_worker(
        __file__, ["--worker", mode, "--calls", str(args.calls)], mode, env))
    print(f"torch {torch.__version__}; {args.rounds} rounds x {args.calls} calls per "
          "variant, one worker process per registration and round; 16x16 float32 "
          "on the stand-in, bfloat16 under the tpu policy")
    print(md_header(["op", "registration", "by hand us/call", "engine us/call",
                     "engine / by hand (median of rounds)", "spread of ratios"]))
    for mode in modes:
        for op in ("mm", "add"):
            hand = [r[f"{op} by hand"] for r in results[mode]]
            eng = [r[f"{op} engine"] for r in results[mode]]
            ratios = [e / h for e, h in zip(eng, hand)]
            print(md_row([op, mode, f"{median(hand):.1f}", f"{median(eng):.1f}",
                          f"{paired_ratio(eng, hand):.3f}",
                          f"{min(ratios):.3f}-{max(ratios):.3f}"]))


if __name__ == "__main__":
    main()
