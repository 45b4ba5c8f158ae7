"""Every op of the built-in policies, and ops no policy lists, called in each
argument form its schema allows: positional as PyTorch calls it,
by keyword, with trailing defaults spelled out, with Python numbers where
the schema takes a Tensor (``t * 2``) or a Scalar (int and float), under
every built-in policy and under an ``"fp32"`` module policy. Each result must
equal the same call made without xla_amp's kernels on inputs cast by hand as
the policy's category says (``expected``).

    calls = capture()              # [(overload, args, kwargs)], CPU tensors:
                                   #   the conformance cases' top-level calls,
                                   #   seen at AutocastPrivateUse1 on the stand-in
    for form, args, kwargs in forms(overload, args, kwargs): ...
    expected(category, overload, args, kwargs, low, device_type)

The capture runs the cases on the stand-in device, every rule recording;
the torch_xla engine replays the calls (tests/autocast/test_argument_forms.py).
"""
from __future__ import annotations

import torch

from xla_amp import policies
from xla_amp.policies import _ops as ops
from xla_amp.policies._attention import lower_precision_impl

from tests.support.argument_cases import OPERATORS, RULELESS, UNREPEATABLE
from tests.support.conformance_cases import CASES
from tests.support.overload_cases import OVERLOAD_CASES
from tests.support.dtype_parity import SKIP, input_dtypes

COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd
def overload(name: str):
    ns, base, over = ops.split(name)
    return getattr(getattr(getattr(torch.ops, ns), base), over or "default")


def listed() -> set[str]:
    """Every overload some built-in policy lists (their kernels are registered)."""
    out = set()
    for name in policies.builtin_names():
        out |= set(policies.get(name).expanded())
    return out


def _case_keys(names) -> list[str]:
    keys = []
    for name in sorted(names):
        base = ops.canonical(name).split(".")[0]
        for key in (name, base):
            if key in SKIP or key in keys:
                continue
            if key in CASES or key in OVERLOAD_CASES:
                keys.append(key)
    return keys


class _Recorder:
    """A rule that records the call and runs it as is (under the kernel's
    exclusion: nothing inside is recorded)."""
    simple = False

    def __init__(self, name, op, sink):
        self.name, self.op, self.sink = name, op, sink

    def __call__(self, args, kwargs):
        self.sink.append((self.name, list(args), dict(kwargs)))
        return self.op(*args, **kwargs)


class _CaptureTable:  # a Table whose every rule records
    def __init__(self, names, sink):
        self.name, self.rules = "capture", {n: _Recorder(n, overload(n), sink) for n in names}


def _to_cpu(v):
    if isinstance(v, torch.Tensor):  # a plain CPU tensor (the stand-in's holds one: .elem)
        return getattr(v, "elem", v).cpu().detach().clone()
    if isinstance(v, (list, tuple)):
        return type(v)(_to_cpu(e) for e in v)
    if isinstance(v, dict):
        return {k: _to_cpu(e) for k, e in v.items()}
    return v


def to_device(v, make):
    if isinstance(v, torch.Tensor):
        return make(v)
    if isinstance(v, (list, tuple)):
        return type(v)(to_device(e, make) for e in v)
    if isinstance(v, dict):
        return {k: to_device(e, make) for k, e in v.items()}
    return v


