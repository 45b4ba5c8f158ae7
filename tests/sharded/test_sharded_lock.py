"""The path lock on sharded checkpoints, with real processes: a second job
saving to a path whose save is under way is refused in one line naming the
path and the holder, before it writes anything, and the holder's save
completes; a thread of this process likewise; a killed holder's lock is
taken over with one line; loads racing a run of saves each read a whole
version; a lock file that is not ours, or that cannot be read, is refused
naming it, with nothing removed; a job of two processes takes one lock.
The holders are tests/sharded/_sharded_lock_runs.py."""
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from tests.sharded._sharded_saves import build, loaded, same, snapshot
from tests.support import launch
from xla_amp import checkpoint, sharded

pytestmark = pytest.mark.sharded
HERE = os.path.dirname(os.path.abspath(__file__))


def start(mode, path, n) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.join(HERE, "_sharded_lock_runs.py"),
                             mode, str(path), str(n)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=launch.launch_env(), cwd=launch.ROOT)


def paused(proc) -> int:
    """Wait until the holder is inside its save; its pid."""
    line = proc.stdout.readline()
    assert line.startswith("paused "), line + proc.stderr.read()[-3000:]
    return int(line.split()[1])


def tree(path) -> dict:
    """Every file under `path` with its bytes."""
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[os.path.relpath(os.path.join(root, f), path)] = fh.read()
    return out


def save(path, seed, device, keep=2):
    model, opt, scaler = build(seed, device)
    sharded.save(path, model=model, optimizer=opt, scaler=scaler, keep=keep)
    return snapshot(model, opt, scaler)


def test_a_second_job_is_refused_in_one_line_and_the_first_completes(device, tmp_path):
    path = str(tmp_path / "ckpt")
    first = save(path, 3, device)
    before = tree(path)
    holder = start("hold", path, 5)
    try:
        pid = paused(holder)
        during = tree(path)          # the holder's new, empty version directory aside
        model, opt, scaler = build(4, device)
        with pytest.raises(checkpoint.CheckpointLocked) as info:
            sharded.save(path, model=model, optimizer=opt, scaler=scaler, keep=2)
        text = str(info.value)
        assert "\n" not in text and text.startswith(f"xla_amp.sharded.save: checkpoint {path} "
                                                    "is in use by another run"), text
        assert f"pid {pid} on {socket.gethostname()}" in text, text
        assert text.endswith("nothing was written"), text
        assert tree(path) == during  # the refused save wrote nothing
        assert same(loaded(path, device), first)   # a load meanwhile: the whole old version
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "saved", holder.stderr.read()[-3000:]
        assert holder.wait(timeout=120) == 0
    finally:
        holder.kill()
        holder.wait()
    old = {k: v for k, v in before.items() if k.startswith("v000001")}
    assert old and {k: v for k, v in tree(path).items() if k.startswith("v000001")} == old
    kept = sharded.versions(path)
    assert len(kept) == 2
    assert same(loaded(kept[0], device), snapshot(*build(5, device)))   # the holder's, whole
    assert same(loaded(kept[1], device), first)                        # the older, untouched


def test_a_thread_holding_the_lock_refuses_a_save_and_its_own_saves_pass(device, tmp_path):
    path = str(tmp_path / "ckpt")
    model, opt, scaler = build(1, device)
    taken, release = threading.Event(), threading.Event()

    def hold():
        with checkpoint.CheckpointLock(path):
            taken.set()
            release.wait(60)
    t = threading.Thread(target=hold)
    t.start()
    try:
        assert taken.wait(60)
        with pytest.raises(checkpoint.CheckpointLocked, match=f"pid {os.getpid()} on "):
            sharded.save(path, model=model, optimizer=opt, scaler=scaler)
        assert not os.path.exists(path)
    finally:
        release.set()
        t.join()
    with checkpoint.CheckpointLock(path):     # held by this thread: its saves go through
        sharded.save(path, model=model, optimizer=opt, scaler=scaler)
        sharded.save(path, model=model, optimizer=opt, scaler=scaler)
    assert [os.path.basename(v) for v in sharded.versions(path)] == ["v000002"]


