"""One check that the launch's processes are the runtime's processes, for
``shard_model``, ``save`` and ``load``.

Under SPMD, PyTorch/XLA's runtime *is* the process group: every process
of a pod slice joins one client, ``torch_xla.runtime.process_count()``
counts them, and the mesh spans all their devices. A launcher can start
processes the runtime never joins: torch_xla 2.9's XLA:CPU client is
single-process (no key-value store, no CPU collectives), so two processes
under ``torchrun --nproc_per_node=2`` each get ``process_count() == 1``,
their own full mesh and an independent replica of the model -- and
``save`` from each writes the same file names into the same directory.
Nothing fails; the run is silently not what was asked for.

So the launch's own count is compared with the runtime's, from the two
places a launch states one:

    WORLD_SIZE (torchrun, torch.distributed's env:// launchers)   when set
    torch.distributed.get_world_size()                            when initialised

and either one that differs from ``process_count()`` is refused, naming
both numbers. Reading the count starts nothing: the runtime is up once a
tensor is on the device, which every caller has already needed.
"""
from __future__ import annotations

import os

_WHAT_TO_DO = ("run one process per host and let the mesh span the host's devices "
               "(on XLA:CPU: one process with CPU_NUM_DEVICES=N for an N-device mesh)")


def _world_size_env() -> int | None:
    value = os.environ.get("WORLD_SIZE", "").strip()
    return int(value) if value.isdigit() else None


def _dist_world_size() -> int | None:
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return None


def check_processes(who: str) -> None:
    """RuntimeError (one line, `who` first) when WORLD_SIZE or an initialised
    torch.distributed counts other processes than PyTorch/XLA's runtime."""
    import torch_xla.runtime as xr
    runtime = xr.process_count()
    for source, launched in (("WORLD_SIZE", _world_size_env()),
                             ("torch.distributed's world size", _dist_world_size())):
        if launched is not None and launched != runtime:
            raise RuntimeError(
                f"{who}: {source} is {launched} but PyTorch/XLA's runtime has {runtime} "
                f"process{'es' if runtime != 1 else ''} (torch_xla.runtime.process_count()): "
                "the processes were not joined into one SPMD runtime, so each would train "
                f"and checkpoint its own replica; {_WHAT_TO_DO}")
