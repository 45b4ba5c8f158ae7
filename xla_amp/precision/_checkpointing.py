"""Activation checkpointing recomputes under the region's policy.

torch.utils.checkpoint (Transformers' gradient checkpointing, and
hand-written code under any framework) and torch_xla.utils.checkpoint run a block's forward once
without saving activations and again in the backward pass. The second run
happens after the autocast region has closed, on autograd's thread: they
restore autocast's enabled/dtype/cache by entering plain
``torch.autocast("xla", ...)``, which runs the default policy (the device's,
or set_default_policy's), not the region's. Under any other policy
(``policy="cuda"`` forced, a `Policy` with overrides, a module policy's
region around the call) the recomputed activations, and so every gradient
behind them, silently came from other casts (torch.utils.checkpoint's
non-reentrant form noticed the dtypes and raised; the reentrant forms did
not).

Algorithm::

    checkpoint(function, *args) called inside a region (the hooks below):
        recorded = _replay.record(the arguments' device type)   # the region's policy
                   + autocast's enabled, dtype, cache for that device type
        function -> in_region(function):
            call: with torch.amp.autocast(recorded state), _replay.replaying(recorded):
                      function(...)
    the forward call: the same policy pushed again (no change)
    the recompute:    autocast's enabled/dtype/cache as recorded (torch's own
                      restore misses them when the tensors come by keyword),
                      then the recorded policy: the forward's casts, bit for bit

Hooks (torch's internals, checked at install; ImportError names a missing
one): ``torch.utils.checkpoint.CheckpointFunction`` (reentrant), the
non-reentrant form's generator (torch 2.9's
``_checkpoint_without_reentrant_generator``, torch 2.15's ``..._impl``) and,
with torch_xla, ``torch_xla.utils.checkpoint.CheckpointFunction``. Both
engines: the torch_xla one ("xla") and the PrivateUse1 one (TorchTPU's
"tpu", torch 2.11+).
Callers that bound the generator at import (torch.distributed's composable
``checkpoint(module)``) are not reached.
"""
from __future__ import annotations

import functools
import inspect
import types

import torch

from xla_amp.precision import _replay

_installed = False
_with_torch_xla = False  # install(torch_xla=True): the torch_xla engine is this process's


