"""The launcher's `--fp8` under float16 (cuda rules + GradScaler) skips an
overflowing step without a trace, with the syncfree optimizer and
with torch.optim (`--nosyncfree`, the scaler's masked step).

The overflow is a real one, reached through the launcher's own flags: a
`--resume` file whose loss scale is 2**100 (one step's scaled gradients
overflow float16). The checkpoint the resumed run writes after two
steps (2**100, then 2**99: both overflow) must hold the resume file's
model (fp8 histories and scales included) and optimizer state bit for
bit, and the scale 2**98."""
import pytest
import torch

from tests.support.launch import MNIST_TINY, launch, launch_side_by_side, summary
from tests.support.no_trace import flatten, moved
from xla_amp import checkpoint
from xla_amp.checkpoint import _integrity

pytestmark = pytest.mark.launchers

# Two steps per epoch and two evaluation batches (--num_steps), of 8 images:
# XLA:CPU runs float16 convolutions in emulated half precision, far slower
# than bfloat16, so a float16 step's time grows with its batch and the
# 360-image evaluation would be half of this test's time. What the test
# checks does not depend on the batch.
FP8 = ["--fp8", "--policy", "cuda", "--num_steps", 2, "--batch_size", 8,
       "--eval_batch_size", 8]


def _flat(state: dict) -> dict:
    """The checkpoint's model and optimizer tensors by path, less fp8's
    per-call diagnostics."""
    out = flatten("optimizer", state["optimizer"], flatten("model", state["model"]))
    return {k: v for k, v in out.items() if not k.endswith(".fp8_stats")}


def _with_scale(src, dst, scale):
    """A copy of the launcher checkpoint `src` whose loss scale is `scale`,
    written as the library writes it (checksums and all)."""
    state = checkpoint.read(src)
    state.pop(_integrity.KEY, None)
    state["scaler"] = dict(state["scaler"], scale=scale)
    checkpoint.write_atomic(dst, lambda f: torch.save(_integrity.with_checksums(state), f))


def test_fp8_float16_overflow_is_skipped_without_a_trace(tmp_path):
    runs = {"syncfree": [], "torch.optim": ["--nosyncfree"]}
    first = launch_side_by_side(*[
        ("train_mnist_amp.py", *MNIST_TINY, *FP8, *extra, "--max_steps", 2,
         "--checkpoint", tmp_path / f"{name}.a.pt") for name, extra in runs.items()])
    for proc in first:
        assert proc.returncode == 0, proc.stderr[-3000:]
    for name in runs:
        _with_scale(tmp_path / f"{name}.a.pt", tmp_path / f"{name}.b.pt", 2.0 ** 100)
    second = launch_side_by_side(*[
        ("train_mnist_amp.py", *MNIST_TINY, *FP8, *extra, "--max_steps", 4, "--log_steps", 100,
         "--resume", tmp_path / f"{name}.b.pt", "--checkpoint", tmp_path / f"{name}.c.pt")
        for name, extra in runs.items()])
    for name, proc in zip(runs, second):
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "resumed from" in proc.stdout
        b, c = (checkpoint.read(tmp_path / f"{name}.{x}.pt") for x in "bc")
        # two steps, each overflowing (2**100 then 2**99), each skipped: backed off twice
        assert c["scaler"]["scale"] == 2.0 ** 98, name
        assert c["position"]["global_step"] == b["position"]["global_step"] + 2
        flat_b = _flat(b)
        assert any("fp8_amax_history" in k for k in flat_b)
        assert moved(flat_b, _flat(c)) == [], name
        # one program per step; the only read is the final summary's (1 over 2 steps)
        assert summary(proc, "XLA").split(", ")[1:] == ["1.00 graph executions/step",
                                                        "0.50 host syncs/step (device-to-host "
                                                        "transfers; training steps only)"]
