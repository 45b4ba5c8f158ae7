"""What a crash-safe checkpoint write costs: xla_amp.checkpoint.write_atomic
(unique temporary file, fsync of file and directory, rename, fsync of the
directory) against the launchers' old write (torch.save to PATH.tmp, rename,
no fsync), for host states of several sizes, interleaved rounds.

    python benchmarks/checkpoint_write.py [--sizes 14,200,1000] [--rounds 7] [--dir /tmp]

The difference is the fsyncs: the time to get the bytes onto the disk,
which the old write left to the kernel (a power loss could then leave a
renamed but empty or partial file). The figure to read against a
preemption's ~30 s grace period is the atomic write's own time.
"""
import argparse
import os
import time

import torch

from xla_amp.checkpoint import write_atomic

from _harness import interleaved, markdown_table, median, paired_ratio  # noqa: E402


def plain(path, state):
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def atomic(path, state):
    write_atomic(path, lambda f: torch.save(state, f))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="14,200,1000", help="state sizes in MB")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--dir", default="/tmp")
    args = ap.parse_args()
    rows = []
    for mb in (int(s) for s in args.sizes.split(",")):
        state = {"w": torch.randn(mb * 2 ** 20 // 4)}
        path = os.path.join(args.dir, f"xla_amp_bench_ck_{mb}.pt")
        variants = {"old (no fsync)": plain, "write_atomic": atomic}
        for f in variants.values():      # warm-up: the file exists, pages allocated
            f(path, state)

        def run_one(name, _r):
            t = time.perf_counter()
            variants[name](path, state)
            return time.perf_counter() - t
        res = interleaved(list(variants), args.rounds, run_one)
        os.remove(path)
        a, b = res["write_atomic"], res["old (no fsync)"]
        rows.append([f"{mb} MB", f"{median(b) * 1e3:.0f} ms", f"{median(a) * 1e3:.0f} ms",
                     f"{paired_ratio(a, b):.2f}x",
                     f"{mb / 1024 / median(a):.2f} GB/s"])
    print(markdown_table(["state", "old write", "write_atomic", "ratio (paired)",
                          "write_atomic throughput"], rows))


if __name__ == "__main__":
    main()
