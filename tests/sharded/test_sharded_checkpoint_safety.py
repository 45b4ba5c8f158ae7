"""A checkpoint's files run no code (make test, in this process): a crafted
``.metadata`` (a real one with a payload that would make a directory,
one whose storage points outside the folder, one that is not a metadata
at all) and a crafted non-tensor entry are refused by
xla_amp.sharded.load with one line naming the file and saying it was not
loaded; the payload never runs, the model is unchanged, and the real
checkpoint still loads. The crafted files come with a record whose
checksums match them (a checksum finds damage, not a stranger's file:
what keeps the payload from running is the restricted reader). Pinned
upstream behaviour (torch 2.9 / torch_xla 2.9), the reason for
xla_amp/checkpoint/_sharded_metadata.py: DCP's ``FileSystemReader.read_metadata`` runs the ``.metadata`` payload, and
``SPMDLoadPlanner.load_bytes`` runs a non-tensor entry's payload once
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` is set."""
import dataclasses
import json
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn

import xla_amp
from xla_amp import sharded
from xla_amp.checkpoint._checksum import digest
from xla_amp.checkpoint import _sharded_metadata as _safe_metadata


class Payload:
    """Unpickled by a plain unpickler, it makes the directory `marker`."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


class PayloadScaler:
    """A 'scaler' whose state is the payload (the non-tensor entry)."""

    def __init__(self, marker):
        self.marker = marker

    def state_dict(self):
        return Payload(self.marker)


@pytest.fixture
def model(device):
    torch.manual_seed(0)
    return nn.Linear(4, 4).to(device)


@pytest.fixture
def ckpt(model, tmp_path):
    """The directory of the checkpoint's (only) version."""
    path = str(tmp_path / "ckpt")
    sharded.save(path, model=model, scaler=xla_amp.GradScaler())
    return sharded.versions(path)[0]


def put_metadata(path, data: bytes):
    """`data` as the `.metadata` of the checkpoint in `path`, with its
    checksum in the record, as someone crafting the files would write it."""
    with open(os.path.join(path, ".metadata"), "wb") as f:
        f.write(data)
    record_file = os.path.join(path, "xla_amp_sharded.json")
    with open(record_file) as f:
        record = json.load(f)
    record["checksums"][".metadata"] = {"size": len(data),
                                        "segments": [[0, len(data), digest(data)]]}
    with open(record_file, "w") as f:
        json.dump(record, f)


def rewrite_metadata(path, change):
    put_metadata(path, pickle.dumps(change(_safe_metadata.read_metadata(path, "test"))))


def crafted(path, marker):
    """The checkpoint's own metadata carrying `Payload(marker)`; returns the
    original's bytes."""
    with open(os.path.join(path, ".metadata"), "rb") as f:
        original = f.read()
    rewrite_metadata(path, lambda md: dataclasses.replace(md, planner_data=Payload(marker)))
    return original


def test_crafted_metadata_is_refused_without_running_it(device, model, ckpt, tmp_path):
    marker = tmp_path / "payload_ran"
    original = crafted(ckpt, marker)
    before = model.weight.detach().cpu().clone()
    fresh = nn.Linear(4, 4).to(device)
    with pytest.raises(ValueError) as err:
        sharded.load(ckpt, model=fresh, scaler=xla_amp.GradScaler())
    text = str(err.value)
    assert text == (f"xla_amp.sharded.load: {os.path.join(ckpt, '.metadata')} was not loaded: "
                    "it refers to posix.mkdir, which a checkpoint's metadata never holds"), text
    assert not marker.exists()
    put_metadata(ckpt, original)  # the real one still loads
    sharded.load(ckpt, model=fresh, scaler=xla_amp.GradScaler())
    assert torch.equal(fresh.weight.detach().cpu(), before)


@pytest.mark.parametrize("change,why", [
    (lambda md: [md], "it holds a list, not a checkpoint's Metadata"),
    (lambda md: dataclasses.replace(md, storage_data={
        k: dataclasses.replace(v, relative_path="../../elsewhere.distcp")
        for k, v in md.storage_data.items()}), "entry '.*' points outside the checkpoint"),
], ids=["not_metadata", "outside"])
def test_metadata_of_the_wrong_shape_is_refused(device, ckpt, change, why):
    rewrite_metadata(ckpt, change)
    with pytest.raises(ValueError, match=f"metadata was not loaded: {why}"):
        sharded.load(ckpt, model=nn.Linear(4, 4).to(device))


@pytest.mark.parametrize("force_no_weights_only", [False, True], ids=["default", "env_forced"])
def test_crafted_non_tensor_entry_is_refused_without_running_it(
        device, model, tmp_path, monkeypatch, force_no_weights_only):
    marker = tmp_path / "payload_ran"
    path = str(tmp_path / "ckpt")
    sharded.save(path, model=model, scaler=PayloadScaler(marker))
    if force_no_weights_only:  # what upstream's planner would then unpickle in full
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    fresh = nn.Linear(4, 4).to(device)
    before = fresh.weight.detach().cpu().clone()
    with pytest.raises(ValueError) as err:
        sharded.load(path, model=fresh, scaler=xla_amp.GradScaler())
    text = str(err.value)
    assert "\n" not in text and "(entry 'scaler') was not loaded" in text, text
    data = os.path.join(sharded.versions(path)[0], "__0_0.distcp")
    assert data in text and "posix.mkdir" in text, text
    assert not marker.exists()
    assert torch.equal(fresh.weight.detach().cpu(), before)


def test_upstream_read_metadata_runs_a_crafted_metadata(ckpt, tmp_path):
    """Pinned upstream behaviour (torch 2.9): FileSystemReader.read_metadata
    is a plain pickle.load. When the marker stops appearing, upstream reads
    safely and _safe_metadata.read_metadata may be dropped."""
    marker = tmp_path / "payload_ran"
    crafted(ckpt, marker)
    dcp.FileSystemReader(ckpt).read_metadata()
    assert marker.is_dir()


def test_upstream_spmd_load_planner_unpickles_entries_in_full_when_forced(
        device, model, tmp_path, monkeypatch):
    """Pinned upstream behaviour (torch_xla 2.9): SPMDLoadPlanner.load_bytes
    calls torch.load without weights_only, so TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
    turns it into a full unpickle (DCP's own DefaultLoadPlanner passes
    weights_only=False outright). xla_amp.sharded reads the entries itself,
    weights-only, before the load."""
    from torch_xla.experimental.distributed_checkpoint import SPMDLoadPlanner
    marker = tmp_path / "payload_ran"
    path = str(tmp_path / "ckpt")
    sharded.save(path, model=model, scaler=PayloadScaler(marker))
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    with pytest.warns(UserWarning, match="TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        dcp.load({"scaler": {}}, storage_reader=dcp.FileSystemReader(sharded.versions(path)[0]),
                 planner=SPMDLoadPlanner(), no_dist=True)
    assert marker.is_dir()
