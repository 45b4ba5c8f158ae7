"""Sharded saves killed mid-way: a real process saves over an existing
checkpoint (keep=2) and dies, and then ``sharded.load(path)`` gives the
previous checkpoint bit-identically -- or the new one, once the manifest's
rename has happened -- the older kept version too, and the next save
succeeds and removes what the killed one left.

The processes are forked from tests/sharded/_sharded_saves.py's server
(one import of torch_xla for all of them). Two ways to die:

* SIGKILL just before each file operation of a save in turn (an open for
  writing, a rename, a removal, a directory made), until a save runs out
  of operations and completes: every step of the publish protocol, each
  save starting over what the previous killed one left;
* the kernel's SIGXFSZ (RLIMIT_FSIZE) at seeded byte offsets of the data
  file and of ``.metadata.tmp``: the file holds exactly that many bytes.
"""
import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading

import pytest

from tests.sharded._sharded_saves import build, loaded, same, snapshot
from xla_amp import sharded

pytestmark = pytest.mark.sharded
HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = "xla_amp_sharded_versions.json"
SEED = 43
FILES = [".metadata", "__0_0.distcp", "__0_checksums.json", "xla_amp_sharded.json"]


@pytest.fixture(scope="module")
def trial():
    """trial(path, seed, kill, log) -> {"signal": ..., "exit": ...} of one
    forked process saving build(seed) over `path` with keep=2."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_USE_SPMD", "CPU_NUM_DEVICES")}
    # stderr a pipe, not a file: RLIMIT_FSIZE limits every regular file the
    # process writes, and a warning appended to a grown log would be the kill
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "_sharded_saves.py")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)
    errors = collections.deque(maxlen=40)
    threading.Thread(target=lambda: errors.extend(proc.stderr), daemon=True).start()
    assert json.loads(proc.stdout.readline() or "{}").get("ready"), "".join(errors)

    def run(path, seed, kill, log):
        spec = dict(path=path, seed=seed, keep=2, kill=kill, log=str(log))
        proc.stdin.write(json.dumps(spec) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, "".join(errors)
        out = json.loads(line)
        assert out["exit"] in (None, 0), "".join(errors)
        return out

    yield run
    proc.stdin.close()
    proc.wait(timeout=60)


def save(path, seed, device):
    model, opt, scaler = build(seed, device)
    sharded.save(path, model=model, optimizer=opt, scaler=scaler, keep=2)
    return snapshot(model, opt, scaler)


def check(path, kept, device, when):
    """``load(path)`` gives kept[0], the older kept version kept[1]."""
    where = sharded.versions(path)
    assert len(where) == 2, (when, where)
    assert same(loaded(path, device), kept[0]), when
    assert same(loaded(where[1], device), kept[1]), when


def check_clean(path):
    """Only the manifest and the two kept versions, each whole, are left."""
    names = [os.path.basename(w) for w in sharded.versions(path)]
    assert sorted(os.listdir(path)) == sorted([MANIFEST] + names), os.listdir(path)
    for n in names:
        assert sorted(os.listdir(os.path.join(path, n))) == FILES, n


def read_log(log):
    return [json.loads(line) for line in log.read_text().splitlines()]


def published(events) -> bool:
    """Whether the manifest's rename is among `events` (done, not the kill's)."""
    return any(e[0] == "os.rename" and e[2].endswith(os.sep + MANIFEST) for e in events)


def test_sigkill_before_each_file_operation_of_a_save(trial, device, tmp_path):
    """Each save starts from the same state (two kept versions, nothing
    else), so operation k is the same step every time: k = 1, 2, ... until
    a save has no k-th operation and completes."""
    path = str(tmp_path / "ckpt")
    older, newer = save(path, 1, device), save(path, 2, device)
    kept, moments = [newer, older], []
    for k in range(1, 100):
        log = tmp_path / f"events-{k}.jsonl"
        out = trial(path, 100 + k, ["event", k], log)
        events = read_log(log)
        if out["signal"] is None:  # no k-th operation: this save completed
            assert len(events) == k - 1, (k, events)
            check(path, [snapshot(*build(100 + k, device)), kept[0]], device, "completed")
            check_clean(path)
            break
        assert out["signal"] == signal.SIGKILL and len(events) == k, (k, out, events)
        moments.append(events[-1])
        if published(events[:-1]):  # the new one is the current from the rename on
            kept = [snapshot(*build(100 + k, device)), kept[0]]
        check(path, kept, device, (k, events[-1]))
        kept = [save(path, 200 + k, device), kept[0]]  # the next save: whole, and cleans up
        check_clean(path)
    else:
        pytest.fail("the saves never completed")
    kinds = {m[0] for m in moments}
    assert {"open", "os.rename", "os.mkdir", "shutil.rmtree", "os.remove", "os.rmdir"} <= kinds, \
        sorted(kinds)
    # among them: just before the manifest's rename, the step that publishes
    assert any(m[0] == "os.rename" and m[2].endswith(os.sep + MANIFEST) for m in moments)


def test_kills_at_seeded_byte_offsets_of_the_data_file_and_of_metadata(trial, device, tmp_path):
    path = str(tmp_path / "ckpt")
    older, newer = save(path, 1, device), save(path, 2, device)
    kept = [newer, older]
    where = sharded.versions(path)[0]
    data = os.path.getsize(os.path.join(where, "__0_0.distcp"))
    meta = os.path.getsize(os.path.join(where, ".metadata"))
    rng = random.Random(SEED)
    cases = [("__0_0.distcp", 0), ("__0_0.distcp", rng.randrange(1, data - 64)),
             ("__0_0.distcp", rng.randrange(1, data - 64)), (".metadata.tmp", 0),
             (".metadata.tmp", rng.randrange(1, meta - 64))]
    for i, (name, offset) in enumerate(cases):
        log = tmp_path / f"events-{i}.jsonl"
        out = trial(path, 10 + i, ["file", name, offset], log)
        assert out["signal"] == signal.SIGXFSZ, (name, offset, out)
        last = json.loads(log.read_text().splitlines()[-1])  # died writing that file
        assert last[0] == "open" and os.path.basename(last[1]) == name, last
        published = [os.path.basename(w) for w in sharded.versions(path)]
        partial = [n for n in os.listdir(path) if n.startswith("v") and n not in published]
        assert len(partial) == 1, os.listdir(path)
        assert os.path.getsize(os.path.join(path, partial[0], name)) == offset
        assert ".metadata" not in os.listdir(os.path.join(path, partial[0]))
        check(path, kept, device, (name, offset))
        # a save killed while it removes that leftover (operations 1 and 2
        # take the lock: its folder made, its holder written; 3 makes the
        # path, 4 starts the removal, then one per file, then the folder)
        k = rng.randrange(4, 6 + len(os.listdir(os.path.join(path, partial[0]))))
        log = tmp_path / f"cleanup-{i}.jsonl"
        out = trial(path, 30 + i, ["event", k], log)
        assert out["signal"] == signal.SIGKILL, out
        assert read_log(log)[1][:2] == ["open", path + ".lock"]
        assert read_log(log)[3][:2] == ["shutil.rmtree", os.path.join(path, partial[0])]
        check(path, kept, device, ("cleanup", k))
        kept = [save(path, 20 + i, device), kept[0]]  # the next save: whole, and cleans up
        check_clean(path)
        check(path, kept, device, ("after", name, offset))
