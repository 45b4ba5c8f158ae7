"""Overrides win on every engine: ops of the built-in policy
files moved, one at a time, into each other category by
``Policy.with_overrides``, run on an engine, and the output dtype compared
with what the override asks for.

    table(region, make) -> {"<entry> -> <category>": output dtype name | "raises ..."}
    expected(key)       -> the dtype the override asks for (or "raises")

The sample: entries of the five policy files whose conformance case
follows its inputs' dtype in plain PyTorch (bf16 in, bf16 out; f32 in, f32
out), MAX_OPS spread over their sorted list, ALWAYS's among them. Inputs per category as in
tests/support/dtype_parity.input_dtypes (low precision: float32 inputs;
fp32: bfloat16 ones; promote: one bfloat16 among float32). Base policy: tpu
(bfloat16). (Removing an op is not compared: with no rule, the ops inside
decide, and which ops those are is each backend's own decomposition.)
Runs on torch_xla, on the stand-in PrivateUse1 device and on torchax
(tests/torchax/test_overrides_win_everywhere.py compares the three).
"""
from __future__ import annotations

import functools

import torch

from xla_amp import policies

from tests.support.conformance_cases import CASES
from tests.support.dtype_parity import SKIP, cases_for, input_dtypes

TARGETS = ("lower_precision_fp", "fp32", "promote")
MAX_OPS = 60
# always in the sample: log_softmax (an override of it once lost on
# torchax), and every attention op the policy files name (SDPA's low-dtype
# computation is xla_amp's own, xla_amp/policies/_attention.py, on every engine)
ALWAYS = ("aten::log_softmax", "aten::scaled_dot_product_attention",
          "aten::_native_multi_head_attention")
LOW = torch.bfloat16


def _floating_out(result):
    leaves = torch.utils._pytree.tree_leaves(result)
    return next((t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()),
                None)


def _follows_inputs(key) -> bool:
    case = CASES[key]
    for dtype in (LOW, torch.float32):
        torch.manual_seed(0)
        try:
            out = _floating_out(case.call(*[t.to(dtype) for t in case.inputs()], *case.extra()))
        except Exception:  # noqa: BLE001  (an op the CPU cannot run in bf16)
            return False
        if out is None or out.dtype != dtype:
            return False
    return True


@functools.cache
def sample() -> list[tuple[str, str, str]]:
    """(entry, its category in the tpu policy or None, case key): MAX_OPS of
    the eligible entries spread evenly over their sorted list, ALWAYS among
    them."""
    tpu = policies.get("tpu")
    entries = sorted({e for name in policies.builtin_names()
                      for e, c in policies.get(name).categories.items()
                      if c in ("lower_precision_fp", "fp32", "promote")})
    eligible = []
    for entry in entries:
        try:
            keys = [k for k in cases_for(entry) if k in CASES and k not in SKIP]
        except AttributeError:  # an overload this torch lacks (prod.dim_Dimname on 2.15)
            continue
        if keys and _follows_inputs(keys[0]):
            eligible.append((entry, tpu.categories.get(entry), keys[0]))
    stride = max(1, -(-len(eligible) // MAX_OPS))
    chosen = eligible[::stride]
    chosen += [row for row in eligible if row[0] in ALWAYS and row not in chosen]
    assert {row[0] for row in chosen} >= set(ALWAYS), "an op the sweep must hold is not eligible"
    return chosen


def override(entry: str, target: str):
    return policies.get("tpu").with_overrides(name=f"tpu, {entry} -> {target}",
                                              **{target: [entry]})


def table(region, make, rows=None) -> dict:
    """`rows`: sample()'s, taken outside any torchax environment (it runs
    the cases on the CPU)."""
    out = {}
    for entry, _, key in rows if rows is not None else sample():
        case = CASES[key]
        for target in TARGETS:
            torch.manual_seed(0)
            inputs = [make(t.to(d)) for t, d in zip(
                case.inputs(), input_dtypes(target, len(case.inputs())))]
            extra = [make(t) for t in case.extra()]
            try:
                with region(override(entry, target)):
                    got = _floating_out(case.call(*inputs, *extra))
                out[f"{entry} -> {target}"] = str(got.dtype).replace("torch.", "")
            except Exception as e:  # noqa: BLE001  (compared: the expectation says)
                out[f"{entry} -> {target}"] = f"raises {type(e).__name__}"
    return out


def expected(entry: str, target: str, key: str) -> str:
    """The dtype the override asks for, the case's inputs as table() builds them."""
    if target == "lower_precision_fp":
        return "bfloat16"
    if target == "fp32":
        return "float32"
    case = CASES[key]  # promote: the widest floating input (the extra ones count too)
    dtypes = input_dtypes(target, len(case.inputs())) + [
        t.dtype for t in case.extra() if t.is_floating_point() and t.dtype != torch.float64]
    return "float32" if torch.float32 in dtypes else "bfloat16"
