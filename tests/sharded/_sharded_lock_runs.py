"""Sharded saves by another process, for tests/sharded/test_sharded_lock.py.

    python _sharded_lock_runs.py hold PATH SEED
        saves build(SEED) to PATH (keep=2), pausing as it is about to write
        its first data file (the path's lock held, its version directory
        made): prints "paused <pid>", then goes on once a line arrives on
        stdin and prints "saved"
    python _sharded_lock_runs.py loop PATH N
        N saves to PATH (keep=1), seeds 1, 2, 1, 2, ...; prints "saved <i>"
        after each

Audit hooks only watch the save (no code of it is replaced).
"""
import os
import re
import sys

os.environ["PJRT_DEVICE"] = "CPU"
os.environ.pop("CPU_NUM_DEVICES", None)

from tests.sharded._sharded_saves import build  # noqa: E402
from xla_amp import sharded  # noqa: E402


def _pause_at_first_data_file() -> None:
    done = []

    def hook(event, args):
        if (event == "open" and not done and str(args[0]).endswith(".distcp")
                and re.fullmatch(r"v\d{6,}", os.path.basename(os.path.dirname(str(args[0]))))):
            done.append(True)
            print(f"paused {os.getpid()}", flush=True)
            sys.stdin.readline()
    sys.addaudithook(hook)


def main() -> None:
    mode, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "hold":
        model, opt, scaler = build(n, "xla")
        _pause_at_first_data_file()
        sharded.save(path, model=model, optimizer=opt, scaler=scaler, keep=2)
        print("saved", flush=True)
        return
    runs = [build(seed, "xla") for seed in (1, 2)]
    for i in range(n):
        model, opt, scaler = runs[i % 2]
        sharded.save(path, model=model, optimizer=opt, scaler=scaler)
        print(f"saved {i}", flush=True)


if __name__ == "__main__":
    main()
