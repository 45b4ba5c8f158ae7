"""Shared by the fp8 tests: a transformer block of Linear layers, and the
gate on the lowered program that replaced the GemmRewriter matcher after the
H100 run (docs/fp8.md): a converted matmul is a dot whose operands are
float8 and whose result is wide (f32/bf16/f16),

    dot(f8[..] a, f8[..] b) -> f32[..]

and no dot is fed a float8 value widened by a convert (the dequantize-then-
dot form, which XLA:GPU folded into a plain f32 GEMM once the scales were
runtime values), behind layout-only ops or a multiply/divide by a scalar.
Run on torch_xla's HLO text (`_get_xla_tensors_hlo`), JAX's
(``lowered.as_text(dialect="hlo")``) or an optimized dump.
"""
from __future__ import annotations

import re

from tests.support import gpt_model


class Block(gpt_model.Block):
    """tests/support/gpt_model.py's pre-LN transformer block, 32 wide, 2 heads: 4
    Linear layers, 12 matmuls in a training step (forward and both gradients)."""

    def __init__(self, d=32, heads=2):
        super().__init__(d, heads)


LAYOUT = {"bitcast", "broadcast", "copy", "reshape", "transpose", "slice", "all-gather",
          "all-to-all", "collective-permute", "bitcast-convert"}
# the type: one array type, or a tuple of them ("(bf16[..]{1,0}, s8[..]{0})": a
# cuBLAS custom-call's result and workspace in an optimized XLA:GPU program)
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\([^()]*\)|\S+?(?:\{[^}]*\})?) "
                    r"([\w\-]+)\((.*?)\)(.*)$")


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


def computations(hlo: str) -> dict[str, tuple[str, dict]]:
    """computation name -> (its ROOT's name, its instructions as `parse`
    gives them): a computation starts at an unindented line that ends in
    "{" ("%fused_x.1 (...) -> f32[3] {", "ENTRY %main.4 (...) -> ... {")."""
    out, name, root, body = {}, None, "", {}
    for line in hlo.splitlines():
        if line and not line[0].isspace() and line.rstrip().endswith("{"):
            name, root, body = line.replace("ENTRY ", "").split()[0].lstrip("%"), "", {}
        elif name is not None and line.strip() == "}":
            out[name] = (root, body)
            name = None
        elif name is not None:
            got = parse(line)
            body.update(got)
            if line.lstrip().startswith("ROOT ") and got:
                root = next(iter(got))
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


WIDE = ("f32", "bf16", "f16")


def widened_f8(instrs, name) -> bool:
    """Whether operand `name` is a float8 value converted to a wide type,
    behind layout-only ops, converts between wide types and multiplies/divides
    by a scalar."""
    for _ in range(64):
        typ, opcode, operands, _ = instrs[name]
        if opcode in LAYOUT or (opcode == "convert" and _elem(instrs[operands[0]][0]) in WIDE):
            name = operands[0]
        elif opcode in ("multiply", "divide") and len(operands) == 2:
            a, b = operands
            if _is_scalar_broadcast(instrs, b):
                name = a
            elif _is_scalar_broadcast(instrs, a) and opcode == "multiply":
                name = b
            else:
                return False
        else:
            return (opcode == "convert" and _elem(instrs[operands[0]][0]).startswith("f8")
                    and _elem(typ) in WIDE)
    return False


def dots(hlo: str):
    """[(dot name, (lhs element type, rhs element type), result element type,
    an operand is a widened float8 value)] for every dot of every computation."""
    return _dots(parse(hlo))


def _dots(instrs):
    out = []
    for name, (typ, opcode, operands, attrs) in instrs.items():
        if opcode != "dot":
            continue
        kinds = tuple(_elem(instrs[o][0]) for o in operands[:2])
        out.append((name, kinds, _elem(typ), any(widened_f8(instrs, o) for o in operands[:2])))
    return out


def fp8_dot(entry) -> bool:
    """A dot on float8 operands with a wide result (the form proven on the H100)."""
    _, (lhs, rhs), result, _ = entry
    return lhs.startswith("f8") and rhs.startswith("f8") and result in WIDE


def precisions(hlo: str) -> dict[str, str]:
    """dot name -> its operand_precision ("" where the dot has none: DEFAULT)."""
    out = {}
    for name, (_, opcode, _, attrs) in parse(hlo).items():
        if opcode == "dot":
            m = re.search(r"operand_precision=\{(\w+)", attrs)
            out[name] = m.group(1) if m else ""
    return out


