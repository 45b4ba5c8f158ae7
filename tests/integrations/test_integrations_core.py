"""The integrations' shared core without any framework (make test): a
precision setting's checks (_mode.Mode), the optimizer a mode needs
(_optimizers), and the hooks' autocast and input conversion (_hooks)."""
import warnings

import pytest
import torch

from xla_amp import syncfree
from xla_amp.integrations import _optimizers
from xla_amp.integrations._hooks import Hooks
from xla_amp.integrations._mode import Mode


@pytest.mark.parametrize("kwargs,match", [
    ({"precision": "16-true"}, "choose one of bf16-mixed, 16-mixed, bf16-true"),
    ({"precision": "bf16-mixed", "master_weights": True}, "needs precision='bf16-true'"),
    ({"precision": "16-mixed", "stochastic_rounding": True}, "needs precision='bf16-true'"),
    ({"precision": "bf16-true", "master_weights": True, "stochastic_rounding": True},
     "exclude each other"),
    ({"precision": "bf16-true", "master_weights": 1}, "master_weights must be a bool"),
    ({"precision": "16-mixed", "policy": "tpu"}, "'tpu' policy does not support"),
    ({"precision": "bf16-mixed", "policy": "no-such"}, "no-such"),
    ({"precision": "bf16-mixed", "keep": (torch.nn.LayerNorm,)}, "keep= applies to"),
    ({"precision": "bf16-true", "keep": (int,)}, "keep must hold nn.Module classes"),
    ({"precision": "bf16-mixed", "scaler": {"init_scale": 8.0}}, "scaler arguments apply"),
    ({"precision": "16-mixed", "scaler": {"growth_factor": 0.5}}, "growth_factor"),
    ({"precision": "bf16-mixed", "module_policies": ["fp32"]}, "module_policies must be a mapping"),
])
def test_bad_settings_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Mode(**kwargs)


def test_a_mode_says_what_it_computes_in():
    assert Mode("bf16").precision == "bf16-mixed"  # Accelerate's name
    true = Mode("bf16-true", stochastic_rounding=True)
    assert (true.compute_dtype, true.param_dtype, true.scaled) == (torch.bfloat16, torch.bfloat16,
                                                                   False)
    assert true.optimizer_options == {"master_weights": False, "stochastic_rounding": True}
    fp16 = Mode("16-mixed", policy="cuda")
    assert (fp16.compute_dtype, fp16.param_dtype, fp16.scaled) == (torch.float16, torch.float32,
                                                                   True)


def _adamw(device, lr=0.1):
    model = torch.nn.Linear(4, 3).to(device)
    return model, torch.optim.AdamW([{"params": [model.weight], "lr": lr},
                                     {"params": [model.bias], "lr": lr / 10,
                                      "weight_decay": 0.0}], betas=(0.8, 0.9), eps=1e-6)


def test_to_syncfree_keeps_every_hyperparameter_and_the_group_dicts(device):
    _, opt = _adamw(device)
    groups = opt.param_groups
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5)
    new = _optimizers.to_syncfree(opt, Mode("bf16-true", master_weights=True))
    assert type(new) is syncfree.AdamW
    assert all(a is b for a, b in zip(new.param_groups, groups))  # the scheduler's dicts
    assert [g["lr"] for g in groups] == [0.1, 0.01] and groups[1]["weight_decay"] == 0.0
    assert all(g["betas"] == (0.8, 0.9) and g["eps"] == 1e-6 and g["master_weights"] for g in groups)
    _optimizers.follow(sched, opt, new)
    assert sched.optimizer is new
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()" would raise
        for p in new.param_groups[0]["params"] + new.param_groups[1]["params"]:
            p.grad = torch.ones_like(p)
        new.step()
        sched.step()
    assert [g["lr"] for g in new.param_groups] == [0.05, 0.005]


def test_to_syncfree_refusals_leave_the_optimizer_as_it_was(device):
    model = torch.nn.Linear(4, 3)  # on the CPU: the syncfree constructor refuses
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = [dict(g) for g in opt.param_groups]
    with pytest.raises(ValueError, match="not on an XLA device"):
        _optimizers.to_syncfree(opt, Mode("bf16-true", master_weights=True))
    assert opt.param_groups == before
    model, opt = _adamw(device)
    model(torch.ones(2, 4, device=device)).sum().backward()
    opt.step()
    with pytest.raises(ValueError, match="has state already"):
        _optimizers.to_syncfree(opt, Mode("bf16-mixed"))


def test_check_refuses_an_optimizer_that_cannot_keep_the_master(device):
    model = torch.nn.Linear(4, 3).to(device)
    master = Mode("bf16-true", master_weights=True)
    with pytest.raises(ValueError, match="needs an xla_amp.syncfree optimizer.*RMSprop"):
        _optimizers.check(torch.optim.RMSprop(model.parameters()), master)
    plain = syncfree.AdamW(model.parameters())
    with pytest.raises(ValueError, match="param group 0 of AdamW has master_weights=False"):
        _optimizers.check(plain, master)
    _optimizers.check(torch.optim.RMSprop(model.parameters()), Mode("16-mixed"))  # scaler masks it
    assert _optimizers.to_syncfree(plain, master) is plain  # never swapped twice


def test_hooks_autocast_and_inputs(device):
    x = {"a": torch.ones(2, 2, device=device), "n": torch.arange(3, device=device)}
    out = Hooks(Mode("bf16-true")).convert_input(x)
    assert (out["a"].dtype, out["n"].dtype) == (torch.bfloat16, torch.int64)
    assert Hooks(Mode("bf16-mixed")).convert_input(x) is x
    w = torch.ones(2, 2, device=device)
    with Hooks(Mode("16-mixed", policy="cuda")).autocast(device):
        assert (w @ w).dtype == torch.float16
    with pytest.raises(ValueError, match="'tpu' policy does not support"):
        _tpu_device_hooks()


def _tpu_device_hooks():
    """16-mixed with the device's policy on a TPU: refused when the region
    is made (the tpu rules have no float16), not left to warn and disable."""
    from unittest import mock
    import torch_xla.core.xla_model as xm
    with mock.patch.object(xm, "xla_device_hw", lambda device: "TPU"):
        Hooks(Mode("16-mixed")).autocast()
