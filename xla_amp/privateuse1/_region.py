"""`autocast` for a PrivateUse1 device (TorchTPU's "tpu", or any backend
renamed from PrivateUse1), driven by an xla_amp policy.

    with xla_amp.autocast("tpu"):                  # the tpu policy, bf16
    with xla_amp.autocast("tpu", policy="cuda"):   # another system's rules, fp16

Algorithm::

    build:  the engine installed for the backend (once, _install.py)
            device type must be the PrivateUse1 backend's name, and its
            device module must see a device (TorchTPU with no TPU: refused)
            policy = policy arg | the default policy (set_default_policy,
                     else "tpu"); dtype = dtype arg | policy.default_dtype;
            a dtype the policy does not support: warn once, disabled
            table = the policy compiled (its ops' kernels registered once)
    enter:  push the table on this thread's stack, then torch.amp.autocast's
            enter for the device type (enabled, dtype, cache, nesting)
    exit:   torch.amp.autocast's exit, then pop; also on exceptions

A subclass of ``torch.amp.autocast``: ``torch.is_autocast_enabled("tpu")``
and ``torch.get_autocast_dtype("tpu")`` report it. ``record=True`` (the
precision report, ``report()``) runs on the native kernels' recorder, the
torch_xla engine's (xla_amp/numerics/_recording.py): with the Python
kernels it is refused in one line.
"""
from __future__ import annotations

import sys

import torch

from xla_amp import engines, policies
from xla_amp.engines._arguments import RegionArgs
from xla_amp.policies._policy import Policy
from xla_amp.privateuse1 import _install, _kernels

def set_default_policy(policy: str | Policy | None) -> None:
    """The policy plain ``torch.autocast(<device>)`` uses on the PrivateUse1
    device where no xla_amp region is open: a name, a Policy, or None ("tpu").
    Raises before changing anything on a bad value."""
    if policy is not None and not isinstance(policy, (str, Policy)):
        raise TypeError(f"set_default_policy: expected a policy name, a Policy or None, "
                        f"got {type(policy).__name__}")
    resolved = policies.get(policy) if isinstance(policy, str) else policy
    table = _install.compile(resolved or policies.get("tpu"))
    _install.default[0] = resolved
    _install.set_default_table(table)


def device_type(device) -> str:
    """The PrivateUse1 backend's name, after checking `device` names it and
    that its device module sees a device; ValueError in one line otherwise."""
    name = _install.backend_name()
    if device is None:
        device = name
    try:
        dev = torch.device(device) if not isinstance(device, torch.device) else device
    except (RuntimeError, TypeError):
        dev = None
    if name == "privateuseone" and "torch_tpu" in sys.modules:
        raise ValueError(
            f"autocast: TorchTPU is installed but found no TPU (it names PrivateUse1 "
            f"'tpu' only when one is present), so {device!r} is no device in this process")
    if dev is None:
        raise ValueError(f"autocast: {device!r} is not a device")
    if dev.type == "xla":
        engines.require("torch_xla", "xla_amp.autocast on an XLA device")
    if dev.type != name or name == "privateuseone":
        raise ValueError(
            f"autocast: device '{dev}' is not this process's PrivateUse1 device "
            f"(PrivateUse1 is named '{name}'); pass '{name}', or an XLA device with torch_xla")
    module = getattr(torch, name, None)
    if module is None or not hasattr(module, "get_amp_supported_dtype"):
        raise ValueError(f"autocast: the '{name}' backend registered no device module with "
                         "get_amp_supported_dtype(), so torch.autocast cannot run on it")
    try:
        count = module.device_count() if hasattr(module, "device_count") else 1
    except RuntimeError:  # TorchTPU: "internal ... use torch.accelerator.device_count"
        count = torch.accelerator.device_count()
    if not count:
        raise ValueError(
            f"autocast: the '{name}' backend is installed but sees no device "
            f"(torch.{name}.device_count() == 0); on a host without a TPU, TorchTPU "
            "cannot enter torch.autocast either")
    return name


class autocast(torch.amp.autocast):
    """Autocast on the PrivateUse1 device under an xla_amp policy; see the
    module docstring."""

    def __init__(self, device=None, enabled: bool = True, dtype: torch.dtype | None = None,
                 cache_enabled: bool = True, policy: str | Policy | None = None,
                 record: bool = False, fp32_matmul_precision: str | None = None):
        args = RegionArgs.check("autocast", enabled, dtype, cache_enabled, policy, record,
                                fp32_matmul_precision)
        kind = device_type(device)
        _install.install()
        if record and _install.kernels() != "native":
            from xla_amp import _engine
            raise ValueError("autocast: record=True needs xla_amp's native kernels (the "
                             "recorder is C++), and the Python ones serve this device: "
                             f"{_engine.privateuse1_problem()}")
        self._record, self._recorder, self._previous = record, None, []
        default = _install.default_policy() if args.policy is None else None
        if args.fp32_matmul_precision or (args.policy or default).fp32_matmul_precision_requested:
            # the backend's kernels run eagerly at their own precision: nothing
            # here can set a dot's (docs/policies.md, "Float32 matmul precision")
            raise ValueError("autocast: fp32_matmul_precision cannot be honoured on a "
                             "PrivateUse1 device: its kernels take the backend's own matmul "
                             "precision; set it through the backend")
        self.policy, dtype, enabled = args.resolve(default, stacklevel=3)
        self._table = _install.compile(self.policy)
        super().__init__(kind, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def __enter__(self):
        if self._record:  # per entry: a region entered again records afresh
            from xla_amp import _engine
            self._recorder = _engine.Recorder()
            self._previous.append(_recording()[0].begin(self._recorder))
        _kernels.push(self._table)
        try:
            return super().__enter__()
        except BaseException:
            self._leave()
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._leave()

    def _leave(self):
        _kernels.pop()
        if self._record:
            _recording()[0].end(self._previous.pop())

    def report(self):
        """The PrecisionReport of this region's latest entry (record=True)."""
        return _recording()[1].of_region(self)


def _recording():
    """(xla_amp.autocast's recording hooks, PrecisionReport), imported on first use."""
    from xla_amp.numerics import _recording as recording
    from xla_amp.numerics._report import PrecisionReport
    return recording, PrecisionReport
