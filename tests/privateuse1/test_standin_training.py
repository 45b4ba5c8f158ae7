"""The PrivateUse1 engine trains real models on the stand-in "tpu" device
(tests/support/standin_tpu.py) in the current profile: a transformer block
and a CNN under the tpu and cuda rules with xla_amp.GradScaler and a plain
torch.optim optimizer, an injected inf skipped bit for bit, torch's own
GradScaler on the ops xla_amp adds, bit-identical resume through
xla_amp.checkpoint, fp8 layers, module policies and a custom op.
Needs torch 2.11+ (the stand-in's Python device guard, for autograd)."""
import copy

import pytest
import torch
from torch import nn

from xla_amp import engines

pytestmark = [pytest.mark.core, pytest.mark.skipif(
    engines.torch_minor() < (2, 11),
    reason="autograd on the stand-in needs torch 2.11+'s Python device guard: make current")]

if engines.torch_minor() >= (2, 11):
    import xla_amp
    from tests.support import standin_models as zoo, standin_tpu

    standin_tpu.install()

STEPS = 6


def _train(kind, policy, steps=STEPS, *, inf_at=None, scaler_kind="xla_amp", model=None,
           opt=None, scaler=None, start=0, fused=False):
    model = model or standin_tpu.to_device(zoo.build(kind))
    opt = opt or (torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True) if fused else
                  torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True))
    scaler = scaler or (xla_amp.GradScaler(init_scale=2.0 ** 10) if scaler_kind == "xla_amp"
                        else torch.amp.GradScaler("tpu", init_scale=2.0 ** 10))
    losses, snapshots = [], []
    for i, (x, y) in enumerate(zoo.batches(kind, start + steps)):
        if i < start:
            continue
        x, y = standin_tpu.to_device(x), standin_tpu.to_device(y)
        with xla_amp.autocast("tpu", policy=policy):
            loss = zoo.loss_of(model, kind, x, y)
        if i == inf_at:
            loss = loss * float("inf")
            snapshots.append(_state(model, opt))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if i == inf_at:
            snapshots.append(_state(model, opt))
        losses.append(float(loss.detach().cpu()))
    return model, opt, scaler, losses, snapshots


def _state(model, opt):
    def cpu(v):
        return v.detach().cpu().clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v)
    return ({k: cpu(v) for k, v in model.state_dict().items()},
            {p: {k: cpu(v) for k, v in st.items()} for p, st in opt.state_dict()["state"].items()})


