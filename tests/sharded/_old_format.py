"""A sharded checkpoint as xla_amp.sharded.save wrote it before versions
and checksums (up to commit 82a26fb): the record (no ``checksums``), then
DCP's files, straight into the directory `path`. Imported by the tests
that check such a checkpoint still loads."""
import os

import torch.distributed.checkpoint as dcp

from xla_amp.sharded import _checkpoint
from xla_amp.sharded import _checkpoint_record as record


def save_old_format(path, model, optimizer=None, scaler=None):
    objects = {k: v for k, v in (("model", model), ("optimizer", optimizer),
                                 ("scaler", scaler)) if v is not None}
    _checkpoint._settle()
    state = {k: v.state_dict() for k, v in objects.items()}
    os.makedirs(path, exist_ok=True)
    record.write(path, record.describe(model, optimizer))
    dcp.save(state, storage_writer=dcp.FileSystemWriter(path, per_thread_copy_ahead=0),
             planner=_checkpoint._save_planner(), no_dist=True)
