"""Data-parallel AMP: SPMD executed on 2 XLA:CPU devices; replica mode by HLO.

Replica-mode collectives do not execute on XLA:CPU (pytorch/xla issue 5005),
so replica mode is checked through the lowered HLO of a one-replica process
with XLA_ALWAYS_ALLREDUCE=1 (PyTorch/XLA's own switch to emit collectives for
one replica) and by running one replica.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch_xla

import xla_amp

from tests.support import hlo
from xla_amp import distributed

HERE = Path(__file__).parent
MAX_ALL_REDUCE = re.compile(r"all-reduce\(.*to_apply=%MaxComputation")


def _train(mode, tmp_path):
    out = tmp_path / f"{mode}.pt"
    env = {k: v for k, v in os.environ.items() if k != "CPU_NUM_DEVICES"}
    r = subprocess.run([sys.executable, str(HERE / "_dp_train_run.py"), "--mode", mode,
                        "--out", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return torch.load(out)


def test_spmd_two_devices_matches_one_device(tmp_path):
    spmd = _train("spmd", tmp_path)
    single = _train("single", tmp_path)
    # Same skip decisions: the scale backs off on exactly the overflow steps.
    assert spmd["scales"] == single["scales"]
    assert spmd["scales"][2] == spmd["scales"][1] / 2
    # Parameters agree to within reduction-order rounding of bf16 matmuls
    # (bf16 keeps ~3 significant digits); one update is ~5e-3 here, so a step
    # taken on one side and skipped on the other would not fit.
    for a, b in zip(spmd["params"], single["params"]):
        assert torch.allclose(a, b, rtol=1e-2, atol=1e-3), (a - b).abs().max()


def _model(device, n_layers=4):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(32, 32) for _ in range(n_layers)]
    return torch.nn.Sequential(*layers).to(device)


def _backward(model, device, scaler=None):
    x = torch.randn(4, 32).to(device)  # CPU generator: reproducible under manual_seed
    loss = model(x).square().mean()
    (scaler.scale(loss) if scaler else loss).backward()


def _hlo(tensors):
    return hlo(*tensors)


def test_replica_hlo_buckets_and_mean_scale(device, emit_collectives):
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _backward(model, device)
    torch_xla.sync()
    # 4 layers of 4 KiB + 128 B: a 10 KiB cap holds two layers per bucket.
    n = distributed.all_reduce_gradients(opt, bucket_cap_mb=10 / 1024, scale=0.25)
    grads = [p.grad for p in model.parameters()]
    text = _hlo(grads)
    reduces = re.findall(r"all-reduce\(", text)
    assert 1 <= len(reduces) <= n == 2, text
    assert "replica_groups={}" in text and "AddComputation" in text
    assert re.search(r"f32\[\] constant\(0.25\)", text)  # the scale is applied once
    assert len(re.findall(r"f32\[\] constant\(0.25\)", text)) == len(grads)  # once each


def test_replica_hlo_found_inf_reduced_when_unscaled_first(device, emit_collectives):
    model = _model(device, 2)
    opt = xla_amp.syncfree.SGD(model.parameters(), lr=0.1)
    scaler = xla_amp.GradScaler()
    _backward(model, device, scaler)
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # local clipping
    xla_amp.optimizer_step(opt, scaler=scaler)
    text = _hlo(list(model.parameters()))
    assert MAX_ALL_REDUCE.search(text), "found_inf was not reduced across replicas"


def test_replica_hlo_no_found_inf_reduction_when_reduced_first(device, emit_collectives):
    model = _model(device, 2)
    opt = xla_amp.syncfree.SGD(model.parameters(), lr=0.1)
    scaler = xla_amp.GradScaler()
    _backward(model, device, scaler)
    xla_amp.optimizer_step(opt, scaler=scaler)
    text = _hlo(list(model.parameters()))
    assert not MAX_ALL_REDUCE.search(text)  # reduced gradients already agree
    assert re.search(r"all-reduce\(.*to_apply=%AddComputation", text)


def test_one_replica_step_runs_and_matches_plain_step(device):
    torch.manual_seed(0)
    a, b = _model(device, 2), _model(device, 2)
    oa = xla_amp.syncfree.SGD(a.parameters(), lr=0.1)
    ob = xla_amp.syncfree.SGD(b.parameters(), lr=0.1)
    sa, sb = xla_amp.GradScaler(), xla_amp.GradScaler()
    for model, opt, scaler, reduce in ((a, oa, sa, True), (b, ob, sb, False)):
        torch.manual_seed(1)
        _backward(model, device, scaler)
        if reduce:
            xla_amp.optimizer_step(opt, scaler=scaler)
        else:
            scaler.step(opt)
            scaler.update()
        torch_xla.sync()
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p.cpu(), q.cpu())


def test_buckets_split_by_dtype_and_size():
    ts = [torch.zeros(256), torch.zeros(256, dtype=torch.bfloat16), torch.zeros(256),
          torch.zeros(1024)]
    parts = distributed.buckets(ts, cap_mb=2048 / 2**20)  # 2 KiB
    assert [[t.dtype for t in b] for b in parts] == [
        [torch.float32, torch.float32], [torch.float32], [torch.bfloat16]]


@pytest.mark.parametrize("groups", [[[1]], [[0], [0]], [[0, 1]], [[]]])
def test_groups_must_cover_the_replicas(device, groups):
    model = _model(device, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _backward(model, device)
    before = [p.grad.cpu() for p in model.parameters()]
    with pytest.raises(ValueError, match="replica groups"):
        xla_amp.all_reduce_gradients(opt, groups=groups)
    assert all(torch.equal(g, p.grad.cpu()) for g, p in zip(before, model.parameters()))


@pytest.mark.parametrize("scale", [0.0, -1.0])
def test_scale_must_be_positive(device, scale):
    model = _model(device, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    _backward(model, device)
    with pytest.raises(ValueError, match="scale must be > 0"):
        xla_amp.all_reduce_gradients(opt, scale=scale)
