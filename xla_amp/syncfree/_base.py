"""Shared machinery of the sync-free optimizers.

A sync-free optimizer computes a *candidate* update for every parameter and
state tensor, then commits it under a device-side predicate::

    keep = found_inf != 0                       # 0-dim bool, on the device
    for each tensor t updated by the step (parameter, state, step count):
        t <- where(keep, t, candidate(t))       # bit-identical when keep

so whether a step is skipped is decided inside the XLA graph, never in
Python. Candidates are computed for all parameters of a group at once with
multi-tensor ``torch._foreach_*`` ops (one Python call per operation, not
per parameter: tracing the step costs little next to the step itself), and
the commits are one ``torch.where`` per tensor plus one multi-tensor copy. Hyperparameters (lr, betas, weight decay, ...) enter the graph as
0-dim device tensors rather than as constants, so a new learning rate from a
scheduler feeds new data to the same compiled graph instead of compiling a
new one.

State is kept on the device while training; ``state_dict()`` writes the
format of the ``torch.optim`` namesake (a step count is a CPU float32
tensor, as in ``torch.optim`` without ``capturable``) and
``load_state_dict()`` accepts it, so checkpoints move freely between a
sync-free optimizer and its ``torch.optim`` twin.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch

class SyncFreeOptimizer(torch.optim.Optimizer):
    """Base class: device checks, ``found_inf`` validation, masked commits,
    hyperparameter scalars and ``torch.optim``-compatible state dicts.

    Subclasses implement ``_update_group(gi, group, keep, params, grads)``
    (compute and commit one param group with multi-tensor ``torch._foreach_*``
    ops) and may override ``_export_state`` / ``_import_state``
    to translate between the on-device state and ``torch.optim``'s format.

    ``xla_amp.GradScaler`` recognises instances by ``_xla_amp_syncfree`` and
    passes its device-side ``found_inf`` to :meth:`step`.
    """

    _xla_amp_syncfree = True

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
            self._check_devices()
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
        device = self._check_devices()
        keep = self._keep_mask(found_inf, device)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Checked for all groups before any update, so bad input changes nothing.
        work = self._params_with_grads()
        for gi, group in enumerate(self.param_groups):
            if work[gi][0]:
                self._update_group(gi, group, keep, *work[gi])
        return loss

    def _keep_mask(self, found_inf, device) -> torch.Tensor | None:
        if found_inf is None:
            return None
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
        return found_inf != 0

    def _params_with_grads(self) -> list[tuple[list, list]]:
        """(params, grads) of every group, parameters without a gradient left
        out; raises before anything is updated when a gradient is unusable."""
        out = []
        for gi, group in enumerate(self.param_groups):
            params, grads = [], []
            for pi, p in enumerate(group["params"]):
                g = p.grad
                if g is None:
                    continue
                if g.is_sparse or g.shape != p.shape or g.device != p.device:
                    self._bad_grad(gi, pi, p, g)
                params.append(p)
                grads.append(g)
            out.append((params, grads))
        return out

    def _bad_grad(self, gi, pi, p, g):
        if g.is_sparse:
            raise ValueError(
                f"{type(self).__name__}: parameter {pi} of param group {gi} "
                "has a sparse gradient, which is not supported")
        raise ValueError(
            f"{type(self).__name__}: gradient of parameter {pi} of param "
            f"group {gi} has shape {tuple(g.shape)} on '{g.device}', "
            f"expected {tuple(p.shape)} on '{p.device}'")

    def _update_group(self, gi: int, group: dict[str, Any], keep: torch.Tensor | None,
                      params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        """Compute and commit one param group; ``params`` (non-empty) are
        those with a gradient, ``grads`` their gradients."""
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
        # super() shares the live per-parameter dicts; build new ones.
        items = [(k, dict(v)) for k, v in sd["state"].items()]
        host = self._host_values([v for _, v in items])
        sd["state"] = {k: self._export_state(v, host) for k, v in items}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of this optimizer or of its ``torch.optim`` twin;
        state tensors move to the parameters' device."""
        super().load_state_dict(state_dict)
        self._lineage.clear()
        self._loaded_lineages: dict[Any, int] = {}  # loaded counter value -> lineage
        for p, st in list(self.state.items()):
            self._import_state(p, st)
        del self._loaded_lineages

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
