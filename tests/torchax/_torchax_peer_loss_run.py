"""Run by tests/torchax/test_torchax_peer_loss.py: one of two processes
(2 CPU devices each, gloo collectives) set up by
xla_amp.torchax.initialize_distributed with its default timeouts, training
a small MLP with make_train_step(mesh=..., sharding="replicate") over the
4-device global mesh.

    _torchax_peer_loss_run.py PID PORT STEPS LINGER END

Prints "step I LOSS" (flushed) after each step. After STEPS steps: sleeps
LINGER seconds (a straggler the others must wait for), prints "done", then
ends by END:
    shutdown    jax.distributed.shutdown(), then the end of the script
    return      the end of the script (the watchdog's atexit hook marks this
                process "exit")
    raise       an unhandled RuntimeError (the hook marks it "fail")
The test SIGKILLs one of the pair mid-run (STEPS large), lets both finish,
or has one raise. With PEER_LOSS_GATE=PATH in its environment a process
prints "gate" after step 2 and waits until PATH exists before step 3 (the
other can be killed while this one is not inside a collective); if PATH
then holds "raise", it raises the error gloo raises in a step whose peer
has died, as if its step 3 had.
"""
import os
import sys

PID, PORT, STEPS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
LINGER, END = float(sys.argv[4]), sys.argv[5]
assert END in ("shutdown", "return", "raise"), END
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("PJRT_DEVICE", "CPU")

import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

import xla_amp.torchax as xt  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
xt.initialize_distributed(f"localhost:{PORT}", 2, PID)
assert (jax.process_count(), jax.device_count()) == (2, 4), (jax.process_count(), jax.devices())

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
mesh = Mesh(np.array(jax.devices()), ("data",))
step = xt.make_train_step(model, lambda out, y: ((out - y) ** 2).mean(), optax.sgd(1e-2),
                          mesh=mesh, sharding="replicate")
x, y = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)), torch.zeros(8, 1)
GATE = os.environ.get("PEER_LOSS_GATE")
for i in range(STEPS):
    if GATE and i == 3:
        print("gate", flush=True)
        while not os.path.exists(GATE):
            time.sleep(0.05)
        with open(GATE) as f:
            if f.read() == "raise":
                raise RuntimeError("UNKNOWN: Gloo all-reduce failed: [pair.cc:538] Read error: "
                                   "Connection reset by peer (raised by the test)")
    print(f"step {i} {float(step(x, y)):.6f}", flush=True)
time.sleep(LINGER)
print("done", flush=True)
if END == "shutdown":
    jax.distributed.shutdown()
elif END == "raise":
    raise RuntimeError(f"process {PID}: a planned failure after {STEPS} steps")
