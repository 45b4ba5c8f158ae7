"""Per-module policies: parts of a model get their own precision, without
editing the model (what Haiku/jmp's per-module policies do).

    handle = xla_amp.module_policies(model, {nn.LayerNorm: "fp32",
                                             "blocks.*.attn": "cuda",
                                             "head": my_policy})
    with xla_amp.autocast(device):
        loss = loss_fn(model(x), y)
    handle.remove()

Rules are an ordered mapping. A key is an ``nn.Module`` subclass (matches
its instances) or a glob on the qualified module name (``fnmatch``: ``*``
matches any characters, dots included). A value is a policy name, a
`Policy`, or ``"fp32"``, optionally as ``(value, {"fp32_matmul_precision":
"highest"})`` (the precision of the module's float32 matmuls,
docs/policies.md): the module's floating inputs are cast to float32
and nothing inside it is cast down (an op meeting float32 and bf16 inputs,
e.g. bf16 weights from `cast_module`, computes in float32), outputs left as
computed.

Algorithm::

    install: every rule checked (nothing installed on a bad one); each
             module gets the first rule that matches it (its forward is
             wrapped); a rule matching no module warns, naming it; each rule
             builds its regions now, one per dtype its policy supports
    call of a ruled module:
        autocast enabled for XLA here?  (an xla_amp.autocast region, or a
                                          module rule's, is open)
            no  -> run forward untouched (outside autocast nothing changes)
            yes -> "fp32": cast floating inputs to float32
                   with the rule's region for the enclosing dtype (or its
                   policy's default dtype if the policy does not support it):
                       run forward          (left also on exceptions)
    a module without a rule runs inside its parent's region (inherits)
    a second install ruling the same module wraps the first: the latest
             install's rule decides; each handle's remove() unlinks its own
             wrappers wherever they sit, so handles come off in any order

Everything on the call path is plain Python over prebuilt regions, so
Dynamo traces it: a compiled model gets the same casts (`autocast/_dynamo.py` turns
each region into policy push/pop nodes). Backward runs on what the
forward's casts recorded, so every gradient takes its forward's dtypes;
`custom_bwd` functions get the module's policy.
"""
from __future__ import annotations

import fnmatch
import functools
import warnings
from collections.abc import Mapping

import torch
from torch import nn

from xla_amp import engines, policies
from xla_amp.policies._policy import Policy

FP32 = "fp32"


@functools.cache
def fp32_policy() -> Policy:
    """The policy of an "fp32" rule: autocast stays on (nested rules still
    apply, the XLA adaptations still fix mixed-precision lowerings) and
    every op any built-in policy lists is `promote`: inputs of one dtype
    run untouched, a float32 input meeting bf16 weights (cast_module) makes
    both float32. Built once, on first use."""
    listed = {op for name in policies.builtin_names()
              for op, cat in policies.get(name).categories.items() if cat != "banned"}
    return Policy(name="fp32", default_dtype=torch.bfloat16,
                  supported_dtypes=(torch.bfloat16, torch.float16),
                  fp32_matmul_precision="highest",  # float32 that is float32
                  categories={op: "promote" for op in sorted(listed)},
                  description="module_policies' fp32 rule: nothing cast down, mixed inputs "
                              "promoted to the widest")


class _Fp32Rule(str):
    """An "fp32" rule with options: equal to "fp32" (inputs cast to float32),
    its regions built from `policy` (fp32_policy() with the options)."""

    def __new__(cls, policy: Policy):
        rule = super().__new__(cls, FP32)
        rule.policy = policy
        return rule


def _check_rules(rules) -> list[tuple[object, Policy | str]]:
    if not isinstance(rules, Mapping):
        raise TypeError(f"module_policies: rules must be a mapping (key -> policy), "
                        f"got {type(rules).__name__}")
    checked = []
    for key, value in rules.items():
        if not (isinstance(key, str) or isinstance(key, type) and issubclass(key, nn.Module)):
            raise ValueError(f"module_policies: rule key {key!r} is neither an nn.Module "
                             "subclass nor a glob on module names")
        options = {}
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], Mapping):
            value, options = value  # (policy, {"fp32_matmul_precision": ...})
            unknown = sorted(set(options) - {"fp32_matmul_precision"})
            if unknown:
                raise ValueError(f"module_policies: rule {_label(key)}: unknown option "
                                 f"{unknown[0]!r}; the options are: fp32_matmul_precision")
        if isinstance(value, Policy) or value == FP32:
            target = value
        elif isinstance(value, str):
            try:
                target = policies.get(value)
            except ValueError as e:
                raise ValueError(f"module_policies: rule {_label(key)}: {e}") from None
        else:
            raise ValueError(f"module_policies: rule {_label(key)}: value {value!r} is not a "
                             f"policy name, a Policy or {FP32!r}")
        if options:
            base = fp32_policy() if target == FP32 else target
            try:
                derived = base.with_overrides(name=base.name, **options)
            except ValueError as e:
                raise ValueError(f"module_policies: rule {_label(key)}: {e}") from None
            target = _Fp32Rule(derived) if target == FP32 else derived
        checked.append((key, target))
    return checked


