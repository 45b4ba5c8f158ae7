"""Policies: which op autocasts how, as data.

A `Policy` is a frozen mapping from op name to cast category plus the dtypes
the hardware it describes supports. Policies are loaded from TOML files in
``xla_amp/policies/`` and derived with `Policy.with_overrides`; the native
engine compiles each one into a table the first time it is used.

Category semantics (evaluated by the AutocastXLA kernel, csrc/autocast_kernel.h)::

    lower_precision_fp  floating XLA inputs -> the autocast dtype
    fp32                floating XLA inputs -> float32
    fp32_set_opt_dtype  no dtype= given      -> run with dtype=float32
    fp32_append_dtype   first input floating -> the overload with a dtype, float32
    promote             floating XLA inputs -> widest floating input type
    banned              raise the policy's explanation

XLA adaptations (`Policy.adaptations`, policies/_xla_adaptations.toml), for
ops the policy leaves uncast whose PyTorch/XLA lowering cannot mix floating
precisions; inputs of one dtype run untouched::

    fp32_compute        low-precision input, float32 params -> compute in
                        float32, first output in the input's dtype
    promote_mixed       mixed floating inputs -> float32 (eager's promotion)

Eligibility, common to all: only floating, non-float64 tensors on an XLA
device are cast; in-place and out= overloads and calls with an explicit
dtype= are never autocast; ops in no category run in their inputs' types.

Policy file format (TOML)::

    name = "tpu"
    description = "..."
    default_dtype = "bfloat16"
    supported_dtypes = ["bfloat16"]
    [sources]                      # citation key -> document
    "003" = "PyTorch/XLA docs, 'Automatic Mixed Precision', https://...: TPU lists"
    [lower_precision_fp]           # one table per category
    "aten::matmul" = "003: __matmul__, matmul"       # op -> citation
    [banned]
    "aten::binary_cross_entropy" = { source = "002: ...", reason = "..." }
    [uncast]                       # optional: named by a document, left uncast
    "aten::gelu" = "001: gelu (why it is not autocast here)"
    [removed_in]                   # optional: ops a newer torch removed (_removed.py)
    "aten::qr" = { torch = "2.14", source = "ops: declared up to 2.13, not in 2.14" }
"""
from __future__ import annotations

import dataclasses
import types
from pathlib import Path
from typing import Iterable, Mapping

import torch

from xla_amp.policies import _decompose as decompose
from xla_amp.policies import _matmul_precision as matmul_precision
from xla_amp.policies import _mixed as mixed
from xla_amp.policies import _ops as ops
from xla_amp.policies import _removed as removed
from xla_amp.policies._adaptations import (  # noqa: F401  (part of this module's surface)
    ADAPTATIONS, adaptation_reason, load_adaptations, xla_adaptations)

CATEGORIES = (
    "lower_precision_fp",
    "fp32",
    "fp32_set_opt_dtype",
    "fp32_append_dtype",
    "promote",
    "banned",
)


_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def _frozen(d: Mapping) -> Mapping:
    return types.MappingProxyType(dict(d))


def _unpickle(fields: dict) -> "Policy":
    return Policy(**fields)


