"""Run by tests/torchax/test_torchax_fp8_layouts.py in one process with 4 CPU
devices (XLA_FLAGS=--xla_force_host_platform_device_count=4, JAX_PLATFORMS=cpu,
set by the test): a delayed-scaling fp8 MLP's make_train_step on a 4-device
mesh, replicated and FSDP, with word transposes left to their default as on
a GPU (`_fp8._on_gpu` answers True: JAX runs on the CPU here), forced off,
and under FSDP forced on. Prints one JSON object (the last line of stdout), a
key per run ("replicate/default", "fsdp/on", ...): the word casts of the lowered step,
the all-gathers of the compiled one, and whether the losses of three steps
and every state leaf equal the forced-off run's bit for bit."""
import json
import os

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
from tests.support.fp8 import word_casts  # noqa: E402
from tests.torchax._torchax_mesh_run import collectives  # noqa: E402
from xla_amp import fp8  # noqa: E402
from xla_amp.torchax import _fp8  # noqa: E402

_fp8._on_gpu = lambda: True  # the default a GPU backend gets (module docstring)


def run(mesh, sharding, on):
    torch.manual_seed(0)
    model = fp8.convert(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 16)),
                        fp8.Fp8Recipe(scaling="delayed"))
    step = xt.make_train_step(model, F.mse_loss, optax.adamw(1e-2), policy="tpu", mesh=mesh,
                              sharding=sharding)
    x, y = torch.randn(64, 64), torch.randn(64, 16)
    with _fp8.word_transposes(on):
        lowered = step.lower(x, y)
        compiled = lowered.compile().as_text()
        losses = [np.asarray(step(x, y)) for _ in range(3)]
    return {"word_casts": word_casts(lowered.as_text(dialect="hlo")),
            "all_gathers": collectives(compiled)["counts"]["all-gather"],
            "bits": [a.tobytes().hex() for a in losses]
            + [np.asarray(a).tobytes().hex() for a in jax.tree_util.tree_leaves(step.state)]}


def main():
    mesh = Mesh(np.array(jax.devices()), ("data",))
    out = {}
    for sharding in ("replicate", "fsdp"):
        off = run(mesh, sharding, False)
        # replicated, the default is the words (its casts show it): no forced run
        forced = (("on", True),) if sharding == "fsdp" else ()
        for name, on in (("default", None), *forced, ("off", False)):
            r = off if on is False else run(mesh, sharding, on)
            out[f"{sharding}/{name}"] = {"word_casts": r["word_casts"],
                                         "all_gathers": r["all_gathers"],
                                         "same_bits": r["bits"] == off["bits"]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
