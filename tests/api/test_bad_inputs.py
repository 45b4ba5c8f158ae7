"""Bad input through every public entry point: each case raises the named
exception type with a message naming the culprit, and leaves parameters,
gradients, optimizer state, scaler state and autocast state bit-identical.

A case is (setup, action, exception, pattern): `setup` runs before the
snapshot (a valid prefix, e.g. a first unscale_), `action` must raise.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch_xla

import xla_amp
from xla_amp import GradScaler, _engine, policies, syncfree
from xla_amp.policies import _env_overrides as env_overrides
from xla_amp.policies._policy import load as load_policy

from tests.support import assert_same


class World:
    """A model, two sync-free optimizers and a scaler, one step taken and
    fresh gradients waiting (the state a bad call meets mid-training)."""

    def __init__(self, device):
        torch.manual_seed(0)
        self.device = device
        self.model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).to(device)
        self.sgd = syncfree.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.adam = syncfree.Adam(self.model.parameters(), lr=0.01)
        self.scaler = GradScaler(init_scale=1024.0, growth_interval=3, min_scale=1.0)
        self.x = torch.randn(5, 4, device=device)
        for opt in (self.sgd, self.adam):
            self.backward()
            self.scaler.step(opt)
            self.scaler.update()
        self.backward()
        torch_xla.sync()

    def backward(self):
        for opt in (self.sgd, self.adam):
            opt.zero_grad()
        with xla_amp.autocast(self.device):
            loss = self.model(self.x).float().pow(2).mean()
        self.scaler.scale(loss).backward()

    def snapshot(self):
        torch_xla.sync()
        cpu = lambda t: t.detach().cpu().clone() if isinstance(t, torch.Tensor) else copy.deepcopy(t)
        return {
            "params": [cpu(p) for p in self.model.parameters()],
            "grads": [cpu(p.grad) for p in self.model.parameters()],
            "opt": [{k: {n: cpu(v) for n, v in st.items()} for k, st in
                     enumerate(o.state.values())} for o in (self.sgd, self.adam)],
            "groups": [copy.deepcopy([{k: v for k, v in g.items() if k != "params"}
                                      for g in o.param_groups]) for o in (self.sgd, self.adam)],
            "scaler": (cpu(self.scaler._scale), cpu(self.scaler._growth_tracker),
                       cpu(self.scaler._skipped), self.scaler._growth_factor,
                       self.scaler._backoff_factor, self.scaler._growth_interval,
                       self.scaler._min_scale,
                       {k: v.stage for k, v in self.scaler._per_optimizer.items()}),
            "autocast": (torch.is_autocast_enabled("xla"), torch.get_autocast_dtype("xla"),
                         _engine.active_policy_name(), xla_amp._C.policy_depth()),
        }


def nothing(w):
    pass


def raise_in_region(w, nested=False):
    with xla_amp.autocast(w.device, policy="cuda", dtype=torch.bfloat16):
        if nested:
            with xla_amp.autocast(w.device, enabled=False):
                raise KeyError("boom")
        raise KeyError("boom")


def sgd_state(w, **changes):
    sd = w.sgd.state_dict()
    sd = copy.deepcopy(sd)
    for key, value in changes.items():
        sd["state"][0][key] = value
    w.sgd.load_state_dict(sd)


def adam_state(w, **changes):
    sd = copy.deepcopy(w.adam.state_dict())
    for key, value in changes.items():
        sd["state"][2][key] = value
    w.adam.load_state_dict(sd)


def scaler_state(w, drop=(), **changes):
    sd = {**w.scaler.state_dict(), **changes}
    for k in drop:
        del sd[k]
    w.scaler.load_state_dict(sd)


def corrupt_then_step(w):
    p = next(w.model.parameters())
    w.adam.state[p]["exp_avg"] = torch.zeros(7, device=w.device)
    try:
        w.adam.step()
    finally:
        w.adam.state[p]["exp_avg"] = w._saved_exp_avg


def setup_corrupt(w):
    w._saved_exp_avg = w.adam.state[next(w.model.parameters())]["exp_avg"]


def closure_raises():
    raise KeyError("closure boom")


def wrong_grad_shape(w):
    p = next(w.model.parameters())
    good = p.grad.data
    p.grad.data = torch.zeros(2, 2, device=w.device)  # (assigning p.grad checks shapes)
    try:
        w.sgd.step()
    finally:
        p.grad.data = good


def bf16_fused(w):
    syncfree.SGD([nn.Parameter(torch.zeros(2, device=w.device, dtype=torch.bfloat16))],
                 lr=0.1, fused=True)


def unscale_first(w):
    w.scaler.unscale_(w.sgd)


def step_first(w):
    w.scaler.step(w.sgd)


def fresh_scaler_update(w):
    GradScaler().update()


def write(tmp, name, text):
    path = tmp / name
    path.write_text(text)
    return str(path)


D = "xla:0"
CASES = {
    # -- autocast -----------------------------------------------------------
    "autocast_cpu_device": (nothing, lambda w: xla_amp.autocast("cpu"), ValueError, "'cpu'"),
    "autocast_cuda_device": (nothing, lambda w: xla_amp.autocast("cuda:0"), ValueError, "cuda:0"),
    "autocast_int_device": (nothing, lambda w: xla_amp.autocast(42), ValueError, "42"),
    "autocast_unknown_policy": (nothing, lambda w: xla_amp.autocast(D, policy="nope"), ValueError, "'nope'"),
    "autocast_policy_type": (nothing, lambda w: xla_amp.autocast(D, policy=3), TypeError, "policy"),
    "autocast_dtype_string": (nothing, lambda w: xla_amp.autocast(D, dtype="bfloat16"), ValueError, "dtype"),
    "autocast_dtype_int": (nothing, lambda w: xla_amp.autocast(D, dtype=torch.int32), ValueError, "int32"),
    "autocast_enabled_str": (nothing, lambda w: xla_amp.autocast(D, enabled="yes"), ValueError, "enabled"),
    "autocast_cache_str": (nothing, lambda w: xla_amp.autocast(D, cache_enabled="no"), ValueError, "cache_enabled"),
    "autocast_region_raises": (nothing, raise_in_region, KeyError, "boom"),
    "autocast_nested_region_raises": (nothing, lambda w: raise_in_region(w, True), KeyError, "boom"),
    # -- policies -----------------------------------------------------------
    "policies_get_unknown": (nothing, lambda w: policies.get("nope"), ValueError, "'nope'"),
    "policies_register_str": (nothing, lambda w: policies.register("tpu"), TypeError, "str"),
    "policies_register_twice": (nothing, lambda w: policies.register(policies.get("tpu")), ValueError, "'tpu'"),
    "policies_for_hardware": (nothing, lambda w: policies.for_hardware("GPU"), ValueError, "'GPU'"),
    "overrides_int": (nothing, lambda w: policies.get("tpu").with_overrides(fp32=42), TypeError, "fp32"),
    "overrides_str": (nothing, lambda w: policies.get("tpu").with_overrides(fp32="aten::mm"), TypeError, "fp32"),
    "overrides_non_str_item": (nothing, lambda w: policies.get("tpu").with_overrides(promote=[3]), TypeError, "promote"),
    "overrides_remove_int": (nothing, lambda w: policies.get("tpu").with_overrides(remove=7), TypeError, "remove"),
    "overrides_name": (nothing, lambda w: policies.get("tpu").with_overrides(name=5), TypeError, "name"),
    "overrides_unknown_op": (nothing, lambda w: policies.get("tpu").with_overrides(fp32=["aten::nope"]), ValueError, "aten::nope"),
    "overrides_two_categories": (nothing, lambda w: policies.get("tpu").with_overrides(
        fp32=["aten::mm"], promote=["aten::mm"]), ValueError, "aten::mm"),
    "overrides_removed_and_moved": (nothing, lambda w: policies.get("tpu").with_overrides(
        fp32=["aten::mm"], remove=["aten::mm"]), ValueError, "aten::mm"),
    "overrides_no_dtype_arg": (nothing, lambda w: policies.get("tpu").with_overrides(
        fp32_set_opt_dtype=["aten::relu"]), ValueError, "aten::relu"),
    "policy_category_no_namespace": (nothing, lambda w: policies.get("tpu").category("mm"), ValueError, "mm"),
    "policy_ops_in_unknown": (nothing, lambda w: policies.get("tpu").ops_in("fp64"), ValueError, "fp64"),
    # -- GradScaler constructor ----------------------------------------------
    "scaler_init_inf": (nothing, lambda w: GradScaler(init_scale=float("inf")), ValueError, "init_scale"),
    "scaler_init_nan": (nothing, lambda w: GradScaler(init_scale=float("nan")), ValueError, "init_scale"),
    "scaler_init_zero": (nothing, lambda w: GradScaler(init_scale=0.0), ValueError, "init_scale"),
    "scaler_init_str": (nothing, lambda w: GradScaler(init_scale="big"), ValueError, "init_scale"),
    "scaler_growth_one": (nothing, lambda w: GradScaler(growth_factor=1.0), ValueError, "growth_factor"),
    "scaler_growth_inf": (nothing, lambda w: GradScaler(growth_factor=float("inf")), ValueError, "growth_factor"),
    "scaler_backoff_big": (nothing, lambda w: GradScaler(backoff_factor=1.5), ValueError, "backoff_factor"),
    "scaler_backoff_nan": (nothing, lambda w: GradScaler(backoff_factor=float("nan")), ValueError, "backoff_factor"),
    "scaler_interval_zero": (nothing, lambda w: GradScaler(growth_interval=0), ValueError, "growth_interval"),
    "scaler_interval_float": (nothing, lambda w: GradScaler(growth_interval=2.5), ValueError, "growth_interval"),
    "scaler_interval_bool": (nothing, lambda w: GradScaler(growth_interval=True), ValueError, "growth_interval"),
    "scaler_min_scale_negative": (nothing, lambda w: GradScaler(min_scale=-1.0), ValueError, "min_scale"),
    "scaler_min_scale_inf": (nothing, lambda w: GradScaler(min_scale=float("inf")), ValueError, "min_scale"),
    "scaler_enabled_str": (nothing, lambda w: GradScaler(enabled="yes"), ValueError, "enabled"),
    # -- GradScaler state machine and setters ----------------------------------
    "scaler_unscale_twice": (unscale_first, lambda w: w.scaler.unscale_(w.sgd), RuntimeError, "already been called"),
    "scaler_unscale_after_step": (step_first, lambda w: w.scaler.unscale_(w.sgd), RuntimeError, "after step"),
    "scaler_step_twice": (step_first, lambda w: w.scaler.step(w.sgd), RuntimeError, "already been called"),
    "scaler_update_before_scale": (nothing, fresh_scaler_update, RuntimeError, "before scale"),
    "scaler_step_closure": (nothing, lambda w: w.scaler.step(w.sgd, lambda: 0.0), RuntimeError, "Closure"),
    "scaler_step_found_inf": (nothing, lambda w: w.scaler.step(w.sgd, found_inf=w.x.sum()), RuntimeError, "found_inf"),
    "scaler_scale_str": (nothing, lambda w: w.scaler.scale([w.x.sum(), "loss"]), ValueError, "str"),
    "scaler_scale_cpu": (nothing, lambda w: w.scaler.scale(torch.ones(())), ValueError, "'cpu'"),
    "scaler_update_new_scale": (unscale_first, lambda w: w.scaler.update(new_scale="x"), ValueError, "new_scale"),
    "scaler_set_growth_nan": (nothing, lambda w: w.scaler.set_growth_factor(float("nan")), ValueError, "growth_factor"),
    "scaler_set_backoff_two": (nothing, lambda w: w.scaler.set_backoff_factor(2.0), ValueError, "backoff_factor"),
    "scaler_set_interval_zero": (nothing, lambda w: w.scaler.set_growth_interval(0), ValueError, "growth_interval"),
    # -- GradScaler state dicts ----------------------------------------------
    "scaler_sd_empty": (nothing, lambda w: w.scaler.load_state_dict({}), RuntimeError, "empty"),
    "scaler_sd_list": (nothing, lambda w: w.scaler.load_state_dict([1]), ValueError, "list"),
    "scaler_sd_missing": (nothing, lambda w: scaler_state(w, drop=["growth_interval"]), ValueError, "growth_interval"),
    "scaler_sd_interval_str": (nothing, lambda w: scaler_state(w, growth_interval="often"), ValueError, "growth_interval"),
    "scaler_sd_scale_inf": (nothing, lambda w: scaler_state(w, scale=float("inf")), ValueError, "scale"),
    "scaler_sd_backoff_zero": (nothing, lambda w: scaler_state(w, backoff_factor=0.0), ValueError, "backoff_factor"),
    "scaler_sd_tracker_negative": (nothing, lambda w: scaler_state(w, _growth_tracker=-1), ValueError, "_growth_tracker"),
    "scaler_sd_unknown_key": (nothing, lambda w: scaler_state(w, bogus=1), ValueError, "bogus"),
    "scaler_min_above_init": (nothing, lambda w: GradScaler(init_scale=1024, min_scale=4096), ValueError,
                              r"min_scale \(4096\) must not exceed init_scale \(1024\)"),
    "scaler_sd_min_above_scale": (nothing, lambda w: scaler_state(w, scale=8.0, min_scale=16.0), ValueError,
                                  r"min_scale \(16\) must not exceed scale \(8\)"),
    "scaler_update_below_floor": (unscale_first, lambda w: w.scaler.update(new_scale=0.5), ValueError,
                                  r"min_scale \(1\) must not exceed new_scale \(0.5\)"),
    "scaler_update_new_scale_inf": (unscale_first, lambda w: w.scaler.update(new_scale=float("inf")),
                                    ValueError, "new_scale must be finite"),
    "overflow_report_not_optimizer": (nothing, lambda w: w.scaler.overflow_report(w.model), TypeError,
                                      "overflow_report: optimizer must be a torch.optim.Optimizer, got Sequential"),
    "scaler_sd_min_scale_str": (nothing, lambda w: scaler_state(w, min_scale="low"), ValueError, "min_scale"),
    # -- sync-free optimizers -------------------------------------------------
    "sgd_negative_lr": (nothing, lambda w: syncfree.SGD(w.model.parameters(), lr=-1.0), ValueError, "learning rate"),
    "sgd_cpu_params": (nothing, lambda w: syncfree.SGD([nn.Parameter(torch.zeros(2))], lr=0.1), ValueError, "'cpu'"),
    "adam_bad_beta": (nothing, lambda w: syncfree.Adam(w.model.parameters(), betas=(1.5, 0.9)), ValueError, "beta"),
    "sgd_fused_bf16": (nothing, bf16_fused, ValueError, "fused"),
    "step_found_inf_float": (nothing, lambda w: w.sgd.step(found_inf=1.0), ValueError, "found_inf"),
    "step_found_inf_cpu": (nothing, lambda w: w.sgd.step(found_inf=torch.zeros(())), ValueError, "found_inf"),
    "step_found_inf_shape": (nothing, lambda w: w.adam.step(found_inf=torch.zeros(2, device=w.device)), ValueError, "found_inf"),
    "step_closure_not_callable": (nothing, lambda w: w.sgd.step(closure=3), TypeError, "closure"),
    "step_closure_raises": (nothing, lambda w: w.adam.step(closure=closure_raises), KeyError, "closure boom"),
    "step_grad_shape": (nothing, wrong_grad_shape, ValueError, "gradient of parameter 0 of param group 0"),
    "step_corrupted_state": (setup_corrupt, corrupt_then_step, ValueError, "'exp_avg' of parameter 0 of param group 0"),
    "sgd_sd_buffer_shape": (nothing, lambda w: sgd_state(w, momentum_buffer=torch.zeros(3)), ValueError,
                            r"'momentum_buffer' of parameter 0 of param group 0: expected shape \(3, 4\)"),
    "adam_sd_exp_avg_int": (nothing, lambda w: adam_state(w, exp_avg=torch.zeros(3, 3, dtype=torch.int32)), ValueError,
                            "'exp_avg' of parameter 2 of param group 0"),
    "adam_sd_step_str": (nothing, lambda w: adam_state(w, step="x"), ValueError, "'step' of parameter 2"),
    "adam_sd_groups": (nothing, lambda w: w.adam.load_state_dict({"state": {}, "param_groups": []}), ValueError,
                       "param groups"),
    "adam_sd_not_dict": (nothing, lambda w: w.adam.load_state_dict(None), ValueError, "NoneType"),
    # -- data parallel ----------------------------------------------------------
    "allreduce_scale_zero": (nothing, lambda w: xla_amp.all_reduce_gradients(w.sgd, scale=0.0), ValueError, "scale"),
    "allreduce_groups": (nothing, lambda w: xla_amp.all_reduce_gradients(w.sgd, groups=[[0, 1]]), ValueError, r"\[\[0, 1\]\]"),
    "allreduce_not_optimizer": (nothing, lambda w: xla_amp.all_reduce_gradients("sgd"), TypeError, "optimizer"),
    "optimizer_step_groups": (nothing, lambda w: xla_amp.optimizer_step(w.sgd, w.scaler, groups=[[]]), ValueError, r"\[\[\]\]"),
    "optimizer_step_bad_scaler": (nothing, lambda w: xla_amp.optimizer_step(w.sgd, scaler="s"), TypeError, "scaler"),
    # -- custom_fwd / custom_bwd ------------------------------------------------
    "custom_fwd_int64": (nothing, lambda w: xla_amp.custom_fwd(cast_inputs=torch.int64), ValueError, "cast_inputs"),
    "custom_fwd_str": (nothing, lambda w: xla_amp.custom_fwd(cast_inputs="float16"), ValueError, "cast_inputs"),
    "custom_fwd_device": (nothing, lambda w: xla_amp.custom_fwd(device_type=3), ValueError, "device_type"),
    "custom_bwd_device": (nothing, lambda w: xla_amp.custom_bwd(device_type=None), ValueError, "device_type"),
}


@pytest.fixture(scope="module")
def world(device):
    return World(device)


def test_enough_cases():
    assert len(CASES) >= 60


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_names_culprit_and_changes_nothing(world, name):
    setup, action, exc, pattern = CASES[name]
    setup(world)
    try:
        before = world.snapshot()
        with pytest.raises(exc, match=pattern):
            action(world)
        assert_same(before, world.snapshot())
    finally:
        world.scaler._per_optimizer.clear()  # back to the start of an iteration


@pytest.mark.parametrize("text,where", [
    ("aten::mm\n\naten::nope\n", ":3"),
    ("# a comment\naten::relu  # fine\naten::mm.bad_overload\n", ":3"),
])
def test_env_list_file_errors(tmp_path, text, where):
    path = write(tmp_path, "ops.txt", text)
    with pytest.raises(ValueError, match=f"ops.txt{where}"):
        env_overrides.read_op_list(path, "fp32")


def test_env_missing_file_and_double_listing(tmp_path):
    with pytest.raises(ValueError, match="nope.txt: cannot read"):
        env_overrides.read_op_list(tmp_path / "nope.txt")
    a = write(tmp_path, "a.txt", "aten::mm\n")
    b = write(tmp_path, "b.txt", "aten::mm\n")
    with pytest.raises(ValueError, match="XLA_AMP_FP32_OPS_LIST.*XLA_AMP_PROMOTE_OPS_LIST|"
                                         "XLA_AMP_LOWER_PRECISION_OPS_LIST.*XLA_AMP_FP32_OPS_LIST"):
        env_overrides.read_environment({"XLA_AMP_LOWER_PRECISION_OPS_LIST": a,
                                        "XLA_AMP_FP32_OPS_LIST": b})


def test_policy_file_errors_name_line(tmp_path):
    path = write(tmp_path, "p.toml", 'name = "p"\ndefault_dtype = "bfloat16"\n'
                 'supported_dtypes = ["bfloat16"]\n[fp32]\n"aten::nope" = "x"\n')
    with pytest.raises(ValueError, match="p.toml:5"):
        load_policy(path)