def capture(make) -> list[tuple[str, list, dict]]:
    """The top-level call each case makes of a listed overload, on the
    stand-in (installed, with its engine) — CPU copies, two per overload at most."""
    from xla_amp.privateuse1 import _install, _kernels
    import xla_amp
    names = listed() | set(RULELESS)
    for name in policies.builtin_names():
        _install.compile(policies.get(name))  # every listed kernel registered
    for name in RULELESS:
        _install.register(name)
    sink: list = []
    table = _CaptureTable(names, sink)
    for key in _case_keys(names):
        case = CASES.get(key) or OVERLOAD_CASES[key]
        torch.manual_seed(0)
        inputs = case.inputs()
        floats = [make(t.to(d)) for t, d in zip(inputs, input_dtypes("fp32", len(inputs)))]
        floats[1:] = [t.float() for t in floats[1:]]  # one bfloat16 input, the rest float32
        extra = [make(t) for t in case.extra()]
        with torch.no_grad(), xla_amp.autocast("tpu"):
            _kernels.push(table)
            try:
                case.call(*floats, *extra)
            except Exception:  # noqa: BLE001  (a case for another torch; its calls so far count)
                pass
            finally:
                _kernels.pop()
    seen: dict[str, int] = {}
    out = []
    for name, args, kwargs in sink:
        if seen.get(name, 0) < 2 and not overload(name)._schema.is_mutable:
            seen[name] = seen.get(name, 0) + 1
            out.append((name, _to_cpu(args), _to_cpu(kwargs)))
    torch.manual_seed(0)
    for name in RULELESS:  # pointwise: two (4, 4) operands and the schema's scalars
        if name not in seen:
            out.append((name, *_pointwise_call(overload(name))))
    out = [(n, a, k, _reached(n, a, k, table, sink, make)) for n, a, k in out]
    for label in OPERATORS:
        t = torch.randn(4, 4)
        out.append((label, [t], {}, _reached(label, [t], {}, table, sink, make)))
    return out


def _reached(name, args, kwargs, table, sink, make):
    """The overload the Python-number form reaches (the binding may pick
    another overload: torch.pow(t, 2.0) is pow.Tensor_Scalar), or None."""
    import xla_amp
    from xla_amp.privateuse1 import _kernels
    numbers = _numbers_form(name, args, kwargs) if name not in OPERATORS else (
        OPERATORS[name], args, kwargs)
    if numbers is None:
        return None
    fn, a, k = numbers
    del sink[:]
    with torch.no_grad(), xla_amp.autocast("tpu"):
        _kernels.push(table)
        try:
            fn(*to_device(a, make), **to_device(k, make))
        except Exception:  # noqa: BLE001  (a form the op does not take)
            pass
        finally:
            _kernels.pop()
    # one op: the form's expected result is that op's category's
    return sink[0][0] if len(sink) == 1 else None


def _pointwise_call(op):
    args, kwargs = [], {}
    for a in op._schema.arguments:
        if a.has_default_value():
            continue
        kind = a.type.kind()
        v = (torch.randn(4, 4) if kind == "TensorType" else 0.5 if kind == "NumberType"
             else None)
        if a.name in ("mask", "condition"):
            v = torch.rand(4, 4) > 0.5
        if a.kwarg_only:
            kwargs[a.name] = v
        else:
            args.append(v)
    return args, kwargs


def python_function(name):
    """torch.<op>, else the Tensor method: the Python binding, whose parser
    makes a number in a Tensor slot an ATen wrapped number (``t * 2``)."""
    _, base, _ = ops.split(name)
    fn = getattr(torch, base, None)
    if fn is None and hasattr(torch.Tensor, base):
        fn = lambda self, *a, **k: getattr(self, base)(*a, **k)  # noqa: E731
    return fn


def forms(name, args, kwargs, reached=None):
    """(form, callee, args, kwargs) for each argument form the schema
    allows; the Python-number form calls the Python binding."""
    if name in OPERATORS:
        return [(f"python numbers, reaching {reached}", OPERATORS[name], args, kwargs)
                ] if reached else []
    op = overload(name)
    params = op._schema.arguments
    out = [("positional", op, list(args), dict(kwargs))]
    if len(args) > 1:
        out.append(("keyword", op, list(args[:1]),
                    {**{params[i].name: args[i] for i in range(1, len(args))}, **kwargs}))
    trailing = [p for p in params[len(args):]
                if not p.kwarg_only and p.has_default_value() and p.name not in kwargs]
    if trailing and all(p.kwarg_only or p.has_default_value() for p in params[len(args):]):
        out.append(("defaults spelled out", op,
                    list(args) + [p.default_value for p in trailing], dict(kwargs)))
    if reached is not None:
        fn, a, k = _numbers_form(name, args, kwargs)
        out.append((f"python numbers, reaching {reached}", fn, a, k))
    return out


