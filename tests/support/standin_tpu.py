"""A stand-in PrivateUse1 device named "tpu", backed by the CPU, in Python.

For testing xla_amp's PrivateUse1 engine where no TPU (and no TorchTPU
device) exists. A tensor on it is a wrapper subclass holding a CPU tensor:
its dispatch keys are PrivateUse1's (AutocastPrivateUse1 and
AutogradPrivateUse1 included), so autocast and autograd treat it as a "tpu"
tensor; below autograd every op unwraps, runs on the CPU and wraps. Factory
calls that name the device (torch.zeros(..., device="tpu")) reach a boxed
PrivateUse1 fallback that does the same.

Like TorchTPU 0.2.0, the device has no kernels for the GradScaler's two ops
(``_amp_foreach_non_finite_check_and_unscale_``, ``_amp_update_scale_``):
they raise NotImplementedError unless someone registered a PrivateUse1
kernel for them (xla_amp's engine does, where the device lacks them).

    from tests.support import standin_tpu
    standin_tpu.install()          # once per process; renames PrivateUse1 "tpu"
    x = torch.randn(4, 4).to("tpu")

Installing renames PyTorch's PrivateUse1 backend for the whole process, so
the tests that use it run in a process of their own or in tests/privateuse1
(tests/conftest.py keeps that folder's modules away from torchax's).
"""
from __future__ import annotations

import types

import torch
from torch.utils._pytree import tree_map

NAME = "tpu"
MISSING = {"aten::_amp_foreach_non_finite_check_and_unscale_", "aten::_amp_update_scale_"}
_libs: list = []


def _device():
    return torch.device(NAME, 0)


class StandinTensor(torch.Tensor):
    """A "tpu" tensor: wraps a CPU tensor (``.elem``)."""

    @staticmethod
    def __new__(cls, elem: torch.Tensor, requires_grad: bool = False):
        assert not isinstance(elem, StandinTensor)
        out = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=_device(),
            requires_grad=requires_grad)
        out.elem = elem
        return out

    def __repr__(self):
        return f"StandinTensor({self.elem!r}, device='{NAME}:0')"

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name in MISSING:
            if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
                raise NotImplementedError(
                    f"Could not run '{name}' with arguments from the '{NAME}' backend "
                    "(the stand-in, like TorchTPU 0.2.0, has no kernel for it)")
            keys = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
            return func.redispatch(keys, *args, **kwargs)
        return _run_on_cpu(func, args, kwargs)


def _unwrap(v):
    if isinstance(v, StandinTensor):
        return v.elem
    if isinstance(v, torch.device) and v.type == NAME:
        return torch.device("cpu")
    return v


def _wrap(v):
    if isinstance(v, torch.Tensor) and not isinstance(v, StandinTensor):
        return StandinTensor(v)
    return v


def _run_on_cpu(func, args, kwargs):
    leaving = kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cpu"
    cargs = tree_map(_unwrap, args)
    ckw = tree_map(_unwrap, kwargs)
    if ckw.get("device") is not None and str(ckw["device"]).startswith(NAME):
        ckw["device"] = "cpu"
    out = func(*cargs, **ckw)
    if func._schema.is_mutable or func._schema.name in ("aten::set_",):
        # in place / out=: the CPU tensor inside was changed; return the wrappers
        mutated = [a for a, spec in zip(args, func._schema.arguments)
                   if spec.alias_info is not None and spec.alias_info.is_write]
        mutated += [kwargs[s.name] for s in func._schema.arguments
                    if s.alias_info is not None and s.alias_info.is_write and s.name in kwargs]
        if len(mutated) == 1 and isinstance(out, torch.Tensor):
            return mutated[0]
    return out if leaving else tree_map(_wrap, out)  # .cpu(), .to("cpu"): a CPU tensor


def _factory_fallback(keyset, op, *args, **kwargs):
    """PrivateUse1 calls with no stand-in tensor among the arguments
    (factories with device="tpu", a CPU tensor's .to("tpu"))."""
    return _run_on_cpu(op, args, kwargs)


def _module() -> types.ModuleType:
    mod = types.ModuleType(f"torch.{NAME}")
    mod.is_available = lambda: True
    mod.device_count = lambda: 1
    mod.current_device = lambda: 0
    mod._is_in_bad_fork = lambda: False
    mod.manual_seed_all = lambda seed: None
    mod.get_amp_supported_dtype = lambda: [torch.bfloat16, torch.float16, torch.float32]
    mod.is_bf16_supported = lambda including_emulation=True: True
    return mod


def install() -> None:
    """Make "tpu" the stand-in device in this process (idempotent)."""
    if _libs:
        return
    current = torch._C._get_privateuse1_backend_name()
    if current != "privateuseone":
        raise RuntimeError(f"PrivateUse1 is '{current}' in this process already")
    from torch.utils import backend_registration
    setup = getattr(backend_registration, "_setup_privateuseone_for_python_backend", None)
    if setup is not None:  # torch 2.11+: the device guard and hooks from Python
        setup(rename=NAME, backend_module=_module())
    else:  # torch 2.9 has no Python device guard: forward only, no autograd
        torch.utils.rename_privateuse1_backend(NAME)
        torch._register_device_module(NAME, _module())
    lib = torch.library.Library("_", "IMPL")
    lib.fallback(_factory_fallback, "PrivateUse1", with_keyset=True)
    _libs.append(lib)


def to_device(module_or_tensor):
    """On the stand-in device (an explicit index: torch 2.9 cannot look one up)."""
    return module_or_tensor.to(_device())
