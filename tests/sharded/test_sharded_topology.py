"""Launches whose process count is not the runtime's are refused (make
test; the torchrun run in make sharded): shard_model, save and load each say so in one line naming both
numbers and what to do, before anything happens.

Pinned known issue (torch_xla 2.9, /work/shared/NOTES.md "Multi-process on
one machine"): the XLA:CPU client is single-process, so two processes
under ``torchrun --nproc_per_node=2`` each see ``process_count() == 1``
and a whole mesh of their own. The torchrun test runs that launch for
real (tests/sharded/_sharded_torchrun.py) and asserts both the pin and each
process's refusals; when process_count() starts saying 2, the runtime
joins the processes and the recipe of docs/sharded.md § A TPU pod can be
tested on XLA:CPU."""
import json
import os
import subprocess
import sys

import pytest
import torch.nn as nn

from xla_amp import sharded

HERE = os.path.dirname(os.path.abspath(__file__))
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def test_world_size_other_than_the_runtimes_is_refused_before_anything(
        device, tmp_path, monkeypatch):
    model = nn.Linear(4, 4).to(device)
    monkeypatch.setenv("WORLD_SIZE", "2")
    for call in (lambda: sharded.save(tmp_path / "c", model=model),
                 lambda: sharded.load(tmp_path / "c", model=model)):
        with pytest.raises(RuntimeError) as err:
            call()
        text = str(err.value)
        assert "\n" not in text and "WORLD_SIZE is 2 but PyTorch/XLA's runtime has 1 process" \
            in text and "CPU_NUM_DEVICES=N" in text, text
    assert not (tmp_path / "c").exists()  # nothing written
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc_per_node=1 agrees
    sharded.save(tmp_path / "c", model=model)
    sharded.load(tmp_path / "c", model=model)


# two processes importing torch_xla: ~17 s on 2 busy cores, so in make sharded
# (make test is at its 10-minute budget)
@pytest.mark.sharded
def test_two_processes_under_torchrun_are_refused_each_known_issue(tmp_path):
    env = dict(os.environ, PJRT_DEVICE="CPU", CPU_NUM_DEVICES="2", OMP_NUM_THREADS="1")
    for var in ("XLA_USE_SPMD", "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.run([TORCHRUN, "--nproc_per_node=2", "--standalone",
                           os.path.join(HERE, "_sharded_torchrun.py"), str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        with open(tmp_path / f"rank{rank}.json") as f:
            out = json.load(f)
        assert out["world_size_env"] == "2" and out["dist_world_size"] == 2, out
        # the pin: each process is a runtime of its own, with the whole mesh
        assert out["process_count"] == 1 and out["devices"] == 2, out
        for source, said in (("WORLD_SIZE is 2", out["env"]),
                             ("torch.distributed's world size is 2", out["dist"])):
            for fn, who in (("shard_model", "shard_model"), ("save", "xla_amp.sharded.save"),
                            ("load", "xla_amp.sharded.load")):
                text = said[fn]
                assert text.startswith(f"{who}: {source} but PyTorch/XLA's runtime has 1 "
                                       "process (torch_xla.runtime.process_count())"), (fn, text)
                assert "\n" not in text and "run one process per host" in text, text
        assert "ckpt" not in out["wrote"], out  # neither process wrote a checkpoint
