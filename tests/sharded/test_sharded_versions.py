"""Versions, keep=K and checksums of xla_amp.sharded checkpoints, in
this process (XLA:CPU, one device): the layout a save leaves, keep=K
rotation with every kept version loading bit-identically, keep refused
before anything is written, a checkpoint from before versions loading
(unverified) and taken over by the next save, and damaged bytes --
flipped in any tensor's or entry's bytes, in .metadata, a checksum file
gone -- refused with one line naming the file and the first damaged
tensor, with nothing changed. Saves killed by signals:
test_sharded_killed_save.py."""
import json
import os

import pytest
import torch

from tests.sharded._old_format import save_old_format
from tests.sharded._sharded_saves import build, fresh, loaded, same, snapshot
from xla_amp import sharded
from xla_amp.checkpoint import CheckpointError
from xla_amp.checkpoint import _sharded_metadata as _safe_metadata

pytestmark = pytest.mark.sharded
MANIFEST = "xla_amp_sharded_versions.json"


def save(path, seed, device, keep=1):
    """Save the run of `seed`; its snapshot."""
    model, opt, scaler = build(seed, device)
    sharded.save(path, model=model, optimizer=opt, scaler=scaler, keep=keep)
    return snapshot(model, opt, scaler)


def listing(path):
    return sorted(os.listdir(path))


def test_keep_k_keeps_the_k_newest_each_loading_bit_identically(device, tmp_path):
    path = str(tmp_path / "ckpt")
    snaps = [save(path, seed, device, keep=3) for seed in range(1, 5)]
    kept = sharded.versions(path)
    assert [os.path.basename(v) for v in kept] == ["v000004", "v000003", "v000002"]
    assert listing(path) == sorted([MANIFEST, "v000002", "v000003", "v000004"])
    assert sorted(os.listdir(kept[0])) == [".metadata", "__0_0.distcp", "__0_checksums.json",
                                           "xla_amp_sharded.json"]
    assert same(loaded(path, device), snaps[3])  # the path: the newest
    for where, snap in zip(kept, snaps[::-1]):
        assert same(loaded(where, device), snap), where
    assert not same(snaps[3], snaps[2])
    last = save(path, 5, device)  # keep=1 (the default): only the new one stays
    assert listing(path) == sorted([MANIFEST, "v000005"])
    assert same(loaded(path, device), last)


@pytest.mark.parametrize("keep,error,said", [
    (0, ValueError, "got 0"), (-2, ValueError, "got -2"), (True, TypeError, "got bool"),
    (1.5, TypeError, "got float"), ("2", TypeError, "got str"), (None, TypeError, "got NoneType"),
])
def test_keep_is_refused_in_one_line_before_anything_is_written(device, tmp_path, keep,
                                                                 error, said):
    model, opt, scaler = build(1, device)
    path = str(tmp_path / "ckpt")
    with pytest.raises(error) as info:
        sharded.save(path, model=model, optimizer=opt, scaler=scaler, keep=keep)
    text = str(info.value)
    assert text == ("xla_amp.sharded.save: keep must be an int >= 1 (how many checkpoints to "
                    f"keep), {said}; nothing was written"), text
    assert not os.path.exists(path)
    first = save(path, 1, device)  # over a checkpoint: nothing touched either
    before = {n: os.stat(os.path.join(path, n)).st_mtime_ns for n in listing(path)}
    with pytest.raises(error):
        sharded.save(path, model=model, optimizer=opt, scaler=scaler, keep=keep)
    assert {n: os.stat(os.path.join(path, n)).st_mtime_ns for n in listing(path)} == before
    assert same(loaded(path, device), first)


def test_extra_is_plain_json_kept_with_the_version_or_refused_before_anything_is_written(
        device, tmp_path):
    model, opt, scaler = build(1, device)
    path = str(tmp_path / "ckpt")
    for bad in ({"step": torch.ones(1)}, {"pos": (1, 2)}, {3: "x"}, ["step", 3]):
        with pytest.raises(TypeError) as info:
            sharded.save(path, model=model, optimizer=opt, scaler=scaler, extra=bad)
        text = str(info.value)
        assert text.startswith("xla_amp.sharded.save: extra must be a dict of plain JSON data")
        assert text.endswith("nothing was written") and "\n" not in text, text
        assert not os.path.exists(path)
    sharded.save(path, model=model, optimizer=opt, scaler=scaler, keep=2,
                 extra={"step": 7, "position": {"epoch": 1, "seen": [3, 4]}})
    sharded.save(path, model=model, optimizer=opt, scaler=scaler, keep=2, extra={"step": 8})
    assert sharded.read_extra(path) == {"step": 8}
    assert sharded.read_extra(sharded.versions(path)[1])["position"]["seen"] == [3, 4]
    assert sharded.load(path, model=fresh(device)[0]) == {"step": 8}


