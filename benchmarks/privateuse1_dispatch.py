"""The PrivateUse1 engine's dispatch cost per op: xla_amp's Python kernels
under AutocastPrivateUse1, per-op and as one boxed fallback, against the
same work done by hand and against torch's own C++ autocast kernel.

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv-current/bin/python \
        benchmarks/privateuse1_dispatch.py [--rounds 20] [--calls 5000]

The device is PrivateUse1 renamed "tpu" with real PrivateUse1 tensors
(torch 2.11+'s torch._C._acc) and Python kernels that compute nothing (they
return an empty tensor of the right shape and dtype) for the four ops the
calls reach: so the figures are dispatch and casting overhead, not
arithmetic. (The test stand-in, tests/support/standin_tpu.py, wraps CPU
tensors in a Python subclass; PyTorch's boxed Python fallback on an
Autocast key fails there with an internal assert, so the fallback is
measured here.)

Each round runs one worker process per registration (interleaved rounds,
rotating order); a worker times, in its own process:

    by hand    no autocast: a.to(bf16) @ b.to(bf16), what torch's own C++
               autocast kernel does for a lower-precision op (cast, redispatch)
    engine     the region open, a @ b, through the worker's registration:
               per-op    xla_amp's kernels, one per listed overload
               fallback  the same rules as one boxed fallback for the key
                         (a key takes one fallback, and per-op kernels win
                         over it, so the two never share a process)
    cpu        torch.autocast("cpu") against the hand cast on CPU tensors:
               what torch's own C++ autocast kernel costs

and the same for an op no policy lists (add: by hand = no region). Reported:
the median time per call and the median of per-round ratios to "by hand"
measured in the same worker.
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


def _device(torch, standin_module):
    """PrivateUse1 as "tpu", with real PrivateUse1 tensors and empty kernels."""
    from torch.utils import backend_registration
    backend_registration._setup_privateuseone_for_python_backend(
        rename="tpu", backend_module=standin_module)
    empty = torch._C._acc.create_empty_tensor
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("mm", lambda a, b: empty((a.shape[0], b.shape[1]), a.dtype), "PrivateUse1")
    lib.impl("add.Tensor", lambda a, b, alpha=1: empty(a.shape, a.dtype), "PrivateUse1")
    lib.impl("_to_copy", lambda a, dtype=None, **kw: empty(a.shape, dtype or a.dtype),
             "PrivateUse1")
    lib.impl("empty.memory_format", lambda size, dtype=None, **kw: empty(
        tuple(size), dtype or torch.float32), "PrivateUse1")
    return lib, lambda shape: empty(shape, torch.float32)


def worker(mode: str, calls: int) -> dict:
    import torch

    import xla_amp
    from xla_amp.privateuse1 import _install, _kernels

    from tests.support import standin_tpu

    torch.set_grad_enabled(False)
    keep, make = _device(torch, standin_tpu._module())
    if mode == "fallback":  # the rules as one boxed fallback (private API; benchmark only)
        lib = torch.library.Library("_", "IMPL")  # before install(): no fallthrough then
        lib.fallback(_kernels.fallback_kernel, _install.KEY, with_keyset=True)
        _install.register = lambda name: _install._registered.add(name)
    xla_amp.privateuse1.install()
    a, b = make((16, 16)), make((16, 16))
    ac, bc = torch.randn(16, 16), torch.randn(16, 16)
    low = torch.bfloat16
    region = xla_amp.autocast("tpu")
    bodies = {"mm by hand": (None, lambda: a.to(low) @ b.to(low)),
              "mm engine": (region, lambda: a @ b),
              "add by hand": (None, lambda: a + b),
              "add engine": (region, lambda: a + b),
              "cpu mm by hand": (None, lambda: ac.to(low) @ bc.to(low)),
              "cpu mm engine": (torch.autocast("cpu", dtype=low), lambda: ac @ bc)}
    with region:
        assert (a @ b).dtype == low and (a + b).dtype == torch.float32
    for region_, fn in bodies.values():  # warm-up
        _per_call(region_, fn, 50)
    return {name: _per_call(region_, fn, calls) for name, (region_, fn) in bodies.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--worker", choices=MODES)
    args = parser.parse_args()
    if args.worker:
        print_result(worker(args.worker, args.calls))
        return
    import torch

    from xla_amp import _engines
    if _engines.torch_minor() < (2, 11):
        raise SystemExit("privateuse1_dispatch.py needs torch 2.11+ (torch._C._acc: Python "
                         "PrivateUse1 tensors); run it in the current profile")
    modes = MODES
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    results = interleaved(modes, args.rounds, lambda mode, r: run_worker(
        __file__, ["--worker", mode, "--calls", str(args.calls)], mode, env))
    print(f"torch {torch.__version__}; {args.rounds} rounds x {args.calls} calls per "
          "variant, one worker process per registration and round; 16x16 float32 on "
          "a PrivateUse1 device with empty kernels, bfloat16 under the tpu policy")
    print(md_header(["op", "registration", "by hand us/call", "engine us/call",
                     "engine / by hand (median of rounds)", "spread of ratios"]))
    for mode in modes:
        for op in ("mm", "add", "cpu mm"):
            hand = [r[f"{op} by hand"] for r in results[mode]]
            eng = [r[f"{op} engine"] for r in results[mode]]
            ratios = [e / h for e, h in zip(eng, hand)]
            print(md_row([op, mode, f"{median(hand):.1f}", f"{median(eng):.1f}",
                          f"{paired_ratio(eng, hand):.3f}",
                          f"{min(ratios):.3f}-{max(ratios):.3f}"]))


if __name__ == "__main__":
    main()
