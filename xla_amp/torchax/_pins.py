"""The torch / torchax / jax combination this backend is verified on.

torchax 0.0.13 imports with torch 2.9.0 and jax 0.10.2 as it is, and with
torch 2.15.0 and jax 0.12 through _compat.py (torch >= 2.13 removed 23 ops and
overloads torchax names, ``aten.prod.dim_Dimname`` first: torchax's own import
fails there). The verified range is torch 2.9 to 2.15; a torch above it is
refused until its removed ops are recorded (tests/torchax/test_current_torch_shim.py).
torch_xla 2.9.0's wheel carries an older torchax (0.0.6) as a top-level
package of its own: installed after torchax 0.0.13 it overwrites it, which
is why the Makefile installs torchax last. Checked before torchax is
imported, so a bad combination fails with one line naming the culprit.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util

TORCHAX = "0.0.13"
TORCH_FROM = (2, 9)    # oldest torch verified
TORCH_UPTO = (2, 15)   # newest torch verified (with _compat.py's shim from 2.13)


def _release(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


def check(torch_version: str, torchax_version: str | None) -> None:
    """ImportError naming what is wrong with this combination, or nothing."""
    if not TORCH_FROM <= _release(torch_version)[:2] <= TORCH_UPTO:
        raise ImportError(
            f"xla_amp.torchax: torch {torch_version} is not supported: torchax {TORCHAX} "
            f"is verified with torch {_dotted(TORCH_FROM)} to {_dotted(TORCH_UPTO)}")
    if torchax_version is None:
        raise ImportError(f"xla_amp.torchax needs torchax=={TORCHAX}: pip install "
                          f"torchax=={TORCHAX}")
    if torchax_version != TORCHAX:
        raise ImportError(
            f"xla_amp.torchax: torchax {torchax_version} is installed, {TORCHAX} is needed"
            + (" (0.0.6 is the copy torch_xla 2.9.0's wheel carries; "
               f"pip install --force-reinstall --no-deps torchax=={TORCHAX})"
               if torchax_version == "0.0.6" else ""))


def check_installed() -> None:
    import torch
    try:
        found = importlib.metadata.version("torchax")
    except importlib.metadata.PackageNotFoundError:
        found = None
    if found is not None:
        # the files on disk decide: torch_xla's wheel may have overwritten them
        spec = importlib.util.find_spec("torchax")
        if spec is not None and spec.origin:
            text = open(spec.origin, encoding="utf-8").read()
            for line in text.splitlines():
                if line.startswith("__version__"):
                    found = line.split("=", 1)[1].strip().strip("\"'")
                    break
    check(torch.__version__, found)
