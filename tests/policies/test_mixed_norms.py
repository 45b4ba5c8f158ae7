"""The cpu rules' [fp32_compute] (xla_amp/policies/_mixed.py): layer and
group norm of a bfloat16/float16 input with float32 weight and bias -- the
mix autocast hands a norm after a cast matmul -- computed as the CPU's
mixed-type kernels do (float32 inside, the input's type out). Before,
torch_xla returned float32 there, so under the cpu rules every activation
after a norm stayed float32 where torch.autocast("cpu")'s is bfloat16.

Checked against a manual cast on XLA (bit for bit, forward and backward),
against PyTorch's CPU kernels (dtypes, close values), on torchvision's
ConvNeXt against torch.autocast("cpu") (every submodule's output dtype),
and the policy file's errors."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xla_amp
from xla_amp import policies
from xla_amp.policies._policy import load

from tests.support import materialize
from tests.support.policy_files import write_policy

LOW = [torch.bfloat16, torch.float16]
aten = torch.ops.aten
# name -> (input shape, parameter size, the call)
NORMS = {
    "layer_norm": ((3, 5, 8), 8, lambda x, w, b: F.layer_norm(x, [8], w, b)),
    "group_norm": ((2, 4, 3, 3), 4, lambda x, w, b: F.group_norm(x, 2, w, b)),
    "native_layer_norm": ((3, 8), 8, lambda x, w, b: aten.native_layer_norm(x, [8], w, b, 1e-5)),
    "native_group_norm": ((2, 4, 3, 3), 4,
                          lambda x, w, b: aten.native_group_norm(x, w, b, 2, 4, 9, 2, 1e-5)),
}


def _inputs(name, low, device):
    shape, n, _ = NORMS[name]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g).to(low)
    w, b = torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g)
    return [t.to(device).requires_grad_() for t in (x, w, b)]


def _outputs(out):
    return list(out) if isinstance(out, tuple) else [out]


def _grads(out, inputs):
    return list(torch.autograd.grad(out[0].float().sum(), inputs))


def test_the_cpu_rules_adapt_the_norms_and_the_others_do_not():
    cpu, tpu, cuda = (policies.get(n) for n in ("cpu", "tpu", "cuda"))
    assert {f"aten::{n}" for n in NORMS} == {
        op for op, kind in cpu.adaptations.items() if kind == "fp32_compute"
        and "norm" in op and "batch" not in op}
    assert all(cpu.adaptation(f"aten::{n}") == "fp32_compute" for n in NORMS)
    assert all(tpu.adaptation(f"aten::{n}") is None for n in NORMS)  # torch_xla's is the TPU's
    assert cuda.adaptation("aten::layer_norm") is None  # its float32 category wins


@pytest.mark.parametrize("low", LOW)
@pytest.mark.parametrize("name", NORMS)
def test_a_mixed_norm_equals_a_manual_cast_and_the_cpus_dtypes(device, name, low):
    call = NORMS[name][2]
    x, w, b = _inputs(name, low, device)
    with xla_amp.autocast(device, policy="cpu", dtype=low):
        got = _outputs(call(x, w, b))
        got_grads = _grads(got, [x, w, b])
    materialize(got + got_grads)
    want = _outputs(call(x.float(), w, b))
    want = [want[0].to(low)] + want[1:]
    want_grads = _grads(want, [x, w, b])
    for g, c in zip(got + got_grads, want + want_grads):
        assert g.dtype == c.dtype and torch.equal(g.cpu(), c.cpu())
    xc, wc, bc = _inputs(name, low, "cpu")  # PyTorch's own mixed-type kernel
    cpu = _outputs(call(xc, wc, bc))
    cpu_grads = _grads(cpu, [xc, wc, bc])
    assert [t.dtype for t in got + got_grads] == [t.dtype for t in cpu + cpu_grads]
    for g, c in zip(got + got_grads, cpu + cpu_grads):
        torch.testing.assert_close(g.cpu(), c, rtol=2e-2, atol=2e-2)


def test_one_dtype_runs_untouched_and_a_float32_input_with_low_weights_is_refused(device):
    x, w, b = (t.detach() for t in _inputs("layer_norm", torch.bfloat16, device))
    with xla_amp.autocast(device, policy="cpu"):
        same = F.layer_norm(x, [8], w.bfloat16(), b.bfloat16())
        with pytest.raises(RuntimeError, match="aten::layer_norm"):
            F.layer_norm(x.float(), [8], w.bfloat16(), b.bfloat16())
    assert torch.equal(same.cpu(), F.layer_norm(x, [8], w.bfloat16(), b.bfloat16()).cpu())
    with pytest.raises(RuntimeError):  # the CPU's kernel refuses that mix too
        F.layer_norm(x.cpu().float(), [8], w.cpu().bfloat16(), b.cpu().bfloat16())


def test_convnext_under_the_cpu_rules_has_torch_cpu_autocasts_dtypes(device):
    """torchvision's ConvNeXt (two small stages): every submodule's output
    dtype, forward, as under torch.autocast("cpu") on the CPU. Its blocks
    norm a cast depthwise convolution's output with float32 parameters;
    before, each of those LayerNorms (and all after them) gave float32."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    torch.manual_seed(0)
    model = ConvNeXt([CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 1)], num_classes=5)
    x = torch.randn(2, 3, 32, 32)

    def dtypes(run):
        seen = {}
        hooks = [sub.register_forward_hook(lambda mod, i, o, n=n: seen.__setitem__(n, o.dtype))
                 for n, sub in model.named_modules() if n]
        run()
        for h in hooks:
            h.remove()
        return seen

    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = dtypes(lambda: model(x))
    model.to(device)
    with xla_amp.autocast(device, policy="cpu"):
        got = dtypes(lambda: model(x.to(device)))
    norms = [n for n, m in model.named_modules() if isinstance(m, torch.nn.LayerNorm)]
    assert sum(want[n] == torch.bfloat16 for n in norms) >= 3, {n: want[n] for n in norms}
    assert got == want


