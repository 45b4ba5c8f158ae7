"""torch.func under an autocast region, and PyTorch's defect pytorch/pytorch#192617
(open): under `torch.vmap`, F.linear with a bias returns float32 under autocast,
on XLA as with PyTorch's own CPU autocast. vmap's batching rule for linear runs
the matmul (cast: bf16) and adds the bias after it, above autocast, where bf16 +
float32 promotes to float32. Without a bias, and unbatched, the output is bf16.
This test fails once upstream fixes it: then update docs/engine.md ("Under
torch.func transforms")."""
import torch
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

import xla_amp


def _linears(device, region):
    torch.manual_seed(0)
    w, b = torch.randn(16, 8).to(device), torch.randn(16).to(device)
    x = torch.randn(5, 8).to(device)
    with region():
        return (F.linear(x, w, b), vmap(lambda t: F.linear(t, w))(x),
                vmap(lambda t: F.linear(t, w, b))(x), vmap(lambda t: t @ w.t() + b)(x))


def test_vmap_linear_with_bias_comes_back_float32_on_xla_as_on_cpu(device):
    xla = _linears(device, lambda: xla_amp.autocast(device, policy="tpu"))
    cpu = _linears("cpu", lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    want = [torch.bfloat16, torch.bfloat16, torch.float32, torch.float32]
    assert [t.dtype for t in xla] == [t.dtype for t in cpu] == want
    # the batched matmul itself was cast: its values are the bf16 product's
    unbatched = xla[0].float()
    assert torch.equal(xla[2].cpu(), xla[3].cpu())
    assert torch.allclose(xla[2].cpu(), unbatched.cpu(), rtol=2 ** -7, atol=0.05)


def test_per_sample_gradients_run_under_the_region(device):
    """vmap(grad(...)) over a module (per-sample gradients): every
    parameter's gradient per sample, in float32, equal to one sample's own
    grad under the same region."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(),
                                torch.nn.Linear(16, 4)).to(device)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(5, 8).to(device)

    def loss(p, xi):
        return functional_call(model, p, (xi.unsqueeze(0),)).float().pow(2).sum()
    with xla_amp.autocast(device, policy="tpu"):
        per_sample = vmap(grad(loss), in_dims=(None, 0))(params, x)
        first = grad(loss)(params, x[0])
    for name, p in params.items():
        assert per_sample[name].shape == (5, *p.shape) and per_sample[name].dtype == torch.float32
        assert torch.allclose(per_sample[name][0].cpu(), first[name].cpu(), rtol=1e-2, atol=1e-3)
