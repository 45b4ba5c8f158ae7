"""Which op ran in which dtype, and why: `PrecisionReport`, the rows an
``autocast(record=True)`` region collected (``numerics`` builds `explain` on it).

    with xla_amp.autocast(device, record=True) as ac:
        loss = loss_fn(model(x), y)
    report = ac.report()
    print(report.table())
    xla_amp.explain(model, x, policy="cuda").diff(xla_amp.explain(model, x, policy="tpu"))

The rows come from the native engine as it decides (csrc/autocast/
recorder.h), one per distinct (module, op, category, in_dtypes, dtype):

    module     qualified name of the innermost module running ("" at top level)
    op         "aten::linear", "aten::add.Tensor" (the overload, if named)
    category   the cast applied: a category of `xla_amp.CATEGORIES`, an XLA
               adaptation ("fp32_compute", "promote_mixed") that acted, or
               "none": the op ran untouched (not listed, in-place/out=,
               dtype= given, nothing eligible)
    in_dtypes  every tensor argument's dtype before the cast, in order
    dtype      the dtype the op ran in: its first tensor output's dtype, or
               float32 for fp32_compute, which casts its output back
    count      calls

Ops the engine has no kernel for (relu, add on most policies: nothing ever
casts them) run in their inputs' dtype and are not rows. Recording is eager
(lazy tensors trace, nothing executes); inside torch.compile a recording
region makes Dynamo fall back to running that code eagerly.
"""
from __future__ import annotations

import dataclasses
import json
from collections import defaultdict

import torch


FIELDS = ("module", "op", "category", "in_dtypes", "dtype", "count")


def _cell(value) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(value)
    return f"`{value}`" if value == "" else str(value)


@dataclasses.dataclass(frozen=True)
class PrecisionReport:
    """What autocast decided, per module and op (see the module docstring).

    policy: the recording region's policy name; dtype: its lower-precision
    dtype (None when the region was disabled)."""
    rows: list[dict]
    policy: str = ""
    dtype: str | None = None

    @classmethod
    def from_engine(cls, rows, policy: str, dtype: torch.dtype | None) -> "PrecisionReport":
        return cls(rows=[{"module": m, "op": op, "category": c, "in_dtypes": list(ins),
                          "dtype": d, "count": n} for m, op, c, ins, d, n in rows],
                   policy=policy, dtype=str(dtype).removeprefix("torch.") if dtype else None)

    @classmethod
    def of_region(cls, region) -> "PrecisionReport":
        """`region.report()` of either engine's autocast: its latest entry's
        rows (RuntimeError in one line before record=True or the first entry)."""
        if not region._record:
            raise RuntimeError("autocast.report(): this region was built without "
                               "record=True; use xla_amp.autocast(device, record=True)")
        if region._recorder is None:
            raise RuntimeError("autocast.report(): the region has not been entered yet")
        return cls.from_engine(region._recorder.rows(), region.policy.name,
                               region.fast_dtype if region._enabled else None)

    def table(self) -> str:
        """Markdown: one line per row, in the order first seen."""
        from xla_amp.numerics._inspect import markdown  # at call: numerics imports this module
        return markdown(FIELDS, ([_cell(r[f]) for f in FIELDS] for r in self.rows))

    def to_json(self, **kwargs) -> str:
        return json.dumps({"policy": self.policy, "dtype": self.dtype, "rows": self.rows},
                          **kwargs)

    @classmethod
    def from_json(cls, text: str) -> "PrecisionReport":
        data = json.loads(text)
        return cls(rows=data["rows"], policy=data.get("policy", ""), dtype=data.get("dtype"))

    def by_op(self) -> dict[tuple[str, str], dict[tuple[str, str], int]]:
        """(module, op) -> {(category, dtype): calls}."""
        out: dict = defaultdict(lambda: defaultdict(int))
        for r in self.rows:
            out[(r["module"], r["op"])][(r["category"], r["dtype"])] += r["count"]
        return out

    def _classes(self, key, by_op) -> list[tuple[str, str]]:
        # the region's own lower-precision dtype reads "lower": bf16 under one
        # policy and fp16 under another is the same decision
        return sorted((c, "lower" if d == self.dtype else d) for c, d in by_op.get(key, {}))

    def diff(self, other: "PrecisionReport") -> "ReportDiff":
        """The (module, op) pairs whose category or dtype differ between the two
        reports (e.g. one model under two policies), an op missing on one
        side included. Each report's own lower-precision dtype counts as the
        same ("lower"), so tpu's bf16 against cuda's fp16 is no difference;
        call counts alone are none either. Rows show the actual dtypes."""
        mine, theirs = self.by_op(), other.by_op()
        rows = []
        for key in list(mine) + [k for k in theirs if k not in mine]:
            if self._classes(key, mine) != other._classes(key, theirs):
                a, b = sorted(mine.get(key, {})), sorted(theirs.get(key, {}))
                rows.append({"module": key[0], "op": key[1],
                             "category": [_join(c for c, _ in a), _join(c for c, _ in b)],
                             "dtype": [_join(d for _, d in a), _join(d for _, d in b)]})
        return ReportDiff(rows=rows, names=(self.policy, other.policy))


def _join(values) -> str:
    return ", ".join(dict.fromkeys(values))  # distinct, in order


@dataclasses.dataclass(frozen=True)
class ReportDiff:
    """`PrecisionReport.diff`: rows of {"module", "op", "category": [mine,
    theirs], "dtype": [mine, theirs]} ("" where the op did not run)."""
    rows: list[dict]
    names: tuple[str, str] = ("", "")

    def __len__(self) -> int:
        return len(self.rows)

    def table(self) -> str:
        a, b = (n or side for n, side in zip(self.names, ("self", "other")))
        header = ("module", "op", f"category ({a})", f"category ({b})",
                  f"dtype ({a})", f"dtype ({b})")
        from xla_amp.numerics._inspect import markdown
        return markdown(header, ([_cell(r["module"]), r["op"], *r["category"], *r["dtype"]]
                                 for r in self.rows))

    def to_json(self, **kwargs) -> str:
        return json.dumps({"names": list(self.names), "rows": self.rows}, **kwargs)