def test_a_checkpoint_from_before_versions_loads_and_the_next_save_takes_it_over(
        device, tmp_path):
    path = str(tmp_path / "ckpt")
    model, opt, scaler = build(1, device)
    save_old_format(path, model, opt, scaler)
    old = snapshot(model, opt, scaler)
    assert sharded.versions(path) == [path]
    assert same(loaded(path, device), old)  # no checksums: loaded unverified
    new = save(path, 2, device, keep=2)
    assert sharded.versions(path) == [os.path.join(path, "v000001"),
                                      os.path.join(path, "v000000")]
    assert listing(path) == sorted([MANIFEST, "v000000", "v000001"])  # its files moved into v000000
    assert same(loaded(path, device), new)
    assert same(loaded(os.path.join(path, "v000000"), device), old)
    newer = save(path, 3, device, keep=2)  # rotated out
    assert listing(path) == sorted([MANIFEST, "v000001", "v000002"])
    assert same(loaded(sharded.versions(path)[1], device), new)
    assert same(loaded(path, device), newer)
    plain = str(tmp_path / "plain")  # keep=1 over one: its files go
    save_old_format(plain, model, opt, scaler)
    save(plain, 2, device)
    assert listing(plain) == sorted([MANIFEST, "v000001"])


def test_a_versioned_checkpoint_whose_record_predates_the_training_record_loads(
        device, tmp_path):
    """The layout the previous format wrote (versions, checksums, a record
    without "training" or "extra"): it loads bit-identically into its own
    mode, and into another one it is refused as then, nothing changed."""
    path = str(tmp_path / "ckpt")
    first = save(path, 1, device)
    where = sharded.versions(path)[0]
    record_file = os.path.join(where, "xla_amp_sharded.json")
    with open(record_file) as f:
        record = json.load(f)
    with open(record_file, "w") as f:
        json.dump({k: v for k, v in record.items() if k not in ("training", "extra")}, f)
    assert same(loaded(path, device), first)
    assert sharded.read_extra(path) == {}
    model, opt, scaler = fresh(device)
    opt = type(opt)(model.parameters(), lr=1e-2, master_weights=True)   # another mode
    with pytest.raises(ValueError, match="was trained with master_weights=False, "
                                         "stochastic_rounding=False .* this optimizer has "
                                         "master_weights=True"):
        sharded.load(path, model=model, optimizer=opt, scaler=scaler)
    assert not opt.state


def items(where):
    """(fqn, chunk offset, file, offset, length) of every item a checkpoint's
    .metadata lists, in file order."""
    md = _safe_metadata.read_metadata(where, "test")
    return sorted((i.fqn, tuple(i.offset or ()), s.relative_path, s.offset, s.length)
                  for i, s in md.storage_data.items())


def flip(file, at):
    with open(file, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))


@pytest.fixture(scope="module")
def saved(device, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("flip") / "ckpt")
    snap = save(path, 1, device)
    where = sharded.versions(path)[0]
    with open(os.path.join(where, "__0_0.distcp"), "rb") as f:
        pristine = f.read()
    return path, where, pristine, snap


def refused(path, device):
    """The one line load(path) raises; checks nothing changed."""
    model, opt, scaler = fresh(device)
    before = snapshot(model, opt, scaler)
    with pytest.raises(CheckpointError) as info:
        sharded.load(path, model=model, optimizer=opt, scaler=scaler)
    assert same(snapshot(model, opt, scaler), before) and not opt.state
    text = str(info.value)
    assert "\n" not in text, text
    return text


