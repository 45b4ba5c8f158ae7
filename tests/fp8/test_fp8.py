"""xla_amp.fp8 on XLA:CPU: every converted matmul of a training step
(forward, input gradient, weight gradient) is a dot on float8 operands with a
wide result, and no dot is fed a widened float8 value (the form the H100 run
proved, docs/fp8.md); shapes that cannot take an fp8 GEMM fall back to the
region's dtype, logged and reported; numerics equal to a float64 reference of the same quantization,
saturation without NaN, delayed scaling against a hand-written reference
(accumulation, skipped steps, zero and non-finite amax), bad input refused
with the model unchanged."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch_xla

import xla_amp
from xla_amp import fp8
from xla_amp.fp8 import _quant

from tests.support.fp8 import Block, ResultTypes, dequantized, dots, fp8_dot, unfoldable

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _step_hlo(device, recipe, policy="tpu", results=None):
    torch.manual_seed(0)
    model = fp8.convert(Block().to(device), recipe)
    types = ResultTypes(model)
    x = torch.randn(2, 16, 32, device=device)
    with xla_amp.autocast(device, policy=policy):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    if results is not None:
        results.extend(types.want)
    return torch_xla._XLAC._get_xla_tensors_hlo([loss] + [p.grad for p in model.parameters()])


@pytest.mark.parametrize("policy", ["tpu", "cuda"])
@pytest.mark.parametrize("recipe", [fp8.Fp8Recipe(), fp8.Fp8Recipe(scaling="delayed"),
                                    fp8.Fp8Recipe(format="e4m3", power_of_two=True),
                                    fp8.Fp8Recipe(gemm_output="bfloat16")],
                         ids=["dynamic_hybrid", "delayed", "e4m3_pow2", "bf16_out"])
def test_every_converted_matmul_is_a_dot_on_float8_operands(device, recipe, policy):
    want = []
    hlo = _step_hlo(device, recipe, policy, want)
    entries = dots(hlo)
    found = [d for d in entries if fp8_dot(d)]
    # 4 layers x (forward, input gradient, weight gradient)
    assert len(found) == 12, entries
    # the wide result the scales apply to: float32, or bfloat16 where the
    # recipe asks for it and the result goes to bfloat16 (the tpu rules'
    # outputs; never under the cuda rules' float16)
    assert sorted(d[2] for d in found) == sorted(want), (found, want)
    if recipe.gemm_output == "float32" or policy == "cuda":
        assert want.count("bf16") == 0, want
    else:  # at least each layer's forward (its output is the region's bfloat16)
        assert want.count("bf16") >= 4, want
    # each float32 result's scales (and, in the backward, the non-finite
    # check) are one multiply by a scalar: the one XLA:GPU folds into the GEMM
    assert unfoldable(hlo) == []
    e5m2 = sum(d[1][0] == "f8e5m2" for d in found)  # the gradient is the lhs of both
    assert e5m2 == (8 if recipe.format == "hybrid" else 0)
    assert not any(d[1] == ("f8e5m2", "f8e5m2") for d in found)
    assert dequantized(entries) == []
    # the rest (attention's) have no float8 operand
    assert all(not k.startswith("f8") for d in entries if not fp8_dot(d) for k in d[1])


def test_gate_refuses_the_dequantize_then_dot_form(device):
    """The old form (the GemmRewriter matcher's), which XLA:GPU compiled to a
    plain f32 GEMM with runtime scales: the gate rejects it, with or without
    a layout op or a bf16 dequantize between."""
    a = torch.randn(16, 32, device=device)
    b = torch.randn(16, 32, device=device)
    s = torch.tensor(0.5, device=device)
    qa, qb = (a * 2).to(E4M3), (b * 2).to(E4M3)
    hlo = torch_xla._XLAC._get_xla_tensors_hlo
    for form in ((qa.float() * s) @ (qb.float() * s).t(),
                 (qa.bfloat16() * 0.5) @ (qb.bfloat16() * 0.5).t(),
                 qa.float() @ qb.float().t()):
        entries = dots(hlo([form]))
        assert len(entries) == 1 and len(dequantized(entries)) == 1, entries
        assert not fp8_dot(entries[0])
    good = dots(hlo([torch.ops.xla_amp.fp8_dot(qa, qb, 1, 1)]))
    assert [fp8_dot(e) for e in good] == [True] and dequantized(good) == []


def _reference(x, w, g, recipe):
    """float64 quantize -> dequantize -> matmul on the CPU, dynamic scaling."""
    fx, fw, fg = recipe.dtypes()
    out = {}
    for name, t, f in (("x", x, fx), ("w", w, fw), ("g", g, fg)):
        s = _quant.scale_from_amax(recipe, f, t.abs().max().float(), torch.tensor(1.0))
        q = _quant.quantize(t, s, f)
        out[name] = (q, q.double() * (1.0 / s.double()))
    xd, wd, gd = out["x"][1], out["w"][1], out["g"][1]
    return out, xd @ wd.t(), gd @ wd, gd.t() @ xd


@pytest.mark.parametrize("recipe", [fp8.Fp8Recipe(), fp8.Fp8Recipe(format="e4m3")],
                         ids=["hybrid", "e4m3"])
def test_forward_and_gradients_equal_a_float64_reference(device, recipe):
    torch.manual_seed(0)
    x, w, g = torch.randn(16, 32), torch.randn(48, 32) * 0.1, torch.randn(16, 48) * 1e-3
    layer = fp8.convert(nn.Sequential(nn.Linear(32, 48, bias=False)), recipe).to(device)
    with torch.no_grad():
        layer[0].weight.copy_(w.to(device))
    xd = x.to(device).requires_grad_()
    y = layer(xd)
    y.backward(g.to(device))
    q, y_ref, gx_ref, gw_ref = _reference(x, w, g, recipe)
    # the quantized operands: bit for bit (the f8 rounding is the same)
    for name, t in (("x", x), ("w", w)):
        s = layer[0].fp8_scale[0 if name == "x" else 1].cpu()
        got = _quant.quantize(t.to(device), s.to(device), recipe.dtypes()[0]).cpu()
        assert torch.equal(got.view(torch.uint8), q[name][0].view(torch.uint8)), name
    # float32 accumulation against float64: relative to the result's magnitude
    for got, ref in ((y, y_ref), (xd.grad, gx_ref), (layer[0].weight.grad, gw_ref)):
        torch.testing.assert_close(got.cpu().double(), ref, rtol=0,
                                   atol=1e-6 * ref.abs().max().item())


def test_a_bfloat16_gemm_output_equals_its_manual_control(device):
    """Fp8Recipe(gemm_output="bfloat16") on a bfloat16 input: the forward and
    input-gradient dots return bfloat16, scaled in float32 and cast, bit for
    bit the same ops written by hand; the weight's (float32) gradient keeps
    the float32 dot; all within bfloat16's rounding of the float64
    reference."""
    recipe = fp8.Fp8Recipe(gemm_output="bfloat16")
    torch.manual_seed(0)
    x, w, g = torch.randn(16, 32), torch.randn(48, 32) * 0.1, torch.randn(16, 48) * 1e-3
    layer = fp8.convert(nn.Sequential(nn.Linear(32, 48, bias=False)), recipe).to(device)
    with torch.no_grad():
        layer[0].weight.copy_(w.to(device))
    xd = x.to(device).bfloat16().requires_grad_()
    y = layer(xd)
    y.backward(g.to(device).bfloat16())
    assert (y.dtype, xd.grad.dtype, layer[0].weight.grad.dtype) == (
        torch.bfloat16, torch.bfloat16, torch.float32)
    fx, fw, fg = recipe.dtypes()
    sx, sw, sg = (s.to(device) for s in layer[0].fp8_scale.cpu().unbind())
    # the control, on the device: the same quantization, dots, scales, cast
    q = {n: _quant.quantize(t.to(device), s, f) for n, t, s, f in (
        ("x", x.bfloat16(), sx, fx), ("w", w, sw, fw), ("g", g.bfloat16(), sg, fg))}

    def scaled(a, b, ca, cb, sa, sb):
        dot = torch.ops.xla_amp.fp8_dot(a, b, ca, cb, torch.bfloat16)
        assert dot.dtype == torch.bfloat16
        return (dot.float() * (torch.reciprocal(sa) * torch.reciprocal(sb))).bfloat16()
    for got, want in ((y, scaled(q["x"], q["w"], 1, 1, sx, sw)),
                      (xd.grad, scaled(q["g"], q["w"], 1, 0, sg, sw))):
        assert torch.equal(got.cpu().view(torch.int16), want.cpu().view(torch.int16))
    _, y_ref, gx_ref, gw_ref = _reference(x.bfloat16().float(), w, g.bfloat16().float(), recipe)
    for got, ref, tol in ((y, y_ref, 2 ** -7), (xd.grad, gx_ref, 2 ** -7),
                          (layer[0].weight.grad, gw_ref, 1e-6)):
        torch.testing.assert_close(got.cpu().double(), ref, rtol=0,
                                   atol=tol * ref.abs().max().item())


def test_saturation_clamps_never_nan(device):
    recipe = fp8.Fp8Recipe(scaling="delayed")  # scale 1 until the first roll
    layer = fp8.convert(nn.Sequential(nn.Linear(16, 16)), recipe).to(device)
    x = torch.full((16, 16), 1e4, device=device)
    x[0, 0] = -1e6
    y = layer(x)
    assert not torch.isnan(y).any().item()
    saturated = layer[0].fp8_stats[0, 0].item()
    assert saturated == 1.0  # every |x| > 448 at scale 1
    assert torch.isfinite(y).all().item()


def _delayed_reference(amaxes_per_step, skipped, recipe):
    """Hand-written delayed scaling for one operand: per optimizer step a
    list of micro-batch amaxes; returns the scale in use at each step."""
    hist = [0.0] * recipe.amax_history_len
    scale, scales = 1.0, []
    fmax = 448.0
    for amaxes, skip in zip(amaxes_per_step, skipped):
        scales.append(scale)
        # a non-finite amax (an overflow) never enters the history
        pending = max([a for a in amaxes if math.isfinite(a)], default=0.0)
        if skip:
            continue
        hist = [pending] + hist[:-1]
        a = max(hist) if recipe.amax_compute == "max" else hist[0]
        if math.isfinite(a) and a > 0:
            s = fmax / (a * 2 ** recipe.margin)
            scale = 2.0 ** math.floor(math.log2(s)) if recipe.power_of_two else s
    return scales


@pytest.mark.parametrize("recipe", [fp8.Fp8Recipe(scaling="delayed", amax_history_len=3),
                                    fp8.Fp8Recipe(scaling="delayed", amax_history_len=2,
                                                  margin=1, power_of_two=True,
                                                  amax_compute="most_recent")],
                         ids=["max", "most_recent_pow2_margin"])
def test_delayed_scaling_equals_reference(device, recipe):
    """Two micro-batches per step (the history rolls once per step, with
    their max), a skipped step, a zero amax and an inf amax."""
    steps = [[2.0, 3.0], [1.0, 0.5], [8.0, 1.0], [0.0, 0.0], [4.0, math.inf], [1.0, 2.0]]
    skipped = [False, False, True, False, False, False]
    layer = fp8.convert(nn.Sequential(nn.Linear(16, 16, bias=False)), recipe).to(device)
    with torch.no_grad():
        layer[0].weight.fill_(0.0)
    got = []
    for amaxes, skip in zip(steps, skipped):
        got.append(layer[0].fp8_scale[0].item())
        for a in amaxes:
            x = torch.zeros(16, 16)
            x[0, 0] = a
            layer(x.to(device))
        fp8.update_scales(layer, torch.tensor(skip, device=device))
    # the inf micro-batch is left out of the history: it cannot freeze the scale
    assert got == pytest.approx(_delayed_reference(steps, skipped, recipe)), got


@pytest.mark.parametrize("optimizer", ["SGD", "Adam", "AdamW"])
def test_update_scales_after_optimizer_step_with_the_grad_scaler(device, optimizer):
    """attach(): the history rolls after each optimizer step, not per
    backward; a step the GradScaler skips leaves it -- with every syncfree
    optimizer."""
    from xla_amp import syncfree
    recipe = fp8.Fp8Recipe(scaling="delayed", amax_history_len=4)
    torch.manual_seed(0)
    model = fp8.convert(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)),
                        recipe).to(device)
    opt = getattr(syncfree, optimizer)(model.parameters(), lr=0.1)
    fp8.attach(opt, model)
    scaler = xla_amp.GradScaler(init_scale=2.0 ** 4)
    hist = model[0].fp8_amax_history
    for poison in (False, True):
        x = torch.randn(16, 16, device=device)
        before = hist.cpu().clone()
        for _ in range(2):  # two micro-batches
            with xla_amp.autocast(device, policy="tpu"):
                loss = model(x).float().pow(2).mean()
            if poison:  # an inf input would be clamped to ±448: poison the loss
                loss = loss * math.inf
            scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch_xla.sync()
        after = hist.cpu()
        if poison:
            assert torch.equal(after, before)
        else:
            assert torch.equal(after[:, 1:], before[:, :-1]) and after[0, 0] > 0


# -- bad input: one clear error each, the model unchanged ---------------------

def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))


def _same(a, b):
    return [type(m) for m in a.modules()] == [type(m) for m in b.modules()]


@pytest.mark.parametrize("kwargs,match", [
    ({"format": "e3m4"}, "format must be one of hybrid, e4m3"),
    ({"scaling": "static"}, "scaling must be one of"),
    ({"amax_history_len": 0}, "amax_history_len must be >= 1"),
    ({"margin": -1}, "margin must be >= 0"),
    ({"keep": "head"}, "keep must be a tuple"),
    ({"gemm_output": "float16"}, "gemm_output must be one of float32, bfloat16"),
])
def test_bad_recipes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fp8.Fp8Recipe(**kwargs)


def test_no_eligible_layer_and_unaligned_layers_and_twice():
    import copy
    model = nn.Sequential(nn.Conv2d(3, 8, 3))
    with pytest.raises(ValueError, match="no nn.Linear or Conv1D layer"):
        fp8.convert(model)
    kept = _mlp()
    with pytest.raises(ValueError, match="no nn.Linear"):
        fp8.convert(kept, fp8.Fp8Recipe(keep=(nn.Linear,)))
    odd = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    before = copy.deepcopy(odd)
    with pytest.raises(ValueError, match=r"layer '2' has weight shape \(10, 64\)"):
        fp8.convert(odd)
    assert _same(odd, before)  # the first layer was not converted either
    fp8.convert(odd, fp8.Fp8Recipe(keep=("2",)))
    assert isinstance(odd[0], fp8.Fp8Linear) and type(odd[2]) is nn.Linear
    with pytest.raises(ValueError, match="already an Fp8Linear"):
        fp8.convert(odd, fp8.Fp8Recipe(keep=("2",)))


def test_state_dict_round_trip_bit_identical(device):
    recipe = fp8.Fp8Recipe(scaling="delayed", amax_history_len=3)
    a = fp8.convert(_mlp(), recipe).to(device)
    for _ in range(2):
        a(torch.randn(16, 32, device=device))
        fp8.update_scales(a)
    sd = {k: v.cpu() for k, v in a.state_dict().items()}
    assert "0.fp8_amax_history" in sd and sd["0.fp8_amax_history"].shape == (3, 3)
    b = fp8.convert(_mlp(), recipe).to(device)
    b.load_state_dict(sd)
    for k, v in b.state_dict().items():
        assert torch.equal(v.cpu(), sd[k]), k
    with pytest.raises(RuntimeError, match="fp8_amax_history"):
        fp8.convert(_mlp(), fp8.Fp8Recipe(scaling="delayed", amax_history_len=5)).load_state_dict(sd)


def test_report_reads_scales_and_fractions_in_one_transfer(device):
    from tests.support import clear_metrics, count
    model = fp8.convert(_mlp(), fp8.Fp8Recipe(scaling="delayed")).to(device)
    # away from zero: a random |x| < 2**-9 also flushes to zero at scale 1 (the
    # unseeded randn made this test flaky: 5/256 underflowed in one run)
    x = torch.randn(16, 32, device=device).abs().clamp(min=0.01)
    x[0, :4] = 1e5  # saturates at scale 1 (before the first roll)
    x[1, :4] = 1e-9  # flushed to zero
    model(x).float().sum().backward()
    torch_xla.sync()
    clear_metrics()
    rep = fp8.report(model)
    assert count("TransferFromDeviceTime") == 1
    first = rep.rows[0]
    assert first.layer == "0" and first.scaling == "delayed"
    assert first.saturated[0] == pytest.approx(4 / 512) and first.underflow[0] == pytest.approx(4 / 512)
    assert first.scale == (1.0, 1.0, 1.0)
    assert rep.worst("saturated", 1)[0].layer == "0"
    assert "x sat%" in str(rep)
    with pytest.raises(ValueError, match="has no Fp8Linear"):
        fp8.report(_mlp())


@pytest.mark.parametrize("scaling,gemm_output", [("dynamic", "float32"), ("delayed", "float32"),
                                                 ("dynamic", "bfloat16")])
def test_compiled_equals_lazy_bit_for_bit(device, scaling, gemm_output):
    """torch.compile(backend="openxla"): dynamic scaling compiles (without
    writing the diagnostic buffers); delayed-scaling layers run outside the
    compiled graph. Loss and gradients equal the lazy run's bits."""
    torch.manual_seed(0)
    model = fp8.convert(_mlp(), fp8.Fp8Recipe(scaling=scaling, gemm_output=gemm_output)).to(device)
    x = torch.randn(16, 32, device=device)

    def loss_of(x):
        with xla_amp.autocast(device, policy="tpu"):
            return model(x).float().pow(2).mean()
    lazy = loss_of(x)
    lazy.backward()
    want = [p.grad.cpu().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    compiled = torch.compile(loss_of, backend="openxla")(x)
    compiled.backward()
    assert compiled.item() == lazy.item()
    for a, p in zip(want, model.parameters()):
        assert torch.equal(a, p.grad.cpu())


def test_optimized_hlo_keeps_the_float8_converts(tmp_path):
    """XLA's optimizer (here XLA:CPU's) does not fold the quantization away:
    after optimization every operand still goes through a float8 convert,
    x and w in e4m3fn, the output gradients in e5m2 (one shape each)."""
    import os
    import re
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PJRT_DEVICE="CPU", XLA_FLAGS=f"--xla_dump_to={tmp_path}")
    env.pop("CPU_NUM_DEVICES", None)
    proc = subprocess.run([sys.executable, os.path.join(here, "_fp8_dump_run.py")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = "".join(p.read_text() for p in tmp_path.glob("*after_optimizations.txt"))
    converts = set(re.findall(r"= (f8e4m3fn|f8e5m2)\[([\d,]+)\]\S* convert\(", text))
    assert {s for f, s in converts if f == "f8e4m3fn"} == {"16,32", "64,32", "16,64"}
    assert {s for f, s in converts if f == "f8e5m2"} == {"16,64", "16,16"}


def test_checkpoint_restore_refuses_bad_fp8_state_before_anything_changes(device):
    """xla_amp.checkpoint.restore checks a state against the model's own
    state_dict, so the fp8 buffers are covered: a history of another length
    or a scale of another shape is refused by name, the model unchanged (a
    float16 scale would be widened exactly, as the precision-mode
    conversion does for any state)."""
    from xla_amp import checkpoint
    recipe = fp8.Fp8Recipe(scaling="delayed", amax_history_len=3)
    model = fp8.convert(_mlp(), recipe).to(device)
    good = {k: v.cpu().clone() for k, v in model.state_dict().items()}
    before = {k: v.cpu().clone() for k, v in model.state_dict().items()}
    for key, bad in (("0.fp8_amax_history", torch.zeros(3, 5)),
                     ("2.fp8_scale", torch.ones(4))):
        state = {"model": dict(good, **{key: bad}),
                 "record": checkpoint.training_record(model)}
        with pytest.raises(checkpoint.CheckpointError, match=key.replace(".", r"\.")):
            checkpoint.restore(state, model=model)
        for k, v in model.state_dict().items():
            assert torch.equal(v.cpu(), before[k]), k
