"""A policy file's ``[decompose]``: composites that follow the policy's system.

Under ``torch.autocast("cpu"/"cuda")`` a composite op -- one PyTorch builds
from other ops on every backend (a CompositeImplicitAutograd or
CompositeExplicitAutograd kernel) -- runs that decomposition, and the ops
inside it meet the autocast rules: ``torch.einsum`` of two float32 tensors
is a bmm, so bfloat16 under CPU autocast. torch_xla 2.9 lowers some of these
ops itself (einsum, affine_grid_generator), so under xla_amp they would run
in float32, escaping the rules. A policy whose system decomposes them lists
them::

    [decompose]
    "aten::einsum" = "decomp: einsum (decomposes into bmm; torch_xla lowers it)"

and the engine runs PyTorch's decomposition for them (the "decompose" XLA
adaptation, csrc/autocast/autocast_kernel.h): the same ops, cast by the same
rules, as on the policy's system -- an einsum of one operand stays float32
there as here. The tpu rules list none: on a TPU torch_xla's own kernels are
the system. Checked when the file loads (file:line): the op exists, has a
composite kernel, and is in no category of the policy.
"""
from __future__ import annotations

import torch

from xla_amp.policies import _ops as ops
from xla_amp.policies._adaptations import read_policy_section

SECTION = "decompose"


def composite(op: str) -> bool:
    """Whether every overload of `op` has PyTorch's composite kernel."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    found = False
    for overload in ops.overloads(op):
        name = overload[:-len(".default")] if overload.endswith(".default") else overload
        try:
            kernels = {k for k in _KEYS if has(name, k)}
        except RuntimeError:  # an overload the dispatcher does not hold (a Python-only one)
            continue
        if not kernels:  # held, but with no kernel (einsum.sublist once torch.testing loads)
            continue
        if not kernels & {"CompositeImplicitAutograd", "CompositeExplicitAutograd"}:
            return False
        found = True
    return found


_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd", "CPU", "CUDA", "XLA",
         "AutogradXLA", "Meta")


def read(path, text: str, data: dict, categories: dict) -> dict[str, str]:
    """op -> "decompose" for the file's [decompose] table (the policy's
    adaptations); ValueError naming file:line for an op that is not a
    composite or that the file also puts in a category."""
    def check(op, _value):
        if not composite(op):
            return (f"{op} has no composite kernel in PyTorch (no "
                    "CompositeImplicitAutograd / CompositeExplicitAutograd): there "
                    "is no decomposition to run")
        return None
    return read_policy_section(path, text, data, SECTION, categories, check)
