"""The garbage collector's settings for long-lived test processes (the
pytest workers, tests/conftest.py; the served processes,
tests/support/_serve_main.py).

Lazy traces and Dynamo allocate many short-lived objects, and with Python's
defaults the collector scans every object alive at each pass: `perf` put
7-9 % of a zoo sweep's CPU samples in its scans. `settle()` freezes what
lives for the whole process (imports, collected tests) out of those scans
and runs a young-generation pass every 20,000 allocations instead of 700.
Reference cycles are still collected, later."""
from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000


def settle() -> None:
    """Call once the process's long-lived objects exist (after the imports)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 10, 10)
