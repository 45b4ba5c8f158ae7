"""The package's shape: one concept per folder, no import cycles, files of
one job (<= 400 lines), and every public name and import path of
../shared/API.md still importable."""
import ast
import importlib
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "xla_amp"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    mods = {_module_name(p): p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}
    mods["xla_amp._C"] = None  # the native extension (imports nothing of ours)
    return mods


def _imports(path: pathlib.Path, known: set[str]) -> set[str]:
    """The xla_amp modules `path` imports, anywhere in it (function-level
    imports too): `from a.b import c` is a.b.c when that is a module."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                     else node.module for a in node.names]
        else:
            continue
        out |= {n for n in names if n in known}
    return out


def test_no_import_cycles():
    """No module of xla_amp reaches itself through imports (module by
    module; the layers between packages are .importlinter's,
    tests/api/test_import_contracts.py)."""
    mods = _modules()
    graph = {m: _imports(p, set(mods)) - {m} if p else set() for m, p in mods.items()}
    # a package's __init__ imports its submodules; a submodule never the
    # __init__ of its own package (that is a cycle in disguise)
    cycles = []

    def visit(m, stack, done):
        if m in stack:
            cycles.append(stack[stack.index(m):] + [m])
            return
        if m in done:
            return
        for n in sorted(graph[m]):
            visit(n, stack + [m], done)
        done.add(m)

    done: set = set()
    for m in sorted(graph):
        visit(m, [], done)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_top_level_is_small_and_folders_hold_concepts():
    # a native build for another Python adds its generated record
    # (_build_info_cpython_312.py, not in git) beside _build_info.py
    top = sorted(p.name for p in PKG.glob("*.py") if not p.name.startswith("_build_info_"))
    assert len(top) <= 10, top
    for concept in ("autocast", "policies", "precision", "scaler", "syncfree", "numerics", "gpu"):
        assert (PKG / concept / "__init__.py").is_file(), concept


def test_no_file_over_400_lines():
    big = []
    for folder in ("xla_amp", "xla_amp_launch", "tests", "benchmarks", "scripts"):
        for p in (ROOT / folder).rglob("*.py"):
            n = len(p.read_text().splitlines())
            if n > 400:
                big.append(f"{p.relative_to(ROOT)}: {n}")
    assert not big, big


PUBLIC = ["autocast", "set_default_policy", "custom_fwd", "custom_bwd", "policies", "Policy",
          "CATEGORIES", "GradScaler", "syncfree", "all_reduce_gradients", "optimizer_step",
          "module_policies", "ModulePolicyHandle", "cast_module", "PrecisionReport", "explain",
          "watch_nonfinite", "NonfiniteWatch", "compare", "ComparisonReport", "gpu", "sharded",
          "checkpoint", "fp8", "engines"]


@pytest.mark.parametrize("path,names", [
    ("xla_amp", PUBLIC),
    ("xla_amp.engines", ["Engine", "EngineUnavailable", "ENGINES", "available", "for_device",
                         "for_module", "default", "require", "problem"]),
    ("xla_amp.policies", ["get", "names", "register", "builtin_names", "Policy", "CATEGORIES"]),
    ("xla_amp.syncfree", ["SGD", "Adam", "AdamW", "SyncFreeOptimizer"]),
    ("xla_amp.autocast", ["autocast", "set_default_policy", "custom_fwd", "custom_bwd"]),
    ("xla_amp.precision", ["module_policies", "cast_module", "ModulePolicyHandle"]),
    ("xla_amp.scaler", ["GradScaler", "OptState"]),
    ("xla_amp.numerics", ["explain", "watch_nonfinite", "compare", "PrecisionReport"]),
    ("xla_amp.distributed", ["all_reduce_gradients", "optimizer_step"]),
    ("xla_amp.gpu", ["use_cuda_plugin", "CudaPluginError", "CudaSetup"]),
    ("xla_amp.sharded", ["ShardedPrecision", "shard_model", "check_sharding", "save", "load"]),
    ("xla_amp.checkpoint", ["save", "load", "restore", "CheckpointLock", "preemption_guard",
                            "CheckpointError", "EXIT_PREEMPTED", "training_record"]),
    ("xla_amp.fp8", ["Fp8Recipe", "convert", "Fp8Linear", "update_scales", "attach", "report"]),
    pytest.param("xla_amp.torchax", ["autocast", "module_policies", "LossScaler", "TrainStep",
                                     "make_train_step", "initialize_distributed"],
                 marks=pytest.mark.torchax),
    # these import their framework: run by make integrations
    *[pytest.param(path, names, marks=pytest.mark.integrations) for path, names in [
        ("xla_amp.integrations.lightning", ["XLAAMPPrecision"]),
        ("xla_amp.integrations.fabric", ["XLAAMPPrecision"]),
        ("xla_amp.integrations.accelerate", ["Accelerator"]),
        ("xla_amp.integrations.transformers", ["XLAAMPTrainer", "XLAAMPTrainerMixin"])]],
])
def test_public_names_and_paths(path, names):
    module = importlib.import_module(path)
    missing = [n for n in names if not hasattr(module, n)]
    assert not missing, (path, missing)
    if path == "xla_amp":
        assert sorted(module.__all__) == sorted(PUBLIC)
        # the names, not the subpackages that share them
        assert isinstance(module.autocast, type) and callable(module.module_policies)
    assert os.path.dirname(module.__file__).startswith(str(PKG))


def test_no_sys_path_edits():
    """What tests, benchmarks and scripts share is importable (the checkout
    is on the path; benchmarks/ is a package): nothing edits sys.path."""
    import re
    edits = []
    for folder in ("xla_amp", "xla_amp_launch", "tests", "benchmarks", "scripts"):
        for p in (ROOT / folder).rglob("*.py"):
            for n, line in enumerate(p.read_text().splitlines(), 1):
                if re.search(r"sys\.path\.(insert|append|extend)\(|sys\.path\s*[+]?=", line):
                    edits.append(f"{p.relative_to(ROOT)}:{n}")
    assert not edits, edits
