"""The conformance tests' machinery: which (policy, entry, category, case)
triples exist, how a case's inputs are built and hand-cast, and how results
are compared. Shared by tests/autocast/test_conformance.py (eager) and
tests/compiled/test_compiled_ops.py (torch.compile). Cases: tests.support.conformance_cases.
"""
from __future__ import annotations

import pytest
import torch
import torch_xla.core.xla_model as xm

import xla_amp
from xla_amp import policies
from xla_amp.policies import _ops as ops

from tests.support.conformance_cases import CASES

POLICIES = ("cuda", "cpu", "xpu", "hpu")
LOW = torch.bfloat16

# Python-level names of the documents (cases "py::..."), with the category
# their mapping to aten ops gives them under each policy (see the policy
# file headers). nn.GRUCell/LSTMCell/RNNCell call the aten cells directly.
INFORMAL = {
    "cuda": {"py::nll_loss": "fp32", "py::__rtruediv__": "fp32", "py::__rdiv__": "fp32", "py::__rpow__": "fp32",
             "py::__pow__": "fp32", "py::__matmul__": "lower_precision_fp",
             "py::softmin": "fp32_set_opt_dtype", "py::normalize": "fp32",
             "py::cross_entropy": "fp32", "py::norm": "fp32", "py::grid_sample": "promote"},
    "cpu": {"py::nll_loss": "fp32", "py::__matmul__": "lower_precision_fp", "py::cross_entropy": "fp32",
            "py::grid_sample": "fp32"},
    "xpu": {"py::__pow__": "fp32", "py::cross_entropy": "fp32", "py::__matmul__": "lower_precision_fp"},
    "hpu": {"py::nll_loss": "fp32", "py::truediv": "fp32", "py::cross_entropy": "fp32", "py::__matmul__": "lower_precision_fp"},
}
# Ops whose outputs are random draws: compared by dtype only against PyTorch.
RANDOM = {"aten::multinomial", "aten::poisson"}


def cases_for(entry: str) -> list[str]:
    if entry.startswith("py::"):
        return [entry]
    found = [o for o in ops.overloads(entry) if o in CASES]
    if not found:
        base = ops.canonical(entry).split(".")[0]
        found = [base] if base in CASES else []
    return found


def raw_params(names=POLICIES):
    """pytest params (policy, entry, category, case key) for the policies `names`."""
    out = []
    for name in names:
        p = policies.get(name)
        rows = [(e, c) for e, c in p.categories.items()]
        rows += [(e, None) for e in p.uncast]
        rows += [(e, c) for e, c in INFORMAL.get(name, {}).items()]
        for entry, cat in rows:
            for key in cases_for(entry):
                out.append(pytest.param(name, entry, cat, key, id=f"{name}-{key}"))
    return out


# Every policy's kernels registered up front: an op registered for one policy
# and unlisted in the active one must still let its inner ops autocast
# (regression: the kernel used to run such ops with AutocastXLA excluded).
for _name in policies.names():
    xla_amp._engine.compile(policies.get(_name))

PARAMS = raw_params()


def input_dtypes(category, n):
    if category == "lower_precision_fp" or category == "banned":
        return [torch.float32] * n
    if category == "promote":
        return [LOW] + [torch.float32] * (n - 1)
    return [LOW] * n           # fp32 classes and uncast ops: start low


def build(key, in_dtypes, make):
    """Case inputs (seeded), converted to in_dtypes and placed by `make`."""
    case = CASES[key]
    torch.manual_seed(0)
    floats = [make(t.to(d)) for t, d in zip(case.inputs(), in_dtypes)]
    extra = [make(t) for t in case.extra()]
    return case, floats, extra


def build_for(category, key, device):
    """`build` on `device`, inputs in the dtypes that exercise `category`."""
    return build(key, input_dtypes(category, len(CASES[key].inputs())), lambda t: t.to(device))


def build_float32(key, device):
    """`build` on `device`, every floating input in float32."""
    return build(key, [torch.float32] * len(CASES[key].inputs()), lambda t: t.to(device))


