"""--precision and --module_policy: how the launchers hold and compute with
weights (docs/precision_modes.md).

    fp32         no autocast, fp32 weights                 (= --noamp)
    amp          autocast + GradScaler, fp32 weights       (default)
    bf16         bf16 weights, plain optimizer update      (naive: small updates are lost)
    bf16_master  bf16 weights, fp32 master copy in the optimizer
    bf16_sr      bf16 weights, stochastically rounded updates
In the bf16 modes normalization layers keep fp32 weights (and get an "fp32"
module rule unless --module_policy names them).
"""
from __future__ import annotations

PRECISIONS = ("fp32", "amp", "bf16", "bf16_master", "bf16_sr")


def _norm_classes():
    from torch import nn
    return (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)


def module_policy_entries(text: str | None) -> list[tuple[str, str]]:
    """``"LayerNorm=fp32,head=fp32"`` -> [(key, policy), ...], without
    importing torch (the flag's validator runs before the launcher imports
    it). ValueError naming a malformed entry."""
    entries = []
    for entry in filter(None, (e.strip() for e in (text or "").split(","))):
        key, sep, value = entry.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"--module_policy: entry {entry!r} is not key=policy")
        entries.append((key, value))
    return entries


def parse_module_policy(text: str | None) -> dict:
    """``"LayerNorm=fp32,head=fp32"`` -> rules for xla_amp.module_policies:
    a key naming a torch.nn class means that class, any other key is a glob
    on module names. ValueError naming a malformed entry."""
    from torch import nn
    rules: dict = {}
    for key, value in module_policy_entries(text):
        cls = getattr(nn, key, None)
        rules[cls if isinstance(cls, type) and issubclass(cls, nn.Module) else key] = value
    return rules


def optimizer_options(precision: str) -> dict:
    return {"bf16_master": {"master_weights": True},
            "bf16_sr": {"stochastic_rounding": True}}.get(precision, {})


def prepare(model, precision: str, module_policy: str | None):
    """Cast `model` for `precision` and install the module rules; returns
    the handle of the rules (or None)."""
    import torch
    import xla_amp
    rules = parse_module_policy(module_policy)
    if precision.startswith("bf16"):
        xla_amp.cast_module(model, torch.bfloat16, keep=_norm_classes())
        present = {type(m) for m in model.modules()}
        for cls in _norm_classes():
            if cls in present:
                rules.setdefault(cls, "fp32")
    return xla_amp.module_policies(model, rules) if rules else None


def shard(model, precision: str, mesh):
    """--fsdp: FSDPv2 over `mesh` for the model as :func:`prepare` cast it
    (norm layers kept in float32); below float32 its weight gradients are
    summed across the mesh in float32, ShardedPrecision's default
    (docs/sharded.md). Autocast stays the loop's own region."""
    import torch
    from xla_amp import sharded
    low = precision != "fp32"
    spec = sharded.ShardedPrecision(
        param_dtype=torch.bfloat16 if precision.startswith("bf16") else torch.float32,
        reduce_dtype=torch.float32 if low else None, keep=_norm_classes())
    return sharded.shard_model(model, spec, mesh=mesh)


def prepare_fp8(model, scaling: str) -> tuple[list[str], list[str]]:
    """--fp8: convert `model`'s Linear layers (xla_amp.fp8), keeping those
    whose dimensions fp8 GEMMs cannot take; returns (converted, kept) names."""
    from torch import nn
    from xla_amp import fp8
    fp8.convert(model, fp8.Fp8Recipe(scaling=scaling), unaligned="keep")
    converted = [n for n, m in model.named_modules() if isinstance(m, fp8.Fp8Linear)]
    kept = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    return converted, kept