def _bitwise(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _bitwise(a[k], b[k])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _bitwise(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    else:
        assert a == b


@pytest.mark.parametrize("kind", ["block", "cnn"])
@pytest.mark.parametrize("policy,low", [("tpu", torch.bfloat16), ("cuda", torch.float16)])
def test_trains_with_the_policys_dtypes(kind, policy, low):
    model = standin_tpu.to_device(zoo.build(kind))
    x, _ = next(zoo.batches(kind, 1))
    seen = {}
    hooks = [m.register_forward_hook(lambda m, i, o, n=n: seen.__setitem__(n, o))
             for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    with xla_amp.autocast("tpu", policy=policy):
        model(standin_tpu.to_device(x))
    for h in hooks:
        h.remove()
    assert seen and all(o.dtype == low for o in seen.values()), \
        {n: o.dtype for n, o in seen.items()}
    _, _, scaler, losses, _ = _train(kind, policy, steps=10)
    assert all(map(lambda v: v == v, losses)), losses
    assert losses[-1] < losses[0], losses
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize("scaler_kind,fused", [("xla_amp", False), ("xla_amp", True),
                                               ("torch", False)])
def test_an_injected_inf_is_skipped_bit_for_bit(scaler_kind, fused):
    """masked step (capturable AdamW), the fused kernel's own found_inf, torch's scaler"""
    model, opt, scaler, losses, (before, after) = _train("block", "cuda", steps=4, inf_at=2,
                                                         scaler_kind=scaler_kind, fused=fused)
    assert bool(getattr(opt, "_step_supports_amp_scaling", False)) == fused  # the path taken
    _bitwise(before, after)
    assert scaler.get_scale() == 2.0 ** 9  # one backoff, no growth in 4 steps


def test_torch_gradscaler_runs_on_the_ops_xla_amp_adds():
    from xla_amp.privateuse1 import _amp_ops
    assert set(_amp_ops.registered()) == set(_amp_ops.OPS)  # the stand-in lacks both
    a = _train("cnn", "cuda", steps=5, inf_at=1, scaler_kind="torch")
    b = _train("cnn", "cuda", steps=5, inf_at=1, scaler_kind="xla_amp")
    assert a[3] == b[3]  # the same losses, step by step
    assert a[2].get_scale() == b[2].get_scale()


def test_resume_is_bit_identical(tmp_path):
    whole = _train("block", "tpu", steps=STEPS)
    model, opt, scaler, _, _ = _train("block", "tpu", steps=STEPS // 2)
    path = tmp_path / "ckpt.pt"
    xla_amp.checkpoint.save(path, model=model, optimizer=opt, scaler=scaler)
    fresh = standin_tpu.to_device(zoo.build("block", seed=1))
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2, capturable=True)
    fresh_scaler = xla_amp.GradScaler(init_scale=2.0 ** 10)
    xla_amp.checkpoint.restore(xla_amp.checkpoint.load(path), model=fresh,
                               optimizer=fresh_opt, scaler=fresh_scaler)
    resumed = _train("block", "tpu", steps=STEPS - STEPS // 2, model=fresh, opt=fresh_opt,
                     scaler=fresh_scaler, start=STEPS // 2)
    _bitwise(_state(whole[0], whole[1]), _state(resumed[0], resumed[1]))
    assert whole[3][STEPS // 2:] == resumed[3]


def test_module_policies_and_custom_ops():
    model = standin_tpu.to_device(zoo.build("block"))
    handle = xla_amp.module_policies(model, {"head": "fp32"})
    x, _ = next(zoo.batches("block", 1))
    with xla_amp.autocast("tpu"):
        out = model(standin_tpu.to_device(x))
        inner = model.mlp(standin_tpu.to_device(torch.randn(2, 32)))
    handle.remove()
    assert out.dtype == torch.float32 and inner.dtype == torch.bfloat16

    @torch.library.custom_op("xla_amp_standin::scaled_mm", mutates_args=())
    def scaled_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b * 2
    policy = xla_amp.policies.get("tpu").with_overrides(
        name="tpu-custom", lower_precision_fp=["xla_amp_standin::scaled_mm"])
    a = standin_tpu.to_device(torch.randn(3, 4))
    with xla_amp.autocast("tpu", policy=policy):
        assert scaled_mm(a, a.t()).dtype == torch.bfloat16
    with xla_amp.autocast("tpu"):
        assert scaled_mm(a, a.t()).dtype == torch.float32  # unlisted: uncast


def test_plain_torch_autocast_follows_the_default_policy():
    a = standin_tpu.to_device(torch.randn(4, 4))
    with torch.autocast("tpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
        assert torch.softmax(a.bfloat16(), -1).dtype == torch.float32  # tpu rules: fp32
    xla_amp.set_default_policy("cpu")
    try:
        with torch.autocast("tpu", dtype=torch.bfloat16):
            assert torch.softmax(a.bfloat16(), -1).dtype == torch.bfloat16  # cpu: unlisted
    finally:
        xla_amp.set_default_policy(None)


def test_fp8_layers_train_and_restore_on_the_device(tmp_path):
    model = standin_tpu.to_device(nn.Sequential(nn.Linear(32, 64, bias=False), nn.ReLU(),
                                                nn.Linear(64, 16, bias=False)))
    xla_amp.fp8.convert(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xla_amp.fp8.attach(opt, model)
    x = standin_tpu.to_device(torch.randn(16, 32))
    losses = []
    for _ in range(4):
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach().cpu()))
    assert losses[-1] < losses[0], losses
    fp8_state = {k for k in model.state_dict() if "amax" in k or "scale" in k}
    assert fp8_state, list(model.state_dict())
    xla_amp.checkpoint.save(tmp_path / "fp8.pt", model=model, optimizer=opt)
    fresh = standin_tpu.to_device(nn.Sequential(nn.Linear(32, 64, bias=False), nn.ReLU(),
                                                nn.Linear(64, 16, bias=False)))
    xla_amp.fp8.convert(fresh)
    fresh_opt = torch.optim.SGD(fresh.parameters(), lr=0.1)
    xla_amp.checkpoint.restore(xla_amp.checkpoint.load(tmp_path / "fp8.pt"), model=fresh,
                               optimizer=fresh_opt)
    _bitwise({k: v.cpu() for k, v in model.state_dict().items()},
             {k: v.cpu() for k, v in fresh.state_dict().items()})


def test_bad_input_is_one_line():
    # record=True with the Python kernels: test_native.py
    with pytest.raises(ValueError, match="unknown autocast policy 'nope'"):
        xla_amp.autocast("tpu", policy="nope")
    with pytest.raises(ValueError, match="fp32_matmul_precision cannot be honoured on a "
                                         "PrivateUse1 device"):
        xla_amp.autocast("tpu", fp32_matmul_precision="highest")
    with pytest.raises(ImportError, match="torch_xla engine, which runs on torch 2.9 only"):
        xla_amp.autocast("xla")
    with pytest.raises(ImportError, match=r"xla_amp\.syncfree .*needs xla_amp's torch_xla"):
        xla_amp.syncfree


ENV_SCRIPT = r'''
import torch, xla_amp
from tests.support import standin_tpu
standin_tpu.install()
a = standin_tpu.to_device(torch.randn(4, 4))
with xla_amp.autocast("tpu"):
    print((a @ a).dtype, torch.softmax(a, -1).dtype)
'''


def test_op_list_overrides_from_the_environment(tmp_path):
    """XLA_AMP_LOWER_PRECISION_OPS_LIST replaces the category on this engine too"""
    import subprocess
    import sys
    from tests.support import launch
    lists = tmp_path / "lower.txt"
    lists.write_text("# only softmax in low precision\naten::softmax\n")
    env = {**launch.launch_env(), "XLA_AMP_LOWER_PRECISION_OPS_LIST": str(lists),
           "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    proc = subprocess.run([sys.executable, "-c", ENV_SCRIPT], capture_output=True, text=True,
                          env=env, timeout=120, cwd=launch.ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["torch.float32", "torch.bfloat16"], proc.stdout


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_recomputes_under_the_region(reentrant):
    """torch.utils.checkpoint on the PrivateUse1 device under the cuda rules
    (the device's default is the tpu rules, under which this CNN's gradients
    differ): the recompute replays the region's policy, so the checkpointed
    run's loss and gradients equal the plain run's bit for bit
    (xla_amp/precision/_checkpointing.py; torch_xla's engine:
    tests/precision/test_activation_checkpointing.py)."""
    from torch.utils.checkpoint import checkpoint

    def grads(policy, wrap):
        model = standin_tpu.to_device(zoo.build("cnn"))
        x, y = next(zoo.batches("cnn", 1))
        x = standin_tpu.to_device(x).requires_grad_()
        with xla_amp.autocast("tpu", policy=policy):
            out = wrap(model, x)
        loss = nn.functional.cross_entropy(out.float(), standin_tpu.to_device(y))
        loss.backward()
        return [loss.detach().cpu(), x.grad.cpu(), *[p.grad.cpu() for p in model.parameters()]]

    plain = grads("cuda", lambda m, x: m(x))
    assert not torch.equal(grads("tpu", lambda m, x: m(x))[2], plain[2])
    _bitwise(grads("cuda", lambda m, x: checkpoint(m, x, use_reentrant=reentrant)), plain)
