"""A damaged data file in a sharded checkpoint: torch's
CheckpointException derives from BaseException (pinned below), so
`except Exception` missed it and users saw a multi-line traceback.
xla_amp.sharded.load turns it into one line of CheckpointError (an
Exception) naming the checkpoint and the first failure -- which a
checkpoint from before checksums still meets; one with checksums is
refused before that, naming the file and the tensor cut short (make test,
in this process)."""
import os

import pytest
import torch
import torch.nn as nn
from torch.distributed.checkpoint.api import CheckpointException

import xla_amp
from xla_amp import sharded


def test_torch_checkpoint_exception_is_a_base_exception():
    """Pinned upstream behaviour (torch 2.9): why sharded.load converts it."""
    assert issubclass(CheckpointException, BaseException)
    assert not issubclass(CheckpointException, Exception)


def truncated(path):
    """Cut the data file of the checkpoint in `path` in half."""
    data = os.path.join(path, "__0_0.distcp")
    size = os.path.getsize(data)
    with open(data, "r+b") as f:
        f.truncate(size // 2)
    return data, size


def refusal(path, device):
    fresh = nn.Linear(16, 16).to(device)
    with pytest.raises(Exception) as info:  # an Exception, not only a BaseException
        sharded.load(path, model=fresh, scaler=xla_amp.GradScaler())
    err = info.value
    assert isinstance(err, xla_amp.checkpoint.CheckpointError), type(err)
    message = str(err)
    assert "\n" not in message, message
    return message


def test_a_truncated_data_file_is_one_line_naming_the_tensor_cut_short(device, tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(16, 16).to(device)
    path = str(tmp_path / "ckpt")
    sharded.save(path, model=model, scaler=xla_amp.GradScaler())
    data, size = truncated(sharded.versions(path)[0])
    message = refusal(path, device)
    assert message.startswith(f"xla_amp.sharded.load: {data} is damaged: it holds "
                              f"{size // 2} bytes, {size} were written ('model."), message
    assert message.endswith("' is cut short); nothing was loaded"), message


def test_a_truncated_data_file_without_checksums_is_one_line_of_an_exception(
        device, tmp_path):
    from tests.sharded._old_format import save_old_format
    torch.manual_seed(0)
    model = nn.Linear(16, 16).to(device)
    path = str(tmp_path / "ckpt")
    save_old_format(path, model, scaler=xla_amp.GradScaler())  # as before checksums
    truncated(path)
    message = refusal(path, device)
    assert message.startswith(f"xla_amp.sharded.load: {path}: "), message
    assert "could not read its data" in message
