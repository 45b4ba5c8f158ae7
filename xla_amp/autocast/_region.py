"""`autocast`: torch.autocast for XLA devices, driven by a policy.

    with autocast(device):                       # policy from the hardware
    with autocast(device, policy="cuda"):        # another system's rules
    @autocast(device)                            # decorator
    with autocast(device, record=True) as ac:    # ac.report(): what ran in which dtype
    with autocast(device, fp32_matmul_precision="highest")   # see _matmul_precision.py

Algorithm::

    new:    engines.for_device(device): another engine's device ("tpu", "jax")
            -> that engine's region, with the same arguments
    build:  (same arguments as a region built before -> reuse its checked state)
            RegionArgs.check / resolve (engines/_arguments.py), with the
            default policy policies.for_hardware(xla_device_hw(device))
            _matmul_precision.claim(the policy's effective precision): torch_xla
                has one per process; a request it cannot honour is refused here
    enter:  one native call: save the thread's XLA autocast state, push the
            policy on this thread's stack, set enabled/dtype/cache, nest
            (torch.export's pre-dispatch trace is told, as for torch.autocast)
    exit:   one native call: restore what that enter saved, pop; also on
            exceptions, and per entry when one object is entered recursively
    record: enter also gives the thread a fresh engine recorder (kept by
            nested regions) and module hooks name the innermost module;
            exit restores the previous recorder and adds this region's rows
            to it (an enclosing recording region reports all that ran inside
            it, nested recording regions included); report() reads the rows
"""
from __future__ import annotations

import torch

from xla_amp import _engine, engines, policies
from xla_amp.autocast import _matmul_precision
from xla_amp.numerics import _recording
from xla_amp.numerics._report import PrecisionReport
from xla_amp.engines._arguments import RegionArgs
from xla_amp.policies._policy import Policy

_ARGUMENTS = ("enabled", "dtype", "cache_enabled", "policy", "record", "fp32_matmul_precision")

# Regions built before: the arguments (types included, so enabled=1 is not
# enabled=True) and the registry generation -> the checked instance state.
# A training loop builds the same region every step; this skips the checks,
# the policy lookup and torch.amp.autocast's own __init__ (half the cost of
# a region, measured by benchmarks/trace_cost.py).
_built: dict[tuple, tuple] = {}
_BUILT_MAX = 64


def _xla_device(device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"autocast: {device!r} is not a device") from None


def _hardware_policy(dev: torch.device) -> Policy:
    import torch_xla.core.xla_model as xm
    return policies.for_hardware(xm.xla_device_hw(dev))


def set_default_policy(policy: str | Policy | None) -> None:
    """The policy plain ``torch.autocast("xla")`` uses on threads with no
    ``xla_amp.autocast`` region open (``xla_amp.autocast`` itself follows
    its device or its ``policy=``): a policy name, a `Policy`, or None to go
    back to choosing by the device's hardware. Takes effect for
    every thread at once; raises before changing anything on a bad value."""
    if policy is None:
        _engine.set_default_policy(None)
        return
    if isinstance(policy, str):
        policy = policies.get(policy)
    elif not isinstance(policy, Policy):
        raise TypeError(f"set_default_policy: expected a policy name, a Policy or None, "
                        f"got {type(policy).__name__}")
    _engine.set_default_policy(policy)


