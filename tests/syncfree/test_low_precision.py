"""bf16 parameters in the sync-free optimizers: fp32 master weights and
stochastic rounding (xla_amp/syncfree/_low_precision.py)."""
import copy

import pytest
import torch
import torch_xla

import xla_amp
from xla_amp import GradScaler, autocast, syncfree

from tests.support import assert_same, clear_metrics, count

OPTS = {
    "sgd": (syncfree.SGD, dict(lr=0.05, momentum=0.9)),
    "adamw": (syncfree.AdamW, dict(lr=1e-3, weight_decay=0.01)),
}
FUSED = [None, False]  # fused op where it applies / portable path


def _const_param(device, value=1.0, n=4096):
    return torch.nn.Parameter(torch.full((n,), value, dtype=torch.bfloat16).to(device))


def _descend(device, cls, fused, after_step=None, **flags):
    """200 updates of 1e-4 on 4096 bf16 parameters at 1.0 (bf16's step
    there: 2**-8 below, 2**-7 above); returns (parameter, optimizer)."""
    p = _const_param(device)
    opt = cls([p], lr=1e-4, fused=fused, **flags)
    for _ in range(200):
        p.grad = torch.ones_like(p)
        opt.step()
        torch_xla.sync()
        if after_step:
            after_step(p, opt)
    assert p.dtype == torch.bfloat16
    return p, opt


def _bf16_neighbours(x):
    """The bf16 values just below and above |x| (float32, CPU, by bits)."""
    bits = x.abs().view(torch.int32)
    down = (bits & ~0xFFFF).view(torch.float32)
    up = ((bits | 0xFFFF) + 1).view(torch.float32)
    exact = (bits & 0xFFFF) == 0
    return down, torch.where(exact, down, up)


def test_round_stochastic_takes_a_neighbour_without_bias(device):
    """Every binade's edges (just below / above powers of two), negatives,
    exact bf16 values, subnormal-range and non-finite values: the result is
    one of the two bf16 neighbours of x, exact values stay, and over 4096
    draws per value the mean is x (|error| < 4 standard errors)."""
    from xla_amp.syncfree._low_precision import _round_stochastic
    g = torch.Generator().manual_seed(0)
    base = torch.cat([torch.randn(64, generator=g) * 10.0 ** torch.randint(-30, 30, (64,),
                                                                         generator=g),
                      torch.tensor([1.0, 2.0, 0.5, 3.0, -1.0])])  # exact bf16 values
    near_pow2 = torch.tensor([2.0 ** k for k in (-100, -3, 0, 1, 7, 100)])
    values = torch.cat([base, near_pow2 * (1 - 2.0 ** -12), near_pow2 * (1 + 2.0 ** -12),
                        -near_pow2 * (1 + 2.0 ** -10)])
    draws = 4096
    x = values.repeat(draws, 1)
    rounded = torch.stack([_round_stochastic(x[i].to(device), torch.tensor(
        i * 7919, dtype=torch.int64).to(device)) for i in range(0, draws, 512)])
    # one call per 512 draws is enough for the neighbour check; the mean uses all
    got = _round_stochastic(x.to(device), torch.tensor(3, dtype=torch.int64).to(device))
    got, rounded = got.float().cpu(), rounded.float().cpu()
    down, up = _bf16_neighbours(values)
    for r in (got, rounded):
        mag = r.abs()
        assert bool(((mag == down) | (mag == up)).all())
        assert bool((torch.sign(r) == torch.sign(values)).all())
    spacing = (up - down).clamp_min(1e-45)
    p_up = (values.abs() - down) / spacing
    mean_up = ((got.abs() == up) & (up != down)).float().mean(0)
    stderr = (p_up * (1 - p_up) / draws).sqrt().clamp_min(1 / draws)
    assert bool(((mean_up - p_up).abs() < 4 * stderr).all()), (mean_up - p_up).abs().max()
    special = torch.tensor([0.0, -0.0, 1e-40, float("inf"), -float("inf"), float("nan")])
    out = _round_stochastic(special.to(device), torch.tensor(1, dtype=torch.int64).to(device))
    assert_same(out.cpu(), special.to(device).to(torch.bfloat16).cpu())  # round to nearest


@pytest.mark.parametrize("fused", FUSED)
@pytest.mark.parametrize("cls", [syncfree.SGD, syncfree.Adam])
def test_stochastic_rounding_keeps_updates_below_resolution(device, cls, fused):
    """Stochastic rounding moves the mean by the expected 0.02;
    round-to-nearest (no flag) leaves it at 1.0."""
    means = {sr: _descend(device, cls, fused, stochastic_rounding=sr)[0].float().mean().item()
             for sr in (True, False)}
    assert means[False] == 1.0
    assert means[True] == pytest.approx(0.98, abs=0.001)