def _numbers_form(name, args, kwargs):
    params = overload(name)._schema.arguments
    numbers = list(args)
    changed = False
    for i, v in enumerate(args):
        kind = params[i].type.kind() if i < len(params) else None
        if i and kind == "TensorType" and isinstance(v, torch.Tensor) and v.is_floating_point():
            numbers[i] = 2.0 if v.numel() != 1 else float(v.item())  # a wrapped number
            changed = True
        elif kind == "NumberType" and isinstance(v, float) and float(v).is_integer():
            numbers[i] = int(v)
            changed = True
        elif kind == "NumberType" and isinstance(v, int) and not isinstance(v, bool):
            numbers[i] = float(v) + 0.5
            changed = True
    fn = python_function(name)
    return (fn, numbers, dict(kwargs)) if changed and fn is not None else None


def _cast(v, to, device_type):
    if isinstance(v, torch.Tensor):
        if (v.is_floating_point() and v.dtype is not torch.float64 and v.dtype is not to
                and v.device.type == device_type):
            return v.to(to)
        return v
    if isinstance(v, (list, tuple)):
        return type(v)(_cast(e, to, device_type) for e in v)
    return v


def _eligible(v, device_type):
    return (isinstance(v, torch.Tensor) and v.is_floating_point()
            and v.dtype is not torch.float64 and v.device.type == device_type)


def _flat(args, kwargs):
    for v in list(args) + list(kwargs.values()):
        yield from (v if isinstance(v, (list, tuple)) else (v,))


def expected(category, name, callee, args, kwargs, low, device_type, run, below=None):
    """The call without xla_amp's kernel for it, its inputs cast by hand as
    `category` says (ATen's autocast rules, written out again). Uncast (None)
    or decomposed: a composite's decomposition is called directly, under the
    region (`run`), so the ops inside meet autocast as they should; any
    other op is called outside the region."""
    op = overload(name)
    has = lambda key: torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), key)  # noqa: E731
    own = ("XLA", "AutogradXLA") if device_type == "xla" else ("PrivateUse1",
                                                                 "AutogradPrivateUse1")
    if category in (None, "decompose") and has(COMPOSITE) and not any(map(has, own)):
        if callee is not op:  # the binding's call, the composite's kernel for the op
            return run(lambda: callee(*args, **kwargs))
        return run(lambda: op._op_dk(COMPOSITE, *args, **kwargs))
    params = op._schema.arguments
    dtype_at = next((i for i, p in enumerate(params) if p.name == "dtype"), -1)
    explicit = dtype_at >= 0 and ((dtype_at < len(args) and args[dtype_at] is not None)
                                  or kwargs.get("dtype") is not None)
    if category is None and below is not None and callee is op:
        # the engine's own kernel for the op, whose inner calls meet autocast (XLA's)
        return run(lambda: below(op, args, kwargs))
    if category in (None, "decompose") or explicit:
        return callee(*args, **kwargs)
    if category == "banned":
        raise RuntimeError(f"{name} is banned")
    if category in ("lower_precision_fp", "fp32", "promote"):
        to = low if category == "lower_precision_fp" else torch.float32
        if category == "promote":
            found = {v.dtype for v in _flat(args, kwargs) if _eligible(v, device_type)}
            if found - {low, torch.float32}:  # ATen's prioritize refuses a third dtype
                raise RuntimeError(f"unexpected floating dtypes {found} under {low}")
            to = torch.float32 if torch.float32 in found else low
        if to is not torch.float32:  # the op's computation in a low dtype, where not its own
            callee = lower_precision_impl(op) or callee
        return callee(*[_cast(a, to, device_type) for a in args],
                  **{k: _cast(v, to, device_type) for k, v in kwargs.items()})
    first = args[0] if args else None
    if not _eligible(first, device_type):
        return callee(*args, **kwargs)
    if category == "fp32_set_opt_dtype":
        if dtype_at < len(args):
            return callee(*args[:dtype_at], torch.float32, *args[dtype_at + 1:], **kwargs)
        return callee(*args, **dict(kwargs, dtype=torch.float32))
    if category == "fp32_append_dtype":
        args = list(args)
        for p in params[len(args):]:
            if p.kwarg_only:
                break
            args.append(kwargs.pop(p.name) if p.name in kwargs else p.default_value)
        return overload(ops.append_dtype_target(name))(*args, **kwargs, dtype=torch.float32)
    raise AssertionError(f"unknown category {category}")