class autocast(torch.amp.autocast):
    """Autocast for an XLA device; see the module docstring.

    A subclass of ``torch.amp.autocast`` for device type ``"xla"``, so
    ``torch.is_autocast_enabled("xla")`` and ``torch.get_autocast_dtype("xla")``
    report it; nesting, ``enabled=False`` and per-thread state behave alike.
    """

    def __new__(cls, device=None, *args, **kwargs):
        # the engine serving the device (engines.for_device): a PrivateUse1
        # device ("tpu" under TorchTPU) or torchax's "jax" gets that engine's region
        # (an XLA device where torch_xla's engine is loaded, every step of a
        # training loop: no lookup)
        if cls is autocast and not (_engine.TORCH_XLA and _is_xla(device)):
            engine = engines.default() if device is None else engines.for_device(device, "autocast")
            if engine.name != "torch_xla":
                return engine.region(device, **_keywords(args, kwargs))
            engine.require("xla_amp.autocast on an XLA device")
        return super().__new__(cls)

    def __init__(self, device, enabled: bool = True, dtype: torch.dtype | None = None,
                 cache_enabled: bool = True, policy: str | Policy | None = None,
                 record: bool = False, fp32_matmul_precision: str | None = None):
        try:
            key = (device, type(device), enabled, type(enabled), dtype, cache_enabled,
                   type(cache_enabled), policy, type(policy), record, type(record),
                   fp32_matmul_precision, type(fp32_matmul_precision), policies._generation)
            built = _built.get(key)
        except TypeError:  # an unhashable argument: the checks below name it
            key = built = None
        if built is not None:
            # attribute by attribute, in __init__'s order: the instance keeps
            # CPython's shared-key layout (a __dict__.update makes __enter__ slower)
            for name, value in built:
                setattr(self, name, value)
            return
        self._build(device, enabled, dtype, cache_enabled, policy, record, fp32_matmul_precision)
        if key is not None and self._enabled == enabled:  # not a warned, disabled region
            if len(_built) >= _BUILT_MAX:
                _built.clear()
            _built[key] = tuple(self.__dict__.items())

    def _build(self, device, enabled, dtype, cache_enabled, policy, record, precision):
        args = RegionArgs.check("autocast", enabled, dtype, cache_enabled, policy, record,
                                precision)
        self.xla_device = _xla_device(device)
        if self.xla_device.type != "xla":
            engine = engines.for_device(self.xla_device, "autocast")  # none: the one line
            raise ValueError(f"autocast: device '{self.xla_device}' is served by xla_amp's "
                             f"{engine.name} engine; pass it to xla_amp.autocast")
        default = _hardware_policy(self.xla_device) if args.policy is None else None
        self.policy, dtype, enabled = args.resolve(default)
        super().__init__("xla", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        self._table = _engine.compile(self.policy)  # bad policies fail here, not on enter
        if enabled:
            _matmul_precision.claim(self.policy.effective_fp32_matmul_precision(),
                                    self.policy.name, self.policy.fp32_matmul_precision_requested)
        self._record = record
        self._recorder = None

    def report(self):
        """The `PrecisionReport` of this region's latest entry (``record=True``):
        every decision the engine made inside it, per innermost module. Call it
        after the region (or inside, for what ran so far); no device work."""
        return PrecisionReport.of_region(self)

    # torch.amp.autocast's __enter__/__exit__ make eight calls into torch and
    # read their saved state back from the instance; here one native call
    # each does the same and keeps that state per thread (see region.h).
    def __enter__(self):
        if self._record:
            self._begin_recording()
        _engine.enter_region(self._table, self._enabled, self.fast_dtype, self._cache_enabled)
        if torch._C._is_torch_function_mode_enabled():
            try:
                _tell_pre_dispatch_mode(torch.amp._enter_autocast, (
                    self.device, self.fast_dtype, self._enabled, self._cache_enabled))
            except BaseException:
                self._leave()
                raise
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self._leave()
        if torch._C._is_torch_function_mode_enabled():
            _tell_pre_dispatch_mode(torch.amp._exit_autocast, ())
        return False

    def _leave(self):
        _engine.exit_region()
        if self._record:
            _recording.end(self._previous_recorders.pop())

    def _begin_recording(self):
        # per entry, so a region object entered again (or recursively) records afresh
        self._recorder = _engine.Recorder()
        self.__dict__.setdefault("_previous_recorders", []).append(
            _recording.begin(self._recorder))


def _is_xla(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "xla"
    return isinstance(device, str) and device.split(":")[0] == "xla"


def _keywords(args: tuple, kwargs: dict) -> dict:
    """autocast's positional arguments after the device, by name (another
    engine's region takes them as keywords)."""
    if len(args) > len(_ARGUMENTS):
        raise TypeError(f"autocast: takes at most {len(_ARGUMENTS) + 1} positional arguments")
    named = dict(zip(_ARGUMENTS, args))
    twice = sorted(set(named) & set(kwargs))
    if twice:
        raise TypeError(f"autocast: got multiple values for argument {twice[0]!r}")
    return {**named, **kwargs}


def _tell_pre_dispatch_mode(fn, args) -> None:
    """torch.export's pre-dispatch tracing records autocast regions as graph
    nodes: hand it the enter/exit as torch.amp.autocast does (only that mode
    is told; other torch-function modes never see regions)."""
    from torch.fx.experimental.proxy_tensor import PreDispatchTorchFunctionMode
    for mode in torch.overrides._get_current_function_mode_stack():
        if isinstance(mode, PreDispatchTorchFunctionMode):
            mode.__torch_function__(fn, (), args)
            return