def contractions(hlo: str) -> dict[str, tuple[int, int]]:
    """dot name -> (lhs, rhs) contracting dim, for dots contracting one dim."""
    out = {}
    for name, (_, opcode, _, attrs) in parse(hlo).items():
        found = dict(re.findall(r"(lhs|rhs)_contracting_dims=\{(\d+)\}", attrs))
        if opcode == "dot" and len(found) == 2:
            out[name] = (int(found["lhs"]), int(found["rhs"]))
    return out


def word_casts(hlo: str) -> int:
    """bitcast-converts to uint32: the word transposes of xla_amp.torchax's
    fp8 dots (xla_amp/torchax/_fp8.py), one per operand they transposed."""
    return sum(op == "bitcast-convert" and _elem(typ) == "u32"
               for typ, op, _, _ in parse(hlo).values())


def traced_delayed_mlp_step(context, optimizer):
    """A delayed-scaling fp8 MLP (32 -> 64 -> ReLU -> 16, seed 0) in
    xla_amp.torchax.make_train_step (tpu rules), traced and run twice inside
    `context`: (the step, its lowered HLO, the two losses as numpy arrays)."""
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    import xla_amp.torchax as xt
    from xla_amp import fp8
    torch.manual_seed(0)
    model = fp8.convert(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)),
                        fp8.Fp8Recipe(scaling="delayed"))
    x, y = torch.randn(16, 32), torch.randn(16, 16)
    step = xt.make_train_step(model, F.mse_loss, optimizer, policy="tpu")
    with context:  # traced (and compiled) on the first call
        hlo = step.lower(x, y).as_text(dialect="hlo")
        losses = [np.asarray(step(x, y)) for _ in range(2)]
    return step, hlo, losses


def unfoldable(hlo: str) -> list:
    """The fp8 dots with a float32 result whose epilogue is not ONE multiply
    by a scalar (what XLA:GPU's GemmRewriter folds into cuBLASLt's fp8 call:
    one multiply at most; a second multiply or a select after it is a pass
    of its own over the float32 result): each as (dot, [users' opcodes])."""
    instrs = parse(hlo)
    users: dict[str, list[str]] = {}
    for name, (_, _, operands, _) in instrs.items():
        for o in set(operands):
            users.setdefault(o, []).append(name)
    bad = []
    for name, kinds, result, _ in _dots(instrs):
        if not (kinds[0].startswith("f8") and kinds[1].startswith("f8") and result == "f32"):
            continue
        mine = users.get(name, [])
        ok = len(mine) == 1 and _scalar_multiply(instrs, mine[0], name)
        after = users.get(mine[0], []) if ok else []
        # (a constant factor after it is the caller's: SGD's -lr, say, which
        # the rewriter would fold into alpha)
        if not ok or any(_scalar_multiply(instrs, u, mine[0], runtime=True)
                         or instrs[u][1] == "select" for u in after):
            bad.append((name, [instrs[u][1] for u in mine + after]))
    return bad


def _scalar_multiply(instrs, name, of, runtime=False) -> bool:
    """Whether `name` multiplies or divides `of` by a scalar (`runtime`: one
    that is not a constant)."""
    _, opcode, operands, _ = instrs[name]
    return opcode in ("multiply", "divide") and any(
        o != of and _is_scalar_broadcast(instrs, o)
        and not (runtime and _constant_scalar(instrs, o)) for o in operands)


def _constant_scalar(instrs, name) -> bool:
    _, opcode, operands, _ = instrs[name]
    if opcode == "broadcast" and operands:
        return instrs[operands[0]][1] == "constant"
    return opcode == "constant"


_HLO_TYPES = {"torch.float32": "f32", "torch.bfloat16": "bf16", "torch.float16": "f16"}


class ResultTypes:
    """The result type each converted GEMM's dot must have, from the layers'
    own calls and recipes (Fp8Recipe.result_dtype of the GEMM's destination:
    the output, the input's gradient, the weight's gradient): attach before
    the step runs, then compare `sorted(want)` with the fp8 dots' results."""

    def __init__(self, model):
        from xla_amp.fp8 import Fp8Linear
        self.want: list[str] = []
        for m in model.modules():
            if isinstance(m, Fp8Linear):
                m.register_forward_hook(self._hook)

    def _hook(self, layer, args, out):
        self.want += [_HLO_TYPES[str(layer.recipe.result_dtype(d))]
                      for d in (out.dtype, args[0].dtype, layer.weight.dtype)]


def dequantized(entries) -> list:
    """The dots fed a widened float8 value: must be none."""
    return [e for e in entries if e[3]]
