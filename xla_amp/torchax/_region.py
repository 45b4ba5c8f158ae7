"""`autocast` for torchax: xla_amp's policies applied to the ops torchax runs.

    env = torchax.default_env()
    with env, xla_amp.torchax.autocast("jax"):              # policy from JAX's backend
    with env, xla_amp.torchax.autocast("jax", policy="cuda", dtype=torch.float16):

Algorithm::

    build:  policy = policy arg | the policy of the JAX backend
                     (tpu -> "tpu", gpu -> "cuda", cpu -> "cpu")
            dtype  = dtype arg  | policy.default_dtype
            RegionArgs.check / resolve (engines/_arguments.py): the same checks
            and messages as every engine's region; refuse a dtype the
            backend has no arithmetic for
            rules  = the policy compiled for torchax (_rules.py), cached
            hook the environment's dispatch once (_hook.py)
    enter:  push (rules, dtype) on this thread's stack (enabled=False pushes
            "off": an inner region turns autocast off, as torch.autocast does)
    exit:   pop what enter pushed, also on exceptions
    op:     (every call torchax dispatches, Python-level and aten)
            no region open, autocast off -> run as is
            inside a categorized op -> run as is, except inside a low op:
                its low ops (a decomposition's dot) in the region's dtype, a
                softmax in float32 (low: lower_precision_fp)
            category of the op under the innermost region's rules:
                none -> the policy's XLA adaptation, if any; else by the
                        path torchax takes (_paths.py): a Python body it does
                        not lower, a decomposition of an op PyTorch builds
                        from other ops, or a composite it lowers in JAX runs
                        where the policy sees the calls inside it; a
                        decomposition standing for a backend kernel runs
                        with autocast suspended; else run as is
                else -> cast the inputs (_rules.apply), run with autocast
                        suspended; a Python-level function torchax does not
                        lower runs its PyTorch decomposition on the cast
                        inputs (SDPA cast low: _attention.low_call)
            an op whose (cast) inputs include float32 runs under
                jax.default_matmul_precision(the region's fp32 matmul precision)
                unless "default": its dots and convolutions carry it (precision=)

The policy acts while JAX traces: a jitted step holds only the converts the
policy asked for, and the compiled program carries no autocast cost.
"""
from __future__ import annotations

import contextlib
import threading

import jax
import torch

from xla_amp import policies
from xla_amp.engines._arguments import RegionArgs
from xla_amp.policies._policy import Policy
from xla_amp.torchax import _attention, _batch_norm, _hook, _lowerings, _paths, _rules

# JAX backend -> xla_amp hardware name (policies.HARDWARE_POLICY's keys)
_BACKEND_HARDWARE = {"tpu": "TPU", "gpu": "CUDA", "cuda": "CUDA", "rocm": "CUDA",
                     "cpu": "CPU", "neuron": "NEURON"}
# Floating types a JAX backend computes in (TPUs have no float16 arithmetic).
BACKEND_DTYPES = {"tpu": (torch.bfloat16,), "neuron": (torch.bfloat16,),
                  "gpu": (torch.bfloat16, torch.float16), "cuda": (torch.bfloat16, torch.float16),
                  "rocm": (torch.bfloat16, torch.float16),
                  "cpu": (torch.bfloat16, torch.float16)}

_state = threading.local()


def _stack() -> list:
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
        _state.within = []
    return stack


class _Top(tuple):
    """A stack entry: (rules, dtype), with the region's float32 matmul
    precision, JAX backend and attention path as attributes."""

    precision = "default"
    backend = "cpu"
    fused_attention = False


def current() -> tuple[_rules.Rules, torch.dtype] | None:
    """(rules, dtype) of the innermost open region on this thread, or None
    (no region, or the innermost one is disabled)."""
    stack = getattr(_state, "stack", None)
    return stack[-1] if stack else None


def _float32_in(args, kwargs) -> bool:
    for a in (*args, *(kwargs or {}).values()):
        if isinstance(a, torch.Tensor):
            if a.dtype == torch.float32:
                return True
        elif isinstance(a, (list, tuple)) and _float32_in(a, None):
            return True
    return False


