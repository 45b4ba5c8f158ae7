"""A region's arguments, checked and resolved once, with the same messages
on every engine (torch_xla's, PrivateUse1's and torchax's regions all call
this).

    args = RegionArgs.check("xla_amp.autocast", enabled, dtype, cache_enabled,
                            policy, record, fp32_matmul_precision)
        -> ValueError/TypeError naming the first bad argument, before anything changes
    policy, dtype, enabled = args.resolve(engine_default_policy)
        policy = policy arg | the engine's default for its device
        fp32_matmul_precision given -> that policy with it (explicit)
        dtype  = dtype arg | policy.default_dtype
        a dtype the policy does not support: warn once per (policy, dtype),
        the region disabled (as PyTorch/XLA does), dtype the policy's default
"""
from __future__ import annotations

import dataclasses
import warnings

import torch

from xla_amp import policies
from xla_amp.policies import _matmul_precision as matmul_precision
from xla_amp.policies._policy import Policy

_warned: set[tuple[str, torch.dtype]] = set()


@dataclasses.dataclass(frozen=True)
class RegionArgs:
    where: str
    enabled: bool = True
    dtype: torch.dtype | None = None
    cache_enabled: bool = True
    policy: Policy | None = None
    record: bool = False
    fp32_matmul_precision: str | None = None

    @classmethod
    def check(cls, where: str, enabled=True, dtype=None, cache_enabled=True, policy=None,
              record=False, fp32_matmul_precision=None) -> "RegionArgs":
        for name, value in (("enabled", enabled), ("cache_enabled", cache_enabled),
                            ("record", record)):
            if not isinstance(value, bool):
                raise ValueError(f"{where}: {name} must be a bool, got {value!r}")
        if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
            raise ValueError(
                f"{where}: dtype must be a floating torch.dtype (torch.bfloat16, "
                f"torch.float16) or None, got {dtype!r}")
        if isinstance(policy, str):
            policy = policies.get(policy)
        elif policy is not None and not isinstance(policy, Policy):
            raise TypeError(f"{where}: policy must be a name or a Policy, "
                            f"got {type(policy).__name__}")
        if fp32_matmul_precision is not None:
            matmul_precision.check(fp32_matmul_precision, where)
        return cls(where, enabled, dtype, cache_enabled, policy, record, fp32_matmul_precision)

    def resolve(self, default: Policy, stacklevel: int = 4) -> tuple[Policy, torch.dtype, bool]:
        """(policy, dtype, enabled) for a region whose engine defaults to `default`."""
        policy = self.policy or default
        if self.fp32_matmul_precision is not None:
            policy = policy.with_overrides(name=policy.name,
                                           fp32_matmul_precision=self.fp32_matmul_precision)
        dtype = policy.default_dtype if self.dtype is None else self.dtype
        enabled = self.enabled
        if enabled and dtype not in policy.supported_dtypes:
            if (policy.name, dtype) not in _warned:
                _warned.add((policy.name, dtype))
                warnings.warn(
                    f"xla_amp.autocast: policy {policy.name!r} does not support {dtype} "
                    f"(supported: {', '.join(map(str, policy.supported_dtypes))}); autocast "
                    "is disabled for this region", stacklevel=stacklevel)
            enabled, dtype = False, policy.default_dtype
        return policy, dtype, enabled
