"""The PrivateUse1 engine's dispatch cost per op: xla_amp's kernels under
AutocastPrivateUse1, native (xla_amp._C, `make current`) and Python, against
torch's own C++ autocast kernel on the same device and against the same
work done by hand.

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv-current/bin/python \
        benchmarks/privateuse1_dispatch.py [--rounds 20] [--calls 5000] \
        [--modes native,python,torch] [--devices empty,standin]

Two devices, each PrivateUse1 renamed "tpu":

    empty    real PrivateUse1 tensors (torch 2.11+'s torch._C._acc) and
             kernels that compute nothing (an empty tensor of the right shape
             and dtype) for the four ops the calls reach: dispatch and
             casting overhead only, no arithmetic
    standin  the test stand-in (tests/support/standin_tpu.py): a Python
             wrapper subclass whose ops run on the CPU (a Python boxed
             fallback on an Autocast key fails there with an internal
             assert, so `fallback` runs on `empty` only)

Each round runs one worker process per (device, registration) (interleaved
rounds, rotating order); a worker times, in its own process:

    by hand    no autocast: a.to(bf16) @ b.to(bf16)
    engine     the region open, a @ b, through the worker's registration:
               native    xla_amp's C++ kernels (XLA_AMP_PRIVATEUSE1_KERNELS=native)
               python    xla_amp's Python kernels, one per listed overload
               fallback  the Python rules as one boxed fallback for the key
               torch     torch.autocast("tpu") with torch's own C++ kernels for
                         mm/matmul (benchmarks/privateuse1_torch_autocast.cpp,
                         ATen's KERNEL_PRIVATEUSEONE, as TorchTPU registers
                         them) and no xla_amp on the key: the TorchTPU-like
                         baseline
    cpu        torch.autocast("cpu") against the hand cast on CPU tensors

and the same for an op no policy lists (add: by hand = no region). Reported:
the median time per call, the median of per-round ratios to "by hand"
measured in the same worker, and each registration's engine time against
torch's (same device, same round).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import time

from _harness import (interleaved, md_header, md_row, median, paired_ratio,  # this folder's
                      print_result, run_worker)

MODES = ("native", "python", "fallback", "torch")
DEVICES = ("empty", "standin")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BASELINE = os.path.join(HERE, "privateuse1_torch_autocast.cpp")
BASELINE_DIR = os.path.join(ROOT, "build", "bench-torch-autocast")


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


def _baseline_library() -> str:
    """torch's own autocast kernels for the key, built once (cached in build/)."""
    from torch.utils import cpp_extension
    os.makedirs(BASELINE_DIR, exist_ok=True)
    cpp_extension.load(name="torch_autocast_pu1", sources=[BASELINE], is_python_module=False,
                       build_directory=BASELINE_DIR, extra_cflags=["-O2", "-g0"], verbose=False)
    return os.path.join(BASELINE_DIR, "torch_autocast_pu1.so")


def worker(device: str, mode: str, calls: int) -> dict:
    import torch

    from tests.support import standin_tpu

    torch.set_grad_enabled(False)
    if device == "empty":
        keep, make = _device(torch, standin_tpu._module())
    else:
        standin_tpu.install()

        def make(shape):
            return standin_tpu.to_device(torch.randn(shape))
    low = torch.bfloat16
    if mode == "torch":  # torch's own kernels; a fallthrough for the rest, as TorchTPU has
        torch.ops.load_library(_baseline_library())
        keep_ft = torch.library.Library("_", "IMPL")
        keep_ft.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
        region = torch.autocast("tpu", dtype=low)
    else:
        import xla_amp
        from xla_amp.privateuse1 import _install, _kernels
        if mode == "fallback":  # the rules as one boxed fallback (private API; benchmark only)
            lib = torch.library.Library("_", "IMPL")  # before install(): no fallthrough then
            lib.fallback(_kernels.fallback_kernel, _install.KEY, with_keyset=True)
            _install.register = lambda name: _install._registered.add(name)
        xla_amp.privateuse1.install()
        want = "native" if mode == "native" else "python"
        assert xla_amp.privateuse1.kernels() == want, (mode, xla_amp.privateuse1.kernels())
        region = xla_amp.autocast("tpu")
    a, b = make((16, 16)), make((16, 16))
    ac, bc = torch.randn(16, 16), torch.randn(16, 16)
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
    parser.add_argument("--modes", default="native,python,torch")
    parser.add_argument("--devices", default=",".join(DEVICES))
    parser.add_argument("--worker")
    args = parser.parse_args()
    if args.worker:
        device, mode = args.worker.split("/")
        print_result(worker(device, mode, args.calls))
        return
    import torch

    from xla_amp import engines
    if engines.torch_minor() < (2, 11):
        raise SystemExit("privateuse1_dispatch.py needs torch 2.11+ (torch._C._acc: Python "
                         "PrivateUse1 tensors); run it in the current profile")
    modes = [m for m in args.modes.split(",") if m]
    devices = [d for d in args.devices.split(",") if d]
    if "torch" in modes:
        _baseline_library()  # built before the workers load it
    variants = [f"{d}/{m}" for d in devices for m in modes
                if not (d == "standin" and m == "fallback")]
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}

    def run_one(variant, r):
        mode = variant.split("/")[1]
        kernels = {"native": "native", "python": "python", "fallback": "python"}.get(mode, "auto")
        return run_worker(__file__, ["--worker", variant, "--calls", str(args.calls)], variant,
                          {**env, "XLA_AMP_PRIVATEUSE1_KERNELS": kernels})
    results = interleaved(variants, args.rounds, run_one)
    print(f"torch {torch.__version__}; {args.rounds} rounds x {args.calls} calls per "
          "variant, one worker process per (device, registration) and round; 16x16 float32 "
          "on PrivateUse1 as 'tpu', bfloat16 (tpu policy for xla_amp)")
    print(md_header(["device", "op", "registration", "by hand us/call", "engine us/call",
                     "engine / by hand (median of rounds)", "spread of ratios",
                     "engine / torch's engine"]))
    for variant in variants:
        device, mode = variant.split("/")
        ops = ("mm", "add", "cpu mm") if variant == variants[0] else ("mm", "add")
        for op in ops:
            hand = [r[f"{op} by hand"] for r in results[variant]]
            eng = [r[f"{op} engine"] for r in results[variant]]
            ratios = [e / h for e, h in zip(eng, hand)]
            versus = "-"
            baseline = f"{device}/torch"
            if baseline in results and op != "cpu mm":
                theirs = [r[f"{op} engine"] for r in results[baseline]]
                versus = f"{paired_ratio(eng, theirs):.3f}"
            print(md_row([device, op, mode, f"{median(hand):.1f}", f"{median(eng):.1f}",
                          f"{paired_ratio(eng, hand):.3f}",
                          f"{min(ratios):.3f}-{max(ratios):.3f}", versus]))


if __name__ == "__main__":
    main()
