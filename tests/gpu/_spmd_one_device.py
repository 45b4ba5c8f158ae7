"""Run by tests/gpu/test_gpu_spmd_mode.py in a subprocess: xla_amp in SPMD mode
on one logical device, as XLA:GPU through the CUDA plugin runs (there the
device is SPMD:0 over CUDA:0). Stand-in: XLA:CPU in SPMD mode with the cuda
policy forced. Prints one JSON object with what it measured.

    python tests/gpu/_spmd_one_device.py spmd|plain

``plain``: the same without SPMD mode, for the comparison."""
import json
import os
import sys

os.environ["PJRT_DEVICE"] = "CPU"
os.environ.pop("CPU_NUM_DEVICES", None)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402
import torch_xla.runtime as xr  # noqa: E402

if sys.argv[1] == "spmd":
    xr.use_spmd()
from benchmarks import _harness as harness  # noqa: E402  (the checkout is importable)
import xla_amp  # noqa: E402
from xla_amp import syncfree  # noqa: E402

dev = torch_xla.device()
out = {"device": str(dev), "hw": xm.xla_device_hw(dev), "devices": xr.global_runtime_device_count()}
try:
    xm.xla_device_kind(dev)
    out["kind"] = "ok"
except Exception as e:  # what torch_xla says on SPMD:0
    out["kind"] = f"{type(e).__name__}: {e}"


def clear():  # once earlier executions have landed (they count when they finish)
    xm.wait_device_ops()
    met.clear_all()


def counts():
    """Executions (SPMD records them as ExecuteReplicatedTime), transfers,
    compilations: the benchmarks' counter, which must see SPMD's too."""
    got = harness.counts()
    return {"executions": got["ExecuteTime"], "transfers": got["TransferFromDeviceTime"],
            "compilations": got["CompileTime"]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.norm(self.fc1(x))))


def measure(dtype) -> dict:
    """Casts, the training step, the tools, torch.compile and the state
    round trip under the cuda rules in ``dtype``."""
    out = {}
    torch.manual_seed(0)
    model = Net().to(dev)
    x, y = torch.randn(8, 16).to(dev), torch.randint(0, 4, (8,)).to(dev)

    # autocast: the cuda rules, bit-equal with a manual cast
    with xla_amp.autocast(dev, policy="cuda", dtype=dtype):
        h = model.fc1(x)
        n = model.norm(h)
    control = F.linear(x.to(dtype), model.fc1.weight.to(dtype), model.fc1.bias.to(dtype))
    out["linear"] = [str(h.dtype), bool(torch.equal(h.cpu(), control.cpu()))]
    out["layer_norm"] = str(n.dtype)

    # the training step: GradScaler + syncfree AdamW, one graph, no transfer
    opt = syncfree.AdamW(model.parameters(), lr=1e-3)
    scaler = xla_amp.GradScaler(init_scale=2.0 ** 10)


    def step(inputs):
        opt.zero_grad()
        with xla_amp.autocast(dev, policy="cuda", dtype=dtype):
            loss = F.cross_entropy(model(inputs), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        torch_xla.sync()
        return loss


    bad = x.clone()
    bad[0, 0] = float("inf")
    for inputs in (x, x, bad):  # warm-up: the graphs of a finite and an overflow step
        step(inputs)
    clear()
    losses = [step(x) for _ in range(3)]
    out["steps"] = counts()
    out["losses"] = torch.stack(losses).detach().cpu().tolist()

    before = {k: v.cpu().clone() for k, v in model.state_dict().items()}
    scale = scaler.get_scale()
    clear()
    step(bad)
    out["overflow_step"] = counts()
    out["skipped_unchanged"] = all(torch.equal(v.cpu(), before[k])
                                   for k, v in model.state_dict().items())
    out["scale"] = [scale, scaler.get_scale()]
    out["overflow_report"] = scaler.overflow_report(opt)

    # numerics tools
    with xla_amp.autocast(dev, policy="cuda", dtype=dtype, record=True) as ac:
        model(x)
    out["report_ops"] = sorted({r["op"] for r in ac.report().rows})
    watch = xla_amp.watch_nonfinite(model)
    model(bad)
    torch_xla.sync()
    out["watch"] = watch.report()
    watch.remove()
    report = xla_amp.compare(model, x, policy="cuda")
    out["compare_modules"] = sorted(r["module"] for r in report.rows)

    # torch.compile under SPMD: the same bits as lazy
    fn = lambda inputs: model(inputs)  # noqa: E731


    def region(inputs):
        with xla_amp.autocast(dev, policy="cuda", dtype=dtype):
            return fn(inputs)


    lazy = region(x)
    try:
        compiled = torch.compile(region, backend="openxla")(x)
        out["compiled"] = [str(compiled.dtype), bool(torch.equal(compiled.cpu(), lazy.cpu()))]
    except Exception as e:
        out["compiled"] = f"{type(e).__name__}: {str(e)[:300]}"

    # checkpoint round trip: optimizer + scaler state onto a fresh optimizer
    saved = {"opt": opt.state_dict(), "scaler": scaler.state_dict()}
    opt2 = syncfree.AdamW(model.parameters(), lr=1e-3)
    opt2.load_state_dict(saved["opt"])
    scaler2 = xla_amp.GradScaler()
    scaler2.load_state_dict(saved["scaler"])
    out["restored"] = scaler2.get_scale() == scaler.get_scale() and all(
        torch.equal(a.cpu(), b.cpu()) for s in opt.state for a, b in
        zip(opt.state[s].values(), opt2.state[s].values()) if torch.is_tensor(a))
    return out


for name in ("float16", "bfloat16"):
    out[name] = measure(getattr(torch, name))
print(json.dumps(out))