@pytest.mark.parametrize("fused", FUSED)
@pytest.mark.parametrize("cls", [syncfree.SGD, syncfree.Adam])
def test_master_keeps_updates_and_params_are_master_rounded(device, cls, fused):
    def rounded_master(p, opt):
        master = opt.state[p]["master"]
        assert master.dtype == torch.float32
        assert_same(p, master.to(torch.bfloat16))
    p, opt = _descend(device, cls, fused, rounded_master, master_weights=True)
    assert opt.state[p]["master"].mean().item() == pytest.approx(0.98, abs=1e-4)


def _mlp(device, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4)).to(device)


def _batches(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)) for _ in range(n)]


def _train(model, opt, scaler, device, batches, overflow_at=()):
    for i, (x, y) in enumerate(batches):
        x = x.to(device) * (float("inf") if i in overflow_at else 1.0)
        opt.zero_grad()
        with autocast(device, policy="tpu"):
            loss = torch.nn.functional.mse_loss(model(x).float(), y.to(device))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch_xla.sync()


@pytest.mark.parametrize("name,fused", [("sgd", None), ("adamw", False)])
def test_master_run_matches_fp32_amp_run(device, name, fused):
    """Linear layers under the tpu rules compute in bf16 either way; what
    differs is that a bf16 parameter's gradient is stored in bf16 (the fp32
    run keeps the dot's f32 result): over 12 steps with an overflow
    (skipped) at step 4 the masters stay within 2 % of the fp32 AMP run's
    parameters (measured: 1.3 % SGD+momentum, 0.34 % AdamW, of each
    tensor's largest value), and every bf16 parameter is its master
    rounded."""
    cls, kw = OPTS[name]
    batches = _batches(12)
    ref = _mlp(device)
    ref_opt = cls(ref.parameters(), fused=fused, **kw)
    _train(ref, ref_opt, GradScaler(init_scale=2.0 ** 8), device, batches, overflow_at={4})

    model = xla_amp.cast_module(_mlp(device), torch.bfloat16)
    opt = cls(model.parameters(), fused=fused, master_weights=True, **kw)
    _train(model, opt, GradScaler(init_scale=2.0 ** 8), device, batches, overflow_at={4})
    for (n, p), r in zip(model.named_parameters(), ref.parameters()):
        m, r = opt.state[p]["master"].cpu(), r.detach().cpu()
        assert ((m - r).abs().max() / r.abs().max()).item() < 0.02, n
        assert_same(p, opt.state[p]["master"].to(torch.bfloat16), n)


@pytest.mark.parametrize("mode", ["master_weights", "stochastic_rounding"])
@pytest.mark.parametrize("name", list(OPTS))
def test_skipped_step_leaves_every_bit(device, name, mode):
    cls, kw = OPTS[name]
    model = xla_amp.cast_module(_mlp(device), torch.bfloat16)
    opt = cls(model.parameters(), **{mode: True}, **kw)
    _train(model, opt, GradScaler(), device, _batches(3))
    before = (copy.deepcopy([p.detach().cpu() for p in model.parameters()]),
              {k: {kk: vv.cpu() if isinstance(vv, torch.Tensor) else vv for kk, vv in v.items()}
               for k, v in enumerate(opt.state.values())})
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step(found_inf=torch.ones((), device=device))
    torch_xla.sync()
    after = ([p.detach().cpu() for p in model.parameters()],
             {k: {kk: vv.cpu() if isinstance(vv, torch.Tensor) else vv for kk, vv in v.items()}
              for k, v in enumerate(opt.state.values())})
    assert_same(after, before)


@pytest.mark.parametrize("mode", ["master_weights", "stochastic_rounding"])
def test_one_graph_no_transfer_lr_change_no_recompile(device, mode):
    model = xla_amp.cast_module(_mlp(device), torch.bfloat16)
    opt = syncfree.AdamW(model.parameters(), lr=1e-3, **{mode: True})
    scaler = GradScaler(init_scale=2.0 ** 8)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.9)
    batches = _batches(10)
    _train(model, opt, scaler, device, batches[:4], overflow_at={1})  # warm-up: skip + lr change
    sched.step()
    clear_metrics()
    for i in range(4, 10):
        _train(model, opt, scaler, device, batches[i:i + 1])
        sched.step()
    assert count("ExecuteTime") == 6
    assert count("CompileTime") == 0
    assert count("TransferFromDeviceTime") == 0