def _label(key) -> str:
    return key.__name__ if isinstance(key, type) else repr(key)


def _matches(key, name: str, module: nn.Module) -> bool:
    if isinstance(key, str):
        return fnmatch.fnmatchcase(name, key)
    return isinstance(module, key)


class _RuledForward:
    """Replaces a ruled module's ``forward`` (an instance attribute, removed
    again by the handle)."""

    def __init__(self, module: nn.Module, target: Policy | str, engine):
        self.module = module
        self.target = target
        self.engine = engine  # its regions and active_dtype (engines/_base.py)
        self.previous = module.__dict__.get("forward")  # an earlier instance forward
        self._build_regions()

    def _build_regions(self):
        if self.target is None:  # removed
            self.regions, self.fallback = {}, None
            return
        policy = getattr(self.target, "policy", None) or (
            fp32_policy() if self.target == FP32 else self.target)
        self.regions = self.engine.regions(policy)
        self.fallback = self.regions.get(policy.default_dtype) or next(iter(self.regions.values()))

    def __call__(self, *args, **kwargs):
        dtype = None if self.target is None else self.engine.active_dtype()
        if dtype is None:
            return self._forward(args, kwargs)
        if self.target == FP32:
            args, kwargs = _to_float32((args, kwargs))
        with self.regions.get(dtype, self.fallback):
            return self._forward(args, kwargs)

    def _forward(self, args, kwargs):
        previous = self.previous
        while isinstance(previous, _RuledForward):  # an earlier install's rule:
            previous = previous.previous            # this one overrides it
        if previous is not None:
            return previous(*args, **kwargs)
        return type(self.module).forward(self.module, *args, **kwargs)

    def unlink(self) -> None:
        """Take this wrapper out of its module's chain of forwards, wherever
        it sits; the module's own forward comes back with the last one."""
        d = self.module.__dict__
        if d.get("forward") is self:
            if self.previous is None:
                d.pop("forward", None)
            else:
                d["forward"] = self.previous
            return
        node = d.get("forward")
        while isinstance(node, _RuledForward):
            if node.previous is self:
                node.previous = self.previous
                return
            node = node.previous
        # Wrapped since by something else: it still calls this; pass through.
        self.target = None
        self._build_regions()

    def __getstate__(self):  # regions hold the engine's tables: rebuilt on load
        return {k: v for k, v in self.__dict__.items() if k not in ("regions", "fallback")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._build_regions()


def _to_float32(tree):
    def cast(t):
        return t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
    return torch.utils._pytree.tree_map(cast, tree)


class ModulePolicyHandle:
    """What `module_policies` installed; `remove()` takes it all out."""

    def __init__(self, wrapped: list[_RuledForward], ruled: dict[str, str]):
        self._wrapped = wrapped
        self.ruled = ruled  # qualified module name -> its policy's name, or "fp32"

    def remove(self) -> None:
        """Takes this call's rules out, whatever other handles on the same
        modules were installed or removed before; a module ruled by no
        other handle gets its original forward back. A second call does
        nothing."""
        for w in reversed(self._wrapped):
            w.unlink()
        self._wrapped = []


def module_policies(model: nn.Module, rules, *, _engine=None) -> ModulePolicyHandle:
    """Installs per-module policies on `model`; see the module docstring.
    Call it once, before training (and before torch.compile); the rules act
    inside every autocast region for the model's device (XLA, or a
    PrivateUse1 device such as TorchTPU's "tpu") until ``handle.remove()``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"module_policies: expected an nn.Module, got {type(model).__name__}")
    if _engine is None:
        _engine = engines.for_module(model)
    checked = _check_rules(rules)
    chosen: dict[str, tuple[nn.Module, Policy | str]] = {}
    used = set()
    for name, module in model.named_modules():
        for i, (key, target) in enumerate(checked):
            if _matches(key, name, module):
                chosen[name] = (module, target)
                used.add(i)
                break
    for i, (key, _) in enumerate(checked):
        if i not in used:
            warnings.warn(f"module_policies: rule {_label(key)} matches no module of "
                          f"{type(model).__name__}", stacklevel=2)
    wrapped = []
    for module, target in chosen.values():
        w = _RuledForward(module, target, _engine)
        module.forward = w
        wrapped.append(w)
    return ModulePolicyHandle(wrapped, {n: t if t == FP32 else t.name
                                        for n, (_, t) in chosen.items()})
