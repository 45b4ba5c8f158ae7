"""XLA counters (compilations, executions, transfers), the progress bar and
number formats for the summary."""
from __future__ import annotations

import sys


class Counters:
    """Compilations, graph executions and device-to-host transfers, from
    torch_xla.debug.metrics (an SPMD run records its executions as
    ExecuteReplicatedTime)."""
    NAMES = {"compilations": ("CompileTime",),
             "executions": ("ExecuteTime", "ExecuteReplicatedTime"),
             "transfers": ("TransferFromDeviceTime",)}

    @classmethod
    def now(cls) -> dict:
        import torch_xla.debug.metrics as met
        out = {}
        for key, names in cls.NAMES.items():
            out[key] = 0
            for name in names:
                data = met.metric_data(name)
                out[key] += 0 if data is None else int(data[0])
        return out

    @staticmethod
    def delta(a: dict, b: dict) -> dict:
        return {k: b[k] - a[k] for k in a}

    @staticmethod
    def add(acc: dict, d: dict) -> None:
        for k, v in d.items():
            acc[k] = acc.get(k, 0) + v


class Progress:
    """A tqdm bar per epoch, or nothing with --noprogress."""

    def __init__(self, enabled: bool, total: int, initial: int, desc: str):
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="step",
                            dynamic_ncols=True, leave=False, file=sys.stderr,
                            mininterval=0.25)

    def update(self, n=1):
        if self.bar:
            self.bar.update(n)

    def postfix(self, text: str):
        if self.bar:
            self.bar.set_postfix_str(text, refresh=False)

    def close(self):
        if self.bar:
            self.bar.close()


def fmt_scale(s: float) -> str:
    return f"{s:.0f}" if s >= 1 and s == int(s) and s < 1e7 else f"{s:.3g}"


def fmt_rate(r: float) -> str:
    return f"{r:,.0f}" if r >= 10 else f"{r:.2f}"
