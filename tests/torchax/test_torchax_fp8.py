"""xla_amp.fp8 on the torchax backend: the same layers (fp8/_linear.py's
functions under a jax.custom_vjp) in a jitted make_train_step: every
matmul of a transformer block's step -- forward, input and weight gradient
-- a dot on float8 operands with an f32 result and no dot fed a widened
float8 value (the gate of the torch_xla test, on JAX's HLO), gradients in
e5m2; the loss equals the torch_xla fp8
run's, with dynamic and with delayed scaling (the history rolled by the
jitted step: amax(g) comes back as a probe's gradient); a skipped step
leaves the history; a hand-written step without probes refuses delayed
scaling by name."""
from __future__ import annotations

import optax
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tests.support.torchax_env as helpers_torchax  # noqa: F401  (JAX on CPU)
from tests.support.fp8 import (Block, ResultTypes, dequantized, dots, fp8_dot, precisions,
                                traced_delayed_mlp_step, unfoldable)

import xla_amp
import xla_amp.torchax as xt
from xla_amp import fp8

pytestmark = pytest.mark.torchax


def _block(scaling="dynamic", **recipe):
    torch.manual_seed(0)
    return (fp8.convert(Block(), fp8.Fp8Recipe(scaling=scaling, **recipe)),
            torch.randn(2, 16, 32), torch.randn(2, 16, 32))


@pytest.mark.parametrize("policy,scaling,gemm_output", [
    ("tpu", "dynamic", "float32"), ("cuda", "dynamic", "float32"), ("tpu", "delayed", "float32"),
    ("tpu", "dynamic", "bfloat16"), ("cuda", "delayed", "bfloat16")])
def test_every_matmul_of_a_jitted_step_is_a_dot_on_float8_operands(policy, scaling, gemm_output):
    model, x, y = _block(scaling, gemm_output=gemm_output)
    types = ResultTypes(model)
    hlo = xt.make_train_step(model, F.mse_loss, optax.sgd(0.1), policy=policy).lower(
        x, y).as_text(dialect="hlo")
    entries = dots(hlo)
    found = [d for d in entries if fp8_dot(d)]
    assert len(found) == 12, entries
    # float32 results, or bfloat16 where the recipe asks and the result goes
    # to bfloat16 (the tpu rules' outputs; the cuda rules' float16 never)
    assert sorted(d[2] for d in found) == sorted(types.want), (found, types.want)
    assert types.want.count("bf16") >= (4 if (policy, gemm_output) == ("tpu", "bfloat16")
                                        else 0), types.want
    if gemm_output == "float32" or policy == "cuda":
        assert set(types.want) == {"f32"}, types.want
    assert unfoldable(hlo) == []  # one multiply by a scalar after each f32 result
    assert sum(d[1][0] == "f8e5m2" for d in found) == 8
    assert dequantized(entries) == []


@pytest.mark.parametrize("fast", ["forward", "all", "none"])
def test_fast_accumulation_is_each_gemms_precision(fast):
    """XLA:GPU gives a float8 dot at DEFAULT precision cuBLASLt's fast
    accumulation and one at HIGHEST the split accumulator: the recipe's
    choice is in the lowered program, per GEMM. Hybrid format: the gradient
    GEMMs are the dots with an e5m2 operand."""
    torch.manual_seed(0)
    model = fp8.convert(Block(), fp8.Fp8Recipe(fast_accumulation=fast))
    hlo = xt.make_train_step(model, F.mse_loss, optax.sgd(0.1), policy="tpu").lower(
        torch.randn(2, 16, 32), torch.randn(2, 16, 32)).as_text(dialect="hlo")
    found = [d for d in dots(hlo) if fp8_dot(d)]
    prec = precisions(hlo)
    forward = {prec[d[0]] for d in found if d[1][0] != "f8e5m2"}
    backward = {prec[d[0]] for d in found if d[1][0] == "f8e5m2"}
    assert len(found) == 12 and len(backward) >= 1, found
    want = {"forward": ({""}, {"highest"}), "all": ({""}, {""}),
            "none": ({"highest"}, {"highest"})}[fast]
    assert (forward, backward) == want, (forward, backward)


