"""The run the sharded checkpoint tests save (``build``), what they compare
(``snapshot``, ``same``, ``loaded``), and saves killed at seeded moments
(tests/sharded/test_sharded_versions.py, test_sharded_killed_save.py).

Run as a script it is a fork server: it imports torch, torch_xla and
xla_amp once (no XLA runtime started, so forking is safe), then for each
JSON line on stdin forks a process that builds ``build(seed)`` on XLA:CPU
and calls ``sharded.save(path, ..., keep=keep)``, armed to die at one point
of that save, and prints one JSON line: how the process ended.

    {"path": P, "seed": S, "keep": K, "log": L, "kill": null}               no kill
    {"path": P, "seed": S, "keep": K, "log": L, "kill": ["event", k]}       SIGKILL
        just before the save's k-th file operation (1-based)
    {"path": P, "seed": S, "keep": K, "log": L, "kill": ["file", NAME, n]}  the
        kernel kills it (SIGXFSZ, RLIMIT_FSIZE) when file NAME, once opened
        for writing, would grow past n bytes: NAME then holds exactly n bytes

A file operation is what Python's audit hooks report of a save: an open for
writing, a rename, a removal, a directory made or removed, a hard link.
Each is appended to the file L as a JSON line before it happens (unbuffered
writes: a killed process has logged the operation it was killed before).
No code of the save is replaced; the hook only watches it.
"""
from __future__ import annotations

import json
import os
import resource
import signal
import sys

import torch
import torch.nn as nn

_OPS = {"os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.link",
        "os.symlink", "os.truncate"}


def build(seed: int, device):
    """A model, a sync-free AdamW after one step and a GradScaler, from `seed`."""
    import torch_xla
    import xla_amp
    from xla_amp import syncfree
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)).to(device)
    opt = syncfree.AdamW(model.parameters(), lr=1e-2)
    scaler = xla_amp.GradScaler(init_scale=2.0 ** (seed % 7 + 4))
    x = torch.randn(4, 8).to(device)
    opt.zero_grad()
    scaler.scale(model(x).square().mean()).backward()
    scaler.step(opt)
    scaler.update()
    torch_xla.sync()
    return model, opt, scaler


def _host(v):
    return v.detach().cpu() if torch.is_tensor(v) else v


def snapshot(model, opt, scaler) -> dict:
    """Every value of the three objects' state, on the host."""
    sd = opt.state_dict()
    return {"model": {k: _host(v) for k, v in model.state_dict().items()},
            "state": {f"{i}.{k}": _host(v) for i, st in sd["state"].items()
                      for k, v in st.items()},
            "groups": sd["param_groups"],
            "scaler": {k: _host(v) for k, v in scaler.state_dict().items()}}


def same(a, b) -> bool:
    """`a` and `b` hold the same keys and bit-identical values (dtype, shape
    and every byte of every tensor)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if torch.is_tensor(a):
        return (torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))
    return type(a) is type(b) and a == b


def contents(path) -> dict:
    """Every entry of the sharded checkpoint `path` reads (its newest
    version), on the host, by its DCP key: tensors through plain DCP, other
    entries weights-only (xla_amp/checkpoint/_sharded_metadata.py); and
    ``"extra"``, what the save kept with them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from xla_amp import sharded
    from xla_amp.checkpoint import _sharded_metadata as safe
    where = sharded.versions(path)[0]
    md = safe.read_metadata(where, "test")
    tensors = {k: torch.zeros(tuple(m.size), dtype=m.properties.dtype)
               for k, m in md.state_dict_metadata.items() if isinstance(m, TensorStorageMetadata)}
    dcp.load(tensors, storage_reader=dcp.FileSystemReader(where), no_dist=True)
    values = safe.read_values(where, md, [k for k in md.state_dict_metadata
                                          if k not in tensors], "test")
    return {**tensors, **values, "extra": sharded.read_extra(path)}


def fresh(device):
    """Objects to load into: the model's structure, a sync-free AdamW with
    no state yet, a GradScaler."""
    import xla_amp
    from xla_amp import syncfree
    torch.manual_seed(12345)
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)).to(device)
    return model, syncfree.AdamW(model.parameters(), lr=1e-2), xla_amp.GradScaler()


def loaded(path, device) -> dict:
    """The snapshot of what ``sharded.load(path)`` restores."""
    from xla_amp import sharded
    model, opt, scaler = fresh(device)
    sharded.load(path, model=model, optimizer=opt, scaler=scaler)
    return snapshot(model, opt, scaler)


def _writes(event: str, args) -> bool:
    if event != "open" or isinstance(args[0], int):   # an open of a descriptor: no file op
        return False
    flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
    mode = args[1] if isinstance(args[1], str) else ""
    return bool(flags & (os.O_WRONLY | os.O_RDWR)) or any(c in mode for c in "wax+")


def _arm(kill, log: int) -> list:
    """Install the audit hook that logs the save's file operations to the
    descriptor `log` and, per `kill`, ends the process. Returns a list whose
    emptying disarms it."""
    armed, count = [True], [0]

    def hook(event, args):
        if not armed or not (event in _OPS or _writes(event, args)):
            return
        count[0] += 1
        os.write(log, (json.dumps([event, str(args[0]), str(args[1])]) + "\n").encode())
        if kill[0] == "event" and count[0] == kill[1]:
            os.kill(os.getpid(), signal.SIGKILL)
        if kill[0] == "file" and event == "open" and os.path.basename(str(args[0])) == kill[1]:
            resource.setrlimit(resource.RLIMIT_FSIZE, (kill[2], resource.RLIM_INFINITY))
    sys.addaudithook(hook)
    return armed


def _trial(spec) -> None:
    """In the forked process: build, arm, save; exit 0 if still alive."""
    from xla_amp import sharded
    model, opt, scaler = build(spec["seed"], "xla")
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)   # Python ignores it by default
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    log = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
    armed = _arm(spec["kill"] or ["none"], log)
    sharded.save(spec["path"], model=model, optimizer=opt, scaler=scaler, keep=spec["keep"])
    armed.clear()


def serve() -> None:
    import torch_xla  # noqa: F401 -- imported once, before any fork
    import torch.distributed.checkpoint  # noqa: F401
    from xla_amp import sharded, syncfree  # noqa: F401
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        spec = json.loads(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _trial(spec)
            except BaseException as e:  # noqa: BLE001 -- reported through the exit code
                print(f"trial failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                code = 1
            sys.stdout.flush()
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                          "exit": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None}),
              flush=True)


if __name__ == "__main__":
    os.environ["PJRT_DEVICE"] = "CPU"
    os.environ.pop("CPU_NUM_DEVICES", None)
    serve()
