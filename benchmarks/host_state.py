"""How fast the machine it runs on compiles right now: the calibration
docs/benchmarks.md ("Test suite") quotes beside suite timings.

    python -m benchmarks.host_state

Two training steps of torchvision's ResNet-50 (2 images of 64x64, SGD) on
XLA:CPU with XLA's backend optimisation at level 0, as the tests compile;
prints the compile seconds (two graphs: the first step's and the steady one)
and the wall time. On the 2-core AMD EPYC the suite's figures come from,
the compile took 5.6 s in the host's fast state and 6.7-8.0 s in its slow
one, and suite targets moved by 20-35 % between the two; a figure taken
without this one beside it cannot be compared with another.
"""
from __future__ import annotations

import os
import time

os.environ["PJRT_DEVICE"] = "CPU"
os.environ["XLA_FLAGS"] = "--xla_backend_optimization_level=0"  # every calibration alike
os.environ.pop("CPU_NUM_DEVICES", None)

import torch  # noqa: E402
import torch_xla  # noqa: E402
import torch_xla.core.xla_model as xm  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402


def calibrate() -> dict:
    import torchvision
    dev = torch_xla.device()
    model = torchvision.models.resnet50().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, 3, 64, 64).to(dev)
    y = torch.randint(0, 1000, (2,)).to(dev)
    t0 = time.perf_counter()
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        torch_xla.sync()
    xm.wait_device_ops()
    count, total_ns = met.metric_data("CompileTime")[:2]
    return {"compile_s": total_ns / 1e9, "compilations": count,
            "wall_s": time.perf_counter() - t0}


def main() -> None:
    r = calibrate()
    print(f"compile {r['compile_s']:.1f} s ({r['compilations']} graphs), "
          f"wall {r['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
