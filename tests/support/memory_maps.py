"""The memory maps of this process against Linux's per-process limit
(``vm.max_map_count``, 65,530 by default), and the suite's guard on them.

XLA:CPU loads each kernel of a compiled graph as mappings of its own, a
code page and a read-only page (an MLP's training step at the tests' flags:
~300 maps; a compiled op's graph: ~110), and torch_xla 2.9 keeps up to
2048 executables a process (``XLA_COMPILATION_CACHE_SIZE``). One of
`make test`'s workers compiles ~1,100 graphs and ended at 52,000 maps. Past
the limit the next compile fails (LLVM: "Cannot allocate memory") and the
process dies by SIGABRT or SIGSEGV; under pytest's default fd capture its
message dies with it (the Makefile's --capture=sys keeps it;
tests/suite/test_upstream_xla_cpu_memory_maps.py pins the behaviour)."""
from __future__ import annotations

import os

SHARE = 0.8  # the guard stops a run past this share of the limit
EVERY = 10   # tests between two counts (a count of 50,000 maps: ~5 ms)


def count() -> int:
    with open("/proc/self/maps", "rb") as f:
        return f.read().count(b"\n")


def limit() -> int | None:
    """vm.max_map_count, or None where there is no such file (not Linux)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def check(share: float | None = None) -> None:
    """Raise RuntimeError, naming the count and the limit, when this process
    holds more than `share` (SHARE unless given) of the limit's maps."""
    share = SHARE if share is None else share
    most = limit()
    if most is None:
        return
    held = count()
    if held > share * most:
        raise RuntimeError(
            f"this process holds {held} memory maps, over {share:.0%} of vm.max_map_count "
            f"({most}); past it XLA:CPU's next compile kills the process. Each cached "
            f"executable holds two maps a kernel: lower XLA_COMPILATION_CACHE_SIZE (now "
            f"{os.environ.get('XLA_COMPILATION_CACHE_SIZE', 'torch_xla default, 2048')}) "
            "or start fewer graphs in one process")
