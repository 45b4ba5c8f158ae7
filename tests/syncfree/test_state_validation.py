"""Loading optimizer state never loses the model: every sync-free optimizer
x {plain, master_weights, stochastic_rounding, stochastic_rounding with
bfloat16 state} x {missing key, extra key, wrong shape, wrong kind, another
floating/integer dtype, CPU tensor, each other variant's dict, a torch.optim
dict} is refused before anything changes (bit-identical parameters,
gradients, state and groups) or converted as docs/precision_modes.md says --
and then one normal AMP step runs and the parameters read back finite.

The parameters are bfloat16 (`cast_module`), where the variants differ.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch_xla

import xla_amp
from xla_amp import GradScaler, syncfree

from tests.support import assert_same

OPTS = {
    "sgd": (syncfree.SGD, torch.optim.SGD, dict(lr=0.05, momentum=0.9)),
    "adam": (syncfree.Adam, torch.optim.Adam, dict(lr=1e-3)),
    "adamw": (syncfree.AdamW, torch.optim.AdamW, dict(lr=1e-3, weight_decay=0.01)),
}
VARIANTS = {
    "plain": {},
    "master": dict(master_weights=True),
    "sr": dict(stochastic_rounding=True),
    "sr_bf16_state": dict(stochastic_rounding=True, state_dtype=torch.bfloat16),
}
# The documented rules (docs/precision_modes.md, "Loading state dicts"):
# the state only one kind of variant keeps, and the keys a step makes when
# a loaded entry lacks them.
OWN_KEY = {"master": "master", "sr": "sr_counter", "sr_bf16_state": "sr_counter"}
CREATED_WHEN_MISSING = {"master", "sr_counter", "momentum_buffer"}


def _model(device, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).to(device)
    return xla_amp.cast_module(model, torch.bfloat16)


def _amp_step(model, opt, scaler, device, seed=1):
    torch.manual_seed(seed)
    x = torch.randn(5, 4).to(device)
    opt.zero_grad()
    with xla_amp.autocast(device):
        loss = model(x).float().pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    torch_xla.sync()


def _trained(device, opt_name, variant, steps=2):
    cls, _, kw = OPTS[opt_name]
    model = _model(device)
    opt = cls(model.parameters(), **kw, **VARIANTS[variant])
    scaler = GradScaler()
    for s in range(steps):
        _amp_step(model, opt, scaler, device, seed=s)
    return model, opt


def _torch_optim_dict(device, opt_name):
    _, twin, kw = OPTS[opt_name]
    model = _model(device)
    opt = twin(model.parameters(), **kw)
    model(torch.ones(2, 4, dtype=torch.bfloat16).to(device)).float().sum().backward()
    opt.step()
    torch_xla.sync()
    return opt.state_dict()


def _snapshot(model, opt):
    torch_xla.sync()
    cpu = lambda t: t.detach().cpu().clone() if isinstance(t, torch.Tensor) else copy.deepcopy(t)
    return {"params": [cpu(p) for p in model.parameters()],
            "grads": [cpu(p.grad) for p in model.parameters()],
            "state": [{k: cpu(v) for k, v in opt.state[p].items()} for p in model.parameters()],
            "groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]}


def _layout(opt, model):
    """(key, dtype, shape, device type) of every state entry, per parameter."""
    return [sorted((k, v.dtype, tuple(v.shape), v.device.type)
                   for k, v in opt.state[p].items() if isinstance(v, torch.Tensor))
            for p in model.parameters()]


def _refused_changes_nothing(model, opt, sd, pattern):
    before = _snapshot(model, opt)
    with pytest.raises(ValueError, match=pattern):
        opt.load_state_dict(sd)
    assert_same(before, _snapshot(model, opt))


def _trains_finite(device, model, opt):
    _amp_step(model, opt, GradScaler(), device, seed=7)
    for p in model.parameters():
        assert p.dtype == torch.bfloat16
        assert torch.isfinite(p.float().cpu()).all()


def _reference_layout(device, opt_name, variant):
    model, opt = _trained(device, opt_name, variant, steps=1)
    return _layout(opt, model)


def _faults(sd, key):
    """name -> (the state dict with parameter 0's `key` changed, outcome):
    outcome "refused" or "converted"."""
    st = sd["state"][0]
    v = st[key]
    floating = v.is_floating_point()
    # (a count as an integer is still a count: a 0-dim floating entry takes
    # integers, as torch.optim's older int step)
    wrong_kind = (torch.complex64 if v.dim() == 0 else torch.int32) if floating else torch.float32
    other = torch.float16 if floating else torch.int32
    changes = {
        "missing": (None, "converted" if key in CREATED_WHEN_MISSING else "refused"),
        "wrong_shape": (torch.zeros(v.numel() + 1, dtype=v.dtype), "refused"),
        "wrong_kind": (v.to(wrong_kind), "refused"),
        "other_dtype": (v.to(other), "converted"),
        "cpu_tensor": (v.cpu(), "converted"),
    }
    out = {}
    for name, (value, outcome) in changes.items():
        new = copy.deepcopy(sd)
        if value is None:
            del new["state"][0][key]
        else:
            new["state"][0][key] = value
        out[name] = (new, outcome)
    return out


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("opt_name", list(OPTS))
def test_faulty_entries_refused_or_converted(device, opt_name, variant):
    model, opt = _trained(device, opt_name, variant)
    sd = opt.state_dict()
    reference = _reference_layout(device, opt_name, variant)
    assert set(sd["state"][0]) >= ({OWN_KEY[variant]} if variant in OWN_KEY else set())
    extra = copy.deepcopy(sd)
    extra["state"][0]["bogus"] = torch.zeros(3, 4)
    _refused_changes_nothing(model, opt, extra, r"state 'bogus' of parameter 0 of param "
                             r"group 0: .* keeps no such state")
    for key in sorted(sd["state"][0]):
        for fault, (bad, outcome) in _faults(sd, key).items():
            where = f"{opt_name}/{variant}: {fault} {key!r}"
            if outcome == "refused":
                named = rf"lacks \['{key}'" if fault == "missing" else f"'{key}' of parameter 0"
                _refused_changes_nothing(model, opt, bad, named)
                continue
            opt.load_state_dict(bad)
            if fault == "missing":  # made by the next step, as on a first step
                assert key not in opt.state[next(model.parameters())], where
                _amp_step(model, opt, GradScaler(), device)
            assert _layout(opt, model) == reference, where
            opt.load_state_dict(sd)
    _trains_finite(device, model, opt)


@pytest.mark.parametrize("target", list(VARIANTS))
@pytest.mark.parametrize("opt_name", list(OPTS))
def test_other_variants_and_torch_optim_dicts(device, opt_name, target):
    """Each other variant's dict and a torch.optim dict: refused exactly when
    the saved state holds an entry only another kind of variant keeps
    (master, sr_counter), else loaded and converted to this variant's
    layout."""
    dicts = {v: _trained(device, opt_name, v)[1].state_dict() for v in VARIANTS if v != target}
    dicts["torch.optim"] = _torch_optim_dict(device, opt_name)
    reference = _reference_layout(device, opt_name, target)
    for source, sd in dicts.items():
        model, opt = _trained(device, opt_name, target)
        own = OWN_KEY.get(source)
        if own is not None and own != OWN_KEY.get(target):
            _refused_changes_nothing(model, opt, sd, rf"state '{own}' of parameter 0 of "
                                     r"param group 0: this \w+ \(master_weights=")
        else:
            opt.load_state_dict(sd)
            _amp_step(model, opt, GradScaler(), device)  # makes what the dict lacked
            assert _layout(opt, model) == reference, f"{source} -> {target}"
        _trains_finite(device, model, opt)


def test_master_from_a_plain_dict_starts_at_the_parameter(device):
    """plain -> master_weights: the master is made from the bf16 parameter on
    the next step (as on a first step), moments widened exactly."""
    _, plain = _trained(device, "adamw", "plain")
    sd = plain.state_dict()
    model, opt = _trained(device, "adamw", "master")
    opt.load_state_dict(sd)
    p = next(model.parameters())
    assert "master" not in opt.state[p]
    assert opt.state[p]["exp_avg"].dtype == torch.float32
    assert_same(opt.state[p]["exp_avg"].cpu(), sd["state"][0]["exp_avg"].float().cpu())


def test_float16_master_is_widened_and_trains(device):
    """A float16 master loads widened to float32 (it used to fail XLA's
    verifier at sync and leave the parameters unreadable)."""
    model, opt = _trained(device, "adamw", "master")
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["master"] = sd["state"][0]["master"].half()
    opt.load_state_dict(sd)
    p = next(model.parameters())
    assert opt.state[p]["master"].dtype == torch.float32
    assert_same(opt.state[p]["master"].cpu(), sd["state"][0]["master"].float().cpu())
    _trains_finite(device, model, opt)


def test_loaded_groups_keep_build_choices_and_fill_old_keys(device):
    """The saved hyperparameters are taken, the build choices kept; a key an
    older dict lacks (amsgrad) keeps this optimizer's value."""
    model, opt = _trained(device, "adam", "master")
    sd = copy.deepcopy(opt.state_dict())
    group = sd["param_groups"][0]
    group.update(lr=0.5, master_weights=False)
    del group["amsgrad"]
    opt.load_state_dict(sd)
    g = opt.param_groups[0]
    assert (g["lr"], g["master_weights"], g["amsgrad"]) == (0.5, True, False)
    _trains_finite(device, model, opt)


def test_state_dtype_needs_master_or_rounding(device):
    params = list(_model(device).parameters())
    with pytest.raises(ValueError, match="state_dtype=torch.bfloat16 applies to .*"
                                         "master_weights or stochastic_rounding"):
        syncfree.AdamW(params, state_dtype=torch.bfloat16)
    opt = syncfree.SGD(params[:2], lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="state_dtype"):
        opt.add_param_group({"params": params[2:], "state_dtype": torch.bfloat16})
    assert len(opt.param_groups) == 1
