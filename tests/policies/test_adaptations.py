"""XLA adaptations (xla_amp/policies/_xla_adaptations.toml): the cuda and cpu
rules hand batch_norm a bf16/fp16 activation with fp32 parameters, and
where/remainder a bf16 and an fp32 tensor. PyTorch/XLA mislabels those
results (tests/engine/test_xla_known_issues.py); the engine computes them so that
the dtype is what CUDA/CPU eager autocast gives and the HLO agrees with it,
bit-equal to a manually cast control."""
import pytest
import torch
import torch.nn.functional as F
import torch_xla

import xla_amp
from xla_amp import policies
from xla_amp.policies._policy import Policy, load_adaptations

from tests.engine.test_xla_known_issues import hlo_dtype

LOW = [torch.bfloat16, torch.float16]
MIXING = ["cuda", "cpu"]  # the built-in policies that leave batch_norm uncast


def _eager_autocast_dtype(device_type, low, fn, *tensors):
    """Output dtype of PyTorch's own autocast for `device_type`; CUDA on fake
    tensors (no GPU needed)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    if device_type == "cpu":
        with torch.autocast("cpu", dtype=low):
            return fn(*tensors).dtype
    with FakeTensorMode():
        fake = [torch.empty(t.shape, dtype=t.dtype, device="cuda") for t in tensors]
        prev = (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))
        torch.set_autocast_enabled("cuda", True)  # torch.autocast asks for a real GPU
        torch.set_autocast_dtype("cuda", low)
        try:
            return fn(*fake).dtype
        finally:
            torch.set_autocast_enabled("cuda", prev[0])
            torch.set_autocast_dtype("cuda", prev[1])
            torch.clear_autocast_cache()


def _bn_inputs(device, low, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 3, 6, 6, generator=g).to(low)
    w = torch.rand(3, generator=g) + 0.5
    b = torch.randn(3, generator=g)
    return [t.to(device).requires_grad_() for t in (x, w, b)]


@pytest.mark.parametrize("policy", MIXING)
@pytest.mark.parametrize("low", LOW)
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_fp32_compute_bit_equal_to_control(device, policy, low, training):
    x, w, b = _bn_inputs(device, low)
    rm, rv = torch.zeros(3, device=device), torch.ones(3, device=device)
    crm, crv = rm.clone(), rv.clone()
    with xla_amp.autocast(device, policy=policy, dtype=low):
        y = F.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5)
    # control: the same computation cast by hand, autocast off
    xc, wc, bc = (t.detach().clone().requires_grad_() for t in (x, w, b))
    yc = F.batch_norm(xc.float(), crm, crv, wc, bc, training, 0.1, 1e-5).to(low)
    # (the output dtype does not depend on the running statistics)
    ref_dtype = _eager_autocast_dtype(
        policy, low, lambda x, w, b: F.batch_norm(x, None, None, w, b, True),
        x.cpu(), w.cpu(), b.cpu())
    assert y.dtype == ref_dtype == low
    assert hlo_dtype(y) == low  # the label is the truth now
    if not training:
        # PyTorch/XLA 2.9 cannot differentiate eval-mode batch_norm with a
        # weight that requires grad, in float32 too ("size of offset factor is 0")
        assert torch.equal(y.cpu(), yc.cpu())
        return
    dy = torch.randn(y.shape).to(low).to(device)
    grads = torch.autograd.grad(y, (x, w, b), dy)
    cgrads = torch.autograd.grad(yc, (xc, wc, bc), dy)
    assert [g.dtype for g in grads] == [low, torch.float32, torch.float32]
    assert hlo_dtype(grads[0]) == low
    for got, want in zip((y, *grads, rm, rv), (yc, *cgrads, crm, crv)):
        assert torch.equal(got.cpu(), want.cpu())


@pytest.mark.parametrize("policy", MIXING)
def test_instance_norm_and_native_batch_norm_adapted(device, policy):
    x, w, b = _bn_inputs(device, torch.bfloat16)
    with xla_amp.autocast(device, policy=policy, dtype=torch.bfloat16):
        y = F.instance_norm(x, weight=w, bias=b)
        out, mean, invstd = torch.native_batch_norm(
            x, w, b, torch.zeros(3, device=device), torch.ones(3, device=device), True, 0.1, 1e-5)
    yc = F.instance_norm(x.float(), weight=w, bias=b).bfloat16()
    assert y.dtype == torch.bfloat16 and hlo_dtype(y) == torch.bfloat16
    assert torch.equal(y.cpu(), yc.cpu())
    # as on CUDA: the output in the input's dtype, saved statistics in float32
    assert (out.dtype, mean.dtype, invstd.dtype) == (torch.bfloat16, torch.float32, torch.float32)
    assert hlo_dtype(out) == torch.bfloat16


@pytest.mark.parametrize("policy", MIXING)
def test_resnet_stem_backward_compiles(device, policy):
    """conv -> bn -> relu -> max_pool -> backward: the graph the zoo's ResNets
    failed on (test_batchnorm_bf16_input_then_maxpool_backward_fails)."""
    torch.manual_seed(0)
    stem = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                               torch.nn.ReLU(), torch.nn.MaxPool2d(2)).to(device)
    x = torch.randn(2, 3, 10, 10, device=device)
    with xla_amp.autocast(device, policy=policy, dtype=torch.bfloat16):
        y = stem(x)
    y.float().sum().backward()
    torch_xla.sync()
    assert y.dtype == torch.bfloat16
    assert all(torch.isfinite(p.grad.cpu()).all() for p in stem.parameters())


def test_uniform_dtypes_run_untouched(device):
    """bf16 input, bf16 parameters: nothing mixes, the op runs as without
    autocast (XLA lowers it fine): same values, no float32 inside."""
    x, w, b = (t.detach().bfloat16() for t in _bn_inputs(device, torch.bfloat16))
    rm, rv = torch.zeros(3, device=device).bfloat16(), torch.ones(3, device=device).bfloat16()
    with xla_amp.autocast(device, policy="cuda", dtype=torch.bfloat16):
        y = F.batch_norm(x, rm.clone(), rv.clone(), w, b, True)
    yc = F.batch_norm(x, rm.clone(), rv.clone(), w, b, True)
    assert y.dtype == torch.bfloat16
    hlo = torch_xla._XLAC._get_xla_tensors_hlo([y])
    assert "f32[4,3,6,6]" not in hlo
    assert torch.equal(y.cpu(), yc.cpu())


def test_other_mixes_are_refused_before_anything_changes(device):
    """fp32 input with bf16 weights: CUDA refuses it, XLA would fail at the
    sync with no name attached; the engine raises naming the arguments."""
    x = torch.randn(2, 3, 4, 4, device=device)
    w = torch.ones(3, device=device).bfloat16()
    rm = torch.zeros(3, device=device)
    with xla_amp.autocast(device, policy="cuda", dtype=torch.bfloat16):
        with pytest.raises(RuntimeError, match=r"aten::batch_norm.*input float32, weight bfloat16"):
            F.batch_norm(x, rm, torch.ones(3, device=device), w, None, True)
    assert torch.equal(rm.cpu(), torch.zeros(3))
    assert torch.is_autocast_enabled("xla") is False


@pytest.mark.parametrize("policy", MIXING)
@pytest.mark.parametrize("op", [
    lambda a, b: torch.where(a > 0, a, b),
    lambda a, b: torch.remainder(a, b.abs() + 1),
], ids=["where", "remainder"])
def test_promote_mixed_gives_eager_dtype(device, policy, op):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(5, generator=g).bfloat16(), torch.randn(5, generator=g)
    with xla_amp.autocast(device, policy=policy, dtype=torch.bfloat16):
        y = op(a.to(device), b.to(device))
    ref = _eager_autocast_dtype(policy, torch.bfloat16, op, a, b)
    assert y.dtype == ref == torch.float32 and hlo_dtype(y) == torch.float32
    assert torch.equal(y.cpu(), op(a.float().to(device), b.to(device)).cpu())
    with xla_amp.autocast(device, policy=policy, dtype=torch.bfloat16):  # one dtype: untouched
        same = op(a.to(device), a.to(device))
    assert same.dtype == torch.bfloat16


def test_policy_category_wins_over_adaptation(device):
    """tpu puts batch_norm in fp32: output float32, no adaptation."""
    tpu = policies.get("tpu")
    assert tpu.category("aten::batch_norm") == "fp32"
    assert tpu.adaptation("aten::batch_norm") is None
    x, w, b = _bn_inputs(device, torch.bfloat16)
    with xla_amp.autocast(device, policy="tpu"):
        y = F.batch_norm(x, None, None, w, b, True)
    assert y.dtype == torch.float32


def test_adaptation_api_and_opt_out(device):
    cuda = policies.get("cuda")
    assert cuda.adaptation("aten::batch_norm") == "fp32_compute"
    assert cuda.adaptation("aten::where.self") == "promote_mixed"
    assert cuda.adaptation("aten::mm") is None  # has a category
    assert cuda.adaptation("aten::relu") is None
    assert cuda.with_overrides(fp32=["aten::batch_norm"]).adaptation("aten::batch_norm") is None
    # the shared XLA adaptations, and the composite its [decompose] table names
    assert dict(cuda.adaptations) == {**policies.xla_adaptations(),
                                      "aten::affine_grid_generator": "decompose"}
    assert "select-and-scatter" in policies.adaptation_reason("aten::batch_norm")
    import dataclasses
    off = dataclasses.replace(cuda, name="cuda-unadapted", adaptations={})
    x = torch.randn(4, device=device).bfloat16()
    w = torch.randn(4, device=device)
    with xla_amp.autocast(device, policy=off):
        y = torch.where(x > 0, x, w)
    assert y.dtype == torch.bfloat16  # PyTorch/XLA's own (mislabelled) result
    torch_xla.sync()
    with pytest.raises(ValueError, match="adaptation 'fp64' of aten::relu"):
        dataclasses.replace(cuda, adaptations={"aten::relu": "fp64"})


@pytest.mark.parametrize("text,match", [
    ('[fp32]\n"aten::relu" = { reason = "x" }\n', r"\[fp32\] is not an adaptation"),
    ('[fp32_compute]\n"aten::no_such_op" = { reason = "x" }\n', r"t\.toml:2: .*aten::no_such_op"),
    ('[fp32_compute]\n\n"aten::relu" = "just a string"\n', r"t\.toml:3: aten::relu needs a reason"),
    ('[fp32_compute]\n"aten::relu" = { reason = "x" }\n[promote_mixed]\n"aten::relu" = { reason = "y" }\n',
     r"aten::relu is in \[fp32_compute\] and \[promote_mixed\]"),
])
def test_adaptation_file_errors_name_file_and_line(tmp_path, text, match):
    (tmp_path / "t.toml").write_text(text)
    with pytest.raises(ValueError, match=match):
        load_adaptations(tmp_path / "t.toml")


def test_builtin_adaptation_file_cites_reproducers():
    import pathlib
    import tomllib
    path = pathlib.Path(xla_amp.__file__).parent / "policies" / "_xla_adaptations.toml"
    data = tomllib.loads(path.read_text())
    from tests.engine import test_xla_known_issues
    for section in data.values():
        for op, entry in section.items():
            file, _, test = entry["reproducer"].partition("::")
            assert file == "tests/engine/test_xla_known_issues.py", op
            assert hasattr(test_xla_known_issues, test), f"{op}: no test {test}"
    assert "_xla_adaptations" not in policies.names()
    assert isinstance(policies.get("cpu"), Policy)
