"""Hugging Face ``LlamaForCausalLM`` (tests/support/llama_model.py's ``tiny``:
2 layers, hidden 64, 4 heads over 2 KV heads, RMSNorm, SwiGLU, RoPE) trains
through xla_amp.torchax.make_train_step under the tpu rules (bf16) and with
its decoder layers in fp8 (delayed scaling, the LM head kept): the CPU gates
of benchmarks/llm.py's GPU run.

- fp8: in the lowered program, each q/k/v/o/gate/up/down projection's
  forward and both gradients are dots on float8 operands (3 per projection,
  e5m2 gradients in the backward two), the LM head's three dots are bf16,
  and no dot is fed a widened float8 value;
- bf16: every dot is bf16 (the projections, the LM head and attention's);
- both: one compiled program and no transfer after the first step; the
  losses stay within the zoo's tolerance (1 %, or 3x PyTorch's own eager
  bf16 deviation) of each other at every step, and fall.
"""
from __future__ import annotations

import copy
import functools

import jax
import numpy as np
import optax
import pytest
import torch

import tests.support.torchax_env as helpers_torchax  # noqa: F401  (JAX on CPU)
from tests.support import llama_model as L
from tests.support.fp8 import dequantized, dots, fp8_dot, parse

import xla_amp.torchax as xt
from xla_amp import fp8

pytestmark = pytest.mark.torchax
SHAPE, BATCH, SEQ, STEPS = "tiny", 2, 16, 6


@functools.lru_cache(maxsize=None)
def _run(kind: str):
    """(losses of STEPS steps, the lowered HLO, compiled programs, the model)
    of `kind`: "bf16" (tpu rules) or "fp8" (the same, decoder layers in fp8)."""
    model = L.build(SHAPE, SEQ)
    if kind == "fp8":
        fp8.convert(model, L.fp8_recipe())
    step = xt.make_train_step(model, L.loss, optax.adamw(1e-3), policy="tpu")
    placed = [step.place_batch(*b) for b in L.batches(SHAPE, BATCH, SEQ)]
    losses = [step(*placed[0])]
    float(losses[0])  # the first step compiled and ran
    with jax.transfer_guard("disallow"):
        losses += [step(*placed[k % len(placed)]) for k in range(1, STEPS)]
    hlo = step.lower(*placed[0]).as_text(dialect="hlo")
    return [float(v) for v in losses], hlo, step._jitted._cache_size(), model


def _vocab_dots(hlo: str) -> list:
    """The dots with the vocabulary in an operand's or the result's shape:
    the LM head's forward, input gradient and weight gradient."""
    instrs = parse(hlo)
    vocab = str(L.SHAPES[SHAPE]["vocab_size"])

    def dims(name):
        return instrs[name][0].split("[")[1].split("]")[0].split(",")
    return [d for d in dots(hlo)
            if vocab in dims(d[0]) or any(vocab in dims(o) for o in instrs[d[0]][2][:2])]


def test_every_projection_is_fp8_forward_and_backward_and_the_head_bf16():
    _, hlo, _, model = _run("fp8")
    converted = [n for n, m in model.named_modules() if isinstance(m, fp8.Fp8Linear)]
    assert sorted({n.rsplit(".", 1)[1] for n in converted}) == sorted(L.PROJECTIONS)
    assert len(converted) == len(L.PROJECTIONS) * L.SHAPES[SHAPE]["num_hidden_layers"]
    assert isinstance(model.model.lm_head, torch.nn.Linear)
    entries = dots(hlo)
    found = [d for d in entries if fp8_dot(d)]
    assert len(found) == 3 * len(converted), entries
    assert sum(d[1][0] == "f8e5m2" for d in found) == 2 * len(converted)
    assert dequantized(entries) == []
    head = _vocab_dots(hlo)
    assert [(d[1], d[2]) for d in head] == [(("bf16", "bf16"), "bf16")] * 3, head
    # the rest: attention's scores and their product with V, forward and backward
    rest = [d for d in entries if not fp8_dot(d) and d not in head]
    assert {(d[1], d[2]) for d in rest} == {(("bf16", "bf16"), "bf16")}, rest


def test_bf16_every_dot_is_bf16():
    _, hlo, _, _ = _run("bf16")
    entries = dots(hlo)
    assert len(_vocab_dots(hlo)) == 3
    assert {(d[1], d[2]) for d in entries} == {(("bf16", "bf16"), "bf16")}, entries


def _eager_bf16_deviation() -> float:
    """|loss(bf16 autocast) - loss(fp32)| / loss(fp32) of PyTorch's own eager
    forward on the CPU, the same weights and batch."""
    model = L.build(SHAPE, SEQ)
    x, y = L.batches(SHAPE, BATCH, SEQ)[0]
    with torch.no_grad():
        fp32 = float(L.loss(model(x), y))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = float(L.loss(copy.deepcopy(model)(x), y))
    return abs(low - fp32) / fp32


def test_one_program_no_transfers_and_fp8_losses_within_bf16_noise():
    bf16, _, bf16_programs, _ = _run("bf16")
    got, _, fp8_programs, _ = _run("fp8")
    assert (bf16_programs, fp8_programs) == (1, 1)
    assert np.isfinite(got).all() and np.isfinite(bf16).all()
    tol = max(0.01, 3.0 * _eager_bf16_deviation())
    gaps = [abs(a - b) / b for a, b in zip(got, bf16)]
    assert max(gaps) <= tol, (got, bf16, tol)
    assert got[-1] < got[0] and bf16[-1] < bf16[0], (got, bf16)
