"""The torchax backend casts like the torch_xla engine: for every overload of
every op the policy tables name (not only the overloads an entry names:
``pow.Tensor_Tensor`` under "tpu", which lists ``pow.Tensor_Scalar``), and
for the Python-level names of the documents, under the tpu, cuda and cpu
policies, the output dtypes under ``xla_amp.torchax.autocast`` equal those
under ``xla_amp.autocast`` on XLA:CPU for the same inputs (integers as JAX
types them). An overload a policy does not list runs twice, from
low-precision and from float32 inputs (SDPA on float32 inputs under "tpu").
What torchax itself cannot run is pinned in tests.support.torchax_env."""
from __future__ import annotations

import pytest
import torch

import tests.support.conformance as hc
from tests.support.overload_cases import NAMED, OVERLOAD_CASES, UNREACHABLE, named
from tests.support.torchax_env import (DIRECT_COMPOSITE_CALLS, ENV, JAX_DTYPE, KNOWN_DIFFERENCES,
                                   TORCHAX_CANNOT_RUN, to_jax)

import xla_amp
import xla_amp.torchax as xt
from xla_amp import policies
from xla_amp.policies import _ops as ops
from xla_amp.torchax._rules import dispatched

pytestmark = pytest.mark.torchax
POLICIES = ("tpu", "cuda", "cpu")
PARAMS = [p for p in hc.raw_params(POLICIES) if p.values[3].startswith("py::")]
CASES = {**hc.CASES, **OVERLOAD_CASES}


def table_overloads() -> list[str]:
    """Every overload the dispatcher has of every op a built-in policy names."""
    out = set()
    for name in policies.builtin_names():
        policy = policies.get(name)
        for entry in [*policy.categories, *policy.uncast]:
            ns, base, _ = ops.split(entry)
            out.update(dispatched(ops.overloads(f"{ns}::{base}")))
    return sorted(out)


def _sweep_keys() -> list[str]:
    """Every table overload with a case, and every case the conformance
    tests run for a table entry (some call their op by its base name)."""
    keys = {o for o in table_overloads() if o in CASES}
    for name in policies.builtin_names():
        policy = policies.get(name)
        for entry in [*policy.categories, *policy.uncast]:
            keys.update(hc.cases_for(entry))
    return sorted(keys)


def _sweep_params():
    out = []
    for name in POLICIES:
        policy = policies.get(name)
        expanded = policy.expanded()
        for key in _sweep_keys():
            category = expanded.get(key) or policy.categories.get(key)
            for start in ((None,) if category else (hc.LOW, torch.float32)):
                tag = "" if start is None else f"-from-{str(start)[6:]}"
                out.append(pytest.param(name, category, key, start, id=f"{name}-{key}{tag}"))
    return out


SWEEP = _sweep_params()


def _dtypes(result):
    return [JAX_DTYPE.get(t.dtype, t.dtype) for t in hc.tensors(result)]


def _inputs(key, category, start=None):
    n = len(CASES[key].inputs())
    in_dtypes = hc.input_dtypes(category, n) if start is None else [start] * n
    case = CASES[key]
    torch.manual_seed(0)
    floats = [t.to(d) for t, d in zip(case.inputs(), in_dtypes)]
    return case, floats, list(case.extra())


def _run_xla(device, policy, key, category, start=None):
    case, floats, extra = _inputs(key, category, start)
    torch.manual_seed(1)
    with xla_amp.autocast(device, policy=policy, dtype=hc.LOW):
        return _dtypes(case.call(*[t.to(device) for t in floats], *[t.to(device) for t in extra]))


def _run_torchax(policy, key, category, autocast=True, start=None):
    case, floats, extra = _inputs(key, category, start)
    if not autocast and start is None:
        floats = [t.float() for t in floats]
    with ENV:
        args = to_jax(floats) + to_jax(extra)
        with xt.autocast("jax", policy=policy, dtype=hc.LOW, enabled=autocast):
            return _dtypes(case.call(*args))