def _outputs(result) -> list:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (list, tuple)):
        return [t for r in result for t in _outputs(r)]
    return []


def structure_problem(outs, refs) -> str | None:
    """What differs in count, dtype or shape between the outputs and the
    expected ones (each engine's `same` then compares the values its way)."""
    if len(outs) != len(refs):
        return f"{len(outs)} outputs, expected {len(refs)}"
    for o, r in zip(outs, refs):
        if o.dtype != r.dtype:
            return f"dtype {o.dtype}, expected {r.dtype}"
        if o.shape != r.shape:
            return f"shape {tuple(o.shape)}, expected {tuple(r.shape)}"
    return None


def _attempt(fn):
    torch.random.default_generator.manual_seed(0)  # (torch.manual_seed: 0.6 ms of CUDA/XPU stacks)
    try:
        return _outputs(fn()), None
    except Exception as e:  # noqa: BLE001  (compared: both must raise)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"


def sweep(regions, device_type, calls, same, below=None, adapted=lambda policy: {}) -> dict:
    """Every call in every form under every region of `regions` ({label:
    (run(fn), policy)}) against `expected`; `same(outs, refs)` compares
    outputs (close, not equal, for UNREPEATABLE ops). Returns counts and the mismatches, one line each."""
    checked, raised, bad = 0, 0, []
    for label, (enter, policy) in regions.items():
        categories = policy.expanded()
        skip = adapted(policy)  # the engine's own adaptations (tests/engine has theirs)
        for name, args0, kwargs0, reached in calls:
            for form, callee, args, kwargs in forms(name, args0, kwargs0, reached):
                op_name = reached if form.startswith("python numbers") else name
                if op_name in skip and op_name not in categories:
                    continue
                got, err = _attempt(lambda: enter(lambda: callee(*args, **kwargs)))
                want, want_err = _attempt(lambda: expected(
                    categories.get(op_name), op_name, callee, args, kwargs,
                    policy.default_dtype, device_type, enter, below))
                checked += 1
                if err or want_err:
                    raised += 1
                    if bool(err) != bool(want_err):
                        bad.append(f"{label} {name} [{form}]: xla_amp {err or 'ran'}; "
                                   f"without it {want_err or 'ran'}")
                    continue
                problem = same(got, want, op_name in UNREPEATABLE)
                if problem:
                    bad.append(f"{label} {name} [{form}]: {problem}")
    return {"checked": checked, "both_raised": raised, "mismatches": bad}


class _Call(torch.nn.Module):
    """Runs fn() in its forward: the module an "fp32" rule is put on."""

    def __init__(self, device):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1, device=device))

    def forward(self, fn):
        return fn()


def regions(autocast, device) -> dict:
    """{label: (run(fn), policy)}: fn() run under every built-in policy, and
    inside a module under an "fp32" rule (module_policies) in a tpu region."""
    import xla_amp
    from xla_amp.precision._module_policies import fp32_policy

    def under(name):
        def run(fn):
            with autocast(policies.get(name)):
                return fn()
        return run

    module = _Call(device)
    xla_amp.module_policies(module, {_Call: "fp32"})

    def in_module(fn):
        with autocast(policies.get("tpu")):
            return module(fn)

    out = {name: (under(name), policies.get(name)) for name in policies.builtin_names()}
    out["fp32 module rule"] = (in_module, fp32_policy())
    return out
