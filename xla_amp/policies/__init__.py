"""Policies: the `Policy` class (_policy.py), the built-in policy files (one
TOML file each in this folder), environment overrides (_env_overrides.py)
and the registry.

    policies.get("tpu")             # a Policy; also any name registered
    policies.names()                # the registered names
    policies.register(policy)       # make a user policy selectable by name
    policies.for_hardware("TPU")    # the policy a device's hardware selects
    policies.xla_adaptations()      # op -> kind: PyTorch/XLA lowering fixes,
                                    # carried by every policy (_xla_adaptations.toml)

Files load on first use. Environment overrides (XLA_AMP_*_OPS_LIST) are
applied to every built-in policy as it loads.
"""
from __future__ import annotations

import threading

from xla_amp.policies._policy import (  # noqa: F401  (the policy concept, one package)
    ADAPTATIONS, CATEGORIES, Policy, adaptation_reason, check_op_fits, load, load_adaptations,
    xla_adaptations)

from xla_amp.policies._builtin import DIR as _DIR, builtin_names  # noqa: E402

# torch_xla.core.xla_model.xla_device_hw(device) -> policy name
HARDWARE_POLICY = {"TPU": "tpu", "NEURON": "tpu", "CUDA": "cuda", "CPU": "cpu"}

_lock = threading.Lock()
_registry: dict[str, Policy] = {}
_generation = 0  # bumped by register(): what a name resolves to may have changed


def names() -> list[str]:
    return sorted(set(builtin_names()) | set(_registry))


def _load_builtin(name: str) -> Policy:
    from xla_amp.policies import _env_overrides as env_overrides  # late
    return env_overrides.apply(load(_DIR / f"{name}.toml"))


def get(name: str) -> Policy:
    """The policy registered as `name`; ValueError listing the valid names."""
    if isinstance(name, Policy):
        return name
    policy = _registry.get(name)
    if policy is not None:
        return policy
    with _lock:
        if name not in _registry:
            if name not in builtin_names():
                raise ValueError(
                    f"unknown autocast policy {name!r}; valid names: {', '.join(names())}")
            _registry[name] = _load_builtin(name)
        return _registry[name]


def register(policy: Policy, *, replace: bool = False) -> None:
    """Makes `policy` selectable as ``policy=policy.name``."""
    if not isinstance(policy, Policy):
        raise TypeError(f"register takes a Policy, got {type(policy).__name__}")
    with _lock:
        if policy.name in _registry and not replace:
            raise ValueError(f"a policy named {policy.name!r} is registered already")
        global _generation
        _registry[policy.name] = policy
        _generation += 1


def for_hardware(hw: str) -> Policy:
    """The policy for a device whose xla_device_hw() is `hw`."""
    if hw not in HARDWARE_POLICY:
        raise ValueError(
            f"no autocast policy for XLA hardware {hw!r}; known: {', '.join(HARDWARE_POLICY)}"
            " (pass policy= to choose one)")
    return get(HARDWARE_POLICY[hw])