def test_a_killed_holders_lock_is_taken_over_with_one_line(device, tmp_path, caplog):
    path = str(tmp_path / "ckpt")
    first = save(path, 3, device)
    holder = start("hold", path, 5)
    try:
        pid = paused(holder)
        os.kill(pid, signal.SIGKILL)
        holder.wait(timeout=60)
    finally:
        holder.kill()
    assert len(os.listdir(path)) == 3   # the manifest, the old version, the killed one's
    with caplog.at_level(logging.WARNING, logger="xla_amp"):
        mine = save(path, 6, device)
    notes = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert len(notes) == 1 and f"pid {pid} on {socket.gethostname()}" in notes[0], notes
    assert path in notes[0] and "\n" not in notes[0]
    kept = sharded.versions(path)
    assert sorted(os.listdir(path)) == sorted(["xla_amp_sharded_versions.json",
                                               *map(os.path.basename, kept)])
    assert same(loaded(kept[0], device), mine) and same(loaded(kept[1], device), first)
    with open(path + ".lock") as f:
        assert f.read() == ""      # released cleanly: the next one takes over nothing


def test_loads_racing_saves_each_read_a_whole_version(device, tmp_path):
    path = str(tmp_path / "ckpt")
    runs = {seed: save(path, seed, device, keep=1) for seed in (1, 2)}
    saver = start("loop", path, 12)
    results = []
    try:
        while saver.poll() is None and len(results) < 40:
            try:
                got = loaded(path, device)
            except checkpoint.CheckpointError as e:   # refused in one line, never half
                assert "replaced" in str(e) and "\n" not in str(e), str(e)
                results.append("refused")
                continue
            results.append(next((s for s, snap in runs.items() if same(got, snap)), "torn"))
        assert saver.wait(timeout=300) == 0, saver.stderr.read()[-3000:]
    finally:
        saver.kill()
    assert "torn" not in results and len(results) >= 3, results
    assert same(loaded(path, device), runs[2])      # the 12th save: seed 2
    assert len(sharded.versions(path)) == 1


@pytest.mark.parametrize("content", [b"my notes, not a lock\n", b"\xff\xfe\x00binary"])
def test_a_lock_file_that_is_not_ours_is_refused_naming_it(device, tmp_path, content):
    path = str(tmp_path / "ckpt")
    first = save(path, 1, device)
    with open(path + ".lock", "wb") as f:
        f.write(content)
    before = tree(tmp_path)
    model, opt, scaler = build(2, device)
    with pytest.raises(checkpoint.CheckpointError) as info:
        sharded.save(path, model=model, optimizer=opt, scaler=scaler)
    text = str(info.value)
    assert "\n" not in text and f"(lock file {path}.lock)" in text, text
    assert "nothing was removed" in text and not isinstance(info.value,
                                                           checkpoint.CheckpointLocked)
    assert tree(tmp_path) == before
    assert same(loaded(path, device), first)


def test_a_lock_path_that_cannot_be_opened_is_refused_naming_it(device, tmp_path):
    path = str(tmp_path / "ckpt")
    os.mkdir(path + ".lock")                 # a directory: no lock file can be opened
    model, opt, scaler = build(2, device)
    with pytest.raises(checkpoint.CheckpointError) as info:
        sharded.save(path, model=model, optimizer=opt, scaler=scaler)
    assert str(info.value) == (f"xla_amp.sharded.save: cannot lock checkpoint {path}: Is a "
                               f"directory [EISDIR] (lock file {path}.lock); nothing was "
                               "written"), str(info.value)
    assert os.path.isdir(path + ".lock") and not os.path.exists(path)


def test_a_job_of_two_processes_takes_one_lock_and_both_are_refused_together(tmp_path):
    """tests/sharded/_sharded_two_ranks.py: while this process holds the
    path's lock, both ranks' save is refused with rank 0's one line; freed,
    the job's saves take it once (rank 0), not once per process."""
    path = str(tmp_path / "ckpt")

    def job(mode):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [subprocess.Popen(
            [sys.executable, os.path.join(HERE, "_sharded_two_ranks.py"), path,
             str(tmp_path), mode], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))) for r in range(2)]
        return [(p.communicate(timeout=300)[0], p.returncode) for p in procs]

    with checkpoint.CheckpointLock(path):
        logs = job("refused")
    assert [rc for _, rc in logs] == [0, 0], logs
    lines = [json.loads(log.strip().splitlines()[-1]) for log, _ in logs]
    want = f"checkpoint {path} is in use by another run (pid {os.getpid()} on "
    assert all(want in line["error"] and "\n" not in line["error"] for line in lines), lines
    assert lines[0]["type"] == "CheckpointLocked" and not os.path.exists(path)
    logs = job("locks")
    assert [rc for _, rc in logs] == [0, 0], logs
    held = [json.loads(log.strip().splitlines()[-1])["held"] for log, _ in logs]
    assert held == [True, False], held     # rank 0 held it during the saves; rank 1 never
