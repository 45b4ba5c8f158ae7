"""xla_amp: automatic mixed precision for PyTorch/XLA, and beyond it.

A core (policies, Policy, fp8, checkpoint, the scaler's tensor math, the
numerics tools that need no engine) under one engine per runtime
(_engines.py says which can run here):

* torch 2.9 + torch_xla: importing xla_amp loads torch_xla, then the native
  engine (xla_amp._C), which takes over the AutocastXLA dispatch key: after
  import, both ``xla_amp.autocast(device)`` and plain ``torch.autocast("xla")``
  run through it. Environment op-list overrides (XLA_AMP_*_OPS_LIST) are
  read here.
* torch 2.9-2.15 without torch_xla (_core.py): the core, and the PrivateUse1
  engine (xla_amp.privateuse1: TorchTPU's "tpu") behind the same names;
  what needs torch_xla raises one line naming what to install.
* torchax: ``import xla_amp.torchax``, with either.

The package, one concept per folder (docs/engine.md has the map):

    autocast/   the region, recording, torch.compile support, custom_fwd/bwd
    policies/   which op gets which cast: cited TOML data, op names
    precision/  module_policies, cast_module
    scaler/     GradScaler
    syncfree/   SGD / Adam / AdamW that skip on the device; bf16 weights
    numerics/   explain, watch_nonfinite, compare
    gpu/        XLA:GPU through JAX's CUDA PJRT plugin (use_cuda_plugin)
    sharded/    FSDPv2 / SPMD: ShardedPrecision, shard_model, sharded checkpoints
    checkpoint/ checkpoints that survive: atomic, locked, data-only, preemption,
                precision-mode conversion on resume
    fp8/        fp8 training: Fp8Recipe, convert, Fp8Linear, report
    torchax/    the same policies, loss scaling and jitted steps on torchax
                (PyTorch on JAX; imported on its own: import xla_amp.torchax)
    privateuse1/ the PrivateUse1 engine: policies as Python kernels under
                AutocastPrivateUse1 (TorchTPU), GradScaler ops the device lacks
    distributed.py   all-reduce with scaling
    _engine.py  the one door to the native engine (xla_amp._C)
    _engines.py which engines can run here; _core.py the names without torch_xla
"""
import torch

from xla_amp import _engines
from xla_amp import policies
from xla_amp.policies import CATEGORIES, Policy

if _engines.available("torch_xla"):  # torch 2.9 + torch_xla: the native engine, as ever
    import torch_xla  # noqa: F401  (its AutocastXLA kernels must exist before ours)

    from xla_amp import _version_check  # noqa: F401  (ImportError if _C was built for another torch)
    from xla_amp import _C  # noqa: F401
    from xla_amp import _engine
    from xla_amp.policies import _env_overrides
    from xla_amp.autocast import _dynamo
    from xla_amp.autocast import autocast, custom_bwd, custom_fwd, set_default_policy
    from xla_amp.precision import ModulePolicyHandle, cast_module, module_policies
    from xla_amp.numerics import (ComparisonReport, NonfiniteWatch, PrecisionReport, compare,
                                  explain, watch_nonfinite)
    from xla_amp.scaler import GradScaler
    from xla_amp import syncfree
    from xla_amp.distributed import all_reduce_gradients, optimizer_step
    from xla_amp import gpu
    from xla_amp import sharded
    from xla_amp import checkpoint
    from xla_amp import fp8

    _env_overrides.load_from_environment()
    _engine.install()
    _dynamo.install()
    from xla_amp.precision import _checkpointing, _xla_device_module
    _xla_device_module.install()  # torch.utils.checkpoint on XLA tensors: torch_xla has no torch.xla
    _checkpointing.install(torch_xla=True)  # checkpoints recompute under the region's policy
    gpu.from_environment()  # XLA_AMP_CUDA_PLUGIN=1: before any tensor exists
    from xla_amp.privateuse1 import _install as _privateuse1
    _privateuse1.at_import()  # plain torch.autocast(<PrivateUse1 device>): works, or one line
else:  # any torch 2.9-2.15 without torch_xla: the core, and the PrivateUse1 engine
    from xla_amp._core import *  # noqa: F401,F403
    from xla_amp._core import __getattr__  # noqa: F401  (one line for a missing engine)

__all__ = ["autocast", "set_default_policy", "custom_fwd", "custom_bwd", "policies", "Policy",
           "CATEGORIES", "GradScaler", "syncfree", "all_reduce_gradients", "optimizer_step",
           "module_policies", "ModulePolicyHandle", "cast_module",
           "PrecisionReport", "explain", "watch_nonfinite", "NonfiniteWatch",
           "compare", "ComparisonReport", "gpu", "sharded", "checkpoint", "fp8"]
__version__ = "0.1.0"
