"""What a policy does to each module's output, against float32, and which
modules would leave float16's range: `compare`.

    report = xla_amp.compare(model, x, policy="tpu")
    print(report.table())
    handle = xla_amp.module_policies(model, report.suggest())   # risky ones in fp32

Algorithm::

    hooks on every module keep its floating outputs (every call)
    run 1: model(*inputs) with autocast off          -> reference (float32)
    run 2: the same inputs, same RNG state, under xla_amp.autocast(policy)
    per module, on the device (one transfer for all of them at the end):
        rel_error  = ||out - ref||_2 / ||ref||_2     (over all its outputs)
        max_abs    = max |ref|
        overflow   = max_abs > 65504                  (float16's largest)
        underflow  = share of nonzero |ref| < 2**-24  (float16 flushes them to 0)
        nonfinite  = the policy run's output holds inf/NaN
    risky = overflow or underflow > 1 %
    suggest() = {name: "fp32" for each risky module}

The model is left as it was (buffers restored, RNG as after run 2).
"""
from __future__ import annotations

import dataclasses
import itertools
import json

import torch
from torch import nn

from xla_amp import engines
from xla_amp.numerics._inspect import buffers_kept, markdown

FP16_MAX = 65504.0
FP16_TINY = 2.0 ** -24          # float16's smallest subnormal
UNDERFLOW_SHARE = 0.01          # risky above this share of flushed values
COLUMNS = ("module", "rel_error", "max_abs", "overflow", "underflow", "nonfinite")


@dataclasses.dataclass(frozen=True)
class ComparisonReport:
    """`compare`'s result: one row per module that produced floating outputs,
    in the model's module order (see the module docstring for each field)."""
    rows: list[dict]
    policy: str = ""

    def risky(self) -> list[str]:
        """Modules whose outputs would overflow float16 or mostly flush to zero."""
        return [r["module"] for r in self.rows
                if r["overflow"] or r["underflow"] > UNDERFLOW_SHARE]

    def suggest(self) -> dict[str, str]:
        """Rules for `xla_amp.module_policies` keeping exactly the risky modules
        in float32 (names are exact: no glob characters)."""
        return {_escape(name): "fp32" for name in self.risky()}

    def table(self) -> str:
        def fmt(r):
            return [f"`{r['module']}`" if r["module"] == "" else r["module"],
                    f"{r['rel_error']:.3g}", f"{r['max_abs']:.4g}",
                    "**yes**" if r["overflow"] else "no", f"{r['underflow']:.2%}",
                    "**yes**" if r["nonfinite"] else "no"]
        return markdown(COLUMNS, (fmt(r) for r in self.rows))

    def to_json(self, **kwargs) -> str:
        return json.dumps({"policy": self.policy, "rows": self.rows}, **kwargs)


def _escape(name: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in name)


def _floating(output) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(output)
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _run(model, inputs, kwargs, modules, region):
    seen: dict[int, list[torch.Tensor]] = {}
    hooks = [m.register_forward_hook(
        lambda mod, args, out, i=i: seen.setdefault(i, []).extend(
            t.detach().float().reshape(-1) for t in _floating(out)))
        for i, m in enumerate(modules)]
    try:
        with region:
            model(*inputs, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    return {i: torch.cat(ts) for i, ts in seen.items() if ts}


def _stats(ref: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    diff = torch.linalg.vector_norm(out - ref)
    norm = torch.linalg.vector_norm(ref)
    rel = torch.where(norm > 0, diff / norm.clamp_min(torch.finfo(torch.float32).tiny), diff)
    mag = ref.abs()
    nonzero = (mag > 0).sum().clamp_min(1)
    flushed = ((mag > 0) & (mag < FP16_TINY)).sum() / nonzero
    nonfinite = (~torch.isfinite(out)).any()
    return torch.stack([rel, mag.max(), flushed.float(), nonfinite.float()])


def _checked_device(model: nn.Module, inputs, kwargs) -> torch.device:
    """The model's device (its first parameter or buffer, else its first
    tensor input), XLA or the PrivateUse1 device; ValueError naming the first
    input (or the model) that is elsewhere, before anything runs."""
    leaves, _ = torch.utils._pytree.tree_flatten_with_path((inputs, kwargs))
    held = next(iter(itertools.chain(model.parameters(), model.buffers())), None)
    held = held if held is not None else next(
        (leaf for _, leaf in leaves if isinstance(leaf, torch.Tensor)), None)
    device = held.device if held is not None else None
    if device is None or engines.for_device_type(device.type) is None:
        served = engines.served_types()
        raise ValueError(f"compare: the model is on '{device}', not on a device an xla_amp "
                         f"engine serves ({', '.join(served)}); move it there first")
    for path, leaf in leaves:
        if isinstance(leaf, torch.Tensor) and leaf.device != device:
            kind = "input" if path[0].idx == 0 else "keyword argument"
            name = torch.utils._pytree.keystr(path[1:])
            raise ValueError(f"compare: {kind} {name} (shape {tuple(leaf.shape)}) is on "
                             f"'{leaf.device}', the model on '{device}'; move it with "
                             f".to('{device}')")
    return device


def compare(model: nn.Module, *inputs, policy=None, **kwargs) -> ComparisonReport:
    """Runs `model` on `inputs` in float32 and under `policy` (None: the
    device's) and compares every module's output; see the module docstring.
    The model is on an XLA device (torch_xla) or the PrivateUse1 device
    (TorchTPU's "tpu"): one device-to-host transfer at the end on either.
    Keyword arguments other than `policy` go to the model."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"compare: expected an nn.Module, got {type(model).__name__}")
    device = _checked_device(model, inputs, kwargs)
    engine = engines.for_device(device, "compare")
    autocast = engine.region_class()
    region = autocast(device, policy=policy)  # a bad policy fails before anything runs
    names = [name for name, _ in model.named_modules()]
    modules = [m for _, m in model.named_modules()]
    restore_rng = engine.rng_restorer(device)
    with buffers_kept(model):
        ref = _run(model, inputs, kwargs, modules, autocast(device, enabled=False))
    restore_rng()
    with buffers_kept(model):
        out = _run(model, inputs, kwargs, modules, region)
    order = [i for i in range(len(modules)) if i in ref and i in out]
    if not order:
        return ComparisonReport(rows=[], policy=region.policy.name)
    values = torch.stack([_stats(ref[i], out[i]) for i in order]).cpu().tolist()
    rows = [{"module": names[i], "rel_error": rel, "max_abs": mx, "overflow": mx > FP16_MAX,
             "underflow": flushed, "nonfinite": bool(bad)}
            for i, (rel, mx, flushed, bad) in zip(order, values)]
    return ComparisonReport(rows=rows, policy=region.policy.name)
