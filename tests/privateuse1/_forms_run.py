"""The argument-forms sweep on the stand-in device (PrivateUse1 engine), in
two phases, each a process of its own (the stand-in renames PrivateUse1):

    _forms_run.py capture CALLS.pt   the cases' calls, recorded by the Python
                                     kernels (XLA_AMP_PRIVATEUSE1_KERNELS=python:
                                     the recording table is a Python one)
    _forms_run.py sweep CALLS.pt OUT.json
                                     every form under every region, on the
                                     kernels the environment picks (native
                                     where xla_amp._C loads, else Python);
                                     {"kernels", "calls", "checked",
                                     "both_raised", "mismatches", ...} as JSON
"""
import json
import sys

import torch

import xla_amp
from xla_amp import engines
from xla_amp import privateuse1

from tests.support import argument_forms as af
from tests.support import standin_tpu

standin_tpu.install()
if sys.argv[1] == "capture":
    assert privateuse1.kernels() == "python", privateuse1.kernels()
    torch.save(af.capture(standin_tpu.to_device), sys.argv[2])
    sys.exit(0)

calls = torch.load(sys.argv[2], weights_only=True)
on_device = [(n, af.to_device(a, standin_tpu.to_device), af.to_device(k, standin_tpu.to_device), r)
             for n, a, k, r in calls]


def same(outs, refs, unrepeatable):
    problem = af.structure_problem(outs, refs)
    if problem:
        return problem
    for o, r in zip(outs, refs):
        o, r = o.cpu(), r.cpu()
        if unrepeatable and o.is_floating_point():
            if not torch.allclose(o, r, rtol=1e-5, atol=1e-6, equal_nan=True):
                return "values differ beyond float32 rounding"
        elif not torch.equal(o.isnan(), r.isnan()) or not torch.equal(
                torch.nan_to_num(o), torch.nan_to_num(r)):
            return "values differ"
    return None


with torch.no_grad():
    result = af.sweep(af.regions(lambda p: xla_amp.autocast("tpu", policy=p), "tpu"),
                      "tpu", on_device, same)
result["kernels"] = privateuse1.kernels()
result["calls"] = len(calls)
result["overloads"] = sorted({n for n, _, _, _ in calls})
result["numbers_forms"] = sum(r is not None for *_, r in calls)

# docs/precision_modes.md's example on the device: LayerNorm under an "fp32"
# rule in a TransformerEncoderLayer, with the hpu rules compiled before it
# (torch 2.11+: the 2.9 stand-in has no device guard, so no Module.to)
if engines.torch_minor() >= (2, 11):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0,
                                             batch_first=True).to("tpu")
    xla_amp.module_policies(layer, {torch.nn.LayerNorm: "fp32"})
    with torch.no_grad(), xla_amp.autocast("tpu"):
        y = layer(torch.randn(2, 5, 16).to("tpu"))
    result["encoder_layer"] = {"dtype": str(y.dtype), "finite": bool(y.cpu().isfinite().all())}
with open(sys.argv[3], "w") as f:
    json.dump(result, f, indent=1)
