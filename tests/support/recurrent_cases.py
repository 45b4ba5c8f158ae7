"""Conformance cases for the whole-network recurrent ops (aten::lstm, gru,
rnn_tanh, rnn_relu; docs/policies.md, "Recurrent networks"): one layer,
input 3, hidden 4, batch 2, five steps. `.input` takes a padded [5, 2, 3]
tensor; `.data` a packed sequence's data (lengths 5, 4, 2: 11 rows) with its
batch sizes, which stay on the CPU as nn.utils.rnn's PackedSequence keeps
them. Floating inputs in the order the call takes them: input, states,
then the layer's w_ih, w_hh, b_ih, b_hh."""
from __future__ import annotations

import torch

from tests.support.op_cases import Case

STEPS, BATCH, FEATURES, HIDDEN = 5, 2, 3, 4
PACKED_BATCH_SIZES = (2, 2, 2, 1, 1)        # two sequences, lengths 5 and 3
PACKED_ROWS = sum(PACKED_BATCH_SIZES)


def _weights(gates: int) -> list[torch.Tensor]:
    g = gates * HIDDEN
    return [torch.randn(g, FEATURES), torch.randn(g, HIDDEN), torch.randn(g), torch.randn(g)]


def _state() -> torch.Tensor:
    return torch.randn(1, BATCH, HIDDEN)


def _case(op: str, gates: int, states: int, packed: bool) -> Case:
    fn = getattr(torch, op)
    rows = (PACKED_ROWS, FEATURES) if packed else (STEPS, BATCH, FEATURES)

    def call(x, *rest):
        hx = list(rest[:states]) if states == 2 else rest[0]
        params = list(rest[states:])
        if packed:
            return fn(x, torch.tensor(PACKED_BATCH_SIZES), hx, params, True, 1, 0.0, False, False)
        return fn(x, hx, params, True, 1, 0.0, False, False, False)

    return Case(lambda: [torch.randn(*rows)] + [_state() for _ in range(states)]
                + _weights(gates), call)


CASES: dict[str, Case] = {}
for _op, _gates, _states in (("lstm", 4, 2), ("gru", 3, 1), ("rnn_tanh", 1, 1),
                             ("rnn_relu", 1, 1)):
    CASES[f"aten::{_op}.input"] = _case(_op, _gates, _states, packed=False)
    CASES[f"aten::{_op}.data"] = _case(_op, _gates, _states, packed=True)
