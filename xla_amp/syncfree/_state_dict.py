"""State dicts of the sync-free optimizers in the format of their torch.optim
namesakes, checked against the parameters before anything is loaded."""
from __future__ import annotations

from typing import Any

import torch

from xla_amp.syncfree import _low_precision


class TorchOptimStateDict:
    """Mixin of SyncFreeOptimizer: ``state_dict`` / ``load_state_dict`` in
    ``torch.optim``'s format; subclasses translate their on-device state
    with ``_host_keys`` / ``_export_state`` / ``_import_state``."""

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
            # the low-precision options appear only when used: a default
            # optimizer writes exactly its torch.optim twin's format
            if not any(group.get(k) for k in _low_precision.KEYS):
                for k in _low_precision.KEYS:
                    group.pop(k, None)
        # super() shares the live per-parameter dicts; build new ones.
        items = [(k, dict(v)) for k, v in sd["state"].items()]
        host = self._host_values([v for _, v in items])
        sd["state"] = {k: self._export_state(v, host) for k, v in items}
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of this optimizer or of its ``torch.optim`` twin;
        state tensors move to the parameters' device. Each group keeps the
        ``fused``, ``master_weights``, ``stochastic_rounding`` and
        ``state_dtype`` choices this optimizer was built with.

        Every state entry is checked against its parameter first (a tensor
        of the parameter's shape, floating; ``step`` one number): a bad one
        raises ``ValueError`` naming the group, index, key, expected and got,
        and the optimizer is left as it was."""
        self._check_loaded_state(state_dict)
        kept = ("fused",) + _low_precision.KEYS  # how this optimizer was built to run
        choices = [{k: g.get(k) for k in kept} for g in self.param_groups]
        super().load_state_dict(state_dict)
        for group, choice in zip(self.param_groups, choices):
            group.update(choice)
        _low_precision.keep_loaded_dtypes(self, state_dict)
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
