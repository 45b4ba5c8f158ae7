"""Two compiled JAX steps' HLO side by side (benchmarks/torchax_lm.py):
instructions by opcode, and where each convert and select comes from.

    ops(text)            optimized HLO text -> Counter opcode -> count, every
                         computation (fusion bodies included);
                         "(entry computation)": the entry's own
    sources(text, op)    Counter source -> count of `op`'s instructions, the
                         source read from the op_name metadata: the innermost
                         named scope (an aten op torchax ran, a jitted JAX
                         function), ", backward" under transpose(...);
                         "(XLA)": no metadata, inserted by XLA's passes (on
                         CPU: bf16 elementwise ops widened to float32, their
                         converts, and copies fusion makes)
    lowered_count(t, op) stablehlo.`op` in the lowered (pre-XLA) program: the
                         casts the program itself makes
    summary(low, opt)    all of that for one step (JSON-ready)
    section(summaries)   markdown lines for {"torchax": summary, "jax": summary}
"""
from __future__ import annotations

import collections
import re

from benchmarks import _harness as H

KEYS = ("(entry computation)", "fusion", "dot", "convolution", "convert", "select")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*)$")
_OPCODE = re.compile(r"(?:^|\s)([a-z][\w\-]*)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_WRAPPER = re.compile(r"^(transpose|jvp|jit|vmap|pjit)\((.*)\)$")


def _instructions(text: str):
    """(opcode, in the entry computation, the instruction's line) for each."""
    in_entry = False
    for line in text.splitlines():
        in_entry = line.startswith("ENTRY") or (in_entry and not line.startswith("}"))
        m = _INSTR.match(line)
        op = m and _OPCODE.search(m.group(1))
        if op:
            yield op.group(1), in_entry, line


def ops(text: str) -> collections.Counter:
    counts, entry = collections.Counter(), 0
    for op, in_entry, _ in _instructions(text):
        counts[op] += 1
        entry += in_entry
    counts["(entry computation)"] = entry
    return counts


def source(op_name: str) -> str:
    """'jit(_step)/transpose(jvp(aten::nll_loss_forward))/aten::where/...'
    -> 'aten::nll_loss_forward, backward'."""
    parts = op_name.split("/")[1:] if op_name.startswith("jit(") else op_name.split("/")
    backward = False
    for part in parts:
        while (m := _WRAPPER.match(part)) is not None:
            backward |= m.group(1) == "transpose"
            part = m.group(2)
        if part:
            return part + (", backward" if backward else "")
    return "(unnamed)"


def sources(text: str, opcode: str) -> collections.Counter:
    found = collections.Counter()
    for op, _, line in _instructions(text):
        if op == opcode:
            m = _OP_NAME.search(line)
            found[source(m.group(1)) if m else "(XLA)"] += 1
    return found


def lowered_count(text: str, opcode: str) -> int:
    return len(re.findall(rf"\bstablehlo\.{opcode}\b", text))


def summary(lowered: str, optimized: str) -> dict:
    return {"ops": dict(ops(optimized)), "converts": dict(sources(optimized, "convert")),
            "selects": dict(sources(optimized, "select")),
            "lowered": {k: lowered_count(lowered, k) for k in ("convert", "select")}}


def section(hlo: dict) -> list[str]:
    """The report's HLO part; `hlo`: {"torchax": summary, "jax": summary}."""
    names = {"torchax": "torchax", "jax": "plain JAX"}
    total = lambda h: sum(v for k, v in h.items() if not k.startswith("("))  # noqa: E731
    a, b = hlo["torchax"]["ops"], hlo["jax"]["ops"]
    diff = sorted((k for k in set(a) | set(b) if not k.startswith("(")),
                  key=lambda k: -abs(a.get(k, 0) - b.get(k, 0)))
    lines = ["", "Optimized HLO of the compiled step, instructions by opcode:", "",
             H.md_header(["step", "all", *KEYS])]
    lines += [H.md_row([names[n], total(s["ops"]), *(s["ops"].get(k, 0) for k in KEYS)])
              for n, s in hlo.items()]
    lines += ["", "largest differences (torchax - plain JAX): " + ", ".join(
        f"{k} {a.get(k, 0) - b.get(k, 0):+d}" for k in diff[:12]), "",
        "Converts and selects: in the lowered program (the casts it makes) and "
        "optimized, by source (op_name; (XLA): inserted by XLA's passes):", "",
        H.md_header(["step", "converts lowered", "optimized", "of them (XLA)",
                     "selects lowered", "optimized", "selects by source"])]
    for n, s in hlo.items():
        conv, sel = s["converts"], s["selects"]
        lines.append(H.md_row([
            names[n], s["lowered"]["convert"], sum(conv.values()), conv.get("(XLA)", 0),
            s["lowered"]["select"], sum(sel.values()),
            ", ".join(f"{k} {v}" for k, v in sorted(sel.items(), key=lambda kv: -kv[1]))]))
    return lines
