"""The MNIST launcher with --fsdp (FSDPv2 through xla_amp.sharded) on 2
virtual XLA:CPU devices, bf16 weights with an fp32 master: trains to the
accuracy of the same run on one device, one graph execution per step, and
a checkpoint resumes under --fsdp. `make sharded`."""
import re

import pytest

from tests.support.launch import launch, summary

pytestmark = pytest.mark.sharded

ARGS = ["--batch_size", 32, "--eval_batch_size", 120, "--num_epochs", 1, "--max_steps", 30,
        "--precision", "bf16_master", "--syncfree", "--optimizer", "adamw"]


def _accuracy(proc) -> float:
    return float(re.match(r"([0-9.]+)%", summary(proc, "accuracy")).group(1))


def test_mnist_fsdp_trains_like_one_device(tmp_path):
    one = launch("train_mnist_amp.py", *ARGS)
    assert one.returncode == 0, one.stderr[-3000:]
    ck = tmp_path / "ck.pt"
    two = launch("train_mnist_amp.py", *ARGS, "--num_devices", 2, "--fsdp", "--checkpoint", ck)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "2 x CPU (FSDPv2: parameters, gradients and state sharded)" in two.stdout
    assert "1.00 graph executions/step" in summary(two, "XLA")
    assert abs(_accuracy(two) - _accuracy(one)) <= 2.0, (summary(one, "accuracy"),
                                                         summary(two, "accuracy"))
    # resume the finished run: the sharded model and master load back
    again = launch("train_mnist_amp.py", *ARGS, "--num_devices", 2, "--fsdp", "--resume", ck)
    assert again.returncode == 0, again.stderr[-3000:]
    assert summary(again, "accuracy") == summary(two, "accuracy")