def test_a_gpu_step_with_fp8_layers_compiles_without_triton_gemms(monkeypatch):
    """XLA's Triton GEMM autotuning took 55.6 s per fp8 GEMM on an H200
    (0.11 s without; cuBLASLt's fp8 GEMM wins either way): a step with fp8
    layers on a GPU backend is jitted with Triton GEMM fusions off, unless
    XLA_FLAGS decides it; nothing changes elsewhere."""
    from xla_amp.torchax import _fp8, _step
    model, plain = _block()[0], Block()
    off = {"xla_gpu_enable_triton_gemm": False}
    assert _fp8.compiler_options(model, "gpu", "") == off
    assert _fp8.compiler_options(model, "gpu", "--xla_gpu_enable_triton_gemm=true") is None
    assert _fp8.compiler_options(model, "cpu", "") is None
    assert _fp8.compiler_options(model, "tpu", "") is None
    assert _fp8.compiler_options(plain, "gpu", "") is None
    # make_train_step jits with them (the backend faked: this host's is a CPU)
    seen = []
    real_jit = _step.jax.jit
    monkeypatch.setattr(_step.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(_step.jax, "jit", lambda f, **kw: seen.append(kw) or real_jit(f, **kw))
    xt.make_train_step(model, F.mse_loss, optax.sgd(0.1), policy="tpu")
    assert seen == [{"compiler_options": off}], seen


def test_the_recipe_refuses_an_unknown_fast_accumulation():
    with pytest.raises(ValueError, match="fast_accumulation must be one of forward, all, none"):
        fp8.Fp8Recipe(fast_accumulation="backward")


@pytest.mark.parametrize("scaling,gemm_output", [("dynamic", "float32"), ("delayed", "float32"),
                                                 ("delayed", "bfloat16")])
def test_losses_equal_the_torch_xla_fp8_run(device, scaling, gemm_output):
    recipe = fp8.Fp8Recipe(scaling=scaling, amax_history_len=3, gemm_output=gemm_output)

    def mlp():
        torch.manual_seed(0)
        return fp8.convert(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16)),
                           recipe)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 32, generator=g), torch.randn(16, 16, generator=g))
               for _ in range(4)]
    step = xt.make_train_step(mlp(), F.mse_loss, optax.sgd(0.1), policy="tpu")
    got = [float(step(x, y)) for x, y in batches]
    model = mlp().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fp8.attach(opt, model)
    want = []
    for x, y in batches:
        opt.zero_grad()
        with xla_amp.autocast(device, policy="tpu"):
            loss = F.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        want.append(loss.item())
    assert got == pytest.approx(want, rel=1e-5)
    assert got[-1] < got[0]
    if scaling == "delayed":  # the same histories and scales after 4 rolls
        for name in ("0.fp8_amax_history", "2.fp8_scale"):
            import numpy as np
            np.testing.assert_allclose(np.asarray(step.state[1][name]),
                                       model.state_dict()[name].cpu().numpy(), rtol=1e-5)


def test_pinned_amaxes_stand_behind_barriers_and_change_no_bit():
    """_quant.pinned_amax on torchax (jax.lax.optimization_barrier): the
    jitted delayed-scaling step traced inside it has one barrier per amax
    (x, w, g of each layer), none with the pin off, as many by default; two
    steps' losses and the fp8 histories are the same bits."""
    import contextlib
    import numpy as np
    from xla_amp.fp8 import _quant

    def run(pin):
        pinning = contextlib.nullcontext() if pin is None else _quant.pinned_amax(pin)
        step, hlo, losses = traced_delayed_mlp_step(pinning, optax.sgd(0.1))
        hist = {k: np.asarray(v) for k, v in step.state[1].items() if "amax" in k}
        return hlo, losses, hist

    hlo, losses, hist = run(False)
    pinned, got, got_hist = run(True)
    default = run(None)[0]
    assert (hlo.count(" opt-barrier("), pinned.count(" opt-barrier(")) == (0, 3 * 2)
    assert default.count(" opt-barrier(") == 3 * 2
    assert [a.tobytes() for a in got] == [a.tobytes() for a in losses]
    assert hist.keys() == got_hist.keys() and len(hist) == 4
    assert all(np.array_equal(hist[k], got_hist[k]) for k in hist)


def test_a_skipped_step_leaves_the_history():
    import numpy as np
    torch.manual_seed(0)
    model = fp8.convert(nn.Sequential(nn.Linear(32, 64)), fp8.Fp8Recipe(scaling="delayed"))

    def loss_fn(out, y):
        return F.mse_loss(out.float(), y[:, :64]) * y[0, 64]  # y[0, 64]: inf poisons

    step = xt.make_train_step(model, loss_fn, optax.sgd(0.1), policy="tpu",
                              scaler=xt.LossScaler(init_scale=4.0))
    x, y = torch.randn(16, 32), torch.ones(16, 65)
    step(x, y)
    hist = np.asarray(step.state[1]["0.fp8_amax_history"]).copy()
    assert (hist[:, 0] > 0).all() and (hist[:, 1:] == 0).all()
    y[0, 64] = float("inf")
    step(x, y)
    assert bool(step.metrics["found_inf"])
    assert np.array_equal(np.asarray(step.state[1]["0.fp8_amax_history"]), hist)
    assert not np.asarray(step.state[1]["0.fp8_amax_pending"]).any()


def test_delayed_scaling_without_probes_is_refused():
    """A hand-written jitted step cannot carry the history: refused by name."""
    from tests.support.torchax_env import ENV
    torch.manual_seed(0)
    model = fp8.convert(nn.Sequential(nn.Linear(32, 64)), fp8.Fp8Recipe(scaling="delayed"))
    with ENV:
        model = model.to("jax")
        with pytest.raises(ValueError, match="delayed scaling needs a step that carries"):
            model(torch.randn(16, 32, device="jax"))