def test_a_damaged_data_file_is_checkpoint_damaged(saved, device):
    """The same class a damaged single-file checkpoint raises."""
    from xla_amp.checkpoint import CheckpointDamaged
    path, where, pristine, _ = saved
    flip(os.path.join(where, "__0_0.distcp"), len(pristine) // 2)
    try:
        model, opt, scaler = fresh(device)
        with pytest.raises(CheckpointDamaged):
            sharded.load(path, model=model, optimizer=opt, scaler=scaler)
    finally:
        with open(os.path.join(where, "__0_0.distcp"), "wb") as f:
            f.write(pristine)


def test_flipped_bytes_anywhere_in_a_data_file_name_the_damaged_tensor(device, saved):
    path, where, pristine, snap = saved
    data = os.path.join(where, "__0_0.distcp")
    listed = items(where)
    assert {fqn for fqn, *_ in listed} >= {"model.0.weight", "optimizer.state.1.exp_avg_sq",
                                           "optimizer.param_groups", "scaler"}
    try:
        for fqn, _, name, offset, length in listed:
            assert name == "__0_0.distcp"
            for at in (offset, offset + length // 2, offset + length - 1):
                flip(data, at)
                text = refused(path, device)
                assert text == (f"xla_amp.sharded.load: {data} is damaged: the bytes of "
                                f"{fqn!r} do not match their checksum; nothing was loaded"), text
                flip(data, at)  # back
    finally:
        with open(data, "wb") as f:
            f.write(pristine)
    assert same(loaded(path, device), snap)


def test_damaged_metadata_cut_data_and_lost_checksums_are_refused(device, saved):
    path, where, pristine, snap = saved
    meta, data = os.path.join(where, ".metadata"), os.path.join(where, "__0_0.distcp")
    flip(meta, os.path.getsize(meta) // 2)
    assert refused(path, device) == (f"xla_amp.sharded.load: {meta} is damaged: its bytes do "
                                     "not match their checksum; nothing was loaded")
    flip(meta, os.path.getsize(meta) // 2)
    first_cut = next(fqn for fqn, _, _, o, n in sorted(items(where), key=lambda i: i[3])
                     if o + n > len(pristine) - 10)
    with open(data, "r+b") as f:
        f.truncate(len(pristine) - 10)
    assert refused(path, device) == (
        f"xla_amp.sharded.load: {data} is damaged: it holds {len(pristine) - 10} bytes, "
        f"{len(pristine)} were written ({first_cut!r} is cut short); nothing was loaded")
    with open(data, "wb") as f:
        f.write(pristine)
    sums = os.path.join(where, "__0_checksums.json")
    os.rename(sums, sums + ".away")
    assert refused(path, device) == (f"xla_amp.sharded.load: {data} is damaged: no checksum "
                                     "was recorded for it; nothing was loaded")
    os.rename(sums + ".away", sums)
    with open(os.path.join(path, MANIFEST)) as f:
        assert json.load(f)["versions"] == ["v000001"]
    assert same(loaded(path, device), snap)


def test_two_processes_write_their_own_files_and_checksums_and_rank_0_publishes(tmp_path):
    """tests/sharded/_sharded_two_ranks.py: two processes, three saves,
    keep=2. Both ranks' data files and checksum files are in each version,
    every entry loads as its rank saved it, and a byte flipped in rank 1's
    file is refused naming that file and rank 1's tensor."""
    import socket
    import subprocess
    import sys
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from xla_amp.checkpoint import _record, _sharded_checksums as _checksums

    path, out = str(tmp_path / "ckpt"), tmp_path
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(os.path.dirname(__file__), "_sharded_two_ranks.py"),
         path, str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))) for r in range(2)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert listing(path) == sorted([MANIFEST, "v000002", "v000003"])
    for where, save in zip(sharded.versions(path), (3, 2)):
        assert sorted(os.listdir(where)) == [".metadata", "__0_0.distcp", "__0_checksums.json",
                                             "__1_0.distcp", "__1_checksums.json",
                                             "xla_amp_sharded.json"]
        want = {}
        for r in range(2):
            want.update(torch.load(out / f"expect-{save}-{r}.pt"))
        got = {k: {n: torch.zeros_like(t) for n, t in v.items()} for k, v in want.items()}
        dcp.load(got, storage_reader=dcp.FileSystemReader(where), no_dist=True)
        assert same(got, want), where
    where = sharded.versions(path)[0]
    metadata = _safe_metadata.read_metadata(where, "test")
    sums = _checksums.expected(where, _record.read_sharded(where, "test"), "test")
    planner = DefaultLoadPlanner()
    planner.set_up_planner(got, metadata, True)
    reads = planner.create_local_plan().items
    sums.check_metadata()
    sums.check_reads(metadata, reads)  # both ranks' checksums reached the load
    fqn, _, name, offset, length = next(i for i in items(where) if i[0] == "rank1.w")
    flip(os.path.join(where, name), offset + length // 2)
    with pytest.raises(CheckpointError) as info:
        sums.check_reads(metadata, reads)
    assert str(info.value) == (f"test: {os.path.join(where, '__1_0.distcp')} is damaged: the "
                               "bytes of 'rank1.w' do not match their checksum; nothing was "
                               "loaded")
