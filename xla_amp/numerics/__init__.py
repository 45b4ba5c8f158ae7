"""Where precision went wrong: tools built on autocast's recording and on
device-side flags.

    _explain.py  `explain`: one traced call's `PrecisionReport`
    _watch.py    `watch_nonfinite`: the first module with an inf/NaN output
                 or output gradient, flags in the step's graph
    _compare.py  `compare`: each module's output against float32, float16
                 range risk, `suggest()` rules for module_policies

(``GradScaler.overflow_report`` names the parameters with inf/NaN gradients;
``xla_amp.scaler``.)
"""
from xla_amp import _engines
from xla_amp.numerics._compare import ComparisonReport, compare  # XLA and PrivateUse1
from xla_amp.numerics._watch import NonfiniteWatch, watch_nonfinite  # XLA and PrivateUse1

if _engines.available("torch_xla"):  # built on the native engine's recording
    from xla_amp.autocast._report import PrecisionReport, ReportDiff
    from xla_amp.numerics._explain import explain
else:
    def __getattr__(name):
        if name in __all__:
            _engines.require("torch_xla", f"xla_amp.numerics.{name}")
        raise AttributeError(f"module 'xla_amp.numerics' has no attribute {name!r}")

__all__ = ["PrecisionReport", "ReportDiff", "explain", "watch_nonfinite", "NonfiniteWatch",
           "compare", "ComparisonReport"]
