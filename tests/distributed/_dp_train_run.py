"""Trains a small MLP with AMP for the data-parallel tests; run as a script.

    python tests/dp_train.py --mode spmd|single --steps 8 --out result.pt

`spmd`: CPU_NUM_DEVICES=2, a 2-device mesh, the batch sharded on it; overflow
is injected into sample 0, which lives in the first shard. `single`: one
device, the whole batch. Both use xla_amp.optimizer_step with a GradScaler,
so the tests can compare skip decisions and parameters.
"""
import argparse
import os

OVERFLOW_STEPS = (2, 5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["spmd", "single"], required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    os.environ["PJRT_DEVICE"] = "CPU"
    if args.mode == "spmd":
        os.environ["CPU_NUM_DEVICES"] = "2"
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.runtime as xr
    import xla_amp

    mesh = None
    if args.mode == "spmd":
        import torch_xla.distributed.spmd as xs
        xr.use_spmd()
        mesh = xs.Mesh(np.arange(2), (2,), ("data",))
    device = torch_xla.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 4)).to(device)
    opt = xla_amp.syncfree.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = xla_amp.GradScaler(init_scale=2.0 ** 10, growth_interval=3)
    gen = torch.Generator().manual_seed(1)
    scales = []
    for step in range(args.steps):
        x = torch.randn(8, 16, generator=gen)
        y = torch.randint(0, 4, (8,), generator=gen)
        if step in OVERFLOW_STEPS:
            x[0, 0] = float("inf")
        x, y = x.to(device), y.to(device)
        if mesh is not None:
            xs.mark_sharding(x, mesh, ("data", None))
            xs.mark_sharding(y, mesh, ("data",))
        opt.zero_grad()
        with xla_amp.autocast(device):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        xla_amp.optimizer_step(opt, scaler=scaler)
        scales.append(scaler.get_scale_tensor().detach().clone())
        torch_xla.sync()
    torch.save({"params": [p.detach().cpu() for p in model.parameters()],
                "scales": [float(s.cpu()) for s in scales]}, args.out)


if __name__ == "__main__":
    main()
