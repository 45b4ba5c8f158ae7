"""One entry point, every engine: ``xla_amp.autocast(device)`` picks the
engine serving the device (xla_amp.engines.for_device) and gives that
engine's region with the same arguments and the same numerics as its own
entry point; module_policies takes its engine the same way; the three
regions refuse bad arguments with one message each (engines/_arguments.py)."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from tests.support.torchax_env import ENV, to_jax

import xla_amp
import xla_amp.torchax as xt
from xla_amp import engines
from xla_amp.privateuse1._region import autocast as privateuse1_autocast

from tests.engines.test_engines import assert_implements_every_hook

pytestmark = pytest.mark.torchax


def test_torchax_devices_pick_the_torchax_engine():
    assert engines.for_device(torch.device("jax")).name == "torchax"
    with ENV:
        (x,) = to_jax([torch.ones(2)])
    assert engines.for_device(x.device).name == "torchax"


@pytest.mark.parametrize("kwargs", [{}, {"policy": "cuda", "dtype": torch.float16},
                                    {"policy": "tpu", "fp32_matmul_precision": "highest"},
                                    {"enabled": False}])
def test_xla_amp_autocast_on_jax_is_the_torchax_region(kwargs):
    face, own = xla_amp.autocast("jax", **kwargs), xt.autocast("jax", **kwargs)
    assert type(face) is type(own) is xt.autocast
    for name in ("dtype", "enabled", "backend", "fused_attention"):
        assert getattr(face, name) == getattr(own, name), name
    assert face.policy.name == own.policy.name and face.policy.categories == own.policy.categories
    assert (face.policy.effective_fp32_matmul_precision()
            == own.policy.effective_fp32_matmul_precision())
    a, b, c = to_jax([torch.randn(8, 16), torch.randn(16, 4), torch.randn(8, 16)])
    with ENV:
        outs = []
        for region in (face, own):
            with region:
                outs.append((torch.mm(a, b), torch.softmax(c, -1)))
        (mm_face, sm_face), (mm_own, sm_own) = outs
        assert mm_face.dtype == mm_own.dtype and sm_face.dtype == sm_own.dtype
        assert torch.equal(mm_face.cpu(), mm_own.cpu())
        assert torch.equal(sm_face.cpu(), sm_own.cpu())
    want = torch.float32 if kwargs.get("enabled") is False else face.dtype
    assert outs[0][0].dtype == want


def test_positional_arguments_keep_xla_amp_autocast_meaning():
    """xla_amp.autocast(device, enabled, dtype, cache_enabled, policy): the
    fifth is the policy on every engine (torchax's own region takes policy
    fourth)."""
    region = xla_amp.autocast("jax", True, torch.float16, True, "cuda")
    assert region.policy.name == "cuda" and region.dtype == torch.float16
    with pytest.raises(TypeError, match="multiple values for argument 'dtype'"):
        xla_amp.autocast("jax", True, torch.float16, dtype=torch.bfloat16)


BAD = [({"enabled": 1}, ValueError, "autocast: enabled must be a bool, got 1"),
       ({"cache_enabled": "yes"}, ValueError, "autocast: cache_enabled must be a bool, got 'yes'"),
       ({"dtype": torch.int8}, ValueError, "autocast: dtype must be a floating torch.dtype "
                                           "(torch.bfloat16, torch.float16) or None, got torch.int8"),
       ({"policy": 3}, TypeError, "autocast: policy must be a name or a Policy, got int"),
       ({"policy": "tpv"}, ValueError, "unknown autocast policy 'tpv'"),
       ({"fp32_matmul_precision": "tf32"}, ValueError,
        "autocast: fp32_matmul_precision must be one of highest, high, ")]


@pytest.mark.parametrize("bad,error,message", BAD)
def test_every_region_refuses_bad_arguments_alike(bad, error, message):
    """The same exception and message from each engine's region, before the
    device is looked at (the PrivateUse1 region has no device here)."""
    for make in (lambda: xla_amp.autocast("xla:0", **bad), lambda: xla_amp.autocast("jax", **bad),
                 lambda: xt.autocast("jax", **bad), lambda: privateuse1_autocast(None, **bad)):
        with pytest.raises(error) as caught:
            make()
        assert str(caught.value).startswith(message), str(caught.value)


def test_an_unsupported_dtype_warns_and_disables_on_every_engine():
    """fp16 under "tpu": one rule (RegionArgs.resolve) for torch_xla and torchax."""
    from xla_amp.engines import _arguments
    for device in ("xla:0", "jax"):
        _arguments._warned.discard(("tpu", torch.float16))
        with pytest.warns(UserWarning, match="policy 'tpu' does not support torch.float16"):
            region = xla_amp.autocast(device, policy="tpu", dtype=torch.float16)
        enabled = region._enabled if device == "xla:0" else region.enabled
        assert enabled is False, device


def test_module_policies_takes_the_engine_of_the_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    with ENV:
        model = model.to("jax")
        (x,) = to_jax([torch.randn(8, 16)])
        assert engines.for_module(model).name == "torchax"
        handle = xla_amp.module_policies(model, {"2": "fp32"})
        try:
            seen = {}
            for name in ("0", "2"):
                model.get_submodule(name).register_forward_hook(
                    lambda m, i, o, name=name: seen.__setitem__(name, o.dtype))
            with xla_amp.autocast("jax", policy="tpu"):
                model(x)
        finally:
            handle.remove()
    assert seen == {"0": torch.bfloat16, "2": torch.float32}, seen


def test_the_torchax_engine_implements_every_hook():
    assert_implements_every_hook(engines.get("torchax"))
