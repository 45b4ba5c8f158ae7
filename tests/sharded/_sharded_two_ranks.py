"""Run as two processes (gloo, RANK / WORLD_SIZE / MASTER_* set) by
tests/sharded/test_sharded_versions.py and test_sharded_lock.py:
xla_amp.sharded's save path across processes (_write_version) on host
tensors with DCP's default planner, as the XLA:CPU runtime cannot join two
processes.

    python _sharded_two_ranks.py PATH OUT
        three saves with keep=2; each rank saves tensors of its own (so its
        own data file) and writes what it saved to OUT/expect-<save>-<rank>.pt
    python _sharded_two_ranks.py PATH OUT refused
        one save, expected to be refused: prints {"type", "error"}
    python _sharded_two_ranks.py PATH OUT locks
        two saves; prints {"held": whether this process held the path's
        lock while it planned its part of each}
"""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import DefaultSavePlanner

from xla_amp.checkpoint import CheckpointError, _lock, _record
from xla_amp.checkpoint import sharded as _checkpoint

path, out = sys.argv[1], sys.argv[2]
mode = sys.argv[3] if len(sys.argv) > 3 else "saves"
dist.init_process_group("gloo")
rank = dist.get_rank()
held = []


class Watching(DefaultSavePlanner):
    def create_local_plan(self):
        held.append(_lock.held_here(path))
        return super().create_local_plan()


def describe():
    return {"format": _record.SHARDED_FORMAT, "version": 1}


for save in ((1,) if mode == "refused" else (1, 2) if mode == "locks" else (1, 2, 3)):
    torch.manual_seed(10 * save + rank)
    state = {f"rank{rank}": {"w": torch.randn(64, 8), "b": torch.randn(8)}}
    try:
        _checkpoint._write_version(path, state, 2, Watching(), describe, "two_ranks")
    except CheckpointError as e:
        assert mode == "refused", e
        print(json.dumps({"type": type(e).__name__, "error": str(e)}), flush=True)
        break
    assert mode != "refused"
    if mode == "saves":
        torch.save(state, os.path.join(out, f"expect-{save}-{rank}.pt"))
dist.barrier()
if mode == "locks":
    print(json.dumps({"held": all(held) if rank == 0 else any(held)}), flush=True)
dist.destroy_process_group()
