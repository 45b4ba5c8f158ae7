"""Run by tests/torchax/test_torchax_mesh.py: a GPT-2-shaped LM trained by
xla_amp.torchax.make_train_step on ONE 4-device mesh (sharding="fsdp",
policy "tpu" / bf16, a LossScaler), in one process or as one of two
processes (jax.distributed, 2 CPU devices each, gloo collectives).
Prints one JSON object (the last line of stdout).

    _torchax_two_process.py single                   one process, 4 devices
                                                     (XLA_FLAGS from the test)
    _torchax_two_process.py train  PID PORT CKPT     one of two processes:
    _torchax_two_process.py resume PID PORT CKPT     one of two processes

single   steps 1..4 (clean batches).
train    steps 1..4; then the poisoned step: process 1 puts inf into the
         float multiplier of ITS rows of the batch (the rows its own two
         devices hold), process 0 passes the clean batch, so only process 1
         ever sees an inf -- found_inf must cross the processes and the step
         be skipped on both; then step.state_dict() on both (a collective),
         process 0 writes CKPT (torch.save); then steps 5..6 (the
         uninterrupted run).
resume   a step built from a different seed, CKPT loaded (torch.load,
         weights_only=True) into it, then steps 5..6.

Every process passes the global batch (make_train_step's call is the same
on one process and on several); the LM's forward multiplies its logits by
the batch's float multiplier `mult` (1.0 everywhere: exact), which is where
the inf goes in.
"""
import json
import os
import sys

MODE = sys.argv[1]
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("PJRT_DEVICE", "CPU")

import jax  # noqa: E402

if MODE != "single":
    PID, PORT, CKPT = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    jax.config.update("jax_num_cpu_devices", 2)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"localhost:{PORT}", num_processes=2, process_id=PID,
                               initialization_timeout=60, heartbeat_timeout_seconds=10,
                               shutdown_timeout_seconds=10)
else:
    PID = 0

import numpy as np  # noqa: E402
import optax  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

import xla_amp.torchax as xt  # noqa: E402

hf_logging.set_verbosity_error()
BATCH, SEQ, VOCAB = 16, 32, 256


class LM(nn.Module):
    """GPT-2 (2 layers, 64 wide) whose logits are multiplied by a per-row float."""

    def __init__(self):
        super().__init__()
        self.gpt = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB,
                                              n_positions=64, bos_token_id=0, eos_token_id=0,
                                              resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))

    def forward(self, ids, mult):
        return self.gpt(input_ids=ids).logits * mult[:, None, None]


def lm_loss(logits, ids):
    """Cross-entropy of the shifted logits (next-token prediction)."""
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB).float(), ids[:, 1:].reshape(-1))


def batch(i, poison_rows=()):
    g = torch.Generator().manual_seed(1000 + i)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    mult = torch.ones(BATCH)
    mult[list(poison_rows)] = float("inf")
    return ids, mult, ids


def make_step(seed):
    assert jax.device_count() == 4, jax.devices()
    torch.manual_seed(seed)
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    step = xt.make_train_step(LM(), lm_loss, optax.adamw(1e-3), policy="tpu",
                              dtype=torch.bfloat16, mesh=mesh, sharding="fsdp",
                              scaler=xt.LossScaler(init_scale=2.0 ** 10, growth_interval=2))
    return step, mesh


def local_rows(mesh):
    """The batch rows this process's devices hold."""
    index = NamedSharding(mesh, P("fsdp")).addressable_devices_indices_map((BATCH,))
    return sorted(r for (sl,) in index.values() for r in range(BATCH)[sl])


def local_leaves(step):
    """This process's shards of the parameters and the optimizer state."""
    params, _, opt_state = step.state[:3]
    return [np.asarray(s.data) for leaf in jax.tree_util.tree_leaves((params, opt_state))
            for s in leaf.addressable_shards]


def bit_equal(a, b):
    return len(a) == len(b) and all(
        x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        for x, y in zip(a, b))


out = {"pid": PID, "processes": jax.process_count(), "devices": jax.device_count(),
       "local_devices": jax.local_device_count()}
if MODE in ("single", "train"):
    step, mesh = make_step(seed=0)
    out["losses"] = [float(step(*batch(i))) for i in range(4)]
if MODE == "train":
    rows = local_rows(mesh)
    poison = rows if PID == 1 else ()
    before, scale_before = local_leaves(step), float(step.metrics["scale"])
    step(*batch(4, poison))
    out.update(local_rows=rows, poisoned_rows=list(poison),
               found_inf=bool(step.metrics["found_inf"]),
               skipped_loss_finite=bool(np.isfinite(float(step.metrics["loss"]))),
               unchanged=bit_equal(before, local_leaves(step)),
               scale_before=scale_before, scale_after=float(step.metrics["scale"]))
    sd = step.state_dict()  # every process: gathers the sharded leaves
    out["saved_shapes"] = {k: list(v.shape) for k, v in sd["model"].items()}
    if PID == 0:
        torch.save(sd, CKPT + ".tmp")
        os.replace(CKPT + ".tmp", CKPT)
if MODE == "resume":
    step, mesh = make_step(seed=1)  # not the saved weights until the load
    step.load_state_dict(torch.load(CKPT, weights_only=True))
    out["scale_loaded"] = float(step.state[3]["scale"])
if MODE in ("train", "resume"):
    out["continued"] = [float(step(*batch(i))) for i in (5, 6)]
print(json.dumps(out), flush=True)
if MODE != "single":
    jax.distributed.shutdown()
