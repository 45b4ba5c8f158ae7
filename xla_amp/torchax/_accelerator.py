"""Native CUDA autograd after torchax: what breaks, and the one line that says so.

torchax renames PrivateUse1 "jax" when it is imported
(``torch.utils.rename_privateuse1_backend``). From torch 2.8 on, a named
PrivateUse1 backend is *the* accelerator (``at::getAccelerator()`` checks it
before CUDA), and the autograd engine asks a node for its stream only on the
accelerator's device type: a backward over CUDA tensors then finds no stream
and stops at ``opt_ready_stream && opt_parent_stream`` (engine.cpp, torch
2.11: line 1084; pytorch/pytorch#161129). The rename cannot be undone and
torchax's tensors need it, so xla_amp cannot prevent it: it says so, once,
when xla_amp.torchax is imported where CUDA is available
(docs/upstream/privateuse1_accelerator_cuda_autograd.md).

    notice(cuda_available, accelerator) -> the line, or None
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("xla_amp")


def notice(cuda_available: bool, accelerator: str | None) -> str | None:
    if not cuda_available or accelerator in (None, "cuda"):
        return None
    return (f"xla_amp.torchax: torchax made {accelerator!r} torch's accelerator: native CUDA "
            "autograd (loss.backward() on CUDA tensors) fails in this process "
            "(opt_ready_stream && opt_parent_stream, pytorch/pytorch#161129); run native CUDA "
            "training in a process that never imports torchax")


def warn_if_native_cuda_breaks() -> None:
    current = torch.accelerator.current_accelerator() if hasattr(torch, "accelerator") else None
    line = notice(torch.cuda.is_available(), None if current is None else current.type)
    if line is not None:
        log.warning(line)