def _precision(top, args, kwargs):
    """jax.default_matmul_precision(the region's) where float32 inputs meet
    a region whose float32 matmuls are not at the backend's default."""
    if top.precision == "default" or not _float32_in(args, kwargs):
        return contextlib.nullcontext()
    return jax.default_matmul_precision(top.precision)


@contextlib.contextmanager
def _suspended(category: str | None = None):
    """Autocast suspended for what runs inside an op of `category` (None:
    an adaptation, or xla_amp's own bookkeeping)."""
    within = _state.__dict__.setdefault("within", [])
    within.append(category)
    try:
        yield
    finally:
        within.pop()


def _on_dispatch(original, func, types, args, kwargs):
    stack = getattr(_state, "stack", None)
    if stack and stack[-1] is not None and func in _lowerings.OPS:
        out = _lowerings.run(_hook.environment_of(original), func, args, kwargs)
        if out is not NotImplemented:
            return out
    if stack and func in _batch_norm.OPS:  # torchax drops the stats, nested calls included
        out = _dispatch(stack, original, func, types, args, kwargs)
        with _suspended():
            _batch_norm.update_running_stats(args, kwargs)
        return out
    return _dispatch(stack, original, func, types, args, kwargs)


def _dispatch(stack, original, func, types, args, kwargs):
    if not stack or stack[-1] is None:
        return original(func, types, args, kwargs)
    rules, dtype = stack[-1]
    if _state.within:
        return _inner(rules, dtype, original, func, types, args, kwargs)
    category = rules.lookup(func, args, kwargs)
    if category is None:
        if func in _attention.SDPA:  # inputs as they come: low ones fuse (_attention.py)
            with _suspended(_LOW_ATTENTION):
                out = _attention.run(stack[-1], original, func, args, kwargs)
            if out is not None:
                return out
        with _precision(stack[-1], args, kwargs):
            return _uncategorized(original, rules, func, types, args, kwargs)
    return _cast_and_run(rules, category, dtype, original, func, types, args, kwargs)


def _cast_and_run(rules, category, dtype, original, func, types, args, kwargs):
    """The call with its inputs cast for `category`, autocast suspended inside."""
    kwargs = kwargs or {}
    plan = _rules.apply(rules, category, func, args, kwargs, dtype)
    if plan is not None:
        func, args, kwargs = plan
    if func in _attention.SDPA and category in (_LOW, "promote") and _attention.low(args, kwargs):
        return _attention.low_call(current(), original, func, args, kwargs, _suspended)
    if category == _LOW and _rules.is_attention(func):
        category = _LOW_ATTENTION  # its softmax in float32, as PyTorch's attention kernels
    with _suspended(category), _precision(current(), args, kwargs):
        out = _attention.run(current(), original, func, args, kwargs) \
            if category == _LOW_ATTENTION else None
        return _run(original, func, types, args, kwargs) if out is None else out


def _run(original, func, types, args, kwargs):
    try:
        return original(func, types, args, kwargs)
    except _hook.OperatorNotFound:
        if isinstance(func, torch._ops.OpOverload):
            raise
        with jax.named_scope(_paths.scope_name(func)):  # what the ops inside came from
            return func(*args, **kwargs)  # torchax's own fallback, on the cast inputs


_LOW = "lower_precision_fp"
_LOW_ATTENTION = _attention.CATEGORY


