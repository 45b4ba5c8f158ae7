"""Teaches TorchDynamo about `xla_amp.autocast`, so compiled code
(``torch.compile(..., backend="openxla")``) gets eager's policy.

Why: Dynamo replaces a ``torch.amp.autocast`` region by two graph nodes that
enter and leave plain ``torch.autocast`` when AOTAutograd traces the graph;
our own ``__enter__`` (the policy push) never runs, so the trace would use
whatever policy the thread happens to have. Here a region becomes two nodes
that push and pop *its* policy, and every compiled frame is guarded on the
policy that was active around it.

Algorithm::

    trace  xla_amp.autocast(dev, dtype, enabled, cache_enabled, policy)
        -> build the real region object (its checks run, at trace time)
        -> key = registry key of its Policy (equal policies share a key)
        -> graph: ctx = _enter(key, dtype, enabled, cache_enabled) ... _exit(ctx)
           (Dynamo itself enters the region while it traces, so fake
            tensors get the policy's dtypes; AOTAutograd runs the nodes
            while it traces, so the compiled HLO holds the casts)
    graph break inside a region -> the resumed code rebuilds the region
        from _region(key, ...) and re-enters it on both sides
    every compiled frame -> guard: active policy now is the one traced
        (the stack top of an enclosing region, else the default policy);
        a different one re-traces once, then each policy reuses its graph
    an argument that cannot be honoured (a non-XLA device, a bad dtype)
        -> graph break: the region runs eagerly and raises its own error

Instances made outside the compiled code (the decorator form
``@xla_amp.autocast(dev)``, a region object passed in) are guarded by
identity and become the same two nodes.

Touches Dynamo internals of the pinned torch (2.9): `install()` checks
they are there and raises naming the missing one otherwise.
"""
from __future__ import annotations

import functools
import threading

import torch
import torch.fx

from xla_amp import _engine
from xla_amp.numerics import _recording
from xla_amp.autocast._region import _tell_pre_dispatch_mode, autocast
from xla_amp.policies._policy import Policy

_lock = threading.Lock()
_key_of: dict[Policy, str] = {}
_policy_of: dict[str, Policy] = {}  # strong refs: a compiled graph may name any key


def policy_key(policy: Policy) -> str:
    """A short, stable name for `policy` in graphs ('tpu#0', 'cuda#3')."""
    with _lock:
        key = _key_of.get(policy)
        if key is None:
            key = f"{policy.name}#{len(_key_of)}"
            _key_of[policy] = key
            _policy_of[key] = policy
        return key


def _region(key: str, dtype: torch.dtype, enabled: bool, cache_enabled: bool):
    """The region a graph names: xla_amp.autocast with the key's policy.
    (Dynamo traces this call when it resumes after a graph break: `autocast`
    must stay a module global so that it reaches our class hook.)"""
    return autocast("xla", enabled=enabled, dtype=dtype, cache_enabled=cache_enabled,
                    policy=_policy_of[key])


_tls = threading.local()  # .open: regions entered by graph nodes, innermost last


def _open() -> list:
    if not hasattr(_tls, "open"):
        _tls.open = []
    return _tls.open


@torch.fx.node.has_side_effect
def _enter(key: str, dtype: torch.dtype, enabled: bool, cache_enabled: bool):
    ctx = _region(key, dtype, enabled, cache_enabled)
    ctx.__enter__()
    _open().append(ctx)
    return ctx


@torch.fx.node.has_side_effect
def _exit(ctx) -> None:
    open_ = _open()
    if open_ and open_[-1] is ctx:
        open_.pop()
    ctx.__exit__(None, None, None)


def _unwind(depth: int) -> None:
    """Leaves the regions a failed trace entered and never left (a backend
    that raises halfway through a graph), innermost first."""
    open_ = _open()
    while len(open_) > depth:
        open_.pop().__exit__(None, None, None)


def _target_values(region) -> list:
    """What a graph needs to rebuild `region` (after its own checks ran)."""
    return [policy_key(region.policy), region.fast_dtype, region._enabled,
            region._cache_enabled]


def _policy_guard(builder, guard, *, traced) -> None:
    # Runs when Dynamo builds a frame's guards: the frame stays valid only
    # while the calling thread's active policy is the one it was traced with.
    builder.add_python_lambda_leaf_guard_to_root(
        ["___xla_amp_active_policy() is ___xla_amp_traced_policy"],
        [f"xla_amp: active policy is {traced.name!r}"],
        closure_vars={"___xla_amp_active_policy": _engine.active_policy,
                      "___xla_amp_traced_policy": traced})


_installed = False


def _refuse_recording(region) -> None:
    """record=True counts the engine's eager decisions: such a region makes
    Dynamo fall back to running the code eagerly, where it records."""
    if region._record:
        from torch._dynamo.exc import unimplemented_v2
        unimplemented_v2(
            gb_type="xla_amp.autocast(record=True) under torch.compile",
            context="record=True",
            explanation="A recording region counts what the engine decides eagerly; "
                        "the code runs eagerly instead.",
            hints=["Call xla_amp.explain(model, *inputs) outside the compiled function."])


