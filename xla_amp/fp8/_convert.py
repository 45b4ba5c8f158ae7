"""`convert(model, recipe)`: nn.Linear (and Hugging Face Conv1D) layers
become `Fp8Linear`, in place.

    convert:  every candidate found and checked first (nothing is replaced
              on a bad one): not already converted, not kept by the recipe,
              both dimensions multiples of 16 (fp8 GEMMs need it; a layer
              that is not is refused by name: keep it with recipe.keep, or
              unaligned="keep": left in the region's dtype, one log line
              naming it, listed in report(model).fallback);
              no candidate at all is an error
              then each is swapped for an Fp8Linear holding the same
              Parameter objects (optimizers built before still point at them)
"""
from __future__ import annotations

import fnmatch
import logging
import warnings

from torch import nn

from xla_amp.fp8._linear import Fp8Linear
from xla_amp.fp8._recipe import ALIGN, Fp8Recipe

log = logging.getLogger("xla_amp")
# set on a layer left in high precision by unaligned="keep": why (report reads it)
FALLBACK_ATTR = "_xla_amp_fp8_fallback"


def _is_conv1d(module) -> bool:
    # Hugging Face's GPT-2 Conv1D: weight (in, out), y = x @ W + b
    return type(module).__name__ == "Conv1D" and hasattr(module, "nf") and hasattr(module, "weight")


def _kept(recipe: Fp8Recipe, name: str, module) -> bool:
    for k in recipe.keep:
        if isinstance(k, str) and fnmatch.fnmatchcase(name, k):
            return True
        if isinstance(k, type) and isinstance(module, k):
            return True
    return False


def aligned(module: nn.Module) -> bool:
    """Both weight dimensions are multiples of 16 (what fp8 GEMMs need)."""
    return all(d % ALIGN == 0 for d in module.weight.shape)


def candidates(model: nn.Module, recipe: Fp8Recipe) -> list[tuple[str, nn.Module, bool]]:
    """(qualified name, layer, transposed) of every layer `convert` would swap."""
    found = []
    for name, module in model.named_modules():
        if isinstance(module, Fp8Linear):
            raise ValueError(f"xla_amp.fp8.convert: {name or type(model).__name__} is already "
                             "an Fp8Linear (convert was called twice)")
        if _kept(recipe, name, module):
            continue
        if type(module) is nn.Linear or _is_conv1d(module):
            found.append((name, module, _is_conv1d(module)))
    return found


def passed_over(model: nn.Module, recipe: Fp8Recipe) -> list[str]:
    """"name (Type)" of each nn.Linear subclass `convert` leaves alone: its
    owner may not call its forward (nn.MultiheadAttention reads
    out_proj.weight directly), so a swapped layer could silently not run."""
    return [f"{name} ({type(m).__name__})" for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and type(m) is not nn.Linear
            and not isinstance(m, Fp8Linear) and not _kept(recipe, name, m)]


def convert(model: nn.Module, recipe: Fp8Recipe | None = None, *,
            unaligned: str = "refuse") -> nn.Module:
    """Swaps the eligible layers of `model` for `Fp8Linear` (see the module
    docstring) and returns `model`. Call before building the optimizer or
    after: the parameters are the same objects. ValueError naming the layer
    on bad input, with the model unchanged. ``unaligned="keep"`` leaves a
    layer whose dimensions are not multiples of 16 in high precision
    instead of refusing it (a classifier head of 10 or 1000 classes)."""
    if unaligned not in ("refuse", "keep"):
        raise ValueError(f"xla_amp.fp8.convert: unaligned must be 'refuse' or 'keep', got "
                         f"{unaligned!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"xla_amp.fp8.convert: expected an nn.Module, got {type(model).__name__}")
    recipe = Fp8Recipe() if recipe is None else recipe
    if not isinstance(recipe, Fp8Recipe):
        raise TypeError(f"xla_amp.fp8.convert: recipe must be an Fp8Recipe, got "
                        f"{type(recipe).__name__}")
    found = candidates(model, recipe)
    left = []
    if unaligned == "keep":
        left = [f for f in found if not aligned(f[1])]
        found = [f for f in found if aligned(f[1])]
    if not found:
        raise ValueError(f"xla_amp.fp8.convert: {type(model).__name__} has no nn.Linear or "
                         "Conv1D layer to convert (all kept by the recipe, or none at all)")
    for name, module, _ in found:
        dims = tuple(module.weight.shape)
        if not aligned(module):
            raise ValueError(
                f"xla_amp.fp8.convert: layer {name!r} has weight shape {dims}; fp8 matmuls need "
                f"both dimensions to be multiples of {ALIGN}: keep it in high precision "
                f"(Fp8Recipe(keep=({name!r},)))")
    skipped = passed_over(model, recipe)
    if skipped:
        warnings.warn(f"xla_amp.fp8.convert: left in high precision, nn.Linear subclasses it "
                      f"does not swap: {', '.join(skipped)}", stacklevel=2)
    for name, module, _ in left:
        why = (f"weight shape {tuple(module.weight.shape)}: fp8 GEMMs need every dimension "
               f"to be a multiple of {ALIGN}")
        setattr(module, FALLBACK_ATTR, why)
        log.warning("xla_amp.fp8.convert: layer %r stays in the region's dtype: %s", name, why)
    modules = dict(model.named_modules())
    for name, module, transposed in found:
        layer = Fp8Linear(module.weight, module.bias, recipe, transposed=transposed, name=name)
        if name == "":
            raise ValueError("xla_amp.fp8.convert: the model itself is a Linear; wrap it in a "
                             "module (convert replaces children in place)")
        parent_name, _, child = name.rpartition(".")
        setattr(modules[parent_name], child, layer)
    return model