def _inner(rules, dtype, original, func, types, args, kwargs):
    """A call made inside a categorized op: not cast again, except inside a
    lower_precision_fp op whose decomposition or torch-level lowering calls
    (a) an op the policy lists in lower_precision_fp: cast to `dtype`
    (baddbmm's decomposition upcasts to float32 before its bmm; torch_xla's
    lowering computes the dot in `dtype`), or (b) inside an attention op
    only, a softmax: float32, as every PyTorch attention kernel computes it
    for low-precision inputs (flash, memory-efficient and math paths;
    torchax's SDPA reference would compute it in `dtype`). Elsewhere a
    softmax inside a low op stays low: an override putting log_softmax or
    cross_entropy in lower_precision_fp gets bfloat16, as on torch_xla."""
    within = _state.within[-1]
    if within not in (_LOW, _LOW_ATTENTION):
        return original(func, types, args, kwargs)
    category = rules.lookup(func, args, kwargs)
    if category != _LOW:
        category = "fp32" if within == _LOW_ATTENTION and _rules.is_softmax(func) else None
    if category is None:
        return original(func, types, args, kwargs)
    return _cast_and_run(rules, category, dtype, original, func, types, args, kwargs)


def _uncategorized(original, rules, func, types, args, kwargs):
    """An op in no category: the policy's XLA adaptation if it has one; a
    Python body or a composite torchax would hide from the policy runs where
    the policy sees inside it (_paths.py)."""
    if rules.adaptation(func) not in (None, "decompose"):  # torchax decomposes on its own
        return _adapted(original, rules, func, types, args, kwargs)
    env = _hook.environment_of(original)
    way = _paths.path(env, func, partial=rules.partial_name(func))
    if way == "decomposition":
        return _paths.run_decomposition(env, original, func, types, args, kwargs)
    if way == "kernel":
        with _suspended():
            return _run(original, func, types, args, kwargs)
    if isinstance(func, torch._ops.OpOverload):
        return original(func, types, args, kwargs)
    kwargs = kwargs or {}
    if way == "body":
        return _paths.run_body(env, func, args, kwargs)
    if way == "composite" and _paths.has_device_tensor(args, kwargs):
        try:
            return _paths.run_composite(func, args, kwargs)
        except Exception:  # noqa: BLE001 - an op inside it torchax cannot run
            pass  # (no lowering, or one that fails): torchax's own lowering, then
    return _paths.as_composite_returns(func, args, original(func, types, args, kwargs))


def _adapted(original, rules, func, types, args, kwargs):
    """The policy's XLA adaptation of an op in no category."""
    kind = rules.adaptation(func)
    plan = _rules.adapt(kind, args, kwargs or {})
    if plan is None:
        return original(func, types, args, kwargs)
    args, kwargs, out_dtype = plan
    with _suspended():
        out = _run(original, func, types, args, kwargs)
    if out_dtype is None:
        return out
    if isinstance(out, (tuple, list)):
        return type(out)([_hook.cast(out[0], out_dtype), *out[1:]])
    return _hook.cast(out, out_dtype)


def backend_name(backend: str | None) -> str:
    if backend is None:
        import jax
        backend = jax.default_backend()
    if backend not in BACKEND_DTYPES:
        raise ValueError(f"xla_amp.torchax: unknown JAX backend {backend!r}; one of "
                         f"{', '.join(BACKEND_DTYPES)}")
    return backend


def _hardware_policy(backend: str) -> Policy:
    return policies.for_hardware(_BACKEND_HARDWARE[backend])


def _device_ok(device) -> None:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"xla_amp.torchax.autocast: {device!r} is not a device") from None
    if dev.type != "jax":
        raise ValueError(f"xla_amp.torchax.autocast: device '{dev}' is not torchax's; pass "
                         "'jax' (use xla_amp.autocast for torch_xla devices)")


