"""The torchax backend casts like the torch_xla engine: for every op case of
the generated op tables, under the tpu, cuda and cpu policies, the output
dtypes under ``xla_amp.torchax.autocast`` equal those under
``xla_amp.autocast`` on XLA:CPU for the same inputs (integers as JAX types
them). What torchax itself cannot run is pinned in tests.support.torchax."""
from __future__ import annotations

import pytest
import torch

import tests.support.conformance as hc
from tests.support.torchax import DIRECT_COMPOSITE_CALLS, ENV, JAX_DTYPE, TORCHAX_CANNOT_RUN, to_jax

import xla_amp
import xla_amp.torchax as xt

pytestmark = pytest.mark.torchax
POLICIES = ("tpu", "cuda", "cpu")
PARAMS = hc.raw_params(POLICIES)


def _dtypes(result):
    return [JAX_DTYPE.get(t.dtype, t.dtype) for t in hc.tensors(result)]


def _inputs(key, category):
    return hc.build(key, hc.input_dtypes(category, len(hc.CASES[key].inputs())), lambda t: t)


def _run_xla(device, policy, key, category):
    case, floats, extra = _inputs(key, category)
    torch.manual_seed(1)
    with xla_amp.autocast(device, policy=policy, dtype=hc.LOW):
        return _dtypes(case.call(*[t.to(device) for t in floats], *[t.to(device) for t in extra]))


def _run_torchax(policy, key, category, autocast=True):
    case, floats, extra = _inputs(key, category)
    if not autocast:
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


@pytest.mark.parametrize("key", sorted(TORCHAX_CANNOT_RUN))
def test_pinned_torchax_limits_still_fail_without_autocast(key):
    """Each pinned op fails in plain float32 torchax, autocast off: a torchax
    that learns it fails this test, and the op joins the parity test."""
    with pytest.raises(Exception) as info:
        _run_torchax("cpu", key, "fp32", autocast=False)
    assert type(info.value).__name__ == TORCHAX_CANNOT_RUN[key], repr(info.value)


def test_every_policy_entry_is_covered():
    """Each policy's entries either run in the parity test or are pinned."""
    keys = {p.values[3] for p in PARAMS}
    assert keys, "no parity cases"
    assert set(TORCHAX_CANNOT_RUN) <= keys | {"aten::vander"}


@pytest.mark.parametrize("key", sorted(DIRECT_COMPOSITE_CALLS))
def test_pinned_direct_composite_overload_calls(key):
    """The limit of the backend, pinned: these direct overload calls are not
    cast (so their bf16 input fails inside the decomposition)."""
    with pytest.raises(Exception) as info:
        _run_torchax("cpu", key, "fp32")
    assert type(info.value).__name__ == DIRECT_COMPOSITE_CALLS[key], repr(info.value)
