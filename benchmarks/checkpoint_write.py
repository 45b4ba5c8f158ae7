"""What a safe checkpoint costs, in interleaved rounds:

- ``atomic``: xla_amp.checkpoint.write_atomic (unique temporary file, fsync
  of file and directory, rename, fsync of the directory) against the
  launchers' old write (torch.save to PATH.tmp, rename, no fsync), for host
  states of several sizes (``--sizes``, MB);
- ``checksums``: xla_amp.checkpoint.save and load of a model + Adam state
  of ``--mb`` MB with their checksums (a checksum per tensor and one of the
  rest, written into the file; verified on reading) against the same code
  with them switched off (``_integrity.enabled``, a private switch); loads
  in this process (its allocator reuses the memory of the previous load)
  and as the first load of a new process (what a resume does);
- ``algorithms``: the hash rate of XXH3-64 (the one the checkpoints use),
  CRC-32 and SHA-256 on one core.

    python benchmarks/checkpoint_write.py [--measure all|atomic|checksums|algorithms]
        [--sizes 14,200,1000] [--mb 1000] [--rounds 7] [--dir DIR]

Files go to ``--dir`` (default: a new temporary directory, removed at the
end). For ``atomic`` the difference is the fsyncs, the time to get the
bytes onto the disk, which the old write left to the kernel. For
``checksums``, each kind (save, load, load in a new process) runs its own
rounds, with and without checksums in an order alternating round by round;
the ratio is the median of the rounds' ratios, the spread the lowest and
highest of them. Peak memory: about 3x ``--mb`` (the state, a loaded copy).
"""
import argparse
import hashlib
import os
import shutil
import tempfile
import time
import zlib

import torch

from xla_amp import checkpoint as ckpt
from xla_amp.checkpoint import _integrity
from xla_amp.checkpoint._checksum import digest

from _harness import (interleaved, markdown_table, median, paired_ratio,  # noqa: E402
                      print_result, run_worker)


def plain(path, state):
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def atomic(path, state):
    ckpt.write_atomic(path, lambda f: torch.save(state, f))


