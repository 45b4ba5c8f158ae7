"""No file of the checkout outside the xla_amp package is named like a module
Python can import from the standard library or the installed packages.

A script run by its path (`python benchmarks/sharded.py`) puts its folder
first on sys.path, and every file there then stands in for the module of its
name. benchmarks/torchax.py did so for every benchmark and test subprocess:
torch_xla 2.9's `xs.mark_sharding` imports torchax on each call
(jax_workarounds.maybe_get_torchax), got the benchmark instead, failed
halfway and tried again at the next call -- 2-3 s of a 17-20 s sharded LM
run in tests/sharded/ (it is benchmarks/torchax_lm.py now). Inside xla_amp/
the names are the package's own (xla_amp.integrations.lightning): no script
runs from there."""
import importlib.machinery
import os
import sys

from tests.support.launch import ROOT

SKIP_DIRS = {"build", "xla_amp", "__pycache__", "node_modules"}


def _outside_paths() -> list[str]:
    """sys.path without the checkout's own folders (the installed packages
    stay, in a venv inside the checkout too)."""
    root = os.path.realpath(ROOT)
    out = []
    for p in sys.path:
        real = os.path.realpath(p or os.getcwd())
        inside = real == root or real.startswith(root + os.sep)
        if not inside or "site-packages" in real.split(os.sep):
            out.append(p)
    return out


def _checkout_modules():
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS]
        for f in files:
            if f.endswith(".py") and f != "__init__.py":
                yield f[:-3], os.path.relpath(os.path.join(folder, f), ROOT)


def test_no_checkout_file_shadows_an_importable_module():
    paths = _outside_paths()
    shadowing = []
    for name, rel in _checkout_modules():
        if name in sys.builtin_module_names or \
                importlib.machinery.PathFinder.find_spec(name, paths) is not None:
            shadowing.append(rel)
    assert not shadowing, (
        f"named like an importable module (run from its folder, a script would import "
        f"this file instead): {sorted(shadowing)}")


def test_the_check_sees_installed_packages():
    """The check above can fail: torch is found on the paths it
    searches, and this very file is among the ones it reads."""
    paths = _outside_paths()
    assert importlib.machinery.PathFinder.find_spec("torch", paths) is not None
    assert ("test_module_names", os.path.join("tests", "suite", "test_module_names.py")) \
        in set(_checkout_modules())
