"""Policy files written by tests, and what the running torch has, asked of
the dispatcher (torch only: the `core` tests of both profiles use this)."""
from __future__ import annotations

import re
from pathlib import Path

import torch

HEAD = 'name = "t"\ndefault_dtype = "bfloat16"\nsupported_dtypes = ["bfloat16"]\n'


def write_policy(folder: Path, body: str, name: str = "t.toml") -> Path:
    """A policy file `name` in `folder`: HEAD (3 lines), then `body` from line 4."""
    path = Path(folder) / name
    path.write_text(HEAD + body)
    return path


def torch_release() -> tuple[int, int]:
    """(major, minor) of the running torch."""
    major, minor = re.match(r"(\d+)\.(\d+)", torch.__version__).groups()
    return int(major), int(minor)


def dispatcher_has(op: str) -> bool:
    """Whether the running torch registers `op` (``ns::name`` or
    ``ns::name.overload``; ``.default`` is the unnamed overload)."""
    name = op[:-len(".default")] if op.endswith(".default") else op
    known = set(torch._C._dispatch_get_all_op_names())
    return name in known or "." not in name and any(
        k.startswith(name + ".") for k in known)
