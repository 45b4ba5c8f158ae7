"""Shared machinery of the sync-free optimizers.

A step never decides in Python whether it is skipped; the device does::

    step(found_inf):
        check every parameter, gradient and found_inf     # raises, changes nothing
        for each param group:
            if fused (default where possible):            # syncfree/_fused.py
                one PyTorch/XLA fused op per parameter: update, state, step
                count and the skip on found_inf in a single IR node
            else (portable path: bf16 parameters, tensor hyperparameters,
                  fused=False):
                candidates for all parameters at once with multi-tensor
                ``torch._foreach_*`` ops, then for each written tensor t
                    t <- where(found_inf != 0, t, candidate(t))

Either way a skipped step leaves parameters, state and step counts
bit-identical, and hyperparameters are graph inputs rather than constants,
so a scheduler's new learning rate feeds new data to the same compiled
graph instead of compiling a new one.

State is kept on the device while training; ``state_dict()`` writes the
format of the ``torch.optim`` namesake (a step count is a CPU float32
tensor, as in ``torch.optim`` without ``capturable``) and
``load_state_dict()`` accepts it, so checkpoints move freely between a
sync-free optimizer and its ``torch.optim`` twin.
"""
from __future__ import annotations

import functools
import itertools
from typing import Any

import torch
import torch.optim.optimizer as _torch_optimizer

from xla_amp import _engine
from xla_amp.syncfree import _fused


class _Skip:
    """The ``found_inf`` of one ``step()`` call in the two forms the paths
    use, each built once per call (``None`` found_inf: never skip)."""

    __slots__ = ("found_inf", "device", "_keep", "_flag")

    def __init__(self, found_inf: torch.Tensor | None, device: torch.device):
        self.found_inf, self.device = found_inf, device
        self._keep = self._flag = None

    @property
    def keep(self) -> torch.Tensor | None:
        """0-dim device bool, true when the step is skipped (portable path)."""
        if self.found_inf is not None and self._keep is None:
            self._keep = self.found_inf != 0
        return self._keep

    @property
    def flag(self) -> torch.Tensor:
        """0-dim float32 device tensor, non-zero to skip (fused path)."""
        if self._flag is None:
            self._flag = _fused.flag(self.found_inf, self.device)
        return self._flag


