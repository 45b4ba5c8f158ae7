"""State dicts of the sync-free optimizers in the format of their torch.optim
namesakes, checked against this optimizer before anything is loaded
(``_state_check.py``)."""
from __future__ import annotations

from typing import Any

import torch

from xla_amp._upload import materialize
from xla_amp.syncfree import _low_precision, _sharding, _state_check


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
        call it between steps. Each group takes the saved hyperparameters
        and keeps the ``fused``, ``master_weights``, ``stochastic_rounding``
        and ``state_dtype`` choices this optimizer was built with.

        Every saved state entry is checked against the state this optimizer
        itself keeps for that parameter (see the module docstring): an entry
        it would not keep, an incomplete entry, or a value of the wrong
        shape or kind raises ``ValueError`` naming the key, group, index,
        expected and got, and the optimizer is left as it was. Accepted
        values are converted to the dtype this optimizer keeps them in, on
        the parameters' device (``docs/precision_modes.md``: which dicts
        convert between the low-precision options)."""
        name = f"{type(self).__name__}.load_state_dict"
        merged, kept = _state_check.check(self, state_dict, name)
        held = {p: {**self._reserved.get(p, {}), **self.state.get(p, {})}
                for group in self.param_groups for p in group["params"]}
        # torch.optim loads the groups; the state comes from the checked
        # entries, each tensor copied once, in the dtype this optimizer keeps
        super().load_state_dict({**state_dict, "state": {}})
        for group, want in zip(self.param_groups, merged):
            group.update(want)  # (with the keys an older dict lacks)
        for idx, (p, keeps) in kept.items():
            self.state[p] = _state_check.converted(keeps, p, state_dict["state"][idx])
            _sharding.follow(p, self.state[p])  # SPMD: sharded as its parameter
        for p in self.state:  # loaded state replaces what was made for a first step
            self._reserved.pop(p, None)
        self._lineage.clear()
        self._loaded_lineages: dict[Any, int] = {}  # loaded counter value -> lineage
        for p, st in list(self.state.items()):
            self._import_state(p, st)
        del self._loaded_lineages
        saved = {p: state_dict["state"][idx] for idx, (p, _) in kept.items()}
        _into_held(held, saved, self.state)

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


def _into_held(held: dict, saved: dict, state: dict) -> None:
    """Put each loaded value that came from the host (an upload of its own)
    into the tensor the optimizer held for that entry before the load (its
    state, or what it made for a first step), where one of the same shape
    and dtype exists on an XLA device without a sharding; that tensor then
    stays the entry and holds the upload's buffer as its own.

    A graph orders its outputs by when their tensors were made: loaded
    state made anew comes after the model's tensors in another order, and
    the next step compiles a graph of its own. Kept tensors keep the graph
    of the steps before the load (tests/syncfree/test_loaded_state_graph.py).
    A value loaded from a device tensor is left as loaded: held, it would
    share that tensor's buffer, which the next step donates. A reference
    to an old state tensor sees the loaded value."""
    kept = []
    for p, st in state.items():
        old, src = held.get(p), saved.get(p, {})
        if not old:
            continue
        for key, v in st.items():
            o, s = old.get(key), src.get(key)
            if (isinstance(o, torch.Tensor) and isinstance(v, torch.Tensor) and o is not v
                    and not (isinstance(s, torch.Tensor) and s.device.type != "cpu")
                    and o.device == v.device and o.device.type == "xla"
                    and o.shape == v.shape and o.dtype == v.dtype
                    and not _sharding.spec(o) and not _sharding.spec(v)):
                o.copy_(v)  # o's value: v's buffer, made o's own below (no graph runs)
                st[key] = o
                kept.append(o)
    materialize(kept)
