"""A sharded checkpoint as xla_amp.sharded.save wrote it before versions
and checksums (up to commit 82a26fb): the record (no ``checksums``), then
DCP's files, straight into the directory `path`. Imported by the tests
that check such a checkpoint still loads."""
import json
import os

import torch.distributed.checkpoint as dcp

from xla_amp.checkpoint import _record
from xla_amp.checkpoint import _sharded_dcp


def save_old_format(path, model, optimizer=None, scaler=None):
    objects = {k: v for k, v in (("model", model), ("optimizer", optimizer),
                                 ("scaler", scaler)) if v is not None}
    _sharded_dcp.settle()
    state = {k: v.state_dict() for k, v in objects.items()}
    os.makedirs(path, exist_ok=True)
    old = {k: v for k, v in _record.sharded_record(model, optimizer).items()
           if k != "training"}   # the record before conversion came in
    with open(os.path.join(path, _record.FILE), "w") as f:
        json.dump(old, f)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(path, per_thread_copy_ahead=0),
             planner=_sharded_dcp.save_planner(), no_dist=True)
