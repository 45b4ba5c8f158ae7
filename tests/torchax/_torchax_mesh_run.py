"""Run by tests/torchax/test_torchax_mesh.py in one process with 4 CPU devices
(XLA_FLAGS=--xla_force_host_platform_device_count=4, JAX_PLATFORMS=cpu, set
by the test): xla_amp.torchax.make_train_step on a 4-device mesh. Prints
one JSON object (the last line of stdout), a key per run:

    replicate, fsdp   an MLP (64 -> 128 -> 10, batch 16: 4 rows a device),
                      policy "tpu" (bf16), LossScaler(2**10,
                      growth_interval=2), optax.adamw: 2 clean steps; a step
                      whose inputs are inf in rows 4..7 only (ONE device's
                      shard); 3 clean steps. Reports found_inf, whether the
                      parameters and the optimizer state stayed bit for bit,
                      the scale after every step, the devices that saw an
                      inf, and the collectives of the compiled step.
    parity            the same MLP, 5 steps, on the 4-device mesh (fsdp) and
                      on one device (no mesh): both runs' losses.
"""
import json
import os
import re

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("PJRT_DEVICE", "CPU")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import xla_amp.torchax as xt  # noqa: E402

BATCH, POISONED = 16, range(4, 8)


def make_step(mesh, sharding="fsdp"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return xt.make_train_step(model, F.cross_entropy, optax.adamw(1e-2), policy="tpu",
                              dtype=torch.bfloat16, mesh=mesh, sharding=sharding,
                              scaler=xt.LossScaler(init_scale=2.0 ** 10, growth_interval=2))


def batch(i):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(BATCH, 64, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def leaves(step):
    params, _, opt_state = step.state[:3]
    return [np.asarray(a) for a in jax.tree_util.tree_leaves((params, opt_state))]


def bit_equal(a, b):
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(a, b))


def collectives(hlo):
    """How many of each collective the compiled (partitioned) step holds,
    and the result type of every all-reduce (e.g. "pred[]", a reduced
    finiteness flag, or "(f32[10,128]{1,0}, ...)", gradients)."""
    counts = {op: len(re.findall(rf" {op}(-start)?\(", hlo))
              for op in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")}
    types = re.findall(r"= (.*?) all-reduce(?:-start)?\(", hlo)
    return {"counts": counts, "all_reduce_types": types}


def overflow_run(mesh, sharding):
    step = make_step(mesh, sharding)
    params = step.state[0]
    out = {"sharded_params": sorted(k for k, a in params.items()
                                    if not a.sharding.is_fully_replicated),
           "losses": [], "found_inf": [], "scales": []}

    def run(x, y):
        out["losses"].append(float(step(x, y)))
        out["found_inf"].append(bool(step.metrics["found_inf"]))
        out["scales"].append(float(step.metrics["scale"]))

    for i in range(2):
        run(*batch(i))
    x, y = batch(2)
    x[list(POISONED)] = float("inf")
    placed = step.place_batch(x, y)[0]
    out["inf_devices"] = sorted(s.device.id for s in placed.addressable_shards
                                if not np.isfinite(np.asarray(s.data)).all())
    out["inf_device_rows"] = [list(range(BATCH)[s.index[0]]) for s in placed.addressable_shards
                              if s.device.id in out["inf_devices"]]
    before = leaves(step)
    run(x, y)
    out["unchanged"] = bit_equal(before, leaves(step))
    for i in range(3, 6):
        run(*batch(i))
    out["params_finite"] = all(np.isfinite(a).all() for a in leaves(step))
    out["collectives"] = collectives(step.lower(*batch(0)).compile().as_text())
    return out


def parity_run(mesh):
    runs = {}
    for name, m in (("mesh", mesh), ("one_device", None)):
        step = make_step(m)
        runs[name] = [float(step(*batch(i))) for i in range(5)]
    return runs


assert jax.device_count() == 4, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("data",))
result = {sharding: overflow_run(mesh, sharding) for sharding in ("replicate", "fsdp")}
result["parity"] = parity_run(mesh)
print(json.dumps(result), flush=True)