def test_the_encoder_layers_cpu_fast_path_is_the_difference_left(device):
    """Pinned (docs/policies.md): a batch_first TransformerEncoderLayer in
    eval mode under no_grad takes PyTorch's CPU fast path, bfloat16 out;
    on XLA its Python forward gives float32, as the CPU does in training."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    x = torch.randn(2, 5, 8)
    got = {}
    for mode in ("train", "eval"):
        layer.train(mode == "train").cpu()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            cpu = layer(x).dtype
        layer.to(device)
        with torch.no_grad(), xla_amp.autocast(device, policy="cpu"):
            got[mode] = (layer(x.to(device)).dtype, cpu)
    assert got == {"train": (torch.float32, torch.float32),
                   "eval": (torch.float32, torch.bfloat16)}


@pytest.mark.parametrize("text,match", [
    ('[fp32_compute]\n"aten::nope" = "x: y"\n', r":\d+: unknown op 'aten::nope'"),
    ('[fp32_compute]\n"aten::layer_norm" = ""\n', r":\d+: aten::layer_norm needs a citation"),
    ('[fp32]\n"aten::layer_norm" = "x: y"\n[fp32_compute]\n"aten::layer_norm" = "x: y"\n',
     r":7: aten::layer_norm is both in \[fp32\] and in \[fp32_compute\]"),
    ('[decompose]\n"aten::einsum" = "x: y"\n[fp32_compute]\n"aten::einsum" = "x: y"\n',
     r":\d+: aten::einsum is both in \[decompose\] and in \[fp32_compute\]"),
])
def test_policy_file_errors_name_file_and_line(tmp_path, text, match):
    path = write_policy(tmp_path, text)
    with pytest.raises(ValueError, match=match):
        load(path)
