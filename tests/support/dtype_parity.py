"""Output dtypes per (policy, op case) under an engine: the parity tables
of tests/privateuse1 (torch only and xla_amp's core: no torch_xla here, so
the current profile imports it too).

    table(region, make) -> {policy: {case key: [output dtype names]}}

`region(policy)` opens the engine's autocast region; `make(t)` puts a CPU
tensor on the engine's device. Every entry of every policy in POLICIES
(plus OVERRIDE: tpu with ops moved between categories) is run through every
case the conformance cases have for it, its inputs in the dtypes that
exercise its category (a lower precision op gets float32 inputs, an fp32 op
bfloat16 ones, a promote op one bfloat16 among float32). Only the output
dtypes are read: on XLA nothing is executed.
"""
from __future__ import annotations

import torch

from xla_amp import policies
from xla_amp.policies import _ops as ops

from tests.support.conformance_cases import CASES

POLICIES = ("tpu", "cuda", "cpu")
LOW = torch.bfloat16
OVERRIDE = "tpu-override"
SKIP = {"aten::multinomial", "aten::poisson", "aten::_grid_sampler_2d_cpu_fallback"}


def override_policy():
    """The tpu rules with one op moved each way (an override's table)."""
    return policies.get("tpu").with_overrides(
        name=OVERRIDE, fp32=["aten::mm", "aten::bmm"], lower_precision_fp=["aten::softmax"],
        remove=["aten::conv2d"])


def input_dtypes(category, n):
    if category in ("lower_precision_fp", "banned"):
        return [torch.float32] * n
    if category == "promote":
        return [LOW] + [torch.float32] * (n - 1)
    return [LOW] * n  # fp32 classes and uncast ops: start low


def cases_for(entry: str) -> list[str]:
    try:
        found = [o for o in ops.overloads(entry) if o in CASES]
    except ValueError:  # an op this torch lacks (a policy skips it as removed)
        return []
    if not found:
        base = ops.canonical(entry).split(".")[0]
        found = [base] if base in CASES else []
    return found


def rows(policy) -> list[tuple[str, str | None, str]]:
    """(entry, category, case key) for every case of `policy`."""
    out = []
    for entry, cat in list(policy.categories.items()) + [(e, None) for e in policy.uncast]:
        for key in cases_for(entry):
            if key not in SKIP:
                out.append((entry, cat, key))
    return out


def _dtypes(result) -> list[str]:
    if isinstance(result, torch.Tensor):
        return [str(result.dtype).replace("torch.", "")]
    out = []
    if isinstance(result, (tuple, list)):
        for r in result:
            out.extend(_dtypes(r))
    return out


def run_case(region, make, policy, category, key) -> list[str] | str:
    case = CASES[key]
    torch.manual_seed(0)
    floats = [make(t.to(d)) for t, d in zip(case.inputs(), input_dtypes(category, len(case.inputs())))]
    extra = [make(t) for t in case.extra()]
    try:
        with region(policy):
            return _dtypes(case.call(*floats, *extra))
    except Exception as e:  # noqa: BLE001  (banned ops raise; recorded, compared)
        return f"raises {type(e).__name__}"


def table(region, make, names=POLICIES) -> dict:
    out = {}
    for name in list(names) + [OVERRIDE]:
        policy = override_policy() if name == OVERRIDE else policies.get(name)
        out[name] = {key: run_case(region, make, policy, cat, key)
                     for _, cat, key in rows(policy)}
    return out