@dataclasses.dataclass(frozen=True, eq=False)
class Policy:
    """An immutable autocast policy. Identity equality: policies are values
    that the engine compiles once each."""

    name: str
    default_dtype: torch.dtype
    supported_dtypes: tuple[torch.dtype, ...]
    categories: Mapping[str, str]                 # op name -> category
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)  # op -> citation
    banned_reasons: Mapping[str, str] = dataclasses.field(default_factory=dict)
    description: str = ""
    # ops a reference document names that this policy deliberately leaves
    # uncast (op -> citation and why); documentation only, never autocast
    uncast: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # XLA adaptations, op -> kind (ADAPTATIONS); None: PyTorch/XLA's table
    # (policies/_xla_adaptations.toml); {} turns them off
    adaptations: Mapping[str, str] | None = None
    # the file's [removed_in]: op -> the torch release that removed it
    removed_in: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # ops of the file the running torch lacks, left out: op -> that release
    skipped_ops: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # the precision of float32 dots and convolutions ("highest" | "high" |
    # "default"), and whether PyTorch's CUDA TF32 switch lowers "highest" to
    # "high" (_matmul_precision.py)
    fp32_matmul_precision: str = "default"
    fp32_matmul_precision_follows_torch: bool = False
    # set by with_overrides(fp32_matmul_precision=...): a request, refused
    # where an engine cannot honour it (a file's value is the system's statement)
    fp32_matmul_precision_requested: bool = False

    def __post_init__(self):
        matmul_precision.check(self.fp32_matmul_precision, f"policy {self.name!r}")
        if not isinstance(self.fp32_matmul_precision_follows_torch, bool):
            raise ValueError(f"policy {self.name!r}: fp32_matmul_precision_follows_torch must "
                             f"be a bool, got {self.fp32_matmul_precision_follows_torch!r}")
        for op, cat in self.categories.items():
            if cat not in CATEGORIES:
                raise ValueError(
                    f"policy {self.name!r}: category {cat!r} of {op} is not one of "
                    f"{', '.join(CATEGORIES)}")
        if self.default_dtype not in self.supported_dtypes:
            raise ValueError(
                f"policy {self.name!r}: default dtype {self.default_dtype} is not "
                "among its supported dtypes")
        object.__setattr__(self, "categories", _frozen(self.categories))
        object.__setattr__(self, "sources", _frozen(self.sources))
        object.__setattr__(self, "banned_reasons", _frozen(self.banned_reasons))
        object.__setattr__(self, "removed_in", _frozen(self.removed_in))
        object.__setattr__(self, "skipped_ops", _frozen(self.skipped_ops))
        if self.adaptations is None:
            object.__setattr__(self, "adaptations", xla_adaptations())
        for op, kind in self.adaptations.items():
            if kind not in ADAPTATIONS:
                raise ValueError(
                    f"policy {self.name!r}: adaptation {kind!r} of {op} is not one of "
                    f"{', '.join(ADAPTATIONS)}")
        object.__setattr__(self, "adaptations", _frozen(self.adaptations))
        object.__setattr__(self, "uncast", _frozen(
            {op: why for op, why in self.uncast.items() if op not in self.categories}))

    def __reduce__(self):
        # Pickled as its fields (a saved model whose module_policies name it);
        # loading builds an equal policy, checked again.
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return (_unpickle, ({k: dict(v) if isinstance(v, Mapping) else v
                             for k, v in fields.items()},))

    def category(self, op: str) -> str | None:
        """The category of `op` (``ns::name`` or ``ns::name.overload``), or None.

        An overload not listed itself takes its base name's category when
        that name covers it (an autocastable overload); ``ns::name`` and
        ``ns::name.default`` both mean the unnamed overload when asked here.
        Raises ValueError naming `op` if no such operator exists.
        """
        ops.validate(op)
        if op in self.categories:
            return self.categories[op]
        ns, base, overload = ops.split(op)
        if overload in ("", "default"):
            # the unnamed overload, listed alone
            return self.categories.get(f"{ns}::{base}.default" if not overload
                                       else f"{ns}::{base}")
        if op in ops.overloads(f"{ns}::{base}"):
            return self.categories.get(f"{ns}::{base}")
        return None

    def effective_fp32_matmul_precision(self) -> str:
        """The precision float32 matmuls get under this policy now (its
        ``fp32_matmul_precision``, "high" where it follows PyTorch's TF32
        switch and that is on)."""
        return matmul_precision.effective(self)

    def adaptation(self, op: str) -> str | None:
        """The XLA adaptation the engine applies to `op` under this policy
        (``"fp32_compute"``, ``"promote_mixed"``), or None: the op has a
        category here, or PyTorch/XLA lowers it correctly."""
        if self.category(op) is not None:
            return None
        if op in self.adaptations:
            return self.adaptations[op]
        ns, base, overload = ops.split(op)
        if overload in ("", "default"):
            return None
        if op in ops.overloads(f"{ns}::{base}"):
            return self.adaptations.get(f"{ns}::{base}")
        return None

    def expanded(self) -> dict[str, str]:
        """Every op overload this policy autocasts -> its category (an entry
        ``ns::op`` stands for each functional overload; an explicit
        ``ns::op.overload`` entry beats its base name's)."""
        out: dict[str, str] = {}
        for op, cat in sorted(self.categories.items(), key=lambda kv: "." in kv[0]):
            for overload in ops.overloads(op):
                out[overload] = cat
        return out

    def ops_in(self, category: str) -> tuple[str, ...]:
        """The op names listed in `category`, sorted."""
        if category not in CATEGORIES:
            raise ValueError(f"unknown category {category!r}; one of {', '.join(CATEGORIES)}")
        return tuple(sorted(op for op, c in self.categories.items() if c == category))

    def with_overrides(self, *, name: str | None = None,
                       lower_precision_fp: Iterable[str] = (),
                       fp32: Iterable[str] = (),
                       fp32_set_opt_dtype: Iterable[str] = (),
                       fp32_append_dtype: Iterable[str] = (),
                       promote: Iterable[str] = (),
                       banned: Mapping[str, str] | Iterable[str] = (),
                       remove: Iterable[str] = (),
                       fp32_matmul_precision: str | None = None) -> "Policy":
        """A new policy: these ops moved into these categories, `remove`d ops
        autocast no more, float32 matmuls at `fp32_matmul_precision` (then
        exactly that: PyTorch's TF32 switch no longer applies). Validates
        everything first; on error nothing changes (policies are immutable)
        and the ValueError names the op or value.

        `banned` may map op -> explanation shown when it is called.
        """
        precision = {}
        if fp32_matmul_precision is not None:
            precision = {"fp32_matmul_precision": matmul_precision.check(
                fp32_matmul_precision, "with_overrides"),
                "fp32_matmul_precision_follows_torch": False,
                "fp32_matmul_precision_requested": True}
        requested = {
            "lower_precision_fp": lower_precision_fp, "fp32": fp32,
            "fp32_set_opt_dtype": fp32_set_opt_dtype,
            "fp32_append_dtype": fp32_append_dtype, "promote": promote,
            "banned": banned,
        }
        if name is not None and not isinstance(name, str):
            raise TypeError(f"with_overrides: name must be a str, got {name!r}")
        for arg, names in [*requested.items(), ("remove", remove)]:
            if isinstance(names, str) or not isinstance(names, Iterable):
                raise TypeError(
                    f"with_overrides: {arg} must be a list of op names, got {names!r}"
                    + (" (a single string)" if isinstance(names, str) else ""))
            listed = names if isinstance(names, Mapping) else list(names)
            bad = [n for n in listed if not isinstance(n, str)]
            if bad:
                raise TypeError(f"with_overrides: {arg} holds {bad[0]!r}, not an op name")
            if arg == "remove":
                remove = listed
            else:
                requested[arg] = listed
        moved: dict[str, str] = {}
        for cat, names in requested.items():
            for op in names:
                ops.validate(op)
                if op in moved and moved[op] != cat:
                    raise ValueError(f"{op} is given two categories: {moved[op]} and {cat}")
                moved[op] = cat
        removed = list(remove)
        for op in removed:
            ops.validate(op)
            if op in moved:
                raise ValueError(f"{op} is both removed and put in category {moved[op]}")
        for op, cat in moved.items():
            check_op_fits(op, cat)
        categories = dict(self.categories)
        sources = dict(self.sources)
        reasons = dict(self.banned_reasons)
        for op in removed:
            categories.pop(op, None)
            sources.pop(op, None)
            reasons.pop(op, None)
        for op, cat in moved.items():
            categories[op] = cat
            sources[op] = "override"
            reasons.pop(op, None)
        if isinstance(banned, Mapping):
            reasons.update(banned)
        return dataclasses.replace(
            self, name=name or f"{self.name}+overrides", categories=categories,
            sources=sources, banned_reasons=reasons, **precision)

    def replace_category(self, category: str, names: Iterable[str],
                         source: str = "override") -> "Policy":
        """A new policy whose `category` holds exactly `names` (ops listed
        there before and not in `names` autocast no more)."""
        names = list(names)
        for op in names:
            ops.validate(op)
            check_op_fits(op, category)
        categories = {op: c for op, c in self.categories.items() if c != category}
        sources = {op: s for op, s in self.sources.items() if op in categories}
        for op in names:
            categories[op] = category
            sources[op] = source
        return dataclasses.replace(self, categories=categories, sources=sources)


