"""custom_fwd / custom_bwd for autograd Functions under xla_amp's autocast.

The meaning of torch.amp.custom_fwd / custom_bwd, with device_type "xla" by
default, plus one duty of xla_amp's: autograd runs backward on its own
device thread, where the forward's xla_amp policy is not active (a policy
is per thread). custom_fwd records the forward's active table on ctx;
custom_bwd makes it the active one while backward runs, so backward
autocasts by the same rules. Both engines: device_type "xla" (torch_xla's)
and the PrivateUse1 device's name (TorchTPU's "tpu").

    class MyMM(torch.autograd.Function):
        @staticmethod
        @xla_amp.custom_fwd(cast_inputs=torch.float32)   # or no args; device_type="tpu"
        def forward(ctx, a, b): ...
        @staticmethod
        @xla_amp.custom_bwd                              # device_type as custom_fwd's
        def backward(ctx, grad): ...

(torch.amp.custom_bwd itself restores autocast's enabled/dtype only: its
backward runs under the thread's default policy, set_default_policy's.)
"""
from __future__ import annotations

import functools

import torch

from xla_amp.precision._replay import record, replaying


def custom_fwd(fwd=None, *, device_type: str = "xla", cast_inputs: torch.dtype | None = None):
    """Decorates a Function's forward; see torch.amp.custom_fwd.

    With `cast_inputs`, forward runs with autocast off and its floating
    inputs cast to that dtype when called inside an autocast region.
    """
    if not isinstance(device_type, str):
        raise ValueError(f"custom_fwd: device_type must be a str such as 'xla', got {device_type!r}")
    if cast_inputs is not None and not (isinstance(cast_inputs, torch.dtype)
                                        and cast_inputs.is_floating_point):
        raise ValueError(
            f"custom_fwd: cast_inputs must be a floating torch.dtype (torch.float32, "
            f"torch.bfloat16, ...) or None, got {cast_inputs!r}")
    if fwd is None:
        return functools.partial(custom_fwd, device_type=device_type, cast_inputs=cast_inputs)
    inner = torch.amp.custom_fwd(fwd, device_type=device_type, cast_inputs=cast_inputs)

    @functools.wraps(fwd)
    def forward(ctx, *args, **kwargs):
        # Compiled (Dynamo traces this): the trace already runs under the
        # region's policy, and a call into _C would break the graph.
        ctx._xla_amp_policy = None if torch.compiler.is_compiling() else record(device_type)
        return inner(ctx, *args, **kwargs)

    return forward


def custom_bwd(bwd=None, *, device_type: str = "xla"):
    """Decorates a Function's backward; it runs with the forward's autocast
    state (enabled, dtype and xla_amp's policy)."""
    if not isinstance(device_type, str):
        raise ValueError(f"custom_bwd: device_type must be a str such as 'xla', got {device_type!r}")
    if bwd is None:
        return functools.partial(custom_bwd, device_type=device_type)
    inner = torch.amp.custom_bwd(bwd, device_type=device_type)

    @functools.wraps(bwd)
    def backward(ctx, *grads):
        with replaying(getattr(ctx, "_xla_amp_policy", None)):
            return inner(ctx, *grads)

    return backward
