"""Every module of PyTorch's own module test database
(torch.testing._internal.common_modules.module_db: the nn modules with their
sample constructors and forward inputs), in training and in eval mode, under
the cpu rules on XLA against torch.autocast("cpu") on the CPU: the dtype of
every output of the module and of each of its submodules, and of every
parameter's gradient: 107 modules, about 1,200 samples.

The op-level conformance tests check each op a policy lists; a module's
composite path is what a user meets (the recurrent networks and the
mixed-type norms were gaps only a whole module showed). Dtypes only, so the
XLA side is traced, not compiled.

What may differ, and nothing else:
- the pinned difference docs/policies.md names (an LSTM with projections:
  its cell state c_n is bfloat16 here, float32 on the CPU);
- what differs between torch_xla and the CPU without autocast too (the
  stack's, not the rules': e.g. softmax over a 0-dim tensor raises on XLA,
  eval-mode batch norm has no backward there,
  tests/engine/test_upstream_torch_xla_eval_batch_norm_backward.py); such a
  part is compared again once the stack agrees;
- a host whose CPU has no oneDNN bfloat16 LSTM (the reference raises).

Left out: the unbatched class-index samples of nn.CrossEntropyLoss, on
which torch_xla 2.9 ends the process, autocast or not
(tests/engine/test_upstream_torch_xla_unbatched_nll_loss.py).
"""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn as nn

import xla_amp

from tests.support.conformance import HOST_LIMITS
from tests.support.module_sweep import MODULES, build, cases, ends_the_process, run, to

LOW = torch.bfloat16
# torch_xla 2.9 replaces nn.GRU with its scan GRU, which runs on XLA tensors
# only (tests/engine/test_upstream_torch_xla_scan_gru.py): the CPU side
# builds torch's own
_GRU = getattr(nn.GRU, "_orig", None)


def _cpu_class(cls):
    return _GRU if _GRU is not None and cls is nn.GRU else cls


def _is_projected_lstm(info, sample) -> bool:
    return info.module_cls is nn.LSTM and sample.constructor_input.kwargs.get("proj_size", 0) > 0


def _host_cannot(info, sample) -> bool:
    """The host's limit (tests/support/conformance.py's HOST_LIMITS): no
    bfloat16 LSTM in oneDNN, which the CPU's LSTM without projections runs."""
    return (info.module_cls is nn.LSTM and not _is_projected_lstm(info, sample)
            and "aten::lstm.input" in HOST_LIMITS)


def _pair(info, training, sample, device):
    """The sample's module on the CPU (torch's own class) and on XLA, seeded alike."""
    return (build(_cpu_class(info.module_cls), training, sample),
            build(info.module_cls, training, sample).to(device))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_dtypes_match_torch_cpu_autocast(device, name):
    info = MODULES[name]
    compared = 0
    for case, training, sample in cases(info):
        if ends_the_process(info, sample) or _host_cannot(info, sample):
            continue
        f = sample.forward_input
        label = f"{name} {case}"
        cpu, xla = _pair(info, training, sample, device)
        args, kwargs = to(f.args, device), to(f.kwargs, device)
        want = run(cpu, f.args, f.kwargs, lambda: torch.autocast("cpu", dtype=LOW))
        got = run(xla, args, kwargs, lambda: xla_amp.autocast(device, policy="cpu", dtype=LOW))
        compared += 1
        if _is_projected_lstm(info, sample):
            # output, h_n as the CPU's; c_n bfloat16 (the CPU's cell loop keeps float32)
            assert want[0][-3:-1] == got[0][-3:-1] and want[1] == got[1], (label, want, got)
            assert (want[0][-1], got[0][-1]) == ("torch.float32", "torch.bfloat16"), (
                label, want, got)
            continue
        if want == got:
            continue
        # the stack's part: torch_xla and the CPU differ there without autocast
        cpu, xla = _pair(info, training, sample, device)
        stack = (run(cpu, f.args, f.kwargs, contextlib.nullcontext),
                 run(xla, args, kwargs, contextlib.nullcontext))
        for part, name_ in enumerate(("forward", "backward")):
            if want[part] != got[part] and stack[0][part] == stack[1][part]:
                raise AssertionError(f"{label} {name_}: torch.autocast('cpu') {want[part]}, "
                                     f"xla_amp {got[part]} (without autocast both "
                                     f"{stack[0][part]})")
    assert compared or name == "nn.LSTM", name
