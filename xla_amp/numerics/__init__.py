"""Where precision went wrong: tools built on autocast's recording and on
device-side flags.

    _explain.py  `explain`: one traced call's `PrecisionReport`
    _watch.py    `watch_nonfinite`: the first module with an inf/NaN output
                 or output gradient, flags in the step's graph
    _report.py   `PrecisionReport`: the rows a recording region collected
    _recording.py  record=True: module hooks that name the running module
    _compare.py  `compare`: each module's output against float32, float16
                 range risk, `suggest()` rules for module_policies

(``GradScaler.overflow_report`` names the parameters with inf/NaN gradients;
``xla_amp.scaler``.)
"""
from xla_amp import engines
from xla_amp.numerics._compare import ComparisonReport, compare
from xla_amp.numerics._report import PrecisionReport, ReportDiff
from xla_amp.numerics._watch import NonfiniteWatch, watch_nonfinite

__all__ = ["PrecisionReport", "ReportDiff", "explain", "watch_nonfinite", "NonfiniteWatch",
           "compare", "ComparisonReport"]


def __getattr__(name):
    if name == "explain":  # a trace of torch_xla's: loaded on first use, where it runs
        engines.require("torch_xla", "xla_amp.numerics.explain")
        from xla_amp.numerics._explain import explain
        globals()["explain"] = explain
        return explain
    raise AttributeError(f"module 'xla_amp.numerics' has no attribute {name!r}")
