"""Results shared by every process of one test run ("train once, check
many"): a subprocess run whose JSON several tests read, possibly from both
xdist workers, is made once per `pytest` invocation by whichever process asks
first, while the other waits for it, and read back from disk after that.

The directory comes from tests/conftest.py, which the controller imports
before it starts the workers (they inherit its environment); it is removed
when the run ends. `compute` must not itself ask for another shared result
(two processes each holding one lock and waiting for the other's)."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
from typing import Callable

RUN_DIR_VAR = "XLA_AMP_TEST_RUN_DIR"


def once_per_run(key: tuple, compute: Callable[[], dict]) -> dict:
    """compute()'s JSON-able result for `key`, computed once per test run."""
    folder = os.environ[RUN_DIR_VAR]
    os.makedirs(folder, exist_ok=True)
    name = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]
    path = os.path.join(folder, name + ".json")
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if os.path.exists(path):
            with open(path) as f:
                return json.load(f)
        result = compute()  # raises: nothing is kept, the next asker tries again
        with open(path + ".tmp", "w") as f:
            json.dump(result, f)
        os.replace(path + ".tmp", path)
        return result
