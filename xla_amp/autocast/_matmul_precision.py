"""The float32 matmul precision on the torch_xla engine: one per process.

torch_xla 2.9 reads its matmul precision (torch_xla.backends.
set_mat_mul_precision) when a graph is lowered, at sync, for every dot and
convolution of the graph (measured: a dot traced under "highest" and
lowered under "default" carries no operand_precision); its dot_general
refuses a precision_config. So no region can give its own ops a precision of
their own: the setting is process-wide, and this module decides it.

    claim(precision, policy, explicit):    (each region built; before it runs)
        owner is None (xla_amp has not set it) and torch_xla's value is
        "default" (never set, or set to the default), and the region is not
        a module rule's (built under `not_setting()`: a module's rule cannot
        decide for the whole process):
            set torch_xla's value to `precision`; owner = policy; log one line
        owner is None and torch_xla's value is not "default":
            owner = "the user" (their setting stands)
        precision == torch_xla's value: nothing to do
        explicit (the region's fp32_matmul_precision=, a policy made with
        with_overrides(fp32_matmul_precision=...)): ValueError, one line, the
            region refused before anything runs
        else (another policy's own statement): warn once per (policy, value),
            the process keeps its value

Cost of "highest" on a TPU: a float32 dot takes six bf16 passes instead of
one (docs/precision.md); on XLA:CPU nothing changes (exact either way,
measured bit-identical); on a GPU no TF32.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import warnings

log = logging.getLogger("xla_amp")
_owner: str | None = None
_warned: set[tuple[str, str]] = set()
_local = threading.local()


@contextlib.contextmanager
def not_setting():
    """Regions built inside compare with the process's precision but never set it."""
    previous = getattr(_local, "passive", False)
    _local.passive = True
    try:
        yield
    finally:
        _local.passive = previous


def process_precision() -> str:
    from torch_xla import _XLAC
    return _XLAC._xla_get_mat_mul_precision()


def claim(precision: str, policy: str, explicit: bool) -> None:
    """See the module docstring."""
    global _owner
    current = process_precision()
    if _owner is None and current != "default":
        _owner = "the user"  # set before xla_amp's first region: it stands
    elif (_owner is None and precision != "default"
          and not getattr(_local, "passive", False)):
        from torch_xla import _XLAC
        _XLAC._xla_set_mat_mul_precision(precision)
        _owner = f"policy {policy!r}"
        log.warning("xla_amp: torch_xla's float32 matmul precision is process-wide; set to "
                    "%r for policy %r (every float32 dot and convolution of this process "
                    "takes it; on a TPU 'highest' costs six bf16 passes a dot)",
                    precision, policy)
        return
    if precision == current:
        return
    who = _owner or "torch_xla's default"
    if explicit:
        raise ValueError(
            f"xla_amp.autocast: fp32_matmul_precision={precision!r} cannot be honoured on "
            f"torch_xla: its matmul precision is one per process, {current!r} (set by {who}); "
            f"call torch_xla.backends.set_mat_mul_precision({precision!r}) before the first "
            f"region, or use one precision per process")
    if (policy, precision) not in _warned:
        _warned.add((policy, precision))
        warnings.warn(f"xla_amp.autocast: policy {policy!r} states float32 matmul precision "
                      f"{precision!r}, but torch_xla's is one per process, {current!r} (set by "
                      f"{who}): this process keeps {current!r}", stacklevel=4)
