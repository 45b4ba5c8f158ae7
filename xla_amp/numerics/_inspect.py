"""What the inspection tools share (explain, compare, the precision report):
a module's buffers kept through an inspection run, markdown tables."""
from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def buffers_kept(fn):
    """While inside, `fn`'s buffers (a module's; nothing for a function) are
    clones, so a forward run for inspection (BatchNorm's running statistics)
    leaves the module as it was."""
    if not isinstance(fn, torch.nn.Module):
        yield
        return
    saved = [(m, name, b) for m in fn.modules() for name, b in m._buffers.items()
             if b is not None]
    for m, name, b in saved:
        m._buffers[name] = b.clone()
    try:
        yield
    finally:
        for m, name, b in saved:
            m._buffers[name] = b


def markdown(header: tuple[str, ...], lines) -> str:
    """`header` and one row per item of `lines`, as a markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(v) for v in line) + " |" for line in lines]
    return "\n".join(out)
