"""Shared by tests/torchax/test_current_torch*.py, which run in both profiles
(torch 2.9 + torch_xla, and torch 2.15 without it): torch, jax, torchax and
xla_amp.torchax only, imported in that order so that xla_amp.torchax's shim
(_compat.py) imports torchax (tests/support/torchax_env.py imports torchax
first, which fails on torch 2.15)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import xla_amp.torchax as xt  # noqa: E402,F401  (first: applies the shim)
import torchax  # noqa: E402

ENV = torchax.default_env()

# Run in a fresh process by registry_in_fresh_process: one JSON line of what
# torchax registered. argv[1] "shim": xla_amp.torchax imported first (its shim
# imports torchax); "plain": xla_amp then torchax, no shim ({"error": ...}
# when torchax's import fails).
REGISTRY_RUN = '''import json
import sys

import torch

out = {"torch": torch.__version__}
if sys.argv[1] == "shim":
    import xla_amp.torchax  # noqa: F401
    from xla_amp.torchax import _compat
    out.update(skipped=_compat.skipped_sites(), removed=_compat.REMOVED,
               imported=list(_compat._state["imported"]))
else:
    import xla_amp  # noqa: F401  (as the shim's process: with torch_xla where installed)
    try:
        import torchax  # noqa: F401
    except AttributeError as e:
        print(json.dumps({**out, "error": f"{type(e).__name__}: {e}"}))
        sys.exit(0)

import torchax  # noqa: E402
from torchax import amp  # noqa: E402
from torchax.ops import ops_registry  # noqa: E402

env = torchax.default_env()  # load_ops: the lowerings and decompositions
from torchax.decompositions import DECOMPOSITIONS  # noqa: E402


def names(keys):
    return sorted(str(k) if isinstance(k, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))
                  else f"{getattr(k, '__module__', '?')}.{getattr(k, '__qualname__', k)}"
                  for k in keys)


out.update(aten_ops=names(ops_registry.all_aten_ops),
           torch_functions=names(ops_registry.all_torch_functions),
           autocast_policy=sorted(f"{k}={v.name}" for k, v in amp.autocast_policy.items()),
           decompositions=names(DECOMPOSITIONS), env_ops=len(env._ops),
           env_decomps=len(env._decomps),
           getattr_restored=[c.__dict__["__getattr__"].__module__ == "torch._ops"
                             for c in (torch._ops.OpOverloadPacket, torch._ops._OpNamespace)])
print(json.dumps(out))
'''


def torch_minor() -> tuple[int, int]:
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def registry_in_fresh_process(mode: str) -> dict:
    """What torchax registers, in a process of its own: mode "shim" imports
    xla_amp.torchax first, "plain" xla_amp then torchax (its error when it fails)."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", TORCH_DEVICE_BACKEND_AUTOLOAD="0",
               PJRT_DEVICE="CPU")
    proc = subprocess.run([sys.executable, "-c", REGISTRY_RUN, mode], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


def batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n batches of a fixed teacher's regression task (the loss falls)."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(16, 4, generator=g) / 4
    xs = [torch.randn(32, 16, generator=g) for _ in range(n)]
    return [(x, torch.tanh(x @ teacher)) for x in xs]


def eager_losses(model: nn.Module, data, optimizer) -> list[float]:
    """CPU torch, eager: the reference."""
    out = []
    for x, y in data:
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        out.append(loss.item())
    return out


def jitted_sgd(model: nn.Module, lr: float):
    """A training step in plain torchax + jax.jit (no xla_amp): the forward
    through torch.func.functional_call on torchax tensors, jax.value_and_grad,
    SGD in JAX. Returns (step, params); step(params, x, y) -> (params, loss)."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_fn(p, x, y):
        with ENV:
            p, x, y = ENV.j2t_iso((p, x, y))
            return F.mse_loss(torch.func.functional_call(model, p, (x,)), y).jax()

    @jax.jit
    def step(p, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        return jax.tree_util.tree_map(lambda a, g: a - lr * g, p, grads), loss

    return step, ENV.t2j_copy(params)


def relative(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b))
