"""The server side of tests/support/served.py: imports the module named on
the command line once, then for each line on stdin (a JSON list of argv
strings) runs its ``main(argv)``; what main prints goes to stdout, followed
by one line: served.END + {"rc": 0} or {"rc": 1, "error": "..."} (the
traceback goes to stderr). Ends when stdin closes.

    python -m tests.support._serve_main tests.support.zoo_check

The imports are frozen out of the garbage collector's scans and young
passes come less often (tests/support/quiet_gc.py): the lazy trace of a
model's step and Dynamo allocate many small objects, and the collector's
passes cost several percent of a zoo sweep."""
from __future__ import annotations

import gc
import importlib
import json
import sys
import traceback

from tests.support import quiet_gc
from tests.support.served import END


def serve(module_name: str) -> None:
    module = importlib.import_module(module_name)
    quiet_gc.settle()
    for line in sys.stdin:
        argv = json.loads(line)
        try:
            module.main(argv)
            status = {"rc": 0}
        except BaseException as e:  # SystemExit included: the call's, not the server's
            if isinstance(e, KeyboardInterrupt):
                raise
            traceback.print_exc()
            status = {"rc": 1, "error": f"{type(e).__name__}: {e}"[:2000]}
        gc.collect()
        sys.stderr.flush()
        print(END + json.dumps(status), flush=True)


if __name__ == "__main__":
    serve(sys.argv[1])
