"""Op-list overrides from environment files (Gaudi's mechanism, validated).

    XLA_AMP_LOWER_PRECISION_OPS_LIST=/path/lower.txt   -> lower_precision_fp
    XLA_AMP_FP32_OPS_LIST=/path/fp32.txt               -> fp32
    XLA_AMP_PROMOTE_OPS_LIST=/path/promote.txt         -> promote

Each file holds one op name per line, ``#`` comments and blank lines allowed.
A set variable replaces that category in every built-in policy. The files
are read once, at import of xla_amp; a missing file or a bad line raises
ValueError naming the file and line, and no policy changes.
"""
from __future__ import annotations

import os
from pathlib import Path

from xla_amp.policies import _ops as ops
from xla_amp.policies._policy import Policy, check_op_fits

VARIABLES = {
    "XLA_AMP_LOWER_PRECISION_OPS_LIST": "lower_precision_fp",
    "XLA_AMP_FP32_OPS_LIST": "fp32",
    "XLA_AMP_PROMOTE_OPS_LIST": "promote",
}


def read_op_list(path: str | Path, category: str | None = None) -> list[str]:
    """Op names from a list file; ValueError with file:line on a bad entry
    (an unknown op, or with `category`, an op that cannot be in it)."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ValueError(f"{path}: cannot read op list: {e.strerror}") from None
    names = []
    for lineno, line in enumerate(lines, 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        try:
            ops.validate(name)
            if category is not None:
                check_op_fits(name, category)
        except ValueError as e:
            raise ValueError(f"{path}:{lineno}: {e}") from None
        names.append(name)
    return names


def read_environment(environ=os.environ) -> dict[str, list[str]]:
    """category -> op names, for each variable that is set."""
    lists = {}
    origin: dict[str, str] = {}   # op -> "VARIABLE (file)" that listed it first
    for var, category in VARIABLES.items():
        if not environ.get(var):
            continue
        names = read_op_list(environ[var], category)
        for op in names:
            ops.validate(op)
            if origin.get(op, var).split(" ")[0] != var:
                raise ValueError(
                    f"{op} is listed by both {origin[op]} and {var} ({environ[var]}); "
                    "an op can be in one category only")
            origin.setdefault(op, f"{var} ({environ[var]})")
        lists[category] = names
    return lists


_lists: dict[str, list[str]] | None = None


def load_from_environment() -> None:
    """Reads the files now (at import of xla_amp) so errors surface there."""
    global _lists
    _lists = read_environment()


def apply(policy: Policy) -> Policy:
    """`policy` with every category named in the environment replaced."""
    if _lists is None:
        load_from_environment()
    for category, names in _lists.items():
        policy = policy.replace_category(category, names, source="environment")
    return policy
