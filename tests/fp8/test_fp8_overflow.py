"""An fp8 layer never hides an overflow from the GradScaler: the
backward's clamp before the cast used to turn an inf output gradient into a
finite one, the step was not skipped, and the inf amax froze the layer's
gradient scale for the whole history. Now a non-finite output gradient is
passed on to the input and weight gradients, and never enters the history.
An MLP whose Linear layers are all fp8 (no bias), float16 under the cuda
rules with the GradScaler, one loss multiplied by 1e30."""
import pytest
import torch
from torch import nn

import xla_amp
from xla_amp import fp8, syncfree


def _mlp(recipe, device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64, bias=False), nn.ReLU(), nn.Linear(64, 64, bias=False),
                          nn.ReLU(), nn.Linear(64, 16, bias=False))
    return fp8.convert(model, recipe).to(device)


def _snapshot(model, opt):
    import torch_xla
    torch_xla.sync()
    return ({k: v.cpu().clone() for k, v in model.state_dict().items()},
            {k: {n: t.cpu().clone() for n, t in st.items() if isinstance(t, torch.Tensor)}
             for k, st in opt.state_dict()["state"].items()})


def _equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            _equal(a[k], b[k])
        else:
            assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("optimizer", ["syncfree", "torch.optim"])
@pytest.mark.parametrize("scaling", ["delayed", "dynamic"])
@pytest.mark.parametrize("fmt", ["hybrid", "e4m3"])
def test_an_overflow_behind_fp8_layers_is_skipped(device, scaling, fmt, optimizer):
    """torch.optim: the GradScaler's masked step; fp8.attach's roll used to
    run on the skipped step anyway (the hook saw no found_inf)"""
    _overflow_is_skipped(device, fp8.Fp8Recipe(scaling=scaling, format=fmt, amax_history_len=4),
                         optimizer, "cuda", 1e30)  # 1e30 overflows float16 in the backward


@pytest.mark.parametrize("optimizer,scaling", [("syncfree", "delayed"), ("torch.optim", "dynamic")])
def test_an_overflow_behind_bfloat16_gemm_outputs_is_skipped(device, optimizer, scaling):
    """Fp8Recipe(gemm_output="bfloat16") under the tpu rules: the bf16 GEMM
    results carry the non-finite gradient on as the float32 ones do."""
    _overflow_is_skipped(device, fp8.Fp8Recipe(scaling=scaling, amax_history_len=4,
                                               gemm_output="bfloat16"),
                         optimizer, "tpu", float("inf"))


def _overflow_is_skipped(device, recipe, optimizer, policy, factor):
    scaling = recipe.scaling
    model = _mlp(recipe, device)
    opt = (syncfree.SGD if optimizer == "syncfree" else torch.optim.SGD)(
        model.parameters(), lr=0.1, momentum=0.9)
    fp8.attach(opt, model)
    scaler = xla_amp.GradScaler(init_scale=256.0)
    x = torch.randn(16, 32).to(device)
    y = torch.randn(16, 16).to(device)
    before = None
    for step in range(4):
        if step == 2:
            before = _snapshot(model, opt)
        with xla_amp.autocast(device, policy=policy):
            loss = nn.functional.mse_loss(model(x).float(), y)
        if step == 2:
            loss = loss * factor
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if step == 2:
            after = _snapshot(model, opt)
            assert scaler.get_scale() == 128.0  # skipped: backed off once
            # weights, histories, pending amaxes, delayed scales bit for bit. Written by
            # every call, not carried by the step: fp8_stats (report()'s diagnostics of
            # the last quantization) and, under dynamic scaling, fp8_scale (the scales
            # the last call computed from its own tensors)
            per_call = ("fp8_stats",) + (("fp8_scale",) if scaling == "dynamic" else ())
            _equal({k: v for k, v in before[0].items() if not k.endswith(per_call)},
                   {k: v for k, v in after[0].items() if not k.endswith(per_call)})
            _equal(before[1], after[1])  # momentum
            hist = [v for k, v in after[0].items() if k.endswith("fp8_amax_history")]
            assert len(hist) == (3 if scaling == "delayed" else 0)
            assert all(torch.isfinite(h).all() for h in hist)
    # the next good steps advance again
    assert not torch.equal(before[0]["0.weight"], model.state_dict()["0.weight"].cpu())


def test_linear_subclasses_left_alone_are_named():
    """convert swaps exact nn.Linear only; a subclass such as
    nn.MultiheadAttention's out_proj (its owner reads .weight directly) is
    named in one warning, not passed over without a word."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
            self.mlp = nn.Linear(32, 32)

    with pytest.warns(UserWarning, match=r"nn\.Linear subclasses it does not swap: "
                                         r"attn\.out_proj \(NonDynamicallyQuantizableLinear\)$"):
        model = fp8.convert(Block())
    assert isinstance(model.mlp, fp8.Fp8Linear)
    assert type(model.attn.out_proj).__name__ == "NonDynamicallyQuantizableLinear"