@pytest.mark.parametrize("mode", ["master_weights", "stochastic_rounding"])
@pytest.mark.parametrize("name", list(OPTS))
def test_state_dict_round_trip_resumes_exactly(device, name, mode, tmp_path):
    """Save after 3 steps, load into a fresh optimizer and model, train on:
    bit-identical to the run that never stopped (masters stay float32,
    stochastic rounding continues its stream)."""
    cls, kw = OPTS[name]
    batches = _batches(6)
    model = xla_amp.cast_module(_mlp(device), torch.bfloat16)
    opt = cls(model.parameters(), **{mode: True}, **kw)
    _train(model, opt, GradScaler(), device, batches[:3])
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt.pt")
    _train(model, opt, GradScaler(), device, batches[3:])

    ckpt = torch.load(tmp_path / "ckpt.pt")
    resumed = xla_amp.cast_module(_mlp(device, seed=5), torch.bfloat16)
    resumed.load_state_dict(ckpt["model"])
    ropt = cls(resumed.parameters(), **{mode: True}, **kw)
    ropt.load_state_dict(ckpt["opt"])
    if mode == "master_weights":
        assert {st["master"].dtype for st in ropt.state.values()} == {torch.float32}
    _train(resumed, ropt, GradScaler(), device, batches[3:])
    assert_same([p.detach() for p in resumed.parameters()],
                [p.detach() for p in model.parameters()])


def test_state_dtype_and_fp32_params_no_op(device):
    model = xla_amp.cast_module(_mlp(device), torch.bfloat16)
    opt = syncfree.AdamW(model.parameters(), stochastic_rounding=True, state_dtype=torch.bfloat16)
    _train(model, opt, GradScaler(), device, _batches(2))
    assert {st["exp_avg"].dtype for st in opt.state.values()} == {torch.bfloat16}

    a, b = _mlp(device), _mlp(device)  # fp32 parameters: the flags change nothing
    oa = syncfree.AdamW(a.parameters(), master_weights=True)
    ob = syncfree.AdamW(b.parameters())
    _train(a, oa, GradScaler(), device, _batches(3))
    _train(b, ob, GradScaler(), device, _batches(3))
    assert_same([p.detach() for p in a.parameters()], [p.detach() for p in b.parameters()])
    assert all("master" not in st for st in oa.state.values())


def test_bad_arguments_name_the_culprit(device):
    params = list(_mlp(device).parameters())
    with pytest.raises(ValueError, match="exclude each other"):
        syncfree.AdamW(params, master_weights=True, stochastic_rounding=True)
    with pytest.raises(ValueError, match="master_weights must be a bool, got 1"):
        syncfree.SGD(params, lr=0.1, master_weights=1)
    with pytest.raises(ValueError, match="state_dtype must be a floating"):
        syncfree.Adam(params, stochastic_rounding=True, state_dtype=torch.int8)
    half = torch.nn.Parameter(torch.ones(4, dtype=torch.float16).to(device))
    opt = syncfree.SGD([torch.nn.Parameter(torch.ones(4).to(device)), half], lr=0.1,
                       stochastic_rounding=True)
    for p in opt.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    with pytest.raises(ValueError, match="parameter 1 of param group 0 is torch.float16"):
        opt.step()
    assert opt.state == {} or all(len(s) == 0 for s in opt.state.values())


def test_grad_scaler_unscales_bf16_gradients(device):
    """bf16 parameters give bf16 gradients; GradScaler unscales them in
    float32 (PyTorch/XLA's own unscale of bf16 builds a graph XLA rejects,
    tests/engine/test_xla_known_issues.py): same values as unscaling a float32 copy
    and rounding once, and an inf is found."""
    p = torch.nn.Parameter(torch.ones(8, dtype=torch.bfloat16).to(device))
    opt = syncfree.SGD([p], lr=0.1)
    scaler = GradScaler(init_scale=3.0)
    g = (torch.arange(8, dtype=torch.float32) * 1.37).bfloat16()
    scaler.scale(torch.ones((), device=device))
    p.grad = g.to(device)
    scaler.unscale_(opt)
    torch_xla.sync()
    assert_same(p.grad, (g.float() * torch.tensor(1 / 3.0)).bfloat16())
    assert scaler.found_inf_flags(opt)[0].item() == 0.0
    p.grad[3] = float("inf")
    scaler.update()
    scaler.scale(torch.ones((), device=device))
    scaler.unscale_(opt)
    assert scaler.found_inf_flags(opt)[0].item() == 1.0
