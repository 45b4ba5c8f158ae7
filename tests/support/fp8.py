"""Shared by the fp8 tests: a transformer block of Linear layers, and a
matcher for the operand form XLA:GPU's GemmRewriter fuses into a
cuBLASLt fp8 GEMM, written from xla/service/gpu/transforms/gemm_rewriter.cc
(openxla/xla): each dot operand is

    [bitcast|broadcast|copy|reshape|transpose|slice|...]*  (layout only)
      (multiply|divide)( convert(f8 -> wide), broadcast(scalar) )

the dot has one contracting dimension, and not both operands are e5m2.
Run on torch_xla's HLO text (`_get_xla_tensors_hlo`), JAX's
(``lowered.as_text(dialect="hlo")``) or an optimized dump.
"""
from __future__ import annotations

import re

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """A pre-LN transformer block of Linear layers (4 of them: 12 matmuls in
    a training step, forward and both gradients)."""

    def __init__(self, d=32, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln2(x))))

LAYOUT = {"bitcast", "broadcast", "copy", "reshape", "transpose", "slice", "all-gather",
          "all-to-all", "collective-permute", "bitcast-convert"}
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+?(?:\{[^}]*\})?) ([\w\-]+)\((.*?)\)(.*)$")


def parse(hlo: str) -> dict[str, tuple[str, str, list[str], str]]:
    """name -> (type, opcode, operand names, attributes) over every computation."""
    out = {}
    for line in hlo.splitlines():
        m = _INSTR.match(line)
        if not m:
            continue
        name, typ, opcode, operands, attrs = m.groups()
        # "f32[8,32]{1,0} %multiply.5, ..." (torch_xla) or "mul.5, ..." (JAX)
        names = [o.split()[-1].lstrip("%") for o in operands.split(", ") if o.strip()]
        out[name] = (typ, opcode, names, attrs)
    return out


def _elem(typ: str) -> str:
    return typ.split("[")[0]


def _is_scalar_broadcast(instrs, name) -> bool:
    typ, opcode, operands, _ = instrs[name]
    if "[]" in typ:
        return True
    if opcode == "broadcast" and operands:
        return "[]" in instrs[operands[0]][0]
    return False


def fp8_operand(instrs, name) -> str | None:
    """The f8 type an operand is dequantized from, or None if it is not in form."""
    seen = 0
    while instrs[name][1] in LAYOUT and seen < 32:
        name = instrs[name][2][0]
        seen += 1
    typ, opcode, operands, _ = instrs[name]
    if opcode not in ("multiply", "divide") or len(operands) != 2:
        return None
    a, b = operands
    for conv, scale in ((a, b), (b, a)):
        ctyp, cop, cops, _ = instrs[conv]
        if cop == "convert" and _elem(instrs[cops[0]][0]).startswith("f8") \
                and _elem(ctyp) in ("f32", "bf16", "f16") and _is_scalar_broadcast(instrs, scale):
            if opcode == "divide" and conv != a:
                continue
            return _elem(instrs[cops[0]][0])
    return None


def dots(hlo: str):
    """[(dot name, (lhs f8 type | None, rhs f8 type | None), contracting dims ok)]"""
    instrs = parse(hlo)
    out = []
    for name, (typ, opcode, operands, attrs) in instrs.items():
        if opcode != "dot":
            continue
        kinds = tuple(fp8_operand(instrs, o) for o in operands[:2])
        lhs = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attrs)
        one = lhs is not None and len(lhs.group(1).split(",")) == 1
        out.append((name, kinds, one))
    return out


def in_form(entry) -> bool:
    _, (lhs, rhs), one = entry
    return lhs is not None and rhs is not None and one and not (lhs == rhs == "f8e5m2")