class autocast(contextlib.ContextDecorator):
    """Autocast for torchax tensors; see the module docstring. Arguments as
    `xla_amp.autocast`'s, with `device` ``"jax"``; `env` is the torchax
    environment (default ``torchax.default_env()``); `backend` the JAX
    backend the program is for (default ``jax.default_backend()``);
    `fused_attention` whether scaled_dot_product_attention in the region's
    low dtype goes to jax.nn.dot_product_attention (cuDNN's fused kernel on a
    GPU; _attention.py), default: on a GPU backend only."""

    def __init__(self, device="jax", enabled: bool = True, dtype: torch.dtype | None = None,
                 policy: str | Policy | None = None, *, env=None, backend: str | None = None,
                 fp32_matmul_precision: str | None = None, fused_attention: bool | None = None,
                 cache_enabled: bool = True, record: bool = False):
        args = RegionArgs.check("autocast", enabled, dtype, cache_enabled,
                                policy, record, fp32_matmul_precision)
        _device_ok(device)
        _attention.check(fused_attention, "xla_amp.torchax.autocast")
        if record:
            raise ValueError("xla_amp.torchax.autocast: record=True needs xla_amp's native "
                             "kernels' recorder, which torchax does not run; the policy acts "
                             "while JAX traces: read the lowered program (docs/torchax.md)")
        self.backend = backend_name(backend)
        self.fused_attention = (_attention.default(self.backend) if fused_attention is None
                                else fused_attention)
        default = _hardware_policy(self.backend) if args.policy is None else None
        self.policy, self.dtype, self.enabled = args.resolve(default, stacklevel=3)
        if self.enabled:
            check_dtype(self.policy, self.dtype, self.backend)
        self.rules = _rules.compile(self.policy)
        if env is None:
            import torchax
            env = torchax.default_env()
        self.env = env
        check_dispatchable(self.policy, env)
        _hook.install(env, _on_dispatch)
        self._depth = []

    def __enter__(self):
        stack = _stack()
        top = None
        if self.enabled:
            top = _Top((self.rules, self.dtype))
            top.precision = self.policy.effective_fp32_matmul_precision()
            top.backend, top.fused_attention = self.backend, self.fused_attention
        stack.append(top)
        self._depth.append(len(stack))
        return self

    def __exit__(self, *exc):
        depth = self._depth.pop()
        del _stack()[depth - 1:]
        return False


def check_dtype(policy: Policy, dtype: torch.dtype, backend: str) -> None:
    """ValueError unless JAX's `backend` computes in `dtype` (the policy's
    support is RegionArgs.resolve's: warned, the region disabled)."""
    if dtype not in BACKEND_DTYPES[backend]:
        raise ValueError(
            f"xla_amp.torchax.autocast: JAX backend {backend!r} has no {dtype} arithmetic "
            f"(it computes in {', '.join(map(str, BACKEND_DTYPES[backend]))}); choose "
            f"another dtype or policy")


_dispatchable: dict[tuple[int, int], bool] = {}


def check_dispatchable(policy: Policy, env) -> None:
    """ValueError naming the first op a user put in `policy` (an override, or
    an op no built-in policy lists) that torchax can neither run nor
    decompose. Built-in entries torchax lacks fail only when called, with
    torchax's own error (docs/torchax.md lists them)."""
    key = (id(policy), id(env))
    if _dispatchable.get(key):
        return
    builtin = {op for name in policies.builtin_names() for op in policies.get(name).categories}
    from xla_amp.policies import _ops as ops
    for op, cat in sorted(policy.categories.items()):
        if cat == "banned" or (op in builtin and policy.sources.get(op) != "override"):
            continue
        if not any(_runs(env, overload) for overload in ops.overloads(op)):
            raise ValueError(
                f"xla_amp.torchax.autocast: policy {policy.name!r} puts {op} in [{cat}], "
                "but torchax has no lowering for it and it does not decompose into ops "
                "torchax runs; remove it from the policy (Policy.with_overrides(remove=...))")
    _dispatchable[key] = True


def _runs(env, overload: str) -> bool:
    if torch._C._dispatch_has_kernel_for_dispatch_key(overload, "CompositeImplicitAutograd"):
        return True
    return _hook.has_lowering(env, _rules.overload_of(overload))


def module_policies(model, rules):
    """`xla_amp.module_policies` for torchax: the same rules (module types or
    name globs -> a policy or "fp32"), acting inside `autocast` regions of
    this backend. Returns the handle whose ``remove()`` takes them out."""
    from xla_amp import engines
    from xla_amp.precision._module_policies import module_policies as install
    return install(model, rules, _engine=engines.get("torchax"))