def tensors(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    out = []
    for r in result:
        if isinstance(r, (torch.Tensor, tuple, list)):
            out.extend(tensors(r))
    return out


def manual_cast(category, floats, dtype):
    if category == "lower_precision_fp":
        target = dtype
    elif category in ("fp32", "fp32_set_opt_dtype", "fp32_append_dtype"):
        target = torch.float32
    elif category == "promote":
        target = dtype
        for t in floats:
            if t.dtype == torch.float32:
                target = torch.float32
        return [t.to(target) for t in floats]
    else:
        return floats
    return [t.to(target) for t in floats]


def seed():
    torch.manual_seed(1)
    xm.set_rng_state(1)


def run_xla(device, policy, category, key, dtype):
    case, floats, extra = build_for(category, key, device)
    seed()
    with xla_amp.autocast(device, policy=policy, dtype=dtype):
        got = tensors(case.call(*floats, *extra))
    seed()
    cast = manual_cast(category, floats, dtype)
    target = next((t.dtype for t in cast if t.is_floating_point()), None)
    want = tensors(case.control(target)(*cast, *extra))
    return got, want


# Kernels that are not bit-reproducible run to run on XLA:CPU (a LAPACK CPU
# fallback): compared to 1e-6 instead of bit for bit.
NONDETERMINISTIC = {"aten::linalg_lstsq"}


def assert_bitwise(got, want, key=""):
    if key in NONDETERMINISTIC:
        assert [t.dtype for t in got] == [t.dtype for t in want]
        for g, w in zip(got, want):
            torch.testing.assert_close(g.cpu(), w.cpu(), rtol=0, atol=1e-6)
        return
    assert [t.dtype for t in got] == [t.dtype for t in want]
    for g, w in zip(got, want):
        g, w = g.cpu(), w.cpu()
        assert g.shape == w.shape
        if g.is_complex():
            g, w = torch.view_as_real(g), torch.view_as_real(w)
        assert torch.equal(g.isnan(), w.isnan())
        # bit equality: the same values in the same dtype (NaNs where NaNs)
        assert torch.equal(g[~g.isnan()], w[~w.isnan()]) if g.is_floating_point() \
            else torch.equal(g, w)



# Ops a policy lists that cannot conform on XLA (docs/policies.md says why).
_NO_XLA_KERNEL = ("XLA has no kernel for it and its CPU fallback has none either "
                  "(the fused cell kernels exist for CUDA only)")
NON_CONFORMANT: dict[str, dict[str, str]] = {
    "cuda": {"aten::_thnn_fused_gru_cell": _NO_XLA_KERNEL,
             "aten::_thnn_fused_lstm_cell": _NO_XLA_KERNEL},
    "xpu": {"aten::_thnn_fused_gru_cell": _NO_XLA_KERNEL},
    "cpu": {"aten::_grid_sampler_2d_cpu_fallback":
            "PyTorch/XLA 2.9 crashes the process (segmentation fault) on this op, "
            "with or without autocast"},
}
CRASHES = {"aten::_grid_sampler_2d_cpu_fallback"}
NON_CONFORMANT["cpu"]["aten::linalg_cond.p_str"] = (
    "PyTorch/XLA 2.9 fails on torch.linalg.cond with a string order (a broadcast "
    "shape error), in float32 and without autocast")
RAISES = {"aten::linalg_cond.p_str": (RuntimeError, "broadcast shape")}


def _host_has_bf16_lstm() -> bool:
    """Whether this CPU's oneDNN builds a bfloat16 LSTM primitive. On CPUs
    without AVX-512 (e.g. an AVX2-only AMD EPYC) torch 2.9 raises "could
    not create a primitive descriptor for the LSTM forward propagation
    primitive" for a bf16 mkldnn_rnn_layer -- in plain CPU eager, with or
    without autocast -- so the op's reference cannot be computed there."""
    from tests.support.conformance_cases import CASES
    args = [t.to(torch.bfloat16) for t in CASES["aten::mkldnn_rnn_layer"].inputs()]
    try:
        CASES["aten::mkldnn_rnn_layer"].call(*args)
    except RuntimeError as e:
        if "primitive descriptor for the LSTM" in str(e):
            return False
        raise
    return True


# Ops whose bf16 reference this host cannot compute (a property of the CPU,
# not of XLA or the policy): their conformance cases are skipped with the
# reason, and test_conformance.py pins that plain CPU eager still raises.
_NO_BF16_LSTM = ("this host's CPU has no oneDNN bfloat16 LSTM primitive (no AVX-512): "
                 "torch 2.9 raises in plain CPU eager, so there is no reference to conform to")
HOST_LIMITS: dict[str, str] = {} if _host_has_bf16_lstm() else {
    "aten::mkldnn_rnn_layer": _NO_BF16_LSTM, "aten::lstm.input": _NO_BF16_LSTM}
# Host limits of torch.autocast("cpu")'s reference alone: XLA runs the op
# without oneDNN (lstm.input reaches mkldnn_rnn_layer on a CPU only;
# docs/policies.md, "Recurrent networks").
CPU_REFERENCE_ONLY = frozenset({"aten::lstm.input"})


def skipped(policy: str, key: str, category: str, cpu_reference: bool = False) -> str | None:
    """Why the conformance case (`policy`, `key`, `category`) is not run
    here, or None: listed as non-conformant, or computed in bfloat16 where
    this host cannot (`cpu_reference`: in torch.autocast("cpu")'s run)."""
    limited = category == "lower_precision_fp" and (
        cpu_reference or key not in CPU_REFERENCE_ONLY)
    return NON_CONFORMANT.get(policy, {}).get(key) or (
        HOST_LIMITS.get(key) if limited else None)
