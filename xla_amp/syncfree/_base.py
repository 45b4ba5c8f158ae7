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
from xla_amp.syncfree import _fresh, _fused, _low_precision, _sharding
from xla_amp.syncfree._scalars import DeviceScalars, Skip as _Skip
from xla_amp.syncfree._state_dict import TorchOptimStateDict


class SyncFreeOptimizer(DeviceScalars, TorchOptimStateDict, torch.optim.Optimizer):
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
        # parameter -> the state its first step takes (_fresh.reserve)
        self._reserved: dict[torch.Tensor, dict[str, Any]] = {}
        # the stochastic-rounding streams' seed: the process seed now, so a
        # counter made before the first step or in it starts alike
        self._seed = torch.initial_seed()

    # Group keys every torch.optim namesake fills in for old pickles.
    _GROUP_DEFAULTS = {"maximize": False, "foreach": None, "differentiable": False,
                       "fused": None, "master_weights": False, "stochastic_rounding": False,
                       "state_dtype": None}

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
            _low_precision.options(type(self).__name__, *(group[k] for k in _low_precision.KEYS))
            if group.get("fused") and not _low_precision.applies(group, group["params"]):
                odd = next(((pi, p.dtype, None) for pi, p in enumerate(group["params"])
                            if p.dtype is not torch.float32), None)
                self._fused_or_raise(len(self.param_groups) - 1, group, odd)
            self._checked_device = device
        except ValueError:
            self.param_groups.pop()  # leave the optimizer unchanged
            raise
        _fresh.reserve(self, self.param_groups[-1])

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
            fresh = [p for p in params if not self.state.get(p)]
            if self._reserved:  # state made before the first forward (_fresh.py)
                self._take_reserved(group, params)
            if _low_precision.applies(group, params):  # bf16 params, master or SR
                fused = _low_precision.step(self, gi, group, skip, params, grads)
            else:
                self._update_group(gi, group, skip, params, grads, fused)
            _sharding.follow_all(fresh, self.state)  # SPMD: state sharded as its parameter
            if fused:  # the op advanced their counters: forget the lineages
                for p in params:  # (unknown history is always safe)
                    lineage.pop(p, None)
        # what no parameter took (none had a gradient) is not kept: its state
        # is made at its first step, and later steps skip the lookup
        self._reserved.clear()
        return loss

    def _take_reserved(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        """Hand each of ``params`` the state ``_fresh.reserve`` made for it,
        or drop that state where the parameter got state another way since
        (a checkpoint loaded into ``self.state``)."""
        reserved = self._reserved
        for p in params:
            if p in reserved:
                if self.state.get(p):
                    del reserved[p]
                elif _fresh.take(self, group, p, self.state[p]):
                    self._lineage[p] = 0  # fresh: step 0, not ready

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
                if p.grad.dtype == p.dtype and _low_precision.applies(group, [p]):
                    odd = None  # widened to float32 for its update
            if params or other_params:
                _low_precision.check(self, gi, group)
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

    def _init_state(self, group: dict[str, Any], p: torch.Tensor,
                    state: dict[str, Any]) -> bool:
        """Add to ``state`` what an update of ``p`` needs and it lacks, as on
        a first step (zeros, on ``p``'s device, in ``p``'s dtype); returns
        whether the state started fresh. Free of side effects on the
        optimizer: ``load_state_dict`` runs it on meta tensors to learn
        which state this optimizer keeps (``_state_dict.py``)."""
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
