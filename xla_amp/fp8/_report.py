"""`report(model)`: where fp8 precision goes, per converted layer.

    print(xla_amp.fp8.report(model))

Each Fp8Linear keeps, on the device, the scales it used and the fractions
of each operand (x, w, g) that its last quantization saturated (clamped to
±fmax) or flushed to zero (non-zero values that became 0). The training step
writes them in-graph (no sync); `report` reads them all in one transfer,
when you call it (between steps, not inside one).

`fallback` lists the layers that ran in the region's dtype instead of fp8,
with why: a call whose shape cannot take an fp8 GEMM (Fp8Linear), or a layer
`convert(..., unaligned="keep")` left in high precision.
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from xla_amp.fp8._convert import FALLBACK_ATTR
from xla_amp.fp8._linear import Fp8Linear

OPERANDS = ("x", "w", "g")


@dataclasses.dataclass(frozen=True)
class Fp8Row:
    layer: str
    scaling: str
    scale: tuple[float, float, float]          # x, w, g
    saturated: tuple[float, float, float]      # fractions, last quantization
    underflow: tuple[float, float, float]
    amax: tuple[float, float, float] | None    # delayed: the history's max


@dataclasses.dataclass(frozen=True)
class Fp8Fallback:
    layer: str
    why: str


@dataclasses.dataclass(frozen=True)
class Fp8Report:
    rows: tuple[Fp8Row, ...]
    fallback: tuple[Fp8Fallback, ...] = ()

    def worst(self, what: str = "saturated", n: int = 5) -> list[Fp8Row]:
        """The `n` layers with the largest `what` ("saturated"|"underflow") fraction."""
        if what not in ("saturated", "underflow"):
            raise ValueError(f"Fp8Report.worst: what must be 'saturated' or 'underflow', "
                             f"got {what!r}")
        return sorted(self.rows, key=lambda r: -max(getattr(r, what)))[:n]

    def __str__(self) -> str:
        head = f"{'layer':<32} {'scaling':<8} " + " ".join(
            f"{o + ' scale':>10} {o + ' sat%':>7} {o + ' uf%':>7}" for o in OPERANDS)
        lines = [head]
        for r in self.rows:
            cells = " ".join(f"{r.scale[i]:>10.4g} {100 * r.saturated[i]:>7.3f} "
                             f"{100 * r.underflow[i]:>7.3f}" for i in range(3))
            lines.append(f"{r.layer:<32} {r.scaling:<8} {cells}")
        lines += [f"{f.layer:<32} fallback: {f.why}" for f in self.fallback]
        return "\n".join(lines)


def report(model: nn.Module) -> Fp8Report:
    """The current fp8 state of every converted layer of `model`; one
    device-to-host transfer for all of them. ValueError if none is converted."""
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, Fp8Linear)]
    if not layers:
        raise ValueError(f"xla_amp.fp8.report: {type(model).__name__} has no Fp8Linear "
                         "(call xla_amp.fp8.convert first)")
    parts = []
    for _, m in layers:
        amax = (m.fp8_amax_history.amax(dim=1) if m.recipe.scaling == "delayed"
                else torch.full((3,), float("nan"), device=m.fp8_scale.device))
        parts.append(torch.cat([m.fp8_scale, m.fp8_stats[:, 0], m.fp8_stats[:, 1], amax]))
    host = torch.stack(parts).cpu().tolist()
    rows = []
    for (name, m), v in zip(layers, host):
        rows.append(Fp8Row(name, m.recipe.scaling, tuple(v[0:3]), tuple(v[3:6]),
                           tuple(v[6:9]), tuple(v[9:12]) if m.recipe.scaling == "delayed"
                           else None))
    fallback = []
    for name, m in model.named_modules():
        reasons = m.fallback if isinstance(m, Fp8Linear) else (
            [getattr(m, FALLBACK_ATTR)] if hasattr(m, FALLBACK_ATTR) else [])
        fallback += [Fp8Fallback(name, why) for why in reasons]
    return Fp8Report(tuple(rows), tuple(fallback))
