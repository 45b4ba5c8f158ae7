"""xla_amp.checkpoint's pieces, fast (make test): atomic writes and what an
OS failure leaves, older versions kept, the path lock (a dead holder's
included), data-only reads, the preemption guard, and the conversion rules
on plain state dicts. The same pieces under real faults: make faults."""
import os
import pickle
import signal
import subprocess
import sys

import pytest
import torch

from xla_amp import checkpoint as ckpt


class Payload:
    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_write_atomic_replaces_whole_files_and_keeps_older_ones(tmp_path):
    path = tmp_path / "sub" / "ck.pt"
    for v in range(4):
        ckpt.write_atomic(path, lambda f, v=v: torch.save({"v": v}, f), keep=3)
    assert torch.load(path, weights_only=True) == {"v": 3}
    assert torch.load(f"{path}.1", weights_only=True) == {"v": 2}
    assert torch.load(f"{path}.2", weights_only=True) == {"v": 1}
    assert not os.path.exists(f"{path}.3")
    assert sorted(os.listdir(path.parent)) == ["ck.pt", "ck.pt.1", "ck.pt.2"]
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask():
    m = os.umask(0)
    os.umask(m)
    return m


def test_write_atomic_failure_leaves_the_old_file_and_no_temporary(tmp_path):
    """An exception inside the write (here the caller's own): the old file
    stays, the temporary goes, the exception is the caller's."""
    path = tmp_path / "ck.pt"
    ckpt.write_atomic(path, lambda f: torch.save({"v": 1}, f))

    def broken(f):
        f.write(b"half a checkpoint")
        raise KeyError("boom")
    with pytest.raises(KeyError):
        ckpt.write_atomic(path, broken)
    assert os.listdir(tmp_path) == ["ck.pt"]
    assert torch.load(path, weights_only=True) == {"v": 1}


