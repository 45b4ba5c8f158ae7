"""fp8 training: scaled float8 matmuls, each a dot on float8 operands with a
float32 result (the form XLA:GPU turns into cuBLASLt fp8 GEMMs; docs/fp8.md).

    model = xla_amp.fp8.convert(model, Fp8Recipe(scaling="delayed"))
    xla_amp.fp8.attach(optimizer, model)      # delayed: roll per optimizer step

    Fp8Recipe      the scaling recipe (_recipe.py)
    convert        nn.Linear / Conv1D -> Fp8Linear, in place (_convert.py)
    Fp8Linear      the layer and its float8 matmuls (_linear.py)
    update_scales  roll the amax histories after a step (in replica mode
                   MAX-reduced over the replicas first); attach does it
                   after every optimizer.step (_history.py)
    report         per-layer scales, saturated and underflow fractions,
                   read in one transfer between steps; .fallback: layers
                   that ran in the region's dtype, with why (_report.py)
"""
from xla_amp.fp8._convert import convert
from xla_amp.fp8._history import attach, update_scales
from xla_amp.fp8._linear import Fp8Linear
from xla_amp.fp8._recipe import Fp8Recipe
from xla_amp.fp8._report import Fp8Fallback, Fp8Report, report

__all__ = ["Fp8Recipe", "convert", "Fp8Linear", "update_scales", "attach", "report",
           "Fp8Report", "Fp8Fallback"]