def _device_type(args, kwargs) -> str | None:
    """The device type whose policy to record: the first of the arguments'
    (keyword arguments too, unlike torch's own inference, which falls back to
    "cuda") that an xla_amp engine runs, else "xla" where torch_xla's engine
    is loaded, else None."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and _replay.engine_for(value.device.type):
            return value.device.type
    return "xla" if _with_torch_xla else None


def _xla_seed(args, kwargs):
    """(device, seed now) of the first XLA tensor among the arguments."""
    import torch_xla.core.xla_model as xm
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.device.type == "xla":
            return str(value.device), xm.get_rng_state(str(value.device))
    return None


def in_region(function, args, kwargs=None, keep_seed=False):
    """`function`, running in the autocast region active now for its
    arguments' device: autocast's enabled/dtype/cache (torch restores them
    only for the device type it infers from positional arguments) and the
    policy (unchanged where no policy is active). `keep_seed` (a recompute
    torch keeps no XLA seed for): each call also starts from the XLA seed
    of now, and leaves the generator as it found it."""
    if torch.compiler.is_compiling():  # traced code: the casts are in the trace already
        return function
    kwargs = kwargs or {}
    device_type = _device_type(args, kwargs)
    recorded = None if device_type is None else _replay.record(device_type)
    if recorded is None:
        return function
    state = {"enabled": torch.is_autocast_enabled(device_type),
             "dtype": torch.get_autocast_dtype(device_type),
             "cache_enabled": torch.is_autocast_cache_enabled()}
    seed = _xla_seed(args, kwargs) if keep_seed and device_type == "xla" else None

    def replay(*a, **k):
        with torch.amp.autocast(device_type, **state), _replay.replaying(recorded):
            if seed is None:
                return function(*a, **k)
            import torch_xla.core.xla_model as xm
            with xm.fork_rng(seed[0]):
                xm.set_rng_state(seed[1], seed[0])
                return function(*a, **k)

    owner = getattr(function, "__self__", None)
    if inspect.ismethod(function) and isinstance(owner, torch.nn.Module):
        # torch_xla's checkpoint reads a bound module method's parameters for
        # its optimization barrier: stay a method of the same module
        return types.MethodType(lambda _self, *a, **k: replay(*a, **k), owner)
    return replay


def _replaying_function(base):
    class Replaying(base):
        @classmethod
        def apply(cls, function, preserve_rng_state, *args):
            return super().apply(in_region(function, args), preserve_rng_state, *args)

    Replaying.__name__ = Replaying.__qualname__ = base.__name__
    Replaying.__module__ = base.__module__
    return Replaying


def _without_reentrant_hook(torch_checkpoint) -> tuple[str, object]:
    """(name, wrapper) for the non-reentrant form's generator: torch 2.15's
    ``_checkpoint_without_reentrant_generator_impl(fn, args, kwargs, *, ...)``
    (its older name is a shim over it), else torch 2.9's
    ``_checkpoint_without_reentrant_generator(fn, ..., *args, **kwargs)``."""
    impl = getattr(torch_checkpoint, "_checkpoint_without_reentrant_generator_impl", None)
    if impl is not None:
        @functools.wraps(impl)
        def without_reentrant_impl(fn, args, kwargs, **config):
            return impl(in_region(fn, args, kwargs, _keeps_xla_seed(config, args)), args,
                        kwargs, **config)
        return "_checkpoint_without_reentrant_generator_impl", without_reentrant_impl
    generator = torch_checkpoint._checkpoint_without_reentrant_generator
    signature = inspect.signature(generator)
    varargs = [p.name for p in signature.parameters.values() if p.kind is p.VAR_POSITIONAL]
    if len(varargs) != 1:
        raise AttributeError("_checkpoint_without_reentrant_generator(..., *args)")

    @functools.wraps(generator)
    def without_reentrant(fn, *rest, **kwargs):
        bound = signature.bind(fn, *rest, **kwargs).arguments
        args = bound.get(varargs[0], ())
        return generator(in_region(fn, args, kwargs, _keeps_xla_seed(bound, args)),
                         *rest, **kwargs)
    return "_checkpoint_without_reentrant_generator", without_reentrant


def _keeps_xla_seed(config, args) -> bool:
    """torch keeps the seed of the device type it infers from positional
    tensors only ("cuda" when there are none): where that is not XLA, the
    recompute keeps the XLA one itself."""
    from torch.utils.checkpoint import _infer_device_type
    return config.get("preserve_rng_state", True) and _infer_device_type(*args) != "xla"


def install(torch_xla: bool) -> None:
    """Hooks torch's checkpoint forms, and torch_xla's where `torch_xla`
    (idempotent). Called on ``import xla_amp``, by either engine."""
    global _installed, _with_torch_xla
    if _installed:
        return
    import torch.utils.checkpoint as torch_checkpoint
    hooks = []  # (module, name, replacement): all found before any is set
    try:
        hooks.append((torch_checkpoint, "CheckpointFunction",
                      _replaying_function(torch_checkpoint.CheckpointFunction)))
        torch_checkpoint._infer_device_type  # noqa: B018
        hooks.append((torch_checkpoint, *_without_reentrant_hook(torch_checkpoint)))
        if torch_xla:
            import torch_xla.utils.checkpoint as xla_checkpoint
            hooks.append((xla_checkpoint, "CheckpointFunction",
                          _replaying_function(xla_checkpoint.CheckpointFunction)))
    except AttributeError as e:
        raise ImportError(
            f"xla_amp: this torch's activation checkpointing lacks {e}; its recompute "
            f"cannot replay xla_amp's policy (torch {torch.__version__}, tested with 2.9 "
            f"and 2.15)") from e
    for module, name, replacement in hooks:
        setattr(module, name, replacement)
    _installed, _with_torch_xla = True, torch_xla
