#!/usr/bin/env python
"""Records what torch.autocast("cuda", float16) gives every public torch
function with a sample (tests/support/op_samples.py), on a GPU: the cuda
rules' reference for composites (tests/policies/test_composites.py
compares xla_amp's cuda policy on XLA:CPU against it).

    python -m scripts.record_cuda_autocast [--out FILE]   # on an NVIDIA GPU
    python -m scripts.record_cuda_autocast --device cpu   # the script's own check
    python -m scripts.record_cuda_autocast --modules [--out FILE]
        every module of PyTorch's module_db with its samples instead
        (tests/support/module_sweep.py): the output dtypes of the module and
        each submodule, the parameters' gradient dtypes, with and without
        autocast -- the reference a module sweep of the cuda rules needs
        (tests/policies/test_module_sweep.py sweeps the cpu rules against
        torch.autocast("cpu"); CUDA's cannot run without a GPU)

(from the checkout's root: it imports the tests package)

Per case: the sample's tensors ("dtype[shape]"), the floating dtypes under
autocast, and without it (a difference between torch_xla and the device
without any autocast is no policy's doing). Runs in a process that never
imports torchax or torch_xla (docs/upstream: torchax breaks native CUDA
autograd in its process). The committed table is
tests/policies/cuda_autocast_dtypes.json; FILE defaults to $OUT/ or build/.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch

from tests.support import op_samples as S


def record(device: str) -> dict:
    dtype = torch.float16 if device == "cuda" else torch.bfloat16
    cases = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, (make, call) in S.composite_cases().items():
            args, kwargs = make()
            cases[name] = {
                "signature": S.signature(args, kwargs),
                "autocast": S.run(call, args, kwargs, device,
                                  torch.autocast(device, dtype=dtype)),
                "plain": S.run(call, args, kwargs, device, contextlib.nullcontext())}
    return cases


def record_modules(device: str) -> dict:
    """{"Class|case|desc": {"signature", "autocast": [forward, backward], "plain": ...}}."""
    from tests.support import module_sweep as M
    dtype = torch.float16 if device == "cuda" else torch.bfloat16
    cases = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for info in M.MODULES.values():
            for case, training, sample in M.cases(info):
                f = sample.forward_input
                args, kwargs = M.to(f.args, device), M.to(f.kwargs, device)
                entry = {"signature": M.signature(sample)}
                for kind, region in (("autocast", lambda: torch.autocast(device, dtype=dtype)),
                                     ("plain", contextlib.nullcontext)):
                    module = M.build(info.module_cls, training, sample).to(device)
                    entry[kind] = list(M.run(module, args, kwargs, region))
                cases[f"{info.module_cls.__name__}|{case}|{sample.desc}"] = entry
    return cases


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--modules", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    name = "cuda_module_dtypes.json" if args.modules else "cuda_autocast_dtypes.json"
    args.out = args.out or os.path.join(os.environ.get("OUT") or "build", name)
    assert "torchax" not in sys.modules and "torch_xla" not in sys.modules
    t0 = time.perf_counter()
    cases = (record_modules if args.modules else record)(args.device)
    table = {"recorded": {"torch": torch.__version__, "device": args.device,
                          "device_name": (torch.cuda.get_device_name(0)
                                          if args.device == "cuda" else "cpu"),
                          "date": datetime.date.today().isoformat(),
                          "autocast_dtype": "float16" if args.device == "cuda" else "bfloat16",
                          "seconds": round(time.perf_counter() - t0, 1)},
             "cases": cases}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{len(cases)} cases -> {args.out} ({table['recorded']['seconds']} s)")


if __name__ == "__main__":
    main()
