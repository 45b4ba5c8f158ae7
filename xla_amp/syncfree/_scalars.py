"""Device-side numbers of the sync-free step: the skip flag of a call, the
hyperparameters as graph inputs, and per-parameter counters (step counts)
tracked in lineages so the scalar work is done once per lineage."""
from __future__ import annotations

import torch

from xla_amp.syncfree import _fused


class Skip:
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


class DeviceScalars:
    """Mixin of SyncFreeOptimizer: hyperparameter scalars and lineage
    counters (its ``_scalars``, ``_lineage`` and ``_lineage_ids``)."""

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
