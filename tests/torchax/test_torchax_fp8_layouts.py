"""xla_amp.torchax's fp8 dots with K-minor operands (`_fp8.word_transposes`):
on a GPU the gradient GEMMs' float8 operands are transposed through 4-byte
words, which an H200 ran 1.24-1.79x faster than XLA's byte transposes
(benchmarks/fp8_transpose.py; the MLP step 1.372x bf16 against 1.309x,
docs/benchmarks.md). JAX runs on the CPU here, so the tests force it on."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F

import tests.support.torchax_env as helpers_torchax  # noqa: F401  (JAX on CPU)
from tests.support.fp8 import (Block, contractions, dequantized, dots, fp8_dot,
                                traced_delayed_mlp_step, unfoldable, word_casts)

import xla_amp.torchax as xt
from xla_amp import fp8
from xla_amp.torchax import _fp8

pytestmark = pytest.mark.torchax

@pytest.mark.parametrize("dtype", [jnp.float8_e4m3fn, jnp.float8_e5m2])
def test_a_word_transpose_is_the_transpose_of_every_bit_pattern(dtype):
    """All 256 byte patterns (NaNs and infinities included), in a [64, 12]
    block: the same bytes as numpy's transpose."""
    rng = np.random.default_rng(0)
    raw = rng.permutation(np.tile(np.arange(256, dtype=np.uint8), 3)).reshape(64, 12)
    q = jax.lax.bitcast_convert_type(jnp.asarray(raw), dtype)
    out = jax.jit(_fp8._word_transpose)(q)
    assert out.dtype == dtype and out.shape == (12, 64)
    assert np.array_equal(np.asarray(jax.lax.bitcast_convert_type(out, jnp.uint8)), raw.T)


def test_only_a_2d_operand_contracted_on_dim_0_with_rows_in_words_is_transposed():
    q = jnp.zeros((16, 8), jnp.float8_e4m3fn)
    with _fp8.word_transposes(True):
        assert _fp8._k_minor(q, 0)[0].shape == (8, 16) and _fp8._k_minor(q, 0)[1] == 1
        assert _fp8._k_minor(q, 1) == (q, 1)                              # already K-minor
        odd = jnp.zeros((18, 8), jnp.float8_e4m3fn)
        assert _fp8._k_minor(odd, 0) == (odd, 0)                          # rows not in words
    with _fp8.word_transposes(False):
        assert _fp8._k_minor(q, 0) == (q, 0)
    assert _fp8._k_minor(q, 0) == (q, 0)  # the default: a GPU backend only; JAX runs on the CPU


def test_the_default_is_a_gpu_backend_with_unsharded_parameters(monkeypatch):
    q = jnp.zeros((16, 8), jnp.float8_e4m3fn)
    monkeypatch.setattr(_fp8, "_on_gpu", lambda: True)
    assert _fp8._k_minor(q, 0)[1] == 1
    with _fp8.sharded_parameters(True):
        assert _fp8._k_minor(q, 0) == (q, 0)
        with _fp8.word_transposes(True):  # said outright, it holds there too
            assert _fp8._k_minor(q, 0)[1] == 1
    monkeypatch.setattr(_fp8, "_on_gpu", lambda: False)
    assert _fp8._k_minor(q, 0) == (q, 0)


def test_on_a_mesh_only_sharded_parameters_keep_xlas_transposes():
    """make_train_step on 4 CPU devices with the GPU default
    (_torchax_fp8_layouts_mesh_run.py): replicated, the step takes the word
    transposes by default with no collective added; FSDP, it keeps XLA's,
    because forced on there the partitioner gathers the transposed weights
    besides the weights (6 all-gathers against 4: pinned, so that a
    partitioner that stops doing so shows here). Every run the same bits."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PJRT_DEVICE="CPU",
               XLA_FLAGS="--xla_force_host_platform_device_count=4")
    script = os.path.join(os.path.dirname(__file__), "_torchax_fp8_layouts_mesh_run.py")
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.splitlines()[-1])
    assert all(r["same_bits"] for r in runs.values()), runs
    casts = {k: r["word_casts"] for k, r in runs.items()}
    assert casts == {"replicate/default": 5, "replicate/off": 0,
                     "fsdp/default": 0, "fsdp/on": 5, "fsdp/off": 0}
    gathers = {k: r["all_gathers"] for k, r in runs.items()}
    assert gathers["replicate/default"] == gathers["replicate/off"] == 0
    assert gathers["fsdp/default"] == gathers["fsdp/off"] < gathers["fsdp/on"]


def _run(on):
    """A delayed-scaling MLP's jitted step traced with word transposes `on`:
    (its lowered HLO, two steps' losses, the state after them)."""
    step, hlo, losses = traced_delayed_mlp_step(_fp8.word_transposes(on), optax.adamw(1e-2))
    return hlo, losses, [np.asarray(leaf) for leaf in jax.tree_util.tree_leaves(step.state)]


def _fp8_dot_contractions(hlo):
    """(lhs, rhs) contracting dims of every dot on float8 operands."""
    dims = contractions(hlo)
    return [dims[entry[0]] for entry in filter(fp8_dot, dots(hlo))]


def test_word_transposes_make_every_fp8_dot_k_minor_and_change_no_bit():
    """Forced on: each of the step's 5 fp8 dots (2 forward, 2 weight
    gradients, 1 input gradient) contracts dim 1 of both operands; left to
    XLA, the gradient GEMMs contract dim 0. The losses and every leaf of the
    state (weights, AdamW's moments, fp8 histories) are the same bits."""
    hlo, losses, state = _run(False)
    words, got, got_state = _run(True)
    assert sorted(_fp8_dot_contractions(words)) == [(1, 1)] * 5
    assert sorted(_fp8_dot_contractions(hlo)) == [(0, 0), (0, 0), (1, 0), (1, 1), (1, 1)]
    assert (word_casts(words), word_casts(hlo)) == (5, 0)  # one per operand at dim 0
    assert [a.tobytes() for a in got] == [a.tobytes() for a in losses]
    assert len(state) == len(got_state) > 10
    assert all(a.tobytes() == b.tobytes() for a, b in zip(state, got_state))


@pytest.mark.parametrize("policy", ["tpu", "cuda"])
def test_a_transformer_blocks_step_keeps_the_gate_with_word_transposes(policy):
    """tests/torchax/test_torchax_fp8.py's gate on a transformer block's 12
    fp8 matmuls (3-D activations, attention and MLP) holds with the word
    transposes on, and every one of the 12 is K-minor."""
    torch.manual_seed(0)
    model = fp8.convert(Block(), fp8.Fp8Recipe(scaling="delayed"))
    x, y = torch.randn(2, 16, 32), torch.randn(2, 16, 32)
    step = xt.make_train_step(model, F.mse_loss, optax.sgd(0.1), policy=policy)
    with _fp8.word_transposes(True):
        hlo = step.lower(x, y).as_text(dialect="hlo")
    entries = dots(hlo)
    assert sum(map(fp8_dot, entries)) == 12 and dequantized(entries) == []
    assert unfoldable(hlo) == []
    assert _fp8_dot_contractions(hlo) == [(1, 1)] * 12