@pytest.mark.parametrize("policy,entry,category,key", PARAMS)
def test_output_dtypes_match_the_torch_xla_engine(device, policy, entry, category, key):
    if hc.skipped(policy, key, category) or key in hc.CRASHES:
        pytest.skip(hc.skipped(policy, key, category) or "crashes PyTorch/XLA")
    if key in TORCHAX_CANNOT_RUN:
        pytest.skip(f"torchax 0.0.13 cannot run it ({TORCHAX_CANNOT_RUN[key]}); pinned below")
    if key in DIRECT_COMPOSITE_CALLS:
        pytest.skip("a composite aten overload called directly: decomposed before torchax "
                    "sees it; pinned below")
    if category == "banned":
        with pytest.raises(RuntimeError, match="banned in autocast regions"):
            _run_torchax(policy, key, category)
        return
    assert _run_torchax(policy, key, category) == _run_xla(device, policy, key, category)


def _not_run(policy, key, category):
    """Why the case (`policy`, `key`, `category`) is not compared, or None."""
    if hc.skipped(policy, key, category) or key in hc.CRASHES:
        return hc.skipped(policy, key, category) or "crashes PyTorch/XLA"
    if key in TORCHAX_CANNOT_RUN:
        return f"torchax 0.0.13 cannot run it ({TORCHAX_CANNOT_RUN[key]}); pinned below"
    if key in DIRECT_COMPOSITE_CALLS:
        return "a composite aten overload called directly: decomposed first; pinned below"
    if key in hc.RAISES:
        return "torch_xla itself raises on it (pinned: tests.support.conformance.RAISES)"
    return None


@pytest.mark.parametrize("policy,category,key,start", SWEEP)
def test_every_overload_matches_the_torch_xla_engine(device, policy, category, key, start):
    if _not_run(policy, key, category):
        pytest.skip(_not_run(policy, key, category))
    if category == "banned":
        with pytest.raises(RuntimeError, match="banned in autocast regions"):
            _run_torchax(policy, key, category)
        return
    try:
        got = _run_torchax(policy, key, category, start=start)
    except Exception as refused:  # noqa: BLE001 - compared by type below
        if start is None:
            raise
        # in no category: the op's own refusal of these inputs on torchax
        # (JAX has no bfloat16 LAPACK or FFT), which plain torchax gives too
        with pytest.raises(type(refused)):
            _run_torchax(policy, key, category, autocast=False, start=start)
        return
    try:
        want = _run_xla(device, policy, key, category, start)
    except Exception:  # noqa: BLE001 - torch_xla's CPU fallback refuses these
        if start is None:  # inputs (no bfloat16 LAPACK kernel): autocast must
            raise          # leave the op in no category as plain torchax runs it
        want = _run_torchax(policy, key, category, autocast=False, start=start)
    if (policy, key, start) in KNOWN_DIFFERENCES:  # pinned: a change shows here
        assert got != want, f"now equal: remove {key} from KNOWN_DIFFERENCES"
        return
    assert got == want


def test_every_table_overload_has_a_case():
    """The sweep's list is generated from the tables: every overload has a
    case, or takes a named tensor (which neither backend runs)."""
    missing = {o for o in table_overloads() if o not in CASES}
    assert {o for o in missing if not named(o)} - set(UNREACHABLE) == set()
    assert len(SWEEP) > 3 * len(table_overloads()) - 3 * len(missing), len(SWEEP)
    print(f"{len(missing)} named-tensor overloads have no case ({NAMED})")


@pytest.mark.parametrize("key", sorted(TORCHAX_CANNOT_RUN))
def test_pinned_torchax_limits_still_fail_without_autocast(key):
    """Each pinned op fails in plain float32 torchax, autocast off: a torchax
    that learns it fails this test, and the op joins the parity test."""
    with pytest.raises(Exception) as info:
        _run_torchax("cpu", key, "fp32", autocast=False)
    assert type(info.value).__name__ == TORCHAX_CANNOT_RUN[key], repr(info.value)


def test_every_policy_entry_is_covered():
    """Each policy's entries either run in the parity test or are pinned."""
    keys = {p.values[2] for p in SWEEP}
    assert keys, "no parity cases"
    assert set(TORCHAX_CANNOT_RUN) <= keys | {"aten::vander"}


@pytest.mark.parametrize("key", sorted(DIRECT_COMPOSITE_CALLS))
def test_pinned_direct_composite_overload_calls(key):
    """The limit of the backend, pinned: these direct overload calls are not
    cast (so their bf16 input fails inside the decomposition)."""
    with pytest.raises(Exception) as info:
        _run_torchax("cpu", key, "fp32")
    assert type(info.value).__name__ == DIRECT_COMPOSITE_CALLS[key], repr(info.value)
