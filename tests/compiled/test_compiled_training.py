"""A training loop whose forward + loss is compiled (torch.compile(backend=
"openxla")) and whose backward, GradScaler and syncfree optimizer run
lazily after it - the pattern docs/compiled.md recommends - trains exactly
as the lazy loop: same loss scales, the same overflow step skipped, the
same parameters bit for bit after 10 steps (the lazy loop syncs after its
forward, the graph cut a compiled forward makes; see test_compiled_models),
and no recompilation when the learning rate changes or a step overflows."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
import torch_xla
from torch._dynamo.testing import CompileCounterWithBackend

import xla_amp
from tests.support.models import mnist_cnn
from xla_amp import syncfree

OVERFLOW_STEP = 4


def _train(device, policy, compiled, steps=10):
    torch.manual_seed(0)
    data = [(torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))) for _ in range(steps)]
    torch.manual_seed(1)
    model = mnist_cnn().to(device)
    opt = syncfree.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.8)
    scaler = xla_amp.GradScaler(init_scale=2.0 ** 12, growth_interval=3)
    factor = {True: torch.tensor(float("inf")).to(device), False: torch.tensor(1.0).to(device)}

    def forward_loss(x, y, factor):
        with xla_amp.autocast(device, policy=policy):
            return F.cross_entropy(model(x * factor), y)
    counter = CompileCounterWithBackend("openxla")
    if compiled:
        forward_loss = torch.compile(forward_loss, backend=counter)
    scales, snapshots = [], []
    for i, (x, y) in enumerate(data):
        opt.zero_grad(set_to_none=True)
        loss = forward_loss(x.to(device), y.to(device), factor[i == OVERFLOW_STEP])
        if not compiled:
            torch_xla.sync()  # the cut a compiled forward makes
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        torch_xla.sync()
        scales.append(scaler.get_scale())
        snapshots.append([p.detach().cpu() for p in model.parameters()])
    return scales, snapshots, counter.frame_count


@pytest.mark.parametrize("policy", ["tpu", "cpu"])
def test_compiled_forward_loop_matches_lazy_loop(device, policy):
    torch._dynamo.reset()
    scales_c, params_c, frames = _train(device, policy, True)
    scales, params, _ = _train(device, policy, False)
    assert frames == 1  # lr changes and the overflow step reuse the one graph
    assert scales_c == scales
    assert scales[OVERFLOW_STEP] == scales[OVERFLOW_STEP - 1] / 2  # the overflow halved it
    for run in (params, params_c):  # ... and that step changed no parameter
        assert all(torch.equal(a, b) for a, b in zip(run[OVERFLOW_STEP], run[OVERFLOW_STEP - 1]))
        assert not all(torch.equal(a, b) for a, b in zip(run[-1], run[OVERFLOW_STEP]))
    for step, (a, b) in enumerate(zip(params_c, params)):
        for i, (pc, p) in enumerate(zip(a, b)):
            assert torch.equal(pc, p), (step, i, (pc - p).abs().max().item())


def test_docs_example_runs(tmp_path):
    """The recommended step of docs/compiled.md runs as written."""
    import os
    import re
    import subprocess
    import sys
    from tests.support.launch import ROOT as root
    with open(os.path.join(root, "docs", "compiled.md")) as f:
        code = re.search(r"```python\n(.*?)```", f.read(), re.S).group(1)
    script = tmp_path / "example.py"
    script.write_text(code)
    env = dict(os.environ, PJRT_DEVICE="CPU")
    env.pop("CPU_NUM_DEVICES", None)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout.strip().splitlines()[-1]) < 1.0  # from ln(10): it learned the batch
