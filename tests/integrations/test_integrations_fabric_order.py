"""Lightning Fabric's canonical order on XLA --
``opt = SGD(model.parameters()); model, opt = fabric.setup(model, opt)`` --
through xla_amp's plugin: the move makes new parameters on the device, and
the optimizer still holds the host ones. The plugin points it at the moved
ones at its first step (state included; in "bf16-true", the cast ones), or
refuses in one line saying what to do. (Stock Fabric 2.6.6 on one XLA
device trains nothing then, without an error.)"""
import pytest
import torch
import torch.nn.functional as F

L = pytest.importorskip("lightning")
from tests.support.integrations import MODES, loader, net, optimizer_options, tpu_probe  # noqa: E402
from xla_amp import syncfree  # noqa: E402
from xla_amp.integrations.fabric import XLAAMPPrecision  # noqa: E402

pytestmark = pytest.mark.integrations

FABRIC_LINE = ("call fabric.setup_module(model) first, then build the optimizer on "
               "model.parameters(), then fabric.setup_optimizers(opt)")
# the modes, and plain bf16-true (bf16 parameters, any optimizer)
CASES = {**MODES, "bf16-true-plain": ("bf16-true", {})}
SCALER = {"scaler": {"init_scale": 2.0 ** 8}}  # no overflow in the first steps


@pytest.fixture(scope="module", autouse=True)
def _tpu_probe():
    with tpu_probe():
        yield


def fabric(case):
    precision, kw = CASES[case]
    kw = {**kw, **SCALER} if precision == "16-mixed" else kw
    return L.Fabric(accelerator="tpu", devices=1, plugins=[XLAAMPPrecision(precision, **kw)])


def held(opt):
    return [p for g in opt.param_groups for p in g["params"]]


def steps(f, model, opt, n=3, clip=None):
    """``n`` steps of the user's loop; the parameters after each."""
    after = [[p.detach().cpu().float().clone() for p in model.parameters()]]
    for x, y in f.setup_dataloaders(loader(n)):
        opt.zero_grad()
        f.backward(F.cross_entropy(model(x), y))
        if clip is not None:
            assert float(f.clip_gradients(model, opt, max_norm=clip)) > clip
        opt.step()
        after.append([p.detach().cpu().float().clone() for p in model.parameters()])
    return after


@pytest.mark.parametrize("case", ["bf16-mixed", "16-mixed", "bf16-true-plain"])
def test_a_torch_optimizer_made_before_setup_trains_every_step(case):
    f = fabric(case)
    model = net()
    model, opt = f.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    after = steps(f, model, opt)
    for prev, now in zip(after, after[1:]):
        assert not any(torch.equal(a, b) for a, b in zip(prev, now))
    assert all(a is b for a, b in zip(held(opt), model.parameters()))  # the moved, cast ones
    dtype = torch.bfloat16 if CASES[case][0] == "bf16-true" else torch.float32
    assert {(p.device.type, p.dtype) for p in held(opt)} == {("xla", dtype)}
    assert set(map(id, opt.state)) == set(map(id, model.parameters()))


@pytest.mark.parametrize("case", ["bf16-true", "bf16-true-sr"])
def test_a_torch_optimizer_is_refused_where_the_mode_needs_a_syncfree_one(case):
    """bf16-true with a master or rounding needs an xla_amp.syncfree
    optimizer, which takes device parameters only: the one line says so."""
    f = fabric(case)
    model = net()
    host = list(model.parameters())
    model, opt = f.setup(model, torch.optim.AdamW(model.parameters(), lr=0.1))
    before = [p.detach().cpu().clone() for p in model.parameters()]
    x, y = next(iter(f.setup_dataloaders(loader(1))))
    f.backward(F.cross_entropy(model(x), y))
    with pytest.raises(ValueError) as err:
        opt.step()
    message = str(err.value)
    flag = next(k for k, v in optimizer_options(case).items() if v)
    assert message.startswith("XLAAMPPrecision: parameter 0 of param group 0 is on cpu, "
                              "not on the XLA device"), message
    assert "call fabric.setup_module(model) first" in message and f"{flag}=True" in message
    assert "\n" not in message
    assert all(a is b for a, b in zip(held(opt), host)) and not opt.state
    assert all(torch.equal(a, b.detach().cpu()) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("case", list(MODES))
def test_a_syncfree_optimizer_made_before_setup_is_refused_when_made(case):
    """The first call is the optimizer's constructor: it takes device
    parameters only, and names the first host one."""
    with pytest.raises(ValueError, match="parameter 0 of param group 0 .* is on 'cpu', not on an "
                                         "XLA device; move the model to torch_xla.device"):
        syncfree.AdamW(net().parameters(), lr=0.1, **optimizer_options(case))


def test_an_optimizer_with_a_parameter_outside_the_model_is_refused_unchanged():
    f = fabric("16-mixed")
    model = net()
    extra = torch.nn.Parameter(torch.ones(3))
    host = list(model.parameters()) + [extra]
    model, opt = f.setup(model, torch.optim.SGD(host, lr=0.1))
    x, y = next(iter(f.setup_dataloaders(loader(1))))
    f.backward(F.cross_entropy(model(x), y))
    with pytest.raises(ValueError) as err:
        opt.step()
    assert str(err.value) == ("XLAAMPPrecision: parameter 4 of param group 0 is on cpu, not on "
                              "the XLA device (shape (3,); the step would not train it): "
                              + FABRIC_LINE)
    assert all(a is b for a, b in zip(held(opt), host))  # not half re-pointed
    assert f._precision.scaler.get_scale() == 2.0 ** 8


def test_state_made_before_setup_follows_the_parameters_bit_identically():
    """An AdamW that stepped on the host before setup: re-pointed, its
    state moves along (exp_avg to the device, the host step count stays a
    host tensor, as torch.optim keeps it) and training continues exactly
    as with the documented order and the same state loaded."""
    def stepped_on_host():
        model = net()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        x, y = next(iter(loader(1)))
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        return model, opt

    f = fabric("bf16-mixed")
    model, opt = f.setup(*stepped_on_host())
    ours = steps(f, model, opt, n=2)
    assert set(map(id, opt.state)) == set(map(id, model.parameters()))
    assert all(st["exp_avg"].is_xla and not st["step"].is_xla for st in opt.state.values())

    f = fabric("bf16-mixed")
    host_model, host_opt = stepped_on_host()
    model = f.setup_module(host_model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.load_state_dict(host_opt.state_dict())
    opt = f.setup_optimizers(opt)
    reference = steps(f, model, opt, n=2)
    for a, b in zip(ours[-1], reference[-1]):
        assert torch.equal(a, b)


def test_gradients_clipped_before_the_first_step_are_the_moved_ones():
    """fabric.clip_gradients reaches the plugin before the step does: the
    optimizer is re-pointed there, so clipping sees the real gradients."""
    f = fabric("bf16-mixed")
    model = net()
    model, opt = f.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    after = steps(f, model, opt, n=2, clip=1e-3)
    assert not any(torch.equal(a, b) for a, b in zip(after[0], after[1]))
    norm = torch.linalg.vector_norm(torch.stack([p.grad.detach().float().norm()
                                                 for p in model.parameters()]))
    assert float(norm) == pytest.approx(1e-3, rel=1e-2)
