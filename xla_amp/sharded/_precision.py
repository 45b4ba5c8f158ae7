"""`ShardedPrecision`: the precision of a sharded (SPMD) model in one frozen
object, applied by ``shard_model`` or, for a model sharded by hand with
``mark_sharding``, by its own methods.

What each field decides, per training step::

    storage:  parameters (so their shards, all-gathers and gradients) in
              param_dtype; floating buffers in buffer_dtype; modules of the
              `keep` classes stay float32
    forward:  compute_dtype set: xla_amp.autocast(policy, compute_dtype)
              None: no autocast, ops run in the parameters' dtype
    update:   parameters below float32 are updated in float32 from an fp32
              master shard (master_weights) or rounded stochastically
              (stochastic_rounding); state in state_dtype (None: float32)
    skip:     GradScaler's found_inf is one value for the whole mesh: XLA's
              partitioner reduces it across the shards inside the step graph

Build variants with ``dataclasses.replace`` or the named presets.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from xla_amp.precision._cast_module import keep_classes
from xla_amp.syncfree import _low_precision

_LOW = (torch.bfloat16, torch.float16)


def _is_float_dtype(v) -> bool:
    return isinstance(v, torch.dtype) and v.is_floating_point


@dataclasses.dataclass(frozen=True)
class ShardedPrecision:
    """How a sharded model stores, computes and updates its parameters.

    param_dtype:         dtype of the parameters and their shards.
    compute_dtype:       autocast dtype of the forward; ``None``: no autocast.
    policy:              autocast rules (a name); ``None``: the device's.
    buffer_dtype:        floating buffers; ``None``: as ``param_dtype``.
    reduce_dtype:        dtype in which gradients are summed across the
                         mesh (``_reduce.py``); ``None``: float32 when the
                         parameters or the compute are below float32.
    master_weights, stochastic_rounding, state_dtype:
                         the ``xla_amp.syncfree`` options for parameters
                         below float32 (``optimizer_options()``); refused
                         with float32 parameters, where they would do nothing.
    keep:                module classes left in float32 (``cast_module``).

    Every argument is checked when the object is made (``ValueError``
    naming it); nothing is applied until ``cast``/``shard_model``.
    """
    param_dtype: torch.dtype = torch.float32
    compute_dtype: torch.dtype | None = None
    policy: str | None = None
    buffer_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    master_weights: bool = False
    stochastic_rounding: bool = False
    state_dtype: torch.dtype | None = None
    keep: tuple = ()

    def __post_init__(self):
        name = "ShardedPrecision"
        if not _is_float_dtype(self.param_dtype):
            raise ValueError(f"{name}: param_dtype must be a floating torch.dtype, "
                             f"got {self.param_dtype!r}")
        for key in ("compute_dtype", "buffer_dtype", "reduce_dtype"):
            v = getattr(self, key)
            if v is not None and not _is_float_dtype(v):
                raise ValueError(f"{name}: {key} must be a floating torch.dtype or None, got {v!r}")
        if self.compute_dtype is not None and self.compute_dtype not in _LOW:
            raise ValueError(f"{name}: compute_dtype must be torch.bfloat16, torch.float16 or "
                             f"None (no autocast), got {self.compute_dtype}")
        if self.policy is not None:
            from xla_amp import policies
            if self.compute_dtype is None:
                raise ValueError(f"{name}: policy={self.policy!r} picks autocast rules, but "
                                 "compute_dtype=None turns autocast off; set compute_dtype")
            if self.policy not in policies.names():
                raise ValueError(f"{name}: unknown policy {self.policy!r}; "
                                 f"known: {', '.join(policies.names())}")
        computed = self.compute_dtype or self.param_dtype
        if self.reduce_dtype not in (None, torch.float32, computed):
            raise ValueError(f"{name}: reduce_dtype={self.reduce_dtype}: gradients are computed "
                             f"in {computed}; they can be summed in {computed} or torch.float32")
        _low_precision.options(name, self.master_weights, self.stochastic_rounding,
                               self.state_dtype)
        if (self.master_weights or self.stochastic_rounding) and self.param_dtype not in _LOW:
            flag = "master_weights" if self.master_weights else "stochastic_rounding"
            raise ValueError(f"{name}: {flag}=True applies to parameters below float32, but "
                             f"param_dtype is {self.param_dtype}: it would do nothing")
        if self.stochastic_rounding and self.param_dtype != torch.bfloat16:
            raise ValueError(f"{name}: stochastic_rounding rounds to bfloat16; param_dtype is "
                             f"{self.param_dtype}")
        object.__setattr__(self, "keep", keep_classes(self.keep, name))

    # -- presets ------------------------------------------------------------

    @classmethod
    def amp(cls, dtype: torch.dtype = torch.bfloat16, policy: str | None = None):
        """float32 parameters, shards and state; the forward autocast to
        `dtype` (float16 wants a GradScaler)."""
        return cls(compute_dtype=dtype, policy=policy)

    @classmethod
    def bf16_master(cls, **kwargs):
        """bfloat16 parameters computed in bfloat16, an fp32 master shard."""
        return cls(param_dtype=torch.bfloat16, compute_dtype=torch.bfloat16,
                   master_weights=True, **kwargs)

    @classmethod
    def bf16_sr(cls, state_dtype: torch.dtype | None = torch.bfloat16, **kwargs):
        """bfloat16 parameters updated with stochastic rounding, state in
        `state_dtype` (bfloat16: the smallest footprint)."""
        return cls(param_dtype=torch.bfloat16, compute_dtype=torch.bfloat16,
                   stochastic_rounding=True, state_dtype=state_dtype, **kwargs)

    @property
    def summed_in(self) -> torch.dtype | None:
        """The dtype gradients are summed in across the mesh when it is not
        the one they are computed in: ``reduce_dtype``, else float32 when
        parameters or compute are below float32; None: as computed."""
        if self.reduce_dtype is not None:
            return self.reduce_dtype if self.reduce_dtype == torch.float32 else None
        low = self.param_dtype in _LOW or self.compute_dtype is not None
        return torch.float32 if low else None

    # -- applying it --------------------------------------------------------

    def cast(self, model: nn.Module) -> nn.Module:
        """Parameters to ``param_dtype`` and buffers to ``buffer_dtype`` in
        place (``xla_amp.cast_module``), before or after sharding: a sharded
        parameter keeps its sharding; and, when gradients are to be summed
        in float32 (:attr:`summed_in`), the modules that compute weight
        gradients get a backward that computes them in float32
        (``_reduce.py``; a warning names parameters it does not cover).
        Returns `model`."""
        from xla_amp.precision import cast_module
        from xla_amp.sharded import _reduce
        cast_module(model, self.param_dtype, keep=self.keep,
                    buffer_dtype=self.buffer_dtype or self.param_dtype)
        if self.summed_in is not None:
            missed = _reduce.install(model, self.summed_in)
            if missed:
                import warnings
                shown = ", ".join(missed[:8]) + (f" and {len(missed) - 8} more"
                                                 if len(missed) > 8 else "")
                warnings.warn(f"ShardedPrecision: gradients of {shown} are summed in the dtype "
                              f"they are computed in, not {self.summed_in} (modules "
                              "xla_amp.sharded does not cover)", stacklevel=2)
        return model

    def autocast(self, device):
        """The forward's region: ``xla_amp.autocast`` with ``compute_dtype``
        and ``policy``, disabled when ``compute_dtype`` is None."""
        from xla_amp.autocast import autocast
        return autocast(device, enabled=self.compute_dtype is not None,
                        dtype=self.compute_dtype, policy=self.policy)

    def optimizer_options(self) -> dict:
        """``master_weights``, ``stochastic_rounding``, ``state_dtype`` for
        any ``xla_amp.syncfree`` optimizer:
        ``syncfree.AdamW(model.parameters(), lr=..., **p.optimizer_options())``."""
        return dict(master_weights=self.master_weights,
                    stochastic_rounding=self.stochastic_rounding, state_dtype=self.state_dtype)
