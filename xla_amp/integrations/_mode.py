"""A framework's precision setting, as xla_amp understands it.

Every integration (Lightning's Trainer and Fabric, Accelerate, the
Transformers Trainer) turns its own flag into one :class:`Mode`; the
checks live here, so each refusal reads the same whichever framework the
bad value came through, and nothing is installed before they pass::

    precision    compute  params  loss scaling         optimizer
    bf16-mixed   bf16     fp32    none                 any (syncfree: no transfer)
    16-mixed     fp16     fp32    xla_amp.GradScaler   any (syncfree: no transfer)
    bf16-true    bf16     bf16    none                 master_weights / stochastic_rounding
                                                       need an xla_amp.syncfree optimizer
    fp8-mixed    fp8 matmuls (xla_amp.fp8, fp8= recipe, default Fp8Recipe()), the
                 rest bf16-mixed; fp8= also combines with bf16-mixed / 16-mixed
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping

import torch

from xla_amp.policies import Policy, get as get_policy
from xla_amp.scaler import GradScaler

# precision -> (compute dtype, parameters in the compute dtype)
PRECISIONS = {"bf16-mixed": (torch.bfloat16, False),
              "16-mixed": (torch.float16, False),
              "bf16-true": (torch.bfloat16, True),
              "fp8-mixed": (torch.bfloat16, False)}

# what the frameworks call the same settings
ALIASES = {"bf16": "bf16-mixed", "fp16": "16-mixed"}


@dataclasses.dataclass(frozen=True)
class Mode:
    """One precision setting, checked (``ValueError`` naming the argument).

    precision:           ``"bf16-mixed"``, ``"16-mixed"`` or ``"bf16-true"``.
    policy:              the autocast rules (a name or a ``Policy``); ``None``:
                         the device's (``xla_amp.autocast``'s choice).
    module_policies:     rules for ``xla_amp.module_policies``, installed on
                         the model the framework hands over.
    master_weights, stochastic_rounding:
                         ``"bf16-true"`` only, one or neither: the options the
                         ``xla_amp.syncfree`` optimizer must carry.
    keep:                ``"bf16-true"``: module classes ``cast_module`` leaves
                         in float32 (default: none, as ``XLA_USE_BF16``).
    scaler:              ``GradScaler`` arguments (``"16-mixed"`` only).
    fp8:                 an ``xla_amp.fp8.Fp8Recipe``: Linear layers of the
                         model become fp8 (``"fp8-mixed"``: default recipe;
                         also with ``"bf16-mixed"`` / ``"16-mixed"``).
    """
    precision: str
    policy: str | Policy | None = None
    module_policies: Mapping[Any, Any] | None = None
    master_weights: bool = False
    stochastic_rounding: bool = False
    keep: tuple[type, ...] = ()
    scaler: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    fp8: Any = None

    def __post_init__(self):
        precision = ALIASES.get(self.precision, self.precision)
        if precision not in PRECISIONS:
            raise ValueError(f"precision={self.precision!r} is not one xla_amp knows; "
                             f"choose one of {', '.join(PRECISIONS)}")
        object.__setattr__(self, "precision", precision)
        for name in ("master_weights", "stochastic_rounding"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool, got {value!r}")
            if value and precision != "bf16-true":
                raise ValueError(f"{name}=True needs precision='bf16-true' (bf16 parameters); "
                                 f"under {precision!r} the parameters stay float32")
        if self.master_weights and self.stochastic_rounding:
            raise ValueError("master_weights and stochastic_rounding exclude each other: "
                             "choose one")
        keep = tuple(self.keep)
        bad = [k for k in keep if not (isinstance(k, type) and issubclass(k, torch.nn.Module))]
        if bad:
            raise ValueError(f"keep must hold nn.Module classes, got {bad[0]!r}")
        if keep and precision != "bf16-true":
            raise ValueError(f"keep= applies to precision='bf16-true' only (got {precision!r})")
        object.__setattr__(self, "keep", keep)
        if self.policy is not None:
            policy = get_policy(self.policy)  # ValueError naming an unknown policy
            check_dtype(policy, self.compute_dtype, precision)
        if self.module_policies is not None and not isinstance(self.module_policies, Mapping):
            raise ValueError("module_policies must be a mapping of rules "
                             f"(see xla_amp.module_policies), got {self.module_policies!r}")
        scaler = dict(self.scaler)
        if scaler and precision != "16-mixed":
            raise ValueError(f"scaler arguments apply to precision='16-mixed' only "
                             f"(got {precision!r}: no loss scaling)")
        if precision == "16-mixed":
            GradScaler(**scaler)  # its own checks, before anything is installed
        object.__setattr__(self, "scaler", MappingProxyType(scaler))
        from xla_amp.fp8 import Fp8Recipe
        if self.fp8 is not None and not isinstance(self.fp8, Fp8Recipe):
            raise ValueError(f"fp8 must be an xla_amp.fp8.Fp8Recipe, got {self.fp8!r}")
        if self.fp8 is not None and precision == "bf16-true":
            raise ValueError("fp8= combines with 'bf16-mixed', '16-mixed' or 'fp8-mixed' "
                             "(float32 parameters), not 'bf16-true'")
        if precision == "fp8-mixed" and self.fp8 is None:
            object.__setattr__(self, "fp8", Fp8Recipe())

    @property
    def compute_dtype(self) -> torch.dtype:
        return PRECISIONS[self.precision][0]

    @property
    def param_dtype(self) -> torch.dtype:
        """The parameters' dtype after ``convert_module``."""
        return self.compute_dtype if PRECISIONS[self.precision][1] else torch.float32

    @property
    def scaled(self) -> bool:
        return self.precision == "16-mixed"

    @property
    def optimizer_options(self) -> dict[str, bool]:
        """The ``xla_amp.syncfree`` options this mode's optimizer must have."""
        return {"master_weights": self.master_weights,
                "stochastic_rounding": self.stochastic_rounding}


def check_dtype(policy: Policy, dtype: torch.dtype, precision: str) -> None:
    """Refuse a policy that cannot autocast to ``dtype`` (fp16 under the tpu
    rules): autocast would otherwise warn and run everything in float32."""
    if dtype not in policy.supported_dtypes:
        supported = ", ".join(str(d).replace("torch.", "") for d in policy.supported_dtypes)
        raise ValueError(f"precision={precision!r} computes in {str(dtype).replace('torch.', '')}, "
                         f"which the {policy.name!r} policy does not support ({supported}); "
                         "pass policy= with one that does (e.g. 'cuda')")