def check_op_fits(op: str, category: str) -> None:
    """Raises ValueError if `op` cannot behave as `category` requires."""
    if category == "fp32_set_opt_dtype":
        for overload in ops.overloads(op):
            if "dtype" not in [a.name for a in ops.schema(overload).arguments]:
                raise ValueError(
                    f"{overload} has no dtype argument, so it cannot be in category "
                    "'fp32_set_opt_dtype'")
    elif category == "fp32_append_dtype":
        for overload in ops.overloads(op):
            ops.append_dtype_target(overload)


def load(path: str | Path) -> Policy:
    """Reads a policy file. Errors name the file and line of the culprit. An
    op the running torch lacks is left out only where [removed_in] says an
    older or equal release removed it (recorded in `Policy.skipped_ops`)."""
    path = Path(path)
    text, data = removed.read_toml(path)

    def where(key: str) -> str:
        return f"{path}:{removed.line_of(text, key)}"

    removed_in = removed.read_table(path, text, data)
    skipped: dict[str, str] = {}

    def exists(op: str) -> bool:
        """False: missing here, and [removed_in] says a release <= this one removed it."""
        try:
            ops.validate(op)
            return True
        except ValueError as e:
            if op not in removed_in:
                raise ValueError(f"{where(op)}: {e}") from None
        skipped[op] = removed.skip(path, text, op, removed_in[op])
        return False

    for key in ("name", "default_dtype", "supported_dtypes"):
        if key not in data:
            raise ValueError(f"{path}: missing required key {key!r}")
    dtypes = []
    for d in [data["default_dtype"], *data["supported_dtypes"]]:
        if d not in _DTYPES:
            raise ValueError(f"{where(d)}: dtype {d!r} is not one of {', '.join(_DTYPES)}")
        dtypes.append(_DTYPES[d])

    categories: dict[str, str] = {}
    sources: dict[str, str] = {}
    reasons: dict[str, str] = {}
    uncast: dict[str, str] = {}
    for op, value in data.get("uncast", {}).items():
        if exists(op):
            uncast[op] = str(value)
    for section, entries in data.items():
        if not isinstance(entries, dict) or section in ("sources", "uncast", removed.SECTION,
                                                        decompose.SECTION, mixed.SECTION):
            continue
        if section not in CATEGORIES:
            raise ValueError(f"{path}: [{section}] is not a category; one of {', '.join(CATEGORIES)}")
        for op, value in entries.items():
            if not exists(op):
                continue
            try:
                check_op_fits(op, section)
            except ValueError as e:
                raise ValueError(f"{where(op)}: {e}") from None
            if op in categories:
                raise ValueError(
                    f"{where(op)}: {op} is in two categories: [{categories[op]}] and [{section}]")
            if op in uncast:
                raise ValueError(
                    f"{where(op)}: {op} is both in [{section}] and in [uncast]")
            categories[op] = section
            if isinstance(value, dict):
                sources[op] = value.get("source", "")
                if "reason" in value:
                    reasons[op] = value["reason"]
            else:
                sources[op] = str(value)
    decomposed, computed = (decompose.read(path, text, data, categories),
                            mixed.read(path, text, data, categories))
    for op in decomposed.keys() & computed.keys():
        raise ValueError(f"{where(op)}: {op} is both in [decompose] and in [fp32_compute]")
    own = {**decomposed, **computed}
    adaptations = dict(xla_adaptations(), **own) if own else None
    precision = matmul_precision.check(data.get("fp32_matmul_precision", "default"),
                                       where("fp32_matmul_precision"))
    follows = data.get("fp32_matmul_precision_follows_torch", False)
    if not isinstance(follows, bool):
        raise ValueError(f"{where('fp32_matmul_precision_follows_torch')}: "
                         f"fp32_matmul_precision_follows_torch must be true or false, "
                         f"got {follows!r}")
    return Policy(
        fp32_matmul_precision=precision, fp32_matmul_precision_follows_torch=follows,
        name=data["name"], default_dtype=dtypes[0],
        supported_dtypes=tuple(dict.fromkeys(dtypes[1:])), categories=categories,
        sources=sources, banned_reasons=reasons,
        description=data.get("description", ""), uncast=uncast,
        removed_in=removed_in, skipped_ops=skipped, adaptations=adaptations)