def measure_atomic(directory, sizes, rounds):
    rows = []
    for mb in sizes:
        state = {"w": torch.randn(mb * 2 ** 20 // 4)}
        path = os.path.join(directory, f"xla_amp_bench_ck_{mb}.pt")
        variants = {"old (no fsync)": plain, "write_atomic": atomic}
        for f in variants.values():      # warm-up: the file exists, pages allocated
            f(path, state)

        def run_one(name, _r):
            t = time.perf_counter()
            variants[name](path, state)
            return time.perf_counter() - t
        res = interleaved(list(variants), rounds, run_one)
        os.remove(path)
        a, b = res["write_atomic"], res["old (no fsync)"]
        rows.append([f"{mb} MB", f"{median(b) * 1e3:.0f} ms", f"{median(a) * 1e3:.0f} ms",
                     f"{paired_ratio(a, b):.2f}x",
                     f"{mb / 1024 / median(a):.2f} GB/s"])
    print(markdown_table(["state", "old write", "write_atomic", "ratio (paired)",
                          "write_atomic throughput"], rows))


def model_and_optimizer(mb):
    """Linear layers of 1920 x 1920 + Adam after one step: weights, biases,
    exp_avg and exp_avg_sq, ~`mb` MB of float32 in all (~3 tensors per
    layer of 14 MB each, 2 small ones)."""
    n = max(1, round(mb * 2 ** 20 / (3 * 4 * (1920 * 1920 + 1920))))
    model = torch.nn.Sequential(*[torch.nn.Linear(1920, 1920) for _ in range(n)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    for p in model.parameters():
        p.grad = None
    return model, opt


def _switched(on, f, *args):
    """f(*args) with the checksums on or off (the private switch)."""
    _integrity.enabled = on
    try:
        return f(*args)
    finally:
        _integrity.enabled = True


def load_worker(path, on):
    """Worker mode: one ckpt.load in this new process (what a resume does:
    the state lands in memory the process never used); prints its time."""
    t = time.perf_counter()
    _switched(on, ckpt.load, path)
    print_result({"s": time.perf_counter() - t})


def _row(name, on, off):
    ratios = [a / b for a, b in zip(on, off)]
    return [name, f"{median(off) * 1e3:.0f} ms", f"{median(on) * 1e3:.0f} ms",
            f"{paired_ratio(on, off):.3f}x", f"{min(ratios):.3f}x .. {max(ratios):.3f}x"]


def measure_checksums(directory, mb, rounds):
    model, opt = model_and_optimizer(mb)
    snap = ckpt.snapshot(model, opt, extra={"step": 1})
    tensors = [t for _, t in _integrity.walk(snap)[0]]
    size = sum(t.numel() * t.element_size() for t in tensors) / 2 ** 20
    paths = {on: os.path.join(directory, f"xla_amp_bench_sum_{'on' if on else 'off'}.pt")
             for on in (False, True)}

    def save(on):
        _switched(on, lambda: ckpt.save(paths[on], model=model, optimizer=opt,
                                        extra={"step": 1}))

    def load(on):
        state = _switched(on, ckpt.load, paths[on])
        del state                         # dropped before the next one

    def fresh(on):
        return run_worker(__file__, ["--load_worker", paths[on], "--on", str(int(on))],
                          "a load in a new process")["s"]
    timed = {"ckpt.save": save, "ckpt.load": load}
    for on in (False, True):              # warm-up: each file exists, pages allocated
        save(on)
        load(on)

    def run_one(variant, _r):
        what, on = variant
        if what == "ckpt.load, first in a new process":
            return fresh(on)
        t = time.perf_counter()
        timed[what](on)
        return time.perf_counter() - t
    load_before = os.getloadavg()[0]
    rows = []                             # each kind in its own rounds, after its own kind
    for what in ("ckpt.save", "ckpt.load", "ckpt.load, first in a new process"):
        res = interleaved([(what, False), (what, True)], rounds, run_one, order="alternate")
        rows.append(_row(what, res[(what, True)], res[(what, False)]))
    hashing = []
    for _ in range(rounds):               # the checksums' own work on write, alone
        t = time.perf_counter()
        _integrity.with_checksums(dict(snap))
        hashing.append(time.perf_counter() - t)
    for p in paths.values():
        os.remove(p)
    print(f"state: {size:.0f} MB in {len(tensors)} tensors (model + Adam), {rounds} "
          f"interleaved rounds; load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after (on {os.cpu_count()} cores)")
    print(f"hashing the state alone (the checksums' work on write): "
          f"{median(hashing) * 1e3:.0f} ms, {size / 1024 / median(hashing):.1f} GB/s")
    print(markdown_table(["", "without checksums", "with checksums", "ratio (median)",
                          "ratio spread (min .. max)"], rows))


def measure_algorithms(rounds):
    buf = memoryview(torch.randn(64 * 2 ** 20).numpy()).cast("B")   # 256 MB
    algorithms = {"xxh3_64 (xxhash)": digest,
                  "crc32 (zlib)": zlib.crc32,
                  "sha256 (hashlib)": lambda b: hashlib.sha256(b).digest()}

    def run_one(name, _r):
        t = time.perf_counter()
        algorithms[name](buf)
        return time.perf_counter() - t
    res = interleaved(list(algorithms), rounds, run_one)
    print(markdown_table(["algorithm", "GB/s (one core)"],
                         [[n, f"{buf.nbytes / 2 ** 30 / median(t):.1f}"]
                          for n, t in res.items()]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--measure", default="all",
                    choices=["all", "atomic", "checksums", "algorithms"])
    ap.add_argument("--sizes", default="14,200,1000", help="atomic: state sizes in MB")
    ap.add_argument("--mb", type=int, default=1000, help="checksums: state size in MB")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--load_worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--on", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--dir", default=None, help="where the files go (default: a new "
                    "temporary directory, removed at the end)")
    args = ap.parse_args()
    if args.load_worker:
        return load_worker(args.load_worker, bool(args.on))
    directory = args.dir or tempfile.mkdtemp(prefix="xla_amp_bench_ck_")
    try:
        if args.measure in ("all", "atomic"):
            measure_atomic(directory, [int(s) for s in args.sizes.split(",")], args.rounds)
        if args.measure in ("all", "checksums"):
            measure_checksums(directory, args.mb, args.rounds)
        if args.measure in ("all", "algorithms"):
            measure_algorithms(args.rounds)
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
