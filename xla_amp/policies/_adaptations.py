"""XLA adaptations: PyTorch/XLA's mixed-precision lowering defects, as a
table every policy carries (``_xla_adaptations.toml``; see _policy.py's
docstring for what each kind does). Errors name the file and line."""
from __future__ import annotations

from pathlib import Path

from xla_amp.policies import _ops as ops
from xla_amp.policies import _removed as removed

# "decompose" comes from a policy file's [decompose] (_decompose.py), not from
# the shared table
ADAPTATIONS = ("fp32_compute", "promote_mixed", "decompose")


def load_adaptations(path: str | Path) -> tuple[dict[str, str], dict[str, str]]:
    """Reads an XLA adaptation table: ({op: kind}, {op: reason}). Errors name
    the file and line of the culprit."""
    path = Path(path)
    text, data = removed.read_toml(path)
    kinds: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for section, entries in data.items():
        if section not in ADAPTATIONS or not isinstance(entries, dict):
            raise ValueError(f"{path}: [{section}] is not an adaptation; one of "
                             f"{', '.join(ADAPTATIONS)}")
        for op, value in entries.items():
            where = f"{path}:{removed.line_of(text, op)}"
            try:
                ops.validate(op)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            if op in kinds:
                raise ValueError(f"{where}: {op} is in [{kinds[op]}] and [{section}]")
            if not isinstance(value, dict) or not value.get("reason"):
                raise ValueError(f"{where}: {op} needs a reason (and a reproducer)")
            kinds[op] = section
            reasons[op] = value["reason"]
    return kinds, reasons


_adaptations: tuple[dict[str, str], dict[str, str]] | None = None


def _adaptation_table() -> tuple[dict[str, str], dict[str, str]]:
    global _adaptations
    if _adaptations is None:
        _adaptations = load_adaptations(Path(__file__).parent / "_xla_adaptations.toml")
    return _adaptations


def xla_adaptations() -> dict[str, str]:
    """op -> adaptation kind for PyTorch/XLA's mixed-precision lowering
    defects; the default `Policy.adaptations` (see _xla_adaptations.toml)."""
    return dict(_adaptation_table()[0])


def adaptation_reason(op: str) -> str:
    """Why `op` (an entry of xla_adaptations()) is adapted."""
    return _adaptation_table()[1][op]


def read_policy_section(path, text: str, data: dict, section: str, categories: dict,
                        check) -> dict[str, str]:
    """op -> `section` for a policy file's own adaptation table ([decompose],
    [fp32_compute]); ValueError naming file:line for an unknown op, an entry
    `check(op, value)` objects to (its text), or an op the file also puts in
    a category."""
    out = {}
    for op, value in data.get(section, {}).items():
        where = f"{path}:{removed.line_of(text, op, section)}"
        try:
            ops.validate(op)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        problem = check(op, value)
        if problem:
            raise ValueError(f"{where}: {problem}")
        if op in categories:
            raise ValueError(f"{where}: {op} is both in [{categories[op]}] and in [{section}]")
        out[op] = section
    return out
