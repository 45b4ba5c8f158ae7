"""`autocast`: torch.autocast for XLA devices, driven by a policy.

    with autocast(device):                       # policy from the hardware
    with autocast(device, policy="cuda"):        # another system's rules
    @autocast(device)                            # decorator

Algorithm (enter)::

    policy = policy arg | policies.for_hardware(xla_device_hw(device))
    dtype  = dtype arg  | policy.default_dtype
    if dtype not in policy.supported_dtypes: warn once, enabled = False
    push policy on this thread's stack; torch.autocast("xla", dtype) enters
    (exit: torch.autocast exits, the policy stack pops; also on exceptions)
"""
from __future__ import annotations

import warnings

import torch

from xla_amp import _engine, policies
from xla_amp.policies._policy import Policy

_warned: set[tuple[str, torch.dtype]] = set()


def _xla_device(device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"autocast: {device!r} is not a device") from None
    if dev.type != "xla":
        raise ValueError(
            f"autocast: device '{dev}' is not an XLA device; pass an XLA device "
            "such as torch_xla.device() or 'xla:0' (use torch.autocast for others)")
    return dev


def _policy_for(dev: torch.device, policy) -> Policy:
    if policy is None:
        import torch_xla.core.xla_model as xm
        return policies.for_hardware(xm.xla_device_hw(dev))
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, str):
        return policies.get(policy)
    raise TypeError(f"autocast: policy must be a name or a Policy, got {type(policy).__name__}")


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

    def __init__(self, device, enabled: bool = True, dtype: torch.dtype | None = None,
                 cache_enabled: bool = True, policy: str | Policy | None = None):
        self.xla_device = _xla_device(device)
        for name, value in (("enabled", enabled), ("cache_enabled", cache_enabled)):
            if not isinstance(value, bool):
                raise ValueError(f"autocast: {name} must be a bool, got {value!r}")
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(
                f"autocast: dtype must be a floating torch.dtype (torch.bfloat16, "
                f"torch.float16) or None, got {dtype!r}")
        self.policy = _policy_for(self.xla_device, policy)
        if dtype is None:
            dtype = self.policy.default_dtype
        if enabled and dtype not in self.policy.supported_dtypes:
            key = (self.policy.name, dtype)
            if key not in _warned:
                _warned.add(key)
                warnings.warn(
                    f"xla_amp.autocast: policy {self.policy.name!r} does not support "
                    f"{dtype} (supported: {', '.join(map(str, self.policy.supported_dtypes))});"
                    " autocast is disabled for this region", stacklevel=2)
            enabled = False
            dtype = self.policy.default_dtype
        super().__init__("xla", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        self._table = _engine.compile(self.policy)  # bad policies fail here, not on enter

    def __enter__(self):
        _engine.push_compiled(self._table)
        try:
            return super().__enter__()
        except BaseException:
            _engine.pop()
            raise

    def __exit__(self, exc_type, exc_val, exc_tb):
        try:
            return super().__exit__(exc_type, exc_val, exc_tb)
        finally:
            _engine.pop()
