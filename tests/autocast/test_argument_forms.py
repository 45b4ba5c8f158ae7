"""The argument-forms sweep (tests/support/argument_forms.py) on the torch_xla
engine: the calls captured on the stand-in device, replayed on XLA in every
form under every built-in policy and an "fp32" module rule. Equal results
are equal programs: the HLO of xla_amp's outputs must be the HLO of the call
without xla_amp's kernel on inputs cast by hand (nothing is executed)."""
import torch
import torch_xla
from torch_xla import _XLAC

import xla_amp

from tests.privateuse1.test_argument_forms import sweep
from tests.support import argument_forms as af


def _same(outs, refs, unrepeatable):
    problem = af.structure_problem(outs, refs)
    if problem:
        return problem
    programs = []
    for ts in (outs, refs):  # XLA checks some arguments only when it lowers
        try:
            programs.append(_XLAC._get_xla_tensors_hlo(ts))
        except RuntimeError as e:
            programs.append(f"raises {str(e).splitlines()[0]}")
    if programs[0] != programs[1]:
        return ("another program than the hand-cast call's" if "raises" not in programs[0]
                else programs[0])
    return None


def _below(op, args, kwargs):
    """An op the policy leaves uncast, under the region: PyTorch/XLA's kernel
    for it calls at:: ops that meet autocast again (addr's multiply under
    the hpu rules), so its hand-cast control is the op in its positional
    form under the region; every other form must give that program. (A
    Python redispatch below AutocastXLA would run fallthrough kernels.)"""
    return op(*args, **kwargs)


def _adapted(policy):
    from xla_amp.policies import _ops as ops
    return {o for op in policy.adaptations for o in ops.overloads(op)}


def test_every_form_equals_the_call_without_xla_amps_kernel():
    calls = torch.load(sweep()["calls"], weights_only=True)
    device = torch_xla.device()
    make = lambda t: t.to(device)  # noqa: E731
    on_device = [(n, af.to_device(a, make), af.to_device(k, make), r) for n, a, k, r in calls]
    with torch.no_grad():
        result = af.sweep(af.regions(lambda p: xla_amp.autocast(device, policy=p), device),
                          "xla", on_device, _same, below=_below, adapted=_adapted)
    assert result["mismatches"] == [], "\n".join(result["mismatches"][:40])
    assert result["checked"] - result["both_raised"] >= 2500, result
