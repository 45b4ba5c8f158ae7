"""Damaged launcher checkpoints, with real processes (make faults): 100
bytes flipped in place inside a tensor of a real checkpoint (a disk or copy
fault: same length, torch.load reads it without complaint) and a file cut
to half. --resume refuses it in one line (exit 2); --auto_resume resumes
from the newest intact file --keep_checkpoints kept, after moving each
damaged newer one aside, and ends equal to an uninterrupted run; with no
intact one it stops (exit 2) and changes no file."""
import os
import shutil
import struct
import zipfile

import pytest
import torch

from xla_amp import checkpoint as ckpt

from tests.support import assert_same
from tests.support.launch import MNIST_TINY, launch

pytestmark = pytest.mark.faults

STATE = ("model", "optimizer", "scaler", "position")
# --max_steps 6 with a checkpoint every 2 steps, three kept: ck.pt holds
# step 6, ck.pt.1 step 4, ck.pt.2 step 2
KEPT = ["--checkpoint_steps", 2, "--keep_checkpoints", 3]


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    directory = tmp_path_factory.mktemp("kept")
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 6, *KEPT,
                  "--checkpoint", directory / "ck.pt")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return directory


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run to step 8: its final checkpoint."""
    path = tmp_path_factory.mktemp("ref") / "ck.pt"
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 8, "--checkpoint", path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(path, weights_only=True)


def copy_of(kept, tmp_path, names=("ck.pt", "ck.pt.1", "ck.pt.2")):
    for n in names:
        shutil.copyfile(kept / n, tmp_path / n)
    return tmp_path / "ck.pt"


def flip_a_tensor(path) -> bytes:
    """Invert 100 bytes in the middle of the largest tensor's data (found
    through the zip's directory); returns the damaged file's bytes."""
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if "/data/" in i.filename),
                   key=lambda i: i.file_size)
    nlen, xlen = struct.unpack("<HH", raw[info.header_offset + 26:info.header_offset + 30])
    start = info.header_offset + 30 + nlen + xlen + info.file_size // 2
    for i in range(start, start + 100):
        raw[i] ^= 0xFF
    path.write_bytes(raw)
    return bytes(raw)


def cut_to_half(path) -> bytes:
    raw = path.read_bytes()[:path.stat().st_size // 2]
    path.write_bytes(raw)
    return raw


DAMAGE = {"100 bytes flipped": (flip_a_tensor, "tensor model/fc1.weight does not match its "
                                               "checksum (1 damaged of 32 tensors)"),
          "cut to half": (cut_to_half, "is not a readable torch checkpoint")}


def files(directory) -> dict:
    """The directory's files (the lock file aside) and their bytes."""
    return {n: (directory / n).read_bytes() for n in sorted(os.listdir(directory))
            if not n.endswith(".lock")}


def lines(text, prefix) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(prefix)]


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_resume_of_a_damaged_file_is_refused_in_one_line(tmp_path, kept, damage):
    path = copy_of(kept, tmp_path, ["ck.pt"])
    change, reason = DAMAGE[damage]
    change(path)
    before = files(tmp_path)
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 8, "--resume", path,
                  "--checkpoint", tmp_path / "out.pt")
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = lines(proc.stderr, "error:")
    assert str(path) in line and reason in line and "not loaded" in line, line
    assert "Traceback" not in proc.stderr and "resumed from" not in proc.stdout
    assert files(tmp_path) == before          # nothing written, the file as it was


@pytest.mark.parametrize("damaged", [["ck.pt"], ["ck.pt", "ck.pt.1"]])
def test_auto_resume_falls_back_to_the_newest_intact_checkpoint(tmp_path, kept, reference,
                                                                 damaged):
    """The damaged files are moved aside (one line each, naming the file,
    the tensor and the file used) before anything is written, so the saves'
    rotation never moves them over an intact one; the run resumes from the
    newest intact file and ends equal to the uninterrupted run."""
    path = copy_of(kept, tmp_path)
    bad = {n: flip_a_tensor(tmp_path / n) for n in damaged}
    used = tmp_path / ("ck.pt.1" if len(damaged) == 1 else "ck.pt.2")
    done = ckpt.read(used)["position"]["global_step"]
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 8, *KEPT,
                  "--checkpoint", path, "--auto_resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    warnings = lines(proc.stderr, "warning:")
    assert len(warnings) == len(damaged) and not lines(proc.stderr, "error:"), proc.stderr
    for name, line in zip(damaged, warnings):
        assert (f"{tmp_path / name} is damaged: tensor model/fc1.weight does not match" in line
                and f"moved to {tmp_path / name}.damaged" in line
                and f"resuming from {used}, the newest intact" in line), line
        assert (tmp_path / f"{name}.damaged").read_bytes() == bad[name]
    assert f"resumed from {used}: " in proc.stdout and f"{done} steps done" in proc.stdout
    steps = [ckpt.read(tmp_path / n)["position"]["global_step"]
             for n in ("ck.pt", "ck.pt.1", "ck.pt.2")]
    assert steps == [8, 6, 4], steps
    final = ckpt.read(path)
    for key in STATE:
        assert_same(final[key], reference[key], key)


@pytest.mark.parametrize("keep", [1, 3])
def test_auto_resume_with_no_intact_checkpoint_stops_and_changes_nothing(tmp_path, kept, keep):
    """keep 1: the one file is damaged; keep 3: all three are. Exit 2, one
    line naming the damaged file and the reason, every file as it was."""
    names = ["ck.pt"] if keep == 1 else ["ck.pt", "ck.pt.1", "ck.pt.2"]
    path = copy_of(kept, tmp_path, names)
    for n in names:
        flip_a_tensor(tmp_path / n)
    before = files(tmp_path)
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 8, "--checkpoint", path,
                  "--auto_resume", "--keep_checkpoints", keep)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = lines(proc.stderr, "error:")
    assert f"{path} is damaged: tensor model/fc1.weight" in line, line
    assert "no intact older checkpoint" in line and "nothing was changed" in line, line
    if keep == 3:
        assert f"{path}.1" in line and f"{path}.2" in line, line
    assert "Traceback" not in proc.stderr and "resumed from" not in proc.stdout
    assert files(tmp_path) == before


def test_auto_resume_takes_the_newest_kept_file_when_the_path_is_gone(tmp_path, kept):
    """A run that moved the damaged file aside and then died before its first
    save leaves no file at the path: the restart resumes from PATH.1 (one
    note line), not from scratch."""
    path = copy_of(kept, tmp_path, ["ck.pt.1", "ck.pt.2"])
    proc = launch("train_mnist_amp.py", *MNIST_TINY, "--max_steps", 6, *KEPT,
                  "--checkpoint", path, "--auto_resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (note,) = lines(proc.stderr, "note:")
    assert f"{path} is not there; resuming from {path}.1" in note, note
    assert f"resumed from {path}.1: " in proc.stdout and "4 steps done" in proc.stdout
    assert ckpt.read(path)["position"]["global_step"] == 6