def install() -> None:
    """Registers the hooks (idempotent). Called on ``import xla_amp``."""
    global _installed
    if _installed:
        return
    try:
        from torch._dynamo import output_graph
        from torch._dynamo.eval_frame import skip_code
        from torch._dynamo.guards import GuardBuilder
        from torch._dynamo.source import GlobalStateSource
        from torch._dynamo.variables import builder, ctx_manager, torch as torch_vars
        _Base = ctx_manager.AutocastModeVariable
        _ClassBase = torch_vars.TorchCtxManagerClassVariable
        _wrap = builder.VariableBuilder._wrap
        _ambient = output_graph.OutputGraph.init_ambient_guards
        _user_compiler = output_graph.OutputGraph.call_user_compiler
        GuardBuilder.ID_MATCH, GuardBuilder.FUNCTION_MATCH  # noqa: B018
        GuardBuilder.add_python_lambda_leaf_guard_to_root  # noqa: B018
    except (ImportError, AttributeError) as e:
        raise ImportError(
            f"xla_amp: this torch's Dynamo lacks {e}; xla_amp.autocast cannot be "
            f"compiled with torch {torch.__version__} (tested with 2.9)") from e

    class XlaAmpAutocastVariable(_Base):
        """An xla_amp.autocast region inside traced code."""

        def enter(self, tx):
            ctx = _enter(*self.target_values)
            self.set_cleanup_hook(tx, lambda: _exit(ctx))
            self.proxy = tx.output.create_node(
                "call_function", _enter, tuple(self.target_values), {})

        def exit(self, tx, *args):
            self.cleanup_assert()
            tx.output.create_node("call_function", _exit, (self.proxy,), {})
            from torch._dynamo.variables import ConstantVariable
            return ConstantVariable.create(None)

        def module_name(self):
            return __name__

        def fn_name(self):
            return "_region"

    class XlaAmpAutocastClassVariable(_ClassBase):
        """xla_amp.autocast (or `_region`, which resumed code calls after a
        graph break), called inside traced code: makes a region variable."""

        def call_function(self, tx, args, kwargs):
            from torch._dynamo.exc import unimplemented_v2
            try:
                args = [a.as_python_constant() for a in args]
                kwargs = {k: v.as_python_constant() for k, v in kwargs.items()}
            except NotImplementedError as e:
                unimplemented_v2(
                    gb_type="xla_amp.autocast with non-constant arguments",
                    context=str(e),
                    explanation="xla_amp.autocast's arguments must be constants "
                                "(a device, dtype, bools, a policy name or Policy object).",
                    hints=["Build the region outside the compiled function and pass it in."])
            try:
                region = self.value(*args, **kwargs)
            except (ValueError, TypeError, KeyError) as e:
                unimplemented_v2(
                    gb_type="xla_amp.autocast rejected its arguments",
                    context=f"{type(e).__name__}: {e}",
                    explanation="The region raises this error when it runs eagerly.",
                    hints=[])
            _refuse_recording(region)
            return XlaAmpAutocastVariable(_target_values(region))

    def wrap(self, value):
        if value is autocast or value is _region:
            self.install_guards(GuardBuilder.FUNCTION_MATCH)
            return XlaAmpAutocastClassVariable(value, source=self.source)
        if isinstance(value, autocast):
            _refuse_recording(value)
            self.install_guards(GuardBuilder.ID_MATCH)
            return XlaAmpAutocastVariable(_target_values(value), source=self.source)
        return _wrap(self, value)

    def init_ambient_guards(self):
        _ambient(self)
        traced = _engine.active_policy()
        self.guards.add(GlobalStateSource().make_guard(
            functools.partial(_policy_guard, traced=traced)))

    def call_user_compiler(self, *args, **kwargs):
        depth = len(_open())
        try:
            return _user_compiler(self, *args, **kwargs)
        except BaseException:
            _unwind(depth)  # the backend's error, not a leaked policy, reaches the user
            raise

    # Eager code around a graph break builds and enters regions: never
    # compile those frames on their own (a half-built region is not one).
    for fn in (autocast.__init__, autocast._build, autocast.__enter__, autocast.__exit__,
               autocast._leave, autocast._begin_recording, _recording.begin, _recording.end,
               _tell_pre_dispatch_mode, _region, _enter, _exit):
        skip_code(fn.__code__)
    builder.VariableBuilder._wrap = functools.wraps(_wrap)(wrap)
    output_graph.OutputGraph.init_ambient_guards = functools.wraps(_ambient)(init_ambient_guards)
    output_graph.OutputGraph.call_user_compiler = functools.wraps(_user_compiler)(call_user_compiler)
    _installed = True