def test_os_failure_is_one_line_naming_the_path(tmp_path):
    """A real EFBIG (RLIMIT_FSIZE in a child process) inside torch.save:
    CheckpointError, one line, path and reason; the old file intact."""
    path = tmp_path / "ck.pt"
    ckpt.write_atomic(path, lambda f: torch.save({"v": 1}, f))
    code = f"""
import resource, torch
from xla_amp import checkpoint as ckpt
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    ckpt.write_atomic({str(path)!r}, lambda f: torch.save({{"w": torch.ones(100000)}}, f))
except ckpt.CheckpointError as e:
    print("ERR", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PJRT_DEVICE": "CPU"}, timeout=300).stdout
    assert out.strip() == f"ERR cannot write checkpoint {path}: File too large [EFBIG]", out
    assert os.listdir(tmp_path) == ["ck.pt"]
    assert torch.load(path, weights_only=True) == {"v": 1}


def test_lock_refuses_a_live_holder_and_not_a_dead_one(tmp_path):
    path = tmp_path / "ck.pt"
    with ckpt.CheckpointLock(path):
        with pytest.raises(ckpt.CheckpointLocked) as e:
            ckpt.CheckpointLock(path).acquire()
        assert str(path) in str(e.value) and f"pid {os.getpid()}" in str(e.value)
    ckpt.CheckpointLock(path).acquire().release()      # released: free again
    # a holder killed with SIGKILL: the kernel drops its lock
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, sys, time
fd = os.open({str(path) + '.lock'!r}, os.O_RDONLY | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(ckpt.CheckpointLocked):
        ckpt.CheckpointLock(path).acquire()
    holder.kill()
    holder.wait()
    ckpt.CheckpointLock(path).acquire().release()


def test_stale_temporaries_are_removed(tmp_path):
    path = tmp_path / "ck.pt"
    for name in (".ck.pt.abc.tmp", ".ck.pt.def.tmp", ".other.pt.x.tmp", "ck.pt"):
        (tmp_path / name).write_bytes(b"x")
    assert sorted(ckpt.remove_stale_temporaries(path)) == [".ck.pt.abc.tmp", ".ck.pt.def.tmp"]
    assert sorted(os.listdir(tmp_path)) == [".other.pt.x.tmp", "ck.pt"]


@pytest.mark.parametrize("kind", ["torch.save", "raw pickle", "not a checkpoint", "missing"])
def test_read_is_data_only(tmp_path, kind):
    marker, path = tmp_path / "ran", tmp_path / "f.pt"
    if kind == "torch.save":
        torch.save({"w": torch.ones(2), "x": Payload(marker)}, path)
    elif kind == "raw pickle":
        path.write_bytes(pickle.dumps(Payload(marker)))
    elif kind == "not a checkpoint":
        path.write_text("hello")
    with pytest.raises(ckpt.CheckpointError) as e:
        ckpt.read(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path) in msg
    assert {"torch.save": "the object posix.system", "raw pickle": "not loaded",
            "not a checkpoint": "not a readable torch checkpoint", "missing": "[ENOENT]"}[kind] in msg, msg
    assert not marker.exists()


def test_preemption_guard_turns_signals_into_a_flag():
    before = signal.getsignal(signal.SIGTERM)
    with ckpt.preemption_guard() as guard:
        assert not guard.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert guard.requested and guard.signal_name == "SIGTERM"
        os.kill(os.getpid(), signal.SIGTERM)          # a second SIGTERM: still a flag
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(KeyboardInterrupt):            # Ctrl-C twice: stop now
        with ckpt.preemption_guard() as guard:
            os.kill(os.getpid(), signal.SIGINT)
            assert guard.signal_name == "SIGINT"
            os.kill(os.getpid(), signal.SIGINT)


def _record(dtype, master=False, sr=False, scaler=True):
    return {"format": 1, "dtypes": {"w": dtype}, "optimizer": "AdamW",
            "optimizer_params": ["w"],
            "groups": [{"params": 1, "master_weights": master, "stochastic_rounding": sr,
                        "state_dtype": None}],
            "amp_dtype": "bfloat16", "scaler": scaler, "mesh": None}


def _state(w, st, record):
    return {"model": {"w": w}, "optimizer": {"state": {0: st}, "param_groups": []},
            "scaler": {"scale": 8.0} if record["scaler"] else {}, "record": record}


def test_convert_rules_on_plain_state_dicts():
    w32 = torch.tensor([1.0 + 2 ** -20, 3.0])
    # fp32 -> bf16 + master: the master is the fp32 weight, the weight its rounding
    out, notes = ckpt.convert(_state(w32, {"step": 1}, _record("float32")),
                              _record("bfloat16", master=True))
    assert torch.equal(out["optimizer"]["state"][0]["master"], w32)
    assert torch.equal(out["model"]["w"], w32.to(torch.bfloat16)) and notes
    # ... -> fp32: the master becomes the weight, exactly
    back, _ = ckpt.convert(dict(out, record=_record("bfloat16", master=True)),
                           _record("float32"))
    assert torch.equal(back["model"]["w"], w32) and "master" not in back["optimizer"]["state"][0]
    # fp32 -> bf16 + SR: the low bits would be lost: refused, naming both modes
    with pytest.raises(ckpt.CheckpointError, match="fp32 weights.*as bf16 weights \\+ stoch"):
        ckpt.convert(_state(w32, {}, _record("float32")), _record("bfloat16", sr=True))
    # ... unless the values fit, or rounding is asked for
    exact = torch.tensor([1.0, 3.0])
    out, _ = ckpt.convert(_state(exact, {}, _record("float32")), _record("bfloat16", sr=True))
    assert out["model"]["w"].dtype == torch.bfloat16
    out, _ = ckpt.convert(_state(w32, {}, _record("float32")), _record("bfloat16", sr=True),
                          allow_rounding=True)
    assert torch.equal(out["model"]["w"], w32.to(torch.bfloat16))
    # SR -> master: the counter goes, the master is made from the weight later
    sr = _state(w32.to(torch.bfloat16), {"sr_counter": torch.tensor(5)},
                _record("bfloat16", sr=True))
    out, notes = ckpt.convert(sr, _record("bfloat16", master=True))
    assert out["optimizer"]["state"][0] == {} and notes == []
    # the scaler: kept, fresh (None) or dropped
    assert ckpt.convert(sr, _record("bfloat16", sr=True))[0]["scaler"] == {"scale": 8.0}
    assert ckpt.convert(_state(w32, {}, _record("float32", scaler=False)),
                        _record("float32"))[0]["scaler"] is None
    assert ckpt.convert(sr, _record("float32", scaler=False))[0]["scaler"] == {}
    # another optimizer or parameter order: refused
    with pytest.raises(ckpt.CheckpointError, match="optimizer is AdamW.*SGD"):
        ckpt.convert(sr, dict(_record("bfloat16"), optimizer="SGD"))


def test_no_code_reads_a_file_that_could_run_code():
    """The whole shipped tree (library, launchers, scripts, benchmarks):
    every torch.load passes weights_only=True, nothing calls pickle.load /
    pickle.loads, and every pickle.Unpickler subclass restricts find_class."""
    import ast
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    bad = []
    for folder in ("xla_amp", "xla_amp_launch", "scripts", "benchmarks"):
        for path in (root / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    owner = getattr(node.func.value, "id", None)
                    if (owner, node.func.attr) == ("torch", "load"):
                        safe = any(k.arg == "weights_only" and getattr(k.value, "value", None)
                                   is True for k in node.keywords)
                        if not safe:
                            bad.append(f"{where}: torch.load without weights_only=True")
                    if owner == "pickle" and node.func.attr in ("load", "loads"):
                        bad.append(f"{where}: pickle.{node.func.attr}")
                if isinstance(node, ast.ClassDef) and any(
                        getattr(b, "attr", getattr(b, "id", None)) == "Unpickler"
                        for b in node.bases):
                    if not any(isinstance(f, ast.FunctionDef) and f.name == "find_class"
                               for f in node.body):
                        bad.append(f"{where}: Unpickler subclass without find_class")
    assert not bad, bad
