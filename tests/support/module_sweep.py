"""The module sweep's machinery (tests/policies/test_module_sweep.py): every
module of PyTorch's own module test database
(torch.testing._internal.common_modules.module_db) with its sample inputs,
run under a region, reduced to dtypes. Imports neither torch_xla nor
torchax, so the recorder on an NVIDIA GPU (scripts/record_cuda_autocast.py
--modules) can run it under torch.autocast("cuda").

    MODULES                       {name: ModuleInfo}, the lazy modules left out
    cases(info)                   (case label, training, sample): training mode,
                                  and eval mode where the database says they differ
    build(cls, training, sample)  the sample's module, seeded
    run(module, args, kwargs, region)
                                  (forward, backward): the output dtypes of the
                                  module and each submodule in call order, and
                                  the parameters' gradient dtypes; each a list
                                  or RAISES
    ends_the_process(info, sample)
                                  a sample torch_xla 2.9 crashes on
    signature(sample)             the sample's tensors as "dtype[shape]" strings
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.testing._internal.common_modules import module_db
from torch.utils._pytree import tree_flatten, tree_map

MODULES = {m.name: m for m in module_db if not m.name.startswith("nn.Lazy")}
RAISES = "raises"


def _dtypes(out) -> list[str]:
    return [str(t.dtype) for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]


def _grad_dtypes(module, out) -> list[str]:
    floats = [t for t in tree_flatten(out)[0]
              if isinstance(t, torch.Tensor) and t.requires_grad and t.is_floating_point()]
    params = [p for p in module.parameters() if p.requires_grad]
    if not floats or not params:
        return []
    grads = torch.autograd.grad(sum(t.float().sum() for t in floats), params, allow_unused=True)
    return [str(g.dtype) if g is not None else "none" for g in grads]


def run(module, args, kwargs, region) -> tuple:
    """(forward, backward) dtypes; the gradients are RAISES when the forward raised."""
    seen = []
    hooks = [m.register_forward_hook(
        lambda m, i, o, name=name: seen.append(f"{name or '.'}: {_dtypes(o)}"))
        for name, m in module.named_modules()]
    try:
        with region():
            out = module(*args, **kwargs)
        forward = seen + _dtypes(out)
    except Exception:  # noqa: BLE001 -- a raise is a result to compare
        return RAISES, RAISES
    finally:
        for h in hooks:
            h.remove()
    try:
        return forward, _grad_dtypes(module, out)
    except Exception:  # noqa: BLE001
        return forward, RAISES


def to(tree, device):
    return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t, tree)


def cases(info):
    for training in (True, False) if info.train_and_eval_differ else (True,):
        for k, sample in enumerate(info.module_inputs_func(
                info, device="cpu", dtype=torch.float32, requires_grad=False,
                training=training)):
            if sample.forward_input is not None:
                yield f"{'train' if training else 'eval'}-{k}", training, sample


def build(cls, training, sample):
    torch.manual_seed(0)
    c = sample.constructor_input
    return cls(*c.args, **c.kwargs).train(training)


def ends_the_process(info, sample) -> bool:
    """An unbatched nll_loss: logits [C], a 0-dim class index
    (tests/engine/test_upstream_torch_xla_unbatched_nll_loss.py)."""
    args = sample.forward_input.args
    return (info.module_cls in (nn.CrossEntropyLoss, nn.NLLLoss) and len(args) == 2
            and args[0].dim() == 1 and args[1].dim() == 0 and not args[1].is_floating_point())


def signature(sample) -> list[str]:
    c, f = sample.constructor_input, sample.forward_input
    return [f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"
            for t in tree_flatten((c.args, c.kwargs, f.args, f.kwargs))[0]
            if isinstance(t, torch.Tensor)]