class SyncFreeOptimizer(torch.optim.Optimizer):
    """Base class: device checks, ``found_inf`` validation, masked commits,
    hyperparameter scalars and ``torch.optim``-compatible state dicts.

    Subclasses implement ``_update_group(gi, group, skip, params, grads,
    fused)`` (update one param group: with PyTorch/XLA's fused op when
    ``fused``, else with multi-tensor ``torch._foreach_*`` ops), name their
    fused op (``_FUSED_KIND``) and the hyperparameters it takes as numbers
    (``_FUSED_KEYS``), and may override ``_export_state`` / ``_import_state``
    to translate between the on-device state and ``torch.optim``'s format.

    A group's ``fused`` (a constructor argument, as in ``torch.optim``)
    picks the path: ``None`` the fused op where it applies (its float32
    parameters, if its hyperparameters are numbers; the rest portable),
    ``True`` the fused op for all or a ``ValueError`` saying why not,
    ``False`` the portable path.

    ``xla_amp.GradScaler`` recognises instances by ``_xla_amp_syncfree`` and
    passes its device-side ``found_inf`` to :meth:`step`.
    """

    _xla_amp_syncfree = True
    _FUSED_KIND = ""
    _FUSED_KEYS: tuple[str, ...] = ()
    # per-parameter state tensors of the parameter's shape; "step" is 1 value
    _STATE_LIKE_PARAM: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict[str, Any]):
        self._init_host_state()
        super().__init__(params, defaults)

    def _init_host_state(self) -> None:
        # (group index, role) -> (value, device, 0-dim device tensor)
        self._scalars: dict[tuple, tuple] = {}
        # Lineages of per-parameter 0-dim counters (Adam's step count, SGD's
        # momentum-buffer flag), tracked on the host: parameters whose
        # counters started equal (fresh state, lineage 0, or loaded with the
        # same value) and that took part in the same step() calls since hold
        # equal counters, since a skip applies to every parameter of a call.
        # The scalar work of a step (bias corrections, ...) is then done once
        # per lineage -- usually one per param group -- not per parameter.
        self._lineage: dict[torch.Tensor, int] = {}
        self._lineage_ids = itertools.count(1)

    # Group keys every torch.optim namesake fills in for old pickles.
    _GROUP_DEFAULTS = {"maximize": False, "foreach": None, "differentiable": False,
                       "fused": None}

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:
            for key, value in self._GROUP_DEFAULTS.items():
                group.setdefault(key, value)
        if not hasattr(self, "_lineage"):  # unpickled: host state is not pickled
            self._init_host_state()       # (unknown lineages are safe)

    # -- parameter groups ---------------------------------------------------

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a param group (as ``torch.optim.Optimizer.add_param_group``).

        Raises ``ValueError`` naming the parameter when one is not on the
        XLA device of the parameters already held; the optimizer is then
        left as it was.
        """
        super().add_param_group(param_group)
        try:
            device = self._check_devices()
            group = self.param_groups[-1]
            if group.get("fused"):
                odd = next(((pi, p.dtype, None) for pi, p in enumerate(group["params"])
                            if p.dtype is not torch.float32), None)
                self._fused_or_raise(len(self.param_groups) - 1, group, odd)
            self._checked_device = device
        except ValueError:
            self.param_groups.pop()  # leave the optimizer unchanged
            raise

    def _check_devices(self) -> torch.device:
        device = None
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.device.type != "xla":
                    raise ValueError(
                        f"{type(self).__name__}: parameter {pi} of param group {gi} "
                        f"(shape {tuple(p.shape)}) is on '{p.device}', not on an XLA "
                        "device; move the model to torch_xla.device() before "
                        "building the optimizer")
                if p.is_complex() or not p.is_floating_point():
                    raise ValueError(
                        f"{type(self).__name__}: parameter {pi} of param group {gi} has "
                        f"dtype {p.dtype}; only real floating-point parameters are supported")
                if device is None:
                    device = p.device
                elif p.device != device:
                    raise ValueError(
                        f"{type(self).__name__}: parameter {pi} of param group {gi} is "
                        f"on '{p.device}' but earlier parameters are on '{device}'; "
                        "one sync-free optimizer serves one XLA device")
        return device

    # -- step ---------------------------------------------------------------

    @staticmethod
    def profile_hook_step(func):
        """``torch.optim.Optimizer``'s wrapper of ``step`` (step pre/post
        hooks, a profiler range), taken only when there is something for it
        to do: entering the profiler range costs about 9 µs per step with no
        profiler running, a third of this optimizer's own Python time."""
        hooked = torch.optim.Optimizer.profile_hook_step(func)
        profiling = torch._C._autograd._profiler_enabled
        global_pre = getattr(_torch_optimizer, "_global_optimizer_pre_hooks", None)
        global_post = getattr(_torch_optimizer, "_global_optimizer_post_hooks", None)
        if global_pre is None or global_post is None:  # another torch: always
            return hooked

        @functools.wraps(func)
        def wrapper(self, *args, **kwargs):
            if (global_pre or global_post or self._optimizer_step_pre_hooks
                    or self._optimizer_step_post_hooks or profiling()):
                return hooked(self, *args, **kwargs)
            return func(self, *args, **kwargs)

        return wrapper

    @torch.no_grad()
    def step(self, closure=None, found_inf: torch.Tensor | None = None):
        """Update the parameters; call once per iteration after ``backward()``
        (or let ``xla_amp.GradScaler.step`` call it).

        Args:
            closure: optional callable that re-evaluates the model and
                returns the loss (run with gradients enabled).
            found_inf: optional 0-dim tensor on the parameters' device.
                Non-zero skips the whole update: parameters, every state
                tensor and the step count keep their exact bits. The
                decision is made on the device, so nothing is read back.

        Returns the closure's loss, or ``None``.
        """
        device = self._device
        self._check_found_inf(found_inf, device)
        if closure is not None and not callable(closure):
            raise TypeError(f"{type(self).__name__}.step: closure must be callable or None, "
                            f"got {type(closure).__name__}")
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Checked for all groups before any update, so bad input changes nothing.
        work = self._collect(device)
        skip = _Skip(found_inf, device)
        lineage = self._lineage
        for gi, group, params, grads, fused in work:
            self._update_group(gi, group, skip, params, grads, fused)
            if fused:  # the op advanced their counters: forget the lineages
                for p in params:  # (unknown history is always safe)
                    lineage.pop(p, None)
        return loss

    @property
    def _device(self) -> torch.device:
        """The XLA device of the parameters, checked when they were added."""
        device = self.__dict__.get("_checked_device")
        if device is None:  # unpickled: not checked yet
            device = self._checked_device = self._check_devices()
        return device

    def _collect(self, device) -> list[tuple]:
        """``(gi, group, params, grads, fused)`` work items: per group with
        gradients, its float32 parameters on the fused path (unless the
        group says otherwise) and the others on the portable one;
        parameters without a gradient left out. Raises before anything is
        updated when a parameter or gradient is unusable. (The pass over the
        parameters runs in C++, ``_engine.collect_grads``, in C++: in Python it
        cost about as much as building the fused update.)"""
        work = []
        for gi, group in enumerate(self.param_groups):
            plist = group["params"]
            params, grads, other_params, other_grads, bad, first_other = _engine.collect_grads(
                plist if type(plist) is list else list(plist), device, self.state,
                self._STATE_LIKE_PARAM)
            if bad >= 0:
                p = plist[bad]
                self._bad_param(gi, bad, p, getattr(p, "grad", None), device)
            odd = None
            if first_other >= 0:
                p = plist[first_other]
                odd = (first_other, p.dtype, p.grad.dtype)
            fused = bool(params) and self._fused_or_raise(gi, group, odd)
            if not fused:  # one portable update for the whole group
                params, grads = params + other_params, grads + other_grads
                other_params = ()
            if params:
                work.append((gi, group, params, grads, fused))
            if other_params:
                work.append((gi, group, other_params, other_grads, False))
        return work

    def _fused_or_raise(self, gi, group, odd) -> bool:
        """Whether the float32 parameters of param group ``gi`` take the
        fused op this step. ``odd`` is (index, dtype, gradient dtype or
        None) of a parameter that cannot: it takes the portable path, or,
        when the group says ``fused=True``, it is refused."""
        mode = group.get("fused")
        if mode is False:
            return False
        why = _fused.unfusable(self._FUSED_KIND, group, self._FUSED_KEYS,
                               odd if mode else None)
        if why is not None and mode:
            raise ValueError(f"{type(self).__name__}: param group {gi} has fused=True "
                             f"but {why}; leave fused=None to fall back")
        return why is None

    def _check_found_inf(self, found_inf, device) -> None:
        if found_inf is None:
            return
        name = type(self).__name__
        if not isinstance(found_inf, torch.Tensor):
            raise ValueError(
                f"{name}.step: found_inf must be a 0-dim tensor on {device}, "
                f"got {type(found_inf).__name__}")
        if found_inf.dim() != 0:
            raise ValueError(
                f"{name}.step: found_inf must be a 0-dim tensor, got shape "
                f"{tuple(found_inf.shape)}")
        if found_inf.device != device:
            raise ValueError(
                f"{name}.step: found_inf is on '{found_inf.device}' but the "
                f"parameters are on '{device}'; a host-side flag would force a sync")

    def _bad_param(self, gi, pi, p, g, device):
        name = type(self).__name__
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"{name}: parameter {pi} of param group {gi} is a "
                            f"{type(p).__name__}, not a tensor")
        if p.device != device:
            where = "not on an XLA device" if p.device.type != "xla" else f"not on '{device}'"
            raise ValueError(
                f"{name}: parameter {pi} of param group {gi} (shape {tuple(p.shape)}) "
                f"is on '{p.device}', {where} where the optimizer's parameters were; "
                "move the model before building the optimizer")
        if g.is_sparse:
            raise ValueError(
                f"{name}: parameter {pi} of param group {gi} "
                "has a sparse gradient, which is not supported")
        for key in self._STATE_LIKE_PARAM:
            v = self.state[p].get(key) if p in self.state else None
            if v is not None and (not isinstance(v, torch.Tensor) or v.shape != p.shape
                                  or v.device != device):
                got = (f"shape {tuple(v.shape)} on '{v.device}'" if isinstance(v, torch.Tensor)
                       else type(v).__name__)
                raise ValueError(
                    f"{name}: state '{key}' of parameter {pi} of param group {gi} is "
                    f"{got}, expected shape {tuple(p.shape)} on '{device}'; nothing was updated")
        raise ValueError(
            f"{name}: gradient of parameter {pi} of param "
            f"group {gi} has shape {tuple(g.shape)} on '{g.device}', "
            f"expected {tuple(p.shape)} on '{p.device}'")

    def _update_group(self, gi: int, group: dict[str, Any], skip: _Skip,
                      params: list[torch.Tensor], grads: list[torch.Tensor],
                      fused: bool) -> None:
        """Update one param group; ``params`` (non-empty) are those with a
        gradient, ``grads`` their gradients."""
        raise NotImplementedError

    @staticmethod
    def _commit(dsts: list[torch.Tensor], news: list[torch.Tensor],
                keep: torch.Tensor | None) -> None:
        """dst <- new for each pair, unless keep (device bool) says the step
        is skipped. ``torch.where`` selects exactly (a skipped step leaves the
        bits of dst, whatever inf/NaN the candidate holds); the writes are one
        multi-tensor copy."""
        if keep is not None:
            news = [torch.where(keep, d, n) for d, n in zip(dsts, news)]
        torch._foreach_copy_(dsts, news)

    def _counters(self, params: list[torch.Tensor], counters: list[torch.Tensor]):
        """Per-parameter 0-dim float32 counters, one value per lineage.

        Returns ``(rep, per_param, commit)``: ``rep`` stacks one counter per
        lineage (shape ``(k,)``); ``per_param(vec)`` turns a ``(k,)`` vector
        computed from it into one 0-dim tensor per parameter, cast to the
        parameter's dtype; ``commit(new, keep)`` writes ``new`` (``(k,)``)
        into every counter under the skip predicate and advances the
        lineages: call it once per step for these parameters.
        """
        lin = self._lineage
        groups: dict[int, list[int]] = {}
        for i, p in enumerate(params):
            k = lin.get(p)
            if k is None:  # unknown history: a lineage of its own
                k = lin[p] = next(self._lineage_ids)
            groups.setdefault(k, []).append(i)
        which = [0] * len(params)
        reps = []
        for j, idx in enumerate(groups.values()):
            for i in idx:
                which[i] = j
            reps.append(counters[idx[0]])
        rep = torch.stack(reps)
        dtypes = [p.dtype for p in params]

        def per_param(vec: torch.Tensor) -> list[torch.Tensor]:
            vals = vec.unbind(0)
            if len(vals) == 1 and all(d == torch.float32 for d in dtypes):
                return [vals[0]] * len(params)
            cast: dict[tuple, torch.Tensor] = {}
            out = []
            for j, d in zip(which, dtypes):
                v = cast.get((j, d))
                if v is None:
                    v = cast[(j, d)] = vals[j] if d == torch.float32 else vals[j].to(d)
                out.append(v)
            return out

        def commit(new: torch.Tensor, keep: torch.Tensor | None) -> None:
            if keep is not None:
                new = torch.where(keep, rep, new)
            vals = new.unbind(0)
            torch._foreach_copy_(counters, [vals[j] for j in which])
            new_ids = [next(self._lineage_ids) for _ in reps]
            for p, j in zip(params, which):
                lin[p] = new_ids[j]

        return rep, per_param, commit

    @staticmethod
    def _like(value: torch.Tensor, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """A 0-dim float32 device scalar repeated for a multi-tensor op, cast
        to each tensor's dtype (some ops want equal dtypes; none should
        promote a bf16 parameter to float32)."""
        cast: dict[torch.dtype, torch.Tensor] = {torch.float32: value}
        out = []
        for t in tensors:
            v = cast.get(t.dtype)
            if v is None:
                v = cast[t.dtype] = value.to(t.dtype)
            out.append(v)
        return out

    def _scalar(self, slot, value, device: torch.device) -> torch.Tensor:
        """A hyperparameter as a 0-dim float32 device tensor: a graph input,
        not a constant, so a new value does not recompile.

        ``slot`` (param group index, role) owns its buffer: sharing one
        between slots whose values happen to coincide (lr == 1 - beta2)
        would change the graph's inputs, and recompile, when they differ.
        """
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"{type(self).__name__}: a tensor hyperparameter must have one "
                    f"element, got shape {tuple(value.shape)}")
            return value.detach().reshape(()).to(device=device, dtype=torch.float32)
        value = float(value)
        cached = self._scalars.get(slot)
        if cached is None or cached[0] != value or cached[1] != device:
            # Uploaded with shape (1,): PyTorch/XLA maps equal-valued 0-dim
            # uploads to one device buffer, which would merge graph inputs.
            t = torch.tensor([value], dtype=torch.float32, device=device)
            cached = self._scalars[slot] = (value, device, t)
        # A fresh view each step, so the (1,) buffer stays the graph input
        # whether or not the value changed (a kept view would be materialised
        # as a 0-dim buffer by the next sync: another graph).
        return cached[2].reshape(())

    # -- state dict -----------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The state in the format of the ``torch.optim`` namesake.

        Call it between steps (after ``torch_xla.sync()`` for a consistent
        snapshot). It reads step counts back to the host in one transfer;
        this is the only place the optimizer does so.
        """
        sd = super().state_dict()
        for group in sd["param_groups"]:  # (copies, not the live groups)
            # fused is how this optimizer runs, not state; torch.optim cannot
            # run fused=True on XLA, so the twin must not inherit it
            if group.get("fused"):
                group["fused"] = None
        # super() shares the live per-parameter dicts; build new ones.
        items = [(k, dict(v)) for k, v in sd["state"].items()]
        host = self._host_values([v for _, v in items])
        sd["state"] = {k: self._export_state(v, host) for k, v in items}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of this optimizer or of its ``torch.optim`` twin;
        state tensors move to the parameters' device. Each group keeps the
        ``fused`` choice this optimizer was built with.

        Every state entry is checked against its parameter first (a tensor
        of the parameter's shape, floating; ``step`` one number): a bad one
        raises ``ValueError`` naming the group, index, key, expected and got,
        and the optimizer is left as it was."""
        self._check_loaded_state(state_dict)
        fused = [g.get("fused") for g in self.param_groups]
        super().load_state_dict(state_dict)
        for group, choice in zip(self.param_groups, fused):
            group["fused"] = choice
        self._lineage.clear()
        self._loaded_lineages: dict[Any, int] = {}  # loaded counter value -> lineage
        for p, st in list(self.state.items()):
            self._import_state(p, st)
        del self._loaded_lineages

    def _check_loaded_state(self, state_dict) -> None:
        name = f"{type(self).__name__}.load_state_dict"
        if not isinstance(state_dict, dict) or not {"state", "param_groups"} <= set(state_dict):
            raise ValueError(f"{name}: expected a dict with 'state' and 'param_groups', got "
                             f"{sorted(state_dict) if isinstance(state_dict, dict) else type(state_dict).__name__}")
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"{name}: the state dict has {len(groups)} param groups, "
                             f"this optimizer {len(self.param_groups)}")
        where = {}
        for gi, (saved, ours) in enumerate(zip(groups, self.param_groups)):
            if len(saved["params"]) != len(ours["params"]):
                raise ValueError(f"{name}: param group {gi} has {len(saved['params'])} "
                                 f"parameters in the state dict, {len(ours['params'])} here")
            for pi, (idx, p) in enumerate(zip(saved["params"], ours["params"])):
                where[idx] = (gi, pi, p)
        for idx, st in state_dict["state"].items():
            if idx not in where:
                raise ValueError(f"{name}: state for parameter id {idx!r}, which no param "
                                 "group lists")
            gi, pi, p = where[idx]
            for key, v in st.items():
                bad = None
                if key == "step":
                    if not (isinstance(v, (int, float)) and not isinstance(v, bool)) and not (
                            isinstance(v, torch.Tensor) and v.numel() == 1):
                        bad = f"expected one number, got {v!r}"
                elif key in self._STATE_LIKE_PARAM:
                    if v is None and key == "momentum_buffer":
                        continue
                    if not isinstance(v, torch.Tensor) or not v.is_floating_point():
                        bad = (f"expected a floating tensor of shape {tuple(p.shape)}, got "
                               f"{v.dtype if isinstance(v, torch.Tensor) else type(v).__name__}")
                    elif v.shape != p.shape:
                        bad = (f"expected shape {tuple(p.shape)} (the parameter's), "
                               f"got {tuple(v.shape)}")
                if bad:
                    raise ValueError(f"{name}: state '{key}' of parameter {pi} of param "
                                     f"group {gi}: {bad}; nothing was loaded")

    def _loaded_lineage(self, value) -> int:
        """The lineage of a counter loaded with ``value`` (equal values, one
        lineage)."""
        lineage = self._loaded_lineages.get(value)
        if lineage is None:
            lineage = self._loaded_lineages[value] = next(self._lineage_ids)
        return lineage

    def _host_values(self, states: list[dict[str, Any]]) -> dict[int, Any]:
        """Read every device tensor that export needs on the host at once."""
        wanted = [t for st in states for t in self._host_keys(st)]
        if not wanted:
            return {}
        values = torch.stack([t.detach().reshape(()).float() for t in wanted]).cpu()
        return {id(t): values[i].clone() for i, t in enumerate(wanted)}

    def _host_keys(self, state: dict[str, Any]) -> list[torch.Tensor]:
        return []

    def _export_state(self, state: dict[str, Any], host: dict[int, Any]) -> dict[str, Any]:
        return state

    def _import_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        pass
