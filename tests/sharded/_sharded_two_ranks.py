"""Run as two processes (gloo, RANK / WORLD_SIZE / MASTER_* set) by
tests/sharded/test_sharded_versions.py: xla_amp.sharded's save path across
processes (_checkpoint._write_version) on host tensors with DCP's default
planner, as the XLA:CPU runtime cannot join two processes. Three saves with
keep=2; each rank saves tensors of its own (so its own data file) and
writes what it saved to OUT/expect-<save>-<rank>.pt.

    python _sharded_two_ranks.py PATH OUT
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import DefaultSavePlanner

from xla_amp.sharded import _checkpoint, _checkpoint_record

path, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
for save in (1, 2, 3):
    torch.manual_seed(10 * save + rank)
    state = {f"rank{rank}": {"w": torch.randn(64, 8), "b": torch.randn(8)}}
    _checkpoint._write_version(path, state, 2, DefaultSavePlanner(),
                               lambda: {"format": _checkpoint_record.FORMAT, "version": 1},
                               "two_ranks")
    torch.save(state, os.path.join(out, f"expect-{save}-{rank}.pt"))
dist.barrier()
dist.destroy_process_group()
