"""The built-in policies' names: the TOML files of this folder (the
``_``-prefixed ones are tables, not policies).

Standard library only: the launchers load this file by path, without
importing xla_amp (which starts torch and torch_xla, ~5 s), to define their
--policy flag, so a usage error or --help comes back at once.
"""
from pathlib import Path

DIR = Path(__file__).parent


def builtin_names() -> list[str]:
    return sorted(p.stem for p in DIR.glob("*.toml") if not p.stem.startswith("_"))
